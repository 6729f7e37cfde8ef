"""Compile every flash-attention kernel for sm_90 without a GPU (ptxas ships in the triton wheel).

Catches what Triton's interpreter accepts but the compiler rejects (types changing in loops, ...):

    PYTHONPATH=src python tools/flash_compile_check.py [fp32 fp64 bf16 fp16]

Slow on a busy CPU (minutes per dtype); prints one line per kernel and exits 1 on any failure.
Check another Triton release (the GPU's may differ from the venv's: 3.6 rejected float64 MMA
operands that 3.9 accepts) with its wheel unpacked elsewhere, e.g.

    pip download --no-deps -d /tmp/t36 triton==3.6.0 && pip install --no-deps --target /tmp/t36/site /tmp/t36/triton-3.6.0-*.whl
    PYTHONPATH=/tmp/t36/site:src python tools/flash_compile_check.py fp64
"""
import inspect, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnopt.transforms import _flash as F

DATA = ("Q", "K", "V", "O", "dO", "dQ", "dK", "dV")


def sig(fn, ptr, consts, fp):
    """Triton signature: data pointers of the input dtype, state in the working dtype."""
    work = "fp64" if fp == "fp64" else "fp32"
    s = {}
    for name in fn.arg_names:
        if name in consts:
            s[name] = "constexpr"
        elif name in DATA:
            s[name] = "*" + fp
        elif name[0].isupper():
            s[name] = "*" + ptr.get(name, work)
        elif name in ("n_q", "n_k", "d", "dv", "causal_off", "n_qb", "n_kb", "max_iter"):
            s[name] = "i32"
        else:
            s[name] = work
    return s
target = GPUTarget("cuda", 90, 32)
ok = True
FPS = sys.argv[1:] or ["fp32", "fp64", "bf16"]
for fp in FPS:
  WORK = tl.float64 if fp == "fp64" else tl.float32
  DOT = {"fp32": tl.float32, "fp64": tl.float64, "bf16": tl.bfloat16, "fp16": tl.float16}[fp]
  for mode in (0, 1, 2, 3):
    for causal in (False, True):
      base = dict(HAS_KM=True, CAUSAL=causal, BM=32 if fp=="fp64" else 64, BN=32 if fp=="fp64" else 64, BD=64, WORK=WORK, DOT=DOT)
      jobs = []
      if mode == 0:
          jobs.append((F._softmax_fwd_kernel, dict(base, BDV=64)))
      else:
          jobs.append((F._max_kernel, dict(base)))
          jobs.append((F._entmax_fwd_kernel, dict(base, BDV=64, MODE=mode)))
      jobs.append((F._bwd_kv_kernel, dict(base, BDV=64, MODE=mode)))
      jobs.append((F._bwd_q_kernel, dict(base, BDV=64, MODE=mode)))
      for fn, consts in jobs:
          ptr = {"KM": "i64" if fp == "fp64" else "i8", "Visits": "i32"}  # as _Plan
          s = sig(fn, ptr, consts, fp)
          try:
              k = triton.compile(ASTSource(fn, s, constexprs=consts), target=target)
              print("ok", fp, mode, causal, fn.fn.__name__, flush=True)
          except Exception as e:
              ok = False
              print("FAIL", fp, mode, causal, fn.fn.__name__, type(e).__name__, str(e)[:1500], flush=True)
sys.exit(0 if ok else 1)
