"""Benchmark: exact maximizer of the Fenchel dual (9), on the workload of Fig. 4 of the paper.

Compares :func:`attnopt.fenchel.solve_dual` (default ``method="auto"``: Newton in the coordinates
``c`` of ``lambda = alpha b + T^T c`` with ``n x n`` systems built from the Gram matrix, after a
first-order warm start) with two baselines measured in the same run on the same inputs:

* **gradient ascent** on (9) — what the paper uses — with a fixed step; the step is the best of
  several multiples of ``2 / (mu + L)`` (``mu = 1/alpha``, ``L = 1/alpha + max_i ||t_i - tbar||^2``
  bounds the curvature), the one needing the fewest iterations (all iterations cost the same);
* **dense Newton** — the same Newton iteration and line search on ``lambda`` itself, with
  ``d x d`` Cholesky solves (``solve_dual(..., method="dense")``).

Workload (Fig. 4): ``d = 384`` float64, one sentence of ``n`` tokens, 12 heads x 20 queries,
templates ``t_i = x_i / sqrt(d_head)``, evidence ``z = K_h^T Q_h y_k`` (the Sec. 8 mapping),
uniform preference, ``alpha = 1``, ``tol = 1e-10`` on ``||grad D||``.  Hidden states ``x`` are
Gaussian with a shared offset; ``K_h``, ``Q_h`` are random ``d_head x d`` projections scaled so that
the attention logits have the standard deviation given by ``--logit-std``.

Two ablations are timed too: the same solver without its warm start, and ``method="span"`` (Newton
on the coordinates of a QR basis of the templates, the solver's previous default, still used for
the OT dual and when there are more templates than dimensions).

Run:  ``python benchmarks/dual_solver.py`` (one to two minutes on one CPU core).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch

import attnopt.fenchel._solvers as solvers
from attnopt.fenchel import relative_deviation, solve_dual


def workload(n: int, queries: int, heads: int, d: int, logit_std: float, device, seed: int = 0):
    """Templates ``t_i = x_i / sqrt(d_head)`` of one sentence, evidence ``z = K_h^T Q_h y_k`` (Sec. 8)."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    dh = d // heads
    offset = 0.5 * torch.randn(d, generator=g, dtype=dt)  # hidden states share a common direction
    x = torch.randn(n, d, generator=g, dtype=dt) + offset
    y = torch.randn(queries, d, generator=g, dtype=dt) + offset
    K = torch.randn(heads, dh, d, generator=g, dtype=dt) / math.sqrt(d)
    Q = torch.randn(heads, dh, d, generator=g, dtype=dt) / math.sqrt(d)
    templates = (x / math.sqrt(dh)).expand(heads, n, d).contiguous()  # a distinct copy per head
    z = torch.einsum("hkd,hke,qe->hqd", K, Q, y)
    z = z * (logit_std / (z @ templates.mT).std())
    mu = templates.mean(-2, keepdim=True)
    return (mu + z).to(device), templates.to(device), z.to(device)


def gradient_ascent(b, templates, alpha: float, tol: float, step_scale: float, max_iter: int = 3000):
    """Fixed-step gradient ascent on (9) from lambda = alpha z; returns (lambda, iterations or None)."""
    T = templates
    tbar = T.mean(-2, keepdim=True)
    r2 = ((T - tbar) ** 2).sum(-1).amax(-1)[..., None, None]  # bound on the covariance term
    eta = step_scale * 2.0 / (2.0 / alpha + r2)
    lam = alpha * (b - tbar)
    for it in range(max_iter):
        p = torch.softmax(lam @ T.mT, dim=-1)
        g = b - lam / alpha - p @ T
        gmax = g.norm(dim=-1).max()
        if not torch.isfinite(gmax) or gmax > 1e8 or (it >= 300 and gmax > 1e-3):
            return lam, None  # diverging or cycling: this step is too large
        if gmax <= tol:
            return lam, it
        lam = lam + eta * g
    return lam, None


CLOCK = time.perf_counter


