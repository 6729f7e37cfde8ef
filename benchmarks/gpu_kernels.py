"""The fused row kernels of attnopt.transforms and flash attention on a GPU, against the peers (issue #30).

    python benchmarks/gpu_kernels.py --device cuda [--out gpu_kernels.json] [--peak-bandwidth 4.8e12]
    TRITON_INTERPRET=1 python benchmarks/gpu_kernels.py --device cpu --quick   # tiny shapes, the
                                                                                # code path only

Rows, all timed in one run as medians of torch.utils.benchmark (``blocked_autorange``), forward
(no autograd) and forward + backward:

* transforms at (64, 12, 128, 128), (1024, 512) and (8, 16384), float32: attnopt's ``softmax``,
  ``sparsemax``, ``entmax15`` and ``entmax(alpha=1.25)`` (``method="auto"``: the Triton kernels on
  CUDA; softmax also with ``method="torch"``, ``torch.softmax`` plus the library's input check
  and dead-row fix) against ``torch.softmax``, entmax's ``sparsemax``, ``entmax15`` and ``entmax_bisect``,
  and AdaSplash's ``triton_entmax`` when ``adasplash`` imports (its rows are skipped otherwise);
* attention with 32 heads, d = 64, batch 1, n in 1k, 4k, 16k, 32k, bfloat16:
  ``attnopt.attention.flash_attention(q, k, v, alpha=1.5)`` when it exists, AdaSplash's
  attention when it imports, and ``torch.nn.functional.scaled_dot_product_attention``.

Each transform row gives ``ratio`` (this row's time over attnopt's for the same transform, shape
and pass: > 1 means attnopt is faster), its max abs error against a float64 reference
(attnopt's exact torch path on float64), and the achieved memory bandwidth as a fraction of the
device's peak (``--peak-bandwidth``, default 4.8e12 B/s, an H200), counting only the traffic a
fused kernel cannot avoid: a read and a write of the scores forward, and forward + backward the
forward's plus a read of the weights and the gradient and a write of the result (5 passes).
Each attention row gives the peak memory allocated during a forward + backward.  A peer that
fails (not installed, unsupported shape, out of memory) gets a row with its error instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform

import torch
from torch.utils.benchmark import Timer

from attnopt import transforms as T

FULL_SHAPES = [(64, 12, 128, 128), (1024, 512), (8, 16384)]
QUICK_SHAPES = [(2, 3, 8, 16), (4, 40)]
FULL_ATTENTION = [1024, 4096, 16384, 32768]
QUICK_ATTENTION = [32]


def _optional(module):
    try:
        return __import__(module)
    except Exception:  # not installed, or broken on this machine: its rows are skipped
        return None


def transforms(entmax, adasplash, method):
    """name -> [(contender, function of the scores)], attnopt's first (``method``: "auto" or "triton")."""
    table = {
        "softmax": [("attnopt", lambda x: T.softmax(x, method=method)),
                    ("torch.softmax", lambda x: torch.softmax(x, dim=-1)),
                    # the alternative to the kernel: torch.softmax plus the checks and the dead-row fix
                    ("attnopt method=torch", lambda x: T.softmax(x, method="torch"))],
        "sparsemax": [("attnopt", lambda x: T.sparsemax(x, method=method))],
        "entmax15": [("attnopt", lambda x: T.entmax15(x, method=method))],
        "entmax alpha=1.25": [("attnopt", lambda x: T.entmax(x, 1.25, method=method))],
    }
    if entmax is not None:
        table["sparsemax"].append(("entmax.sparsemax", lambda x: entmax.sparsemax(x, dim=-1)))
        table["entmax15"].append(("entmax.entmax15", lambda x: entmax.entmax15(x, dim=-1)))
        table["entmax alpha=1.25"].append(("entmax.entmax_bisect", lambda x: entmax.entmax_bisect(x, 1.25, dim=-1)))
    if adasplash is not None:
        for name, alpha in (("sparsemax", 2.0), ("entmax15", 1.5), ("entmax alpha=1.25", 1.25)):
            table[name].append(("adasplash.triton_entmax", lambda x, a=alpha: adasplash.triton_entmax(x, alpha=a)))
    return table


