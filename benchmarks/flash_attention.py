"""Flash entmax attention (attnopt.attention.flash_attention, method="triton") against its peers.

    python benchmarks/flash_attention.py --device cuda                 # n in 1k, 4k, 16k, 32k, bfloat16, causal
    python benchmarks/flash_attention.py --device cuda --sizes 1024 4096 --dtype float32
    python benchmarks/flash_attention.py --device cuda --no-causal --out flash.json
    python benchmarks/flash_attention.py --quick                       # CPU smoke run, Triton's interpreter

Batch 1, 32 heads, d = 64, bfloat16 (``--quick``: 1 head, d = 16, n in 32, 64, float32; about a minute).  Rows, all in one run:

* ``attnopt flash a=1.5`` / ``a=2`` / ``a=1``: the Triton kernels (entmax15, sparsemax, softmax);
* ``torch sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's flash / memory-
  efficient softmax kernels), the speed of attention without sparsity;
* ``dense entmax15``: scores, :func:`attnopt.transforms.entmax15`, ``@ v``, only up to
  ``--dense-max-n`` (4096) and where its n x n tensors fit in 60 % of the free memory;
* ``adasplash a=1.5``: AdaSplash's flash entmax attention (``adasplash.adasplash``), if importable.

Times are medians (CUDA events around each call, after a warm-up that also compiles the kernels)
of the forward and of forward + backward, over at most 10 calls and at most ``--rep-budget``
seconds per measurement (so 1-3 calls at n = 32k); ``peak MB`` is the peak memory allocated during
forward + backward above what the inputs hold; ``ratio`` is the peer's time / attnopt flash
a=1.5's time (> 1: attnopt is faster); ``max err`` is the largest absolute difference of the output
from the dense float64 path, where that is run (n <= ``--dense-max-n``).

Each row is printed (and flushed) as soon as it is measured.  A measurement that would start after
``--budget`` seconds is skipped and reported, so the whole run stays within about that time plus
one row (default 90 s; the defaults take about a minute on an H200).  float32 runs the products in
IEEE float32 on CUDA cores (no TF32), several times slower than bfloat16: give it smaller
``--sizes`` (1024 4096).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="tiny CPU smoke run under TRITON_INTERPRET=1")
    ap.add_argument("--no-causal", action="store_true", help="bidirectional attention (default: causal)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="input dtype (default bfloat16 on cuda, float32 on cpu)")
    ap.add_argument("--sizes", type=int, nargs="*", help="sequence lengths (default 1024 4096 16384 32768)")
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--budget", type=float, default=90.0,
                    help="seconds: measurements that would start later are skipped (default 90)")
    ap.add_argument("--rep-budget", type=float, default=1.0,
                    help="seconds of timed calls per measurement, after the warm-up (default 1)")
    ap.add_argument("--dense-max-n", type=int, default=4096,
                    help="largest n for the dense entmax15 row and the float64 error reference (default 4096)")
    ap.add_argument("--out", help="write the rows as JSON here")
    return ap.parse_args()


ARGS = parse()
if ARGS.device == "cpu":
    # Before anything imports Triton: its helpers and our kernels are decorated at import.
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from attnopt import transforms  # noqa: E402
from attnopt.attention import _flash_attention, attention_scores  # noqa: E402

DEV = torch.device(ARGS.device)
CUDA = DEV.type == "cuda"


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def _once(fn):
    """Seconds of one call of fn (CUDA events on the GPU)."""
    if CUDA:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / 1e3
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def timed(fn, reps, budget_s):
    """Median seconds of fn() over up to ``reps`` calls, as many as fit in ``budget_s`` (at least 1)."""
    fn()  # warm-up (compiles the kernels on first use)
    _sync()
    times = [_once(fn)]
    n_more = min(reps, int(budget_s / max(times[0], 1e-6))) - 1
    for _ in range(max(n_more, 0)):
        times.append(_once(fn))
    return statistics.median(times)


def peak_mb(fn):
    if not CUDA:
        return float("nan")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def fmt(x, spec):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table_row(r):
    return (f"| {r['n']} | {r['method']} | {fmt(r['fwd_ms'], '.2f')} | {fmt(r['fwd_bwd_ms'], '.2f')} | "
            f"{fmt(r['peak_mb'], '.0f')} | {fmt(r.get('ratio_fwd'), '.2f')} | {fmt(r.get('ratio_fwd_bwd'), '.2f')} | "
            f"{fmt(r['max_err'], '.1e')} |")


def main():
    t_start = time.perf_counter()
    causal = not ARGS.no_causal
    if ARGS.dtype is None:
        ARGS.dtype = "bfloat16" if CUDA else "float32"
    dtype = getattr(torch, ARGS.dtype)
    if ARGS.quick:
        sizes, heads, d, blocks, reps = ARGS.sizes or [32, 64], ARGS.heads or 1, 16, dict(block_m=16, block_n=16), 1
    else:
        sizes, heads, d, blocks, reps = ARGS.sizes or [1024, 4096, 16384, 32768], ARGS.heads or 32, 64, {}, 10
    try:
        from adasplash import adasplash  # noqa: PLC0415
    except Exception:  # not installed, or no CUDA for its kernels
        adasplash = None

    def flash(alpha):
        return lambda q, k, v: _flash_attention(q, k, v, alpha=alpha, causal=causal, method="triton", **blocks)[0]

    def dense15(q, k, v):
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril() if causal else None
        return transforms.entmax15(attention_scores(q, k, mask=mask)) @ v

    peers = {
        "attnopt flash a=1.5": flash(1.5),  # first: the other rows' ratios are to it
        "attnopt flash a=2": flash(2.0),
        "attnopt flash a=1": flash(1.0),
        "torch sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "dense entmax15": dense15,
    }
    if adasplash is not None and CUDA:
        peers["adasplash a=1.5"] = lambda q, k, v: adasplash(q, k, v, alpha=1.5, is_causal=causal)

    device = torch.cuda.get_device_name() if CUDA else platform.processor() or "cpu"
    mode = "causal" if causal else "bidirectional"
    print(f"Flash attention, {device}, torch {torch.__version__}, batch 1, {heads} heads, d={d}, {ARGS.dtype}, {mode}"
          f"{' (Triton interpreter, smoke run)' if not CUDA else ''}; ratio = peer time / attnopt flash a=1.5 time\n")
    print("| n | method | fwd ms | fwd+bwd ms | peak MB (fwd+bwd) | ratio fwd | ratio fwd+bwd | max err vs float64 dense |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    rows, skipped = [], []
    for n in sizes:
        g = torch.Generator(device="cpu").manual_seed(n)
        q, k, v = (torch.randn(1, heads, n, d, generator=g).to(DEV, dtype) for _ in range(3))
        do = torch.randn(1, heads, n, d, generator=g).to(DEV, dtype)
        n_bytes_dense = 6 * heads * n * n * 4  # scores, weights and their gradients, in float32
        free = torch.cuda.mem_get_info()[0] if CUDA else 8 * 2**30
        small = n <= ARGS.dense_max_n
        ref = None
        base = None
        for name, fn in peers.items():
            if name == "dense entmax15" and (not small or n_bytes_dense > 0.6 * free):
                continue  # slow (sorts n x n scores) and memory-bound: not at long n
            if ARGS.quick and not CUDA and name.startswith("adasplash"):
                continue
            if time.perf_counter() - t_start > ARGS.budget:
                skipped.append(f"n={n} {name}")
                continue
            if ref is None and small and heads * n * n * 8 * 4 < 0.3 * free:
                with torch.no_grad():  # a float64 dense reference for the errors
                    ref = dense15(q.double(), k.double(), v.double())
            qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))

            def fwd():
                with torch.no_grad():
                    return fn(qq, kk, vv)

            def fwd_bwd():
                out = fn(qq, kk, vv)
                torch.autograd.grad(out, (qq, kk, vv), do)

            try:
                t_f = timed(fwd, reps, ARGS.rep_budget)
                t_fb = timed(fwd_bwd, reps, ARGS.rep_budget)
                mem = peak_mb(fwd_bwd)
                err = float("nan")
                if ref is not None and ("1.5" in name or "entmax15" in name):
                    err = (fwd().double() - ref).abs().max().item()
            except Exception as e:  # a peer that cannot run this shape: say so, keep going
                print(f"n={n} {name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
                continue
            r = dict(n=n, method=name, fwd_ms=t_f * 1e3, fwd_bwd_ms=t_fb * 1e3, peak_mb=mem, max_err=err)
            if name == "attnopt flash a=1.5":
                base = r
            if base:
                r["ratio_fwd"] = r["fwd_ms"] / base["fwd_ms"]
                r["ratio_fwd_bwd"] = r["fwd_bwd_ms"] / base["fwd_bwd_ms"]
            rows.append(r)
            print(table_row(r), flush=True)
        del q, k, v, do, ref
        if CUDA:
            torch.cuda.empty_cache()
    total = time.perf_counter() - t_start
    print(f"\n{len(rows)} rows in {total:.0f} s" + (f"; skipped (past --budget {ARGS.budget:.0f} s): "
                                                  + ", ".join(skipped) if skipped else ""), flush=True)
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            json.dump(dict(device=device, dtype=ARGS.dtype, causal=causal, heads=heads, d=d, torch=torch.__version__,
                           seconds=total, skipped=skipped, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