def interleaved_times(fns: dict, rounds: int, block: float = 0.25) -> dict:
    """Per-call times of each function, measured in ``rounds`` interleaved rounds.

    Each round times every function in turn over a block of about ``block`` seconds, so a slow
    spell of a shared machine hits all of them alike; the ratio of two functions is then taken per
    round and its median reported (see ``ratio``).  Returns ``{name: [seconds per call, per round]}``.
    """
    calls = {}
    for name, fn in fns.items():  # warm up and size the blocks
        fn()
        t0 = CLOCK()
        fn()
        calls[name] = max(1, int(block / max(CLOCK() - t0, 1e-6)))
    out = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = CLOCK()
            for _ in range(calls[name]):
                fn()
            out[name].append((CLOCK() - t0) / calls[name])
    return out


def ratio(times: dict, num: str, den: str) -> float:
    """Median over rounds of ``times[num] / times[den]``."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10, 20, 30], help="templates (tokens of a sentence)")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--tol", type=float, default=1e-10)
    ap.add_argument("--logit-std", type=float, nargs="+", default=[2.0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dense-repeats", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (each about 1 s)")
    ap.add_argument("--clock", choices=["wall", "process"], default="process",
                    help="process CPU time is robust to other jobs on a shared machine (CPU, 1 thread)")
    args = ap.parse_args()
    global CLOCK
    if args.clock == "process" and args.device == "cpu":
        CLOCK = time.process_time
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# solve_dual benchmark — torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} thread(s), device {device}, float64, d={args.d}, heads={args.heads}, "
          f"alpha={args.alpha}, tol={args.tol:g}, clock={CLOCK.__name__}\n")
    print("| n | queries | logit std | rel. dev. mean | `solve_dual` (ms) | no warm start (ms) | QR span (ms) "
          "| grad. ascent (ms) [iters, step x] | dense Newton (ms) | GA / ours | dense / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        for std in args.logit_std:
            b, T, z = workload(n, args.queries, args.heads, args.d, std, device)
            a, tol = args.alpha, args.tol

            def ours():
                solve_dual(b, T, None, a, tol)
                sync(device)

            def cold():  # ablation: the Gram-space Newton iteration from lambda = alpha z, no warm start
                saved, solvers.CAUCHY_STEPS = solvers.CAUCHY_STEPS, 0
                try:
                    solve_dual(b, T, None, a, tol, method="gram")
                finally:
                    solvers.CAUCHY_STEPS = saved
                sync(device)

            def span():
                solve_dual(b, T, None, a, tol, method="span")
                sync(device)

            lam = solve_dual(b, T, None, a, tol)
            assert (lam - solve_dual(b, T, None, a, tol, method="span")).norm(dim=-1).max() < 1e-8
            dev = relative_deviation(lam, a * z).mean().item()
            # gradient ascent: the step multiple needing the fewest iterations (same cost per iteration)
            trials = []
            for scale in (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0):
                lam_ga, iters = gradient_ascent(b, T, a, tol, scale)
                if iters is not None:
                    assert (lam_ga - lam).norm(dim=-1).max() < 1e-8
                    trials.append((iters, scale))
            it_ga, sc_ga = min(trials)

            times = interleaved_times(
                {"ours": ours, "cold": cold, "span": span,
                 "ga": lambda: (gradient_ascent(b, T, a, tol, sc_ga), sync(device))},
                rounds=args.rounds,
            )
            t_ours, t_cold, t_span, t_ga = (statistics.median(times[k]) for k in ("ours", "cold", "span", "ga"))

            # dense Newton: few repeats (seconds each); the first run also checks agreement
            dense_times = []
            for _ in range(args.dense_repeats):
                t0 = CLOCK()
                lam_dense = solve_dual(b, T, None, a, tol, method="dense")
                sync(device)
                dense_times.append(CLOCK() - t0)
            assert (lam - lam_dense).norm(dim=-1).max() < 1e-8
            t_dense = statistics.median(dense_times)
            print(f"| {n} | {args.heads}x{args.queries} | {std:g} | {dev:.3f} | {1e3 * t_ours:.2f} | {1e3 * t_cold:.2f} | "
                  f"{1e3 * t_span:.2f} | {1e3 * t_ga:.2f} [{it_ga}, {sc_ga:g}] | {1e3 * t_dense:.0f} | "
                  f"{ratio(times, 'ga', 'ours'):.1f}x | {t_dense / t_ours:.0f}x |", flush=True)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