def reference(name, x):
    x64 = x.double()
    with torch.no_grad():
        if name == "softmax":
            return T.softmax(x64, method="torch")
        if name == "sparsemax":
            return T.sparsemax(x64, method="sort")
        if name == "entmax15":
            return T.entmax15(x64, method="sort")
        return T.entmax(x64, 1.25, method="bisect")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_s(stmt, env, min_run_time):
    return Timer(stmt, globals=env).blocked_autorange(min_run_time=min_run_time).median


def fwd(fn, x):
    with torch.no_grad():
        return fn(x)


def fwd_bwd(fn, x, g):
    x = x.detach().requires_grad_()
    (grad,) = torch.autograd.grad(fn(x), x, g)
    return grad


def transform_rows(shapes, device, peak, min_run_time, entmax, adasplash, method):
    rows = []
    for shape in shapes:
        torch.manual_seed(0)
        x = torch.randn(*shape, device=device)
        g = torch.randn(*shape, device=device)
        numel, size = x.numel(), x.element_size()
        for name, contenders in transforms(entmax, adasplash, method).items():
            ref = reference(name, x)
            ours = {}
            for who, fn in contenders:
                row = {"kind": "transform", "transform": name, "shape": list(shape), "dtype": "float32", "who": who}
                try:
                    error = (fwd(fn, x).double() - ref).abs().max().item()
                    fwd_bwd(fn, x, g)  # warm up (compiles the Triton kernels)
                    sync(device)
                    times = {"forward": median_s("fwd(fn, x)", dict(fwd=fwd, fn=fn, x=x), min_run_time),
                             "forward+backward": median_s("fwd_bwd(fn, x, g)", dict(fwd_bwd=fwd_bwd, fn=fn, x=x, g=g),
                                                          min_run_time)}
                except Exception as err:  # a peer that cannot run this: say why, keep going
                    rows.append({**row, "error": f"{type(err).__name__}: {err}"[:200]})
                    continue
                for passes, (pass_name, t) in zip((2, 5), times.items()):
                    if who == "attnopt":
                        ours[pass_name] = t
                    bandwidth = passes * numel * size / t
                    rows.append({**row, "pass": pass_name, "ms": t * 1e3, "ratio": t / ours.get(pass_name, math.nan),
                                 "bandwidth_fraction": bandwidth / peak, "max_abs_error": error})
    return rows


def attention_contenders(adasplash):
    import attnopt.attention as A

    out = []
    if hasattr(A, "flash_attention"):
        out.append(("attnopt.flash_attention alpha=1.5", lambda q, k, v: A.flash_attention(q, k, v, alpha=1.5)))
    if adasplash is not None and hasattr(adasplash, "adasplash"):
        out.append(("adasplash alpha=1.5", lambda q, k, v: adasplash.adasplash(q, k, v, alpha=1.5, is_causal=False)))
    out.append(("torch sdpa (softmax)", lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)))
    return out


def attention_rows(lengths, device, min_run_time, adasplash, heads, d, dtype):
    rows = []
    for n in lengths:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, heads, n, d, device=device, dtype=dtype) for _ in range(3))
        g = torch.randn(1, heads, n, d, device=device, dtype=dtype)
        for who, fn in attention_contenders(adasplash):
            row = {"kind": "attention", "who": who, "n": n, "heads": heads, "d": d, "dtype": str(dtype).split(".")[-1]}

            def run(q=q, k=k, v=v, fn=fn):
                qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
                return torch.autograd.grad(fn(qs, ks, vs), (qs, ks, vs), g)

            try:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                run()
                sync(device)
                peak = (torch.cuda.max_memory_allocated() - base) if device.type == "cuda" else None
                with torch.no_grad():
                    t_f = median_s("fn(q, k, v)", dict(fn=fn, q=q, k=k, v=v), min_run_time)
                t_fb = median_s("run()", dict(run=run), min_run_time)
            except Exception as err:
                rows.append({**row, "error": f"{type(err).__name__}: {err}"[:200]})
                continue
            rows.append({**row, "forward_ms": t_f * 1e3, "forward+backward_ms": t_fb * 1e3,
                         "peak_memory_MiB": None if peak is None else peak / 2**20})
    return rows


