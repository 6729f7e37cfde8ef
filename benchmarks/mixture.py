"""Benchmark attnopt.mixture.weighted_em: batched over examples and components, against
(a) a per-component Python loop (batched over examples, one component at a time, as a direct
transcription of eqs. (5.12)--(5.15)) and (b) a per-example loop calling weighted_em on one example.

Setting: 64 examples, a 14x14 grid of the unit square (196 points in 2D), attention weights
softmax(3 * randn), K in {2, 5}, 50 EM iterations, float32, the same initialization for all
three (the thesis's region initialization computed once), no early stopping.

Run:  python benchmarks/mixture.py          (under a minute on a 2-core CPU)

Timings (one torch thread) are medians of repeats (a single run for the slow per-example loop) from torch.utils.benchmark.Timer, measured in the
same run; ratio = baseline time / batched time (> 1: the batched implementation is faster).
"""

from __future__ import annotations

import math
import platform

import numpy as np
import torch
from torch.utils.benchmark import Timer

from attnopt.mixture import region_labels, weighted_em
from attnopt.value_functions import grid_locations

torch.manual_seed(0)
torch.set_num_threads(1)  # small batched linear algebra; threads only add contention on a shared CPU
DT = torch.float32
B, N_ITER = 64, 50


def em_component_loop(points, weights, means, covs, mixing, n_iter, cov_floor=1e-6):
    """Weighted EM with a Python loop over the K components (batched over examples only)."""
    k_comp = means.shape[-2]
    d = points.shape[-1]
    eye = torch.eye(d, dtype=points.dtype)
    means = [means[:, k] for k in range(k_comp)]
    covs = [covs[:, k] for k in range(k_comp)]
    mixing = [mixing[:, k] for k in range(k_comp)]
    total = weights.sum(-1)
    for _ in range(n_iter):
        # E-step, one component at a time
        logs = []
        for k in range(k_comp):
            chol = torch.linalg.cholesky(covs[k])  # (B, D, D)
            diff = points.unsqueeze(0) - means[k].unsqueeze(1)  # (B, N, D)
            z = torch.linalg.solve_triangular(chol, diff.transpose(-1, -2), upper=False)
            logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
            logs.append(torch.log(mixing[k])[:, None] - 0.5 * (z * z).sum(-2) - 0.5 * logdet[:, None] - 0.5 * d * math.log(2 * math.pi))
        log_norm = torch.logsumexp(torch.stack(logs, -1), -1)
        # M-step, one component at a time
        for k in range(k_comp):
            rw = weights * torch.exp(logs[k] - log_norm)  # (B, N)
            nk = rw.sum(-1) + 10 * torch.finfo(points.dtype).eps * total
            means[k] = (rw @ points) / nk[:, None]
            diff = points.unsqueeze(0) - means[k].unsqueeze(1)
            covs[k] = torch.einsum("bn,bnd,bne->bde", rw, diff, diff) / nk[:, None, None] + cov_floor * eye
            mixing[k] = nk / total
    return torch.stack(means, 1), torch.stack(covs, 1), torch.stack(mixing, 1)


def _region_init(points, weights, k):
    """Moment matching within the regions of attnopt.mixture.region_labels (mixing = region mass)."""
    lab = region_labels(points, k)  # (N, K)
    rw = weights.unsqueeze(-1) * lab  # (B, N, K)
    nk = rw.sum(-2)
    means = torch.einsum("bnk,nd->bkd", rw, points) / nk[..., None]
    diff = points - means.unsqueeze(-2)  # (B, K, N, D)
    covs = torch.einsum("bnk,bknd,bkne->bkde", rw, diff, diff) / nk[..., None, None] + 1e-6 * torch.eye(2, dtype=points.dtype)
    return means, covs, nk / nk.sum(-1, keepdim=True)


def em_example_loop(points, weights, init, k, n_iter):
    outs = [weighted_em(points, weights[i], k, n_iter=n_iter, init={key: v[i] for key, v in init.items()}, tol=None) for i in range(weights.shape[0])]
    return torch.stack([o.means for o in outs]), torch.stack([o.covariances for o in outs]), torch.stack([o.mixing for o in outs])


def median_seconds(stmt, env, repeats=None):
    timer = Timer(stmt=stmt, globals=env, num_threads=1)
    if repeats:  # slow baselines: a few single runs
        return float(np.median([timer.timeit(1).median for _ in range(repeats)]))
    return timer.blocked_autorange(min_run_time=0.3).median


def fmt(t):
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def main():
    points = grid_locations(14, dtype=DT)
    weights = torch.softmax(3 * torch.randn(B, 196, dtype=DT), -1)
    rows = [
        f"| K | batched `weighted_em` | per-component loop | ratio | per-example loop | ratio | max abs diff (comp. / ex.) |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in (2, 5):
        # the same start for all three: the thesis's region initialization (halves/strips)
        m0, c0, p0 = _region_init(points, weights, k)
        init = {"means": m0, "covariances": c0, "mixing": p0}
        env = dict(weighted_em=weighted_em, em_component_loop=em_component_loop, em_example_loop=em_example_loop,
                   points=points, weights=weights, init=init, k=k, n=N_ITER, m0=m0, c0=c0, p0=p0)
        ours = weighted_em(points, weights, k, n_iter=N_ITER, init=init, tol=None)
        cm, _, _ = em_component_loop(points, weights, m0, c0, p0, N_ITER)
        em_, _, _ = em_example_loop(points, weights, init, k, N_ITER)
        diff_c = (cm - ours.means).abs().max().item()
        diff_e = (em_ - ours.means).abs().max().item()
        t_b = median_seconds("weighted_em(points, weights, k, n_iter=n, init=init, tol=None)", env)
        t_c = median_seconds("em_component_loop(points, weights, m0, c0, p0, n)", env)
        t_e = median_seconds("em_example_loop(points, weights, init, k, n)", env, repeats=1)
        rows.append(f"| {k} | {fmt(t_b)} | {fmt(t_c)} | {t_c / t_b:.2f} | {fmt(t_e)} | {t_e / t_b:.1f} | {diff_c:.1e} / {diff_e:.1e} |")
    print(f"weighted EM, {B} examples x 196 points (14x14 grid, D=2), {N_ITER} iterations, float32, "
          f"torch {torch.__version__}, {platform.machine()}, 1 thread\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
