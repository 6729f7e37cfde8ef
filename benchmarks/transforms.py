"""Forward+backward timings of attnopt.transforms against the `entmax` package and torch.softmax,
and of Sinkhorn attention against a plain log-domain loop that syncs with the host every step.

    python benchmarks/transforms.py            # full run (about 3 minutes on 2 CPU cores)
    python benchmarks/transforms.py --quick    # small shape only, shorter Sinkhorn
    python benchmarks/transforms.py --device cuda   # the same on a GPU (Newton rows added)
    python benchmarks/transforms.py --threads 1     # one intra-op thread
    python benchmarks/transforms.py --baseline-commit SHA   # also: this tree against that commit,
                                                           # interleaved (sparsemax, entmax15, entmax)

Every row reports the max abs error against a float64 reference; iterative baselines are given
the fewest iterations that reach <= 1e-6 (equal accuracy), so no baseline is handicapped by doing
more work than it needs.  Ratios are baseline time / attnopt time (> 1: attnopt is faster).
"""

from __future__ import annotations

import argparse
import platform

import entmax as E
import torch
from torch.utils.benchmark import Timer

from _baseline import load_commit  # benchmarks/ is the script's folder
from attnopt import transforms as T

TARGET = 1e-6
DEVICE = torch.device("cpu")


def fwd_bwd(fn, x, g):
    x = x.detach().requires_grad_()
    y = fn(x)
    (grad,) = torch.autograd.grad(y, x, g)
    return y, grad


def median_ms(fn, x, g, min_run_time):
    t = Timer("fwd_bwd(fn, x, g)", globals=dict(fwd_bwd=fwd_bwd, fn=fn, x=x, g=g))
    return t.blocked_autorange(min_run_time=min_run_time).median * 1e3


def err(fn, x, ref):
    with torch.no_grad():
        return (fn(x).double() - ref).abs().max().item()


def fewest_iters(make, x, ref, choices):
    for k in choices:
        if err(make(k), x, ref) <= TARGET:
            return k
    return choices[-1]


def transform_rows(shape, min_run_time, skip_slow):
    torch.manual_seed(0)
    x = torch.randn(*shape).to(DEVICE)
    g = torch.randn(*shape).to(DEVICE)
    x64 = x.double()
    refs = {
        "sparsemax": E.sparsemax(x64, dim=-1),
        "entmax15": E.entmax15(x64, dim=-1),
        "softmax": torch.softmax(x64, dim=-1),
    }
    # Accuracy search on a slice (the iteration count needed does not depend on the batch size).
    xs, rs = x.reshape(-1, shape[-1])[:2048], refs["entmax15"].reshape(-1, shape[-1])[:2048]
    k_pkg = fewest_iters(lambda k: (lambda z: E.entmax_bisect(z, 1.5, -1, n_iter=k)), xs, rs, [10, 15, 20, 22, 24, 26, 28, 30, 40, 50])
    k_ours = fewest_iters(lambda k: (lambda z: T.entmax(z, 1.5, n_iter=k)), xs, rs, [2, 3, 4, 5, 6, 8, 10, 15, 20])
    cases = [
        ("sparsemax", "entmax.sparsemax", lambda z: E.sparsemax(z, -1), lambda z: T.sparsemax(z), "sparsemax"),
        ("sparsemax (sort)", "entmax.sparsemax", lambda z: E.sparsemax(z, -1), lambda z: T.sparsemax(z, method="sort"), "sparsemax"),
        ("entmax15", "entmax.entmax15", lambda z: E.entmax15(z, -1), lambda z: T.entmax15(z), "entmax15"),
        ("entmax15 (sort)", "entmax.entmax15", lambda z: E.entmax15(z, -1), lambda z: T.entmax15(z, method="sort"), "entmax15"),
    ]
    if DEVICE.type != "cpu":  # "auto" means sort off the CPU: time the Newton path as well
        cases += [
            ("sparsemax (newton)", "entmax.sparsemax", lambda z: E.sparsemax(z, -1), lambda z: T.sparsemax(z, method="newton"), "sparsemax"),
            ("entmax15 (newton)", "entmax.entmax15", lambda z: E.entmax15(z, -1), lambda z: T.entmax15(z, method="newton"), "entmax15"),
        ]
    cases += [
        (f"entmax α=1.5, n_iter={k_ours}", f"entmax_bisect n_iter={k_pkg}", lambda z: E.entmax_bisect(z, 1.5, -1, n_iter=k_pkg),
         lambda z: T.entmax(z, 1.5, n_iter=k_ours), "entmax15"),
        ("entmax α=1.5, default (working precision)", f"entmax_bisect n_iter={k_pkg}", lambda z: E.entmax_bisect(z, 1.5, -1, n_iter=k_pkg),
         lambda z: T.entmax(z, 1.5), "entmax15"),
        ("softmax", "torch.softmax", lambda z: torch.softmax(z, -1), lambda z: T.softmax(z), "softmax"),
    ]
    rows, cache = [], {}
    for name, base_name, base, ours, ref in cases:
        if skip_slow and "bisect" in base_name:
            continue
        if base_name not in cache:
            cache[base_name] = (median_ms(base, x, g, min_run_time), err(base, x, refs[ref]))
        tb, eb = cache[base_name]
        to, eo = median_ms(ours, x, g, min_run_time), err(ours, x, refs[ref])
        rows.append((str(tuple(shape)), name, base_name, tb, eb, to, eo))
    return rows