def markdown(rows):
    lines = ["| transform | shape | pass | who | ms | ratio | bandwidth / peak | max abs error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] != "transform":
            continue
        if "error" in r:
            lines.append(f"| {r['transform']} | {tuple(r['shape'])} | | {r['who']} | {r['error']} | | | |")
        else:
            lines.append(f"| {r['transform']} | {tuple(r['shape'])} | {r['pass']} | {r['who']} | {r['ms']:.4g} | "
                         f"{r['ratio']:.2f} | {r['bandwidth_fraction']:.1%} | {r['max_abs_error']:.1e} |")
    lines += ["", "| attention | n | heads x d | forward ms | forward+backward ms | peak memory MiB |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] != "attention":
            continue
        if "error" in r:
            lines.append(f"| {r['who']} | {r['n']} | {r['heads']} x {r['d']} | {r['error']} | | |")
        else:
            mem = "n/a" if r["peak_memory_MiB"] is None else f"{r['peak_memory_MiB']:.0f}"
            lines.append(f"| {r['who']} | {r['n']} | {r['heads']} x {r['d']} | {r['forward_ms']:.4g} | "
                         f"{r['forward+backward_ms']:.4g} | {mem} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (the CPU check of this script)")
    parser.add_argument("--peak-bandwidth", type=float, default=4.8e12, help="the device's peak memory bandwidth, B/s")
    parser.add_argument("--min-run-time", type=float, default=None, help="seconds per timing (default 0.2, quick 0.01)")
    parser.add_argument("--out", default=None, help="write the rows and the setting as JSON here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    # On CUDA attnopt's default ("auto": the kernels); on the CPU the kernels through Triton's
    # interpreter when it is on (so that --quick exercises them), else the torch paths.
    interpreting = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    method = "triton" if device.type == "cpu" and interpreting else "auto"
    if device.type == "cpu" and not interpreting:
        print("note: on the CPU without TRITON_INTERPRET=1 attnopt takes its torch paths (no kernels)")
    min_run_time = args.min_run_time or (0.01 if args.quick else 0.2)
    entmax, adasplash = _optional("entmax"), _optional("adasplash")
    rows = transform_rows(QUICK_SHAPES if args.quick else FULL_SHAPES, device, args.peak_bandwidth, min_run_time,
                          entmax, adasplash, method)
    heads, d, dtype = (2, 16, torch.float32) if args.quick else (32, 64, torch.bfloat16)
    rows += attention_rows(QUICK_ATTENTION if args.quick else FULL_ATTENTION, device, min_run_time, adasplash,
                           heads, d, dtype)
    setting = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
               "torch": torch.__version__, "triton": getattr(_optional("triton"), "__version__", None),
               "entmax": getattr(entmax, "__version__", None) if entmax else None,
               "adasplash": getattr(adasplash, "__version__", "installed") if adasplash else None,
               "peak_bandwidth": args.peak_bandwidth, "quick": args.quick, "attnopt_method": method, "min_run_time": min_run_time}
    print(f"# {setting['device']}, torch {setting['torch']}, triton {setting['triton']}, "
          f"adasplash {setting['adasplash'] or 'not installed'}, {setting['date']}\n")
    print(markdown(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"setting": setting, "rows": rows}, f, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    return rows


if __name__ == "__main__":
    main()
