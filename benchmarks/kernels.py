"""Benchmark attnopt.kernels: exact W1 (l1 cost) against POT's ot.emd2, and the batched
empirical Lipschitz estimate of attention on 10^5 query pairs.

Run:  python benchmarks/kernels.py          (about a minute on a 2-core CPU)

Timings (one torch thread) are medians of repeats from torch.utils.benchmark.Timer, measured in the same run as
their baseline; ratios > 1 mean attnopt is slower than the baseline.
"""

from __future__ import annotations

import platform

import numpy as np
import ot
import torch
from torch.utils.benchmark import Timer

from attnopt.kernels import EmpiricalMeasure, attention_kernel
from attnopt.regularity import lipschitz_ratio, wasserstein1

torch.manual_seed(0)
torch.set_num_threads(1)  # POT is single-threaded; one thread also avoids OpenMP contention on a shared CPU
F64 = torch.float64


def median_seconds(stmt, env, min_run_time=0.3, slow=False):
    timer = Timer(stmt=stmt, globals=env, num_threads=torch.get_num_threads())
    if slow:  # a few single runs for solvers that take seconds
        return float(np.median([timer.timeit(1).median for _ in range(3)]))
    return timer.blocked_autorange(min_run_time=min_run_time).median


def fmt(t):
    return f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.2f} s"


def w1_table():
    rows = ["| N = M | d | method | time | ot.emd2 (baseline) | ratio | |value − emd2| |", "|---|---|---|---|---|---|---|"]
    for n in (8, 32, 128, 512):
        for d in (1, 8):
            x = torch.randn(n, d, dtype=F64)
            y = torch.randn(n, d, dtype=F64) + 0.3
            a = torch.rand(n, dtype=F64) + 0.1
            a /= a.sum()
            mu, nu = EmpiricalMeasure(x, a), EmpiricalMeasure(y)
            b = nu.weights
            env = dict(ot=ot, x=x, y=y, a=a, b=b, mu=mu, nu=nu, wasserstein1=wasserstein1)
            base_stmt = "ot.emd2(a.numpy(), b.numpy(), ot.dist(x.numpy(), y.numpy(), metric='cityblock'), numItermax=10**7)"
            base = median_seconds(base_stmt, env)
            ref = eval(base_stmt, env)
            methods = ["auto"] if d == 1 else ["auto", "linprog", "ssp"]
            for method in methods:
                if method == "linprog" and n > 128 or method == "ssp" and n > 128:
                    continue
                stmt = f"wasserstein1(mu, nu, method={method!r})"
                t = median_seconds(stmt, env, slow=(n >= 128 and method != "auto"))
                val = eval(stmt, env).item()
                label = {"auto": "auto (1-D closed form)" if d == 1 else "auto (= POT network simplex)"}.get(method, method)
                rows.append(f"| {n} | {d} | {label} | {fmt(t)} | {fmt(base)} | {t / base:.2f} | {abs(val - ref):.1e} |")
    # A batch of 256 pairs in 1-D: one batched torch call against a loop of ot.emd2.
    bx, by = torch.randn(256, 128, 1, dtype=F64), torch.randn(256, 128, 1, dtype=F64)
    env = dict(ot=ot, bx=bx, by=by, wasserstein1=wasserstein1, np=np)
    u = np.full(128, 1 / 128)
    env["u"] = u
    base = median_seconds(
        "[ot.emd2(u, u, ot.dist(bx[i].numpy(), by[i].numpy(), metric='cityblock')) for i in range(256)]", env
    )
    t = median_seconds("wasserstein1(bx, by)", env)
    rows.append(f"| 128 (×256 pairs) | 1 | auto (1-D closed form, batched) | {fmt(t)} | {fmt(base)} (loop) | {t / base:.3f} | |")
    return "\n".join(rows)


def lipschitz_table():
    n_keys, d, pairs = 64, 16, 100_000
    keys = torch.randn(n_keys, d)
    vals = torch.randn(n_keys, d)
    q1, q2 = torch.randn(pairs, d), torch.randn(pairs, d)
    fn = lambda q: attention_kernel(q, keys, vals)[0]  # noqa: E731
    env = dict(
        lipschitz_ratio=lipschitz_ratio, fn=fn, q1=q1, q2=q2, keys=keys, vals=vals, torch=torch, attention_kernel=attention_kernel
    )
    t_est = median_seconds("lipschitz_ratio(fn, q1, q2).max()", env, min_run_time=1.0)
    t_sdpa = median_seconds(
        "F.scaled_dot_product_attention(q1, keys, vals); F.scaled_dot_product_attention(q2, keys, vals)",
        dict(env, F=torch.nn.functional),
        min_run_time=1.0,
    )
    loop_n = 1000
    t_loop = median_seconds(
        f"max(((fn(q1[i:i+1]) - fn(q2[i:i+1])).norm() / (q1[i] - q2[i]).norm()).item() for i in range({loop_n}))",
        env,
        min_run_time=1.0,
    ) * (pairs / loop_n)
    rows = [
        f"| Lipschitz estimate, {pairs:,} pairs (N = {n_keys} keys, d = {d}, float32) | time | attnopt / baseline |",
        "|---|---|---|",
        f"| `lipschitz_ratio(attention_kernel, q1, q2)` (batched) | {fmt(t_est)} | 1.00 |",
        f"| two calls of `torch.nn.functional.scaled_dot_product_attention` (floor) | {fmt(t_sdpa)} | {t_est / t_sdpa:.2f} |",
        f"| per-pair Python loop (timed on {loop_n} pairs, scaled ×{pairs // loop_n}) | {fmt(t_loop)} | {t_est / t_loop:.4f} |",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    print(f"torch {torch.__version__}, POT {ot.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads\n")
    print("### Exact W1 with l1 ground cost vs `ot.emd2`\n")
    print(w1_table())
    print("\n### Batched empirical Lipschitz ratio of attention\n")
    print(lipschitz_table())
