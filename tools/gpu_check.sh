#!/usr/bin/env bash
# The GPU checks of the course, in one go: the CUDA test subset, the Triton kernels' tests at full
# size and their benchmarks against entmax, AdaSplash and PyTorch, every benchmark on the GPU, every
# notebook at scale="book" on the GPU (tools/time_notebooks.py) and, unless "quick" is given, the
# whole library suite under the machine's own torch and every notebook at scale="full".
# Logs go to $OUT (default _build/gpu).
#
#   OUT=_build/gpu bash tools/gpu_check.sh [quick]
#
# Wheels for packages the GPU machine lacks (entmax, POT, adasplash) may be placed in .whl/ beforehand; they
# are installed into a private target, nothing system-wide.  Steps run in order of importance and
# each has its own time limit, so a short lease still returns the most useful numbers first.
set -uo pipefail
OUT=${OUT:-_build/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, report the status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "[$name] rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  tail -n 4 "$OUT/$name.log"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  nproc; } > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
step cuda_tests 240 $PY -m pytest tests/lib -m cuda -q -p no:cacheprovider
# the Triton kernels compiled for this GPU, at full size (on the CPU they run in the interpreter)
step triton_tests 300 env ATTNOPT_FULL_SIZE=1 $PY -m pytest tests/lib/test_transforms_triton.py tests/lib/test_flash_attention.py -q -p no:cacheprovider
step gpu_kernels 240 $PY benchmarks/gpu_kernels.py --device cuda --out "$OUT/gpu_kernels.json"
step flash_attention 240 $PY benchmarks/flash_attention.py --device cuda --out "$OUT/flash_attention.json"
step transforms 240 $PY benchmarks/transforms.py --device cuda ${1:+--quick}
step dual_solver 120 $PY benchmarks/dual_solver.py --device cuda --clock wall
for b in continuous mixture; do
  if grep -q -- '--device' "benchmarks/$b.py"; then step "$b" 180 $PY "benchmarks/$b.py" --device cuda; fi
done
step notebooks_book 300 $PY tools/time_notebooks.py --scale book --timeout 120 --out "$OUT/notebooks_book.json"
if [ -z "${1:-}" ]; then
  xdist=$($PY -c 'import xdist' 2>/dev/null && echo '-n 8')
  step lib_tests 300 $PY -m pytest tests/lib -q -p no:cacheprovider $xdist
  step notebooks_full 600 $PY tools/time_notebooks.py --scale full --timeout 300 --out "$OUT/notebooks_full.json"
fi
