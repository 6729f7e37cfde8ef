r"""The engine of :func:`attnopt.kernels.regularity.wasserstein1`: exact optimal transport with the l1 ground cost.

In one dimension :math:`\mathbb W_1(\mu,\nu)=\int|F_\mu-F_\nu|` is evaluated in closed form, batched
and differentiable (:func:`wasserstein1_1d`).  Otherwise the linear program is solved exactly per
pair of measures on the CPU in float64, by POT's network simplex, SciPy's HiGHS, or the built-in
successive-shortest-path solver (:func:`exact_plan`), and the value is rebuilt in torch from the
plan and the dual potentials, so that its gradients are the envelope-theorem ones
(:func:`lp_distance`).

References:
    Santambrogio (2015), *Optimal Transport for Applied Mathematicians*, eq. (6.2) and Prop. 2.17
    (the one-dimensional closed form).  Peyré and Cuturi (2019), *Computational Optimal Transport*,
    Secs. 3.1 (the linear program and its dual), 3.5 (the network simplex) and 3.6 (dual ascent,
    of which successive shortest paths is one).
"""

from __future__ import annotations

import numpy as np
import torch


def successive_shortest_paths(a: np.ndarray, b: np.ndarray, cost: np.ndarray):
    """Exact transport by successive shortest paths (dense Dijkstra on reduced costs).

    Returns the plan and dual potentials ``(f, g)`` with ``f_i + g_j <= C_ij``.  Pure NumPy; each
    Dijkstra is O((n+m)^2) with vectorised relaxations, so this is for moderate sizes.
    """
    n, m = cost.shape
    plan = np.zeros((n, m))
    excess, deficit = a.copy(), b.copy()
    ps, pt = np.zeros(n), np.zeros(m)  # reduced cost of i -> j is C_ij + ps_i - pt_j >= 0
    tol = 1e-14
    while excess.max() > tol and deficit.max() > tol:
        rc = cost + ps[:, None] - pt[None, :]
        ds = np.where(excess > tol, 0.0, np.inf)
        dt = np.full(m, np.inf)
        pred_t = np.full(m, -1)
        pred_s = np.full(n, -1)
        done_s = np.zeros(n, bool)
        done_t = np.zeros(m, bool)
        sink, dist = -1, np.inf
        while True:
            cs = np.where(done_s, np.inf, ds)
            ct = np.where(done_t, np.inf, dt)
            i, j = int(cs.argmin()), int(ct.argmin())
            if cs[i] == np.inf and ct[j] == np.inf:
                break
            if cs[i] <= ct[j]:
                done_s[i] = True
                cand = ds[i] + np.maximum(rc[i], 0.0)
                upd = (cand < dt) & ~done_t
                dt[upd] = cand[upd]
                pred_t[upd] = i
            else:
                done_t[j] = True
                if deficit[j] > tol:
                    sink, dist = j, dt[j]
                    break
                cand = dt[j] + np.maximum(-rc[:, j], 0.0)
                upd = (plan[:, j] > 0) & (cand < ds) & ~done_s
                ds[upd] = cand[upd]
                pred_s[upd] = j
        if sink < 0:
            break
        ps += np.where(done_s, np.minimum(ds, dist), dist)
        pt += np.where(done_t, np.minimum(dt, dist), dist)
        # Trace the path back from the sink, find the bottleneck, augment.
        path = []  # (i, j, forward?)
        j = sink
        while True:
            i = pred_t[j]
            path.append((i, j, True))
            if pred_s[i] < 0:
                root = i
                break
            j = pred_s[i]
            path.append((i, j, False))
        delta = min(excess[root], deficit[sink], min((plan[i, j] for i, j, fw in path if not fw), default=np.inf))
        for i, j, fw in path:
            plan[i, j] = plan[i, j] + delta if fw else max(plan[i, j] - delta, 0.0)
        excess[root] = 0.0 if excess[root] <= delta else excess[root] - delta
        deficit[sink] = 0.0 if deficit[sink] <= delta else deficit[sink] - delta
    return plan, -ps, pt