def sinkhorn_baseline(scores, eps, n_iter):
    """Plain log-domain Sinkhorn with a host-synced convergence check every iteration."""
    M = scores / eps
    n, m = M.shape[-2], M.shape[-1]
    log_a = torch.full(M.shape[:-1], -torch.log(torch.tensor(float(n))).item(), dtype=M.dtype, device=M.device)
    log_b = torch.full(M.shape[:-2] + (m,), -torch.log(torch.tensor(float(m))).item(), dtype=M.dtype, device=M.device)
    f = torch.zeros_like(log_a)
    g = torch.zeros_like(log_b)
    for _ in range(n_iter):
        g = log_b - torch.logsumexp(M + f.unsqueeze(-1), dim=-2)
        f = log_a - torch.logsumexp(M + g.unsqueeze(-2), dim=-1)
        col_err = (torch.exp(M + f.unsqueeze(-1) + g.unsqueeze(-2)).sum(-2) - log_b.exp()).abs().max().item()
        if col_err < 1e-12:  # the data-dependent early exit that forces the sync
            break
    return torch.exp(M + f.unsqueeze(-1) + g.unsqueeze(-2) - log_a.unsqueeze(-1))


def sinkhorn_rows(shape, n_iter, min_run_time):
    torch.manual_seed(0)
    s = torch.randn(*shape).to(DEVICE)
    g = torch.randn(*shape).to(DEVICE)
    ref = sinkhorn_baseline(s.double(), 1.0, n_iter)
    rows = []
    base = lambda z: sinkhorn_baseline(z, 1.0, n_iter)
    eb = err(base, s, ref)
    fwd = lambda fn: Timer("fn(s)", globals=dict(fn=fn, s=s)).blocked_autorange(min_run_time=min_run_time).median * 1e3
    with torch.no_grad():
        ours = lambda z: T.sinkhorn_attention(z, 1.0, n_iter, tol=None)
        rows.append((str(tuple(shape)), f"sinkhorn {n_iter} it, forward only", "log-domain + .item() per step", fwd(base), eb,
                     fwd(ours), err(ours, s, ref)))
    tb = median_ms(base, s, g, min_run_time)
    for mode in ("unrolled", "implicit"):
        fn = lambda z, mode=mode: T.sinkhorn_attention(z, 1.0, n_iter, tol=None, grad=mode)
        rows.append((str(tuple(shape)), f"sinkhorn {n_iter} it, {mode}", "log-domain + .item() per step", tb, eb,
                     median_ms(fn, s, g, min_run_time), err(fn, s, ref)))
    return rows


def against_commit(old, shape, rounds, min_run_time):
    """This tree's default sparsemax, entmax15 and entmax(1.5) against the commit's, forward +
    backward, timed in alternation (``rounds`` rounds; medians), so that the load of a shared
    machine hits both alike."""
    torch.manual_seed(0)
    x = torch.randn(*shape).to(DEVICE)
    g = torch.randn(*shape).to(DEVICE)
    cases = [("sparsemax", T.sparsemax, old.sparsemax), ("entmax15", T.entmax15, old.entmax15),
             ("entmax α=1.5, default", lambda z: T.entmax(z, 1.5), lambda z: old.entmax(z, 1.5))]
    rows = []
    for name, new_fn, old_fn in cases:
        t_new, t_old = [], []
        for _ in range(rounds):
            t_old.append(median_ms(old_fn, x, g, min_run_time))
            t_new.append(median_ms(new_fn, x, g, min_run_time))
        t_old.sort()
        t_new.sort()
        rows.append((str(tuple(shape)), name, t_old[rounds // 2], t_new[rounds // 2]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small transform shape and a smaller Sinkhorn batch only")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU; default: torch's)")
    parser.add_argument("--baseline-commit", default=None, help="also time the sparse transforms of this git commit, interleaved")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, float32, {DEVICE}\n")
    rows = transform_rows((1024, 512), 0.5, skip_slow=False)
    if not args.quick:
        rows += transform_rows((64, 12, 128, 128), 0.05, skip_slow=False)
    rows += sinkhorn_rows((96, 128, 128) if args.quick else (768, 128, 128), 10, 0.05)
    print("| input | attnopt | baseline | baseline ms | baseline err | attnopt ms | attnopt err | speed-up |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for shape, name, base, tb, eb, to, eo in rows:
        print(f"| {shape} | {name} | {base} | {tb:.1f} | {eb:.1e} | {to:.1f} | {eo:.1e} | {tb / to:.2f}× |")
    if args.baseline_commit:
        old = load_commit(args.baseline_commit, "transforms")
        pairs = against_commit(old, (1024, 512), 5, 0.2)
        if not args.quick:
            pairs += against_commit(old, (64, 12, 128, 128), 3, 0.05)
        print(f"\nThis tree against {args.baseline_commit[:8]}, interleaved (medians), forward + backward:\n")
        print(f"| input | transform | {args.baseline_commit[:8]} ms | this tree ms | time ratio (this / commit) |")
        print("|---|---|---:|---:|---:|")
        for shape, name, t_old, t_new in pairs:
            print(f"| {shape} | {name} | {t_old:.1f} | {t_new:.1f} | {t_new / t_old:.2f} |")


if __name__ == "__main__":
    main()