def l1_cost(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise l1 distances ``(..., N, M)`` (direct differences: ``torch.cdist(p=1)`` is slow on CPU)."""
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1)


def exact_plan(a: np.ndarray, b: np.ndarray, cost: np.ndarray, method: str):
    """Optimal plan and dual potentials for one pair, by the chosen exact solver."""
    a = a / a.sum()
    b = b / b.sum()
    n, m = cost.shape
    ia, jb = np.flatnonzero(a > 0), np.flatnonzero(b > 0)
    c = cost[np.ix_(ia, jb)]
    ar, br = a[ia] / a[ia].sum(), b[jb] / b[jb].sum()
    if method == "emd":
        import ot

        plan_r, log = ot.emd(ar, br, c, numItermax=max(100_000, 50 * c.size), log=True)
        if log.get("result_code", 1) != 1:
            raise RuntimeError(f"POT's network simplex did not converge: {log.get('warning')}")
        g = np.asarray(log["v"])
    elif method == "linprog":
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        nr, mr = c.shape
        rows = np.concatenate([np.repeat(np.arange(nr), mr), nr + np.tile(np.arange(mr), nr)])
        cols = np.concatenate([np.arange(nr * mr), np.arange(nr * mr)])
        a_eq = coo_matrix((np.ones(2 * nr * mr), (rows, cols)), shape=(nr + mr, nr * mr)).tocsr()
        res = linprog(c.ravel(), A_eq=a_eq, b_eq=np.concatenate([ar, br]), bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"linprog failed: {res.message}")
        plan_r = res.x.reshape(nr, mr)
        g = res.eqlin.marginals[nr:]
    elif method == "ssp":
        plan_r, _, g = successive_shortest_paths(ar, br, c)
    else:  # pragma: no cover - guarded by the caller
        raise ValueError(method)
    # Canonical dual potentials on all atoms (c-transforms), so that zero-mass atoms get the
    # tightest admissible value: f_i = min_j C_ij - g_j, g_j = min_i C_ij - f_i.
    g_full = np.full(m, 0.0)
    g_full[jb] = g
    f_full = (cost[:, jb] - g[None, :]).min(axis=1)
    g_full = (cost - f_full[:, None]).min(axis=0)
    plan = np.zeros((n, m))
    plan[np.ix_(ia, jb)] = plan_r
    return plan, f_full, g_full


def default_lp_method() -> str:
    try:
        import ot  # noqa: F401

        return "emd"
    except ImportError:
        pass
    try:
        import scipy.optimize  # noqa: F401

        return "linprog"
    except ImportError:
        return "ssp"


def wasserstein1_1d(mu, nu) -> torch.Tensor:
    r"""Closed form :math:`\int|F_\mu-F_\nu|` on the line, batched and differentiable."""
    batch = torch.broadcast_shapes(mu.batch_shape, nu.batch_shape)
    x = mu.points[..., 0].expand(*batch, mu.n_atoms)
    y = nu.points[..., 0].expand(*batch, nu.n_atoms)
    a = mu.weights.expand(*batch, mu.n_atoms)
    b = nu.weights.expand(*batch, nu.n_atoms)
    z = torch.cat([x, y], dim=-1)
    w = torch.cat([a, -b], dim=-1)
    z_sorted, order = torch.sort(z, dim=-1)
    cdf_gap = torch.cumsum(torch.gather(w, -1, order), dim=-1)[..., :-1]
    return (cdf_gap.abs() * torch.diff(z_sorted, dim=-1)).sum(-1)


def lp_distance(x, y, a, b, method: str):
    r"""Exact W1 between ``(x, a)`` and ``(y, b)``, flat batches ``(B, N, d)``, ``(B, M, d)``, ``(B, N)``, ``(B, M)``.

    Returns the ``(B,)`` values and the ``(B, N, M)`` plans.  The value is
    :math:`\sum_{ij}\gamma^\star_{ij}C_{ij}` in torch, plus :math:`\langle f,a-a\rangle+\langle g,b-b\rangle`
    terms (zero in value) that give the weights their envelope-theorem gradients.
    """
    cost = l1_cost(x, y)
    if cost.device.type == "meta" or cost.shape[0] == 0:  # no values, or no pair: nothing to solve
        plan = torch.zeros_like(cost)
        return (plan * cost).sum((-2, -1)), plan
    c_np = cost.detach().to("cpu", torch.float64).numpy()
    a_np = a.detach().to("cpu", torch.float64).numpy()
    b_np = b.detach().to("cpu", torch.float64).numpy()
    plans, fs, gs = [], [], []
    for t in range(c_np.shape[0]):  # one exact LP per pair (solver iterations, not a hot path)
        plan, f, g = exact_plan(a_np[t], b_np[t], c_np[t], method)
        plans.append(plan)
        fs.append(f)
        gs.append(g)
    like = dict(dtype=cost.dtype, device=cost.device)
    plan = torch.as_tensor(np.stack(plans), **like)
    value = (plan * cost).sum((-2, -1))
    if a.requires_grad or b.requires_grad:
        f = torch.as_tensor(np.stack(fs), **like)
        g = torch.as_tensor(np.stack(gs), **like)
        value = value + (f * (a - a.detach())).sum(-1) + (g * (b - b.detach())).sum(-1)
    return value, plan
