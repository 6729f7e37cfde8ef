r"""Attention as the approximate solution of a Fenchel dual (the Fenchel-dual paper).

The Fenchel-dual paper estimates the mean :math:`h` of an unknown distribution :math:`p` over
templates :math:`t_1,\dots,t_n\in\mathbb{R}^d` from a *preference* :math:`u\in\Delta^{n-1}` (with
mean :math:`\mu=\sum_i u_i t_i`) and a noisy *evidence* :math:`z` of the shift :math:`h-\mu`.  With
:math:`b=\mu+z` it solves, eq. (4),

.. math::

    \min_{p}\; \frac{\alpha}{2}\Big\lVert b-\sum_i p_i t_i\Big\rVert^2 + \operatorname{KL}(p\,\Vert\,u),

through its Fenchel dual, eqs. (9)–(10),

.. math::

    \max_{\lambda\in\mathbb{R}^d}\; D(\lambda)=\langle\lambda,b\rangle-\frac{1}{2\alpha}\lVert\lambda\rVert^2
    -\log\sum_i u_i e^{\langle t_i,\lambda\rangle},

whose maximizer :math:`\lambda^*` gives the primal solution :math:`\tilde p_i\propto u_i
e^{\langle t_i,\lambda^*\rangle}` (eq. 11) and the estimate :math:`\hat h=\sum_i\tilde p_i t_i`
(eq. 12).  Replacing :math:`\lambda^*` by :math:`\alpha z` (eq. 16), exact to first order in
:math:`\alpha`, gives the *generalized attention* of eq. (18); dot-product attention, boolean masks
and T5's relative-position bias are choices of :math:`u` (eqs. 19–20).

**Solving the dual in the span of the templates.**  Setting :math:`\nabla D=0` gives
:math:`\lambda^*=\alpha b-\alpha\,T^\top p(\lambda^*)=\alpha z+\alpha T^\top(u-p(\lambda^*))`, where
:math:`T\in\mathbb{R}^{n\times d}` stacks the templates and
:math:`p(\lambda)=\operatorname{softmax}(\log u+T\lambda)`: the exact maximizer is the paper's
approximation :math:`\alpha z` (eq. 16) plus a correction in the row space of :math:`T`.  Writing
:math:`\lambda=\alpha b+T^\top c`, the problem becomes :math:`n`-dimensional and needs only the Gram
matrix :math:`G=TT^\top`: the scores are :math:`T\lambda=\alpha Tb+Gc`, the gradient is
:math:`\nabla D=-T^\top r` with :math:`r=c/\alpha+p`, and the Newton step
:math:`\Delta\lambda=T^\top\Delta c` solves :math:`(I_n+\alpha SG)\,\Delta c=-\alpha r`,
:math:`S=\operatorname{diag}(p)-pp^\top`, instead of the :math:`d\times d` system
:math:`(I_d/\alpha+T^\top ST)\Delta\lambda=\nabla D`.  :func:`solve_dual` solves it through the
symmetric system :math:`M=I_n+\alpha A^\top GA` (:math:`S=AA^\top`, eigenvalues of :math:`M` at least 1,
so its Cholesky factorization cannot fail), globalized by a backtracking (Armijo) line search on
:math:`\lVert\nabla D\rVert^2`, batched over any leading dimensions; on the CPU a few steepest-ascent
steps (one product with :math:`G` each) first bring the iterate close.  With more templates than
dimensions, or for the OT dual below, it uses a reduced QR factorization :math:`T^\top=Q_TR` instead
and iterates on :math:`v` in :math:`\lambda=\alpha b+Q_Tv` with :math:`\min(n,d)`-dimensional systems
:math:`(I/\alpha+RSR^\top)\,\Delta v=-(v/\alpha+Rp)`.

The entropic optimal-transport variant of Sec. 9 (eqs. 23–25, 36–41) has the same structure, with
:math:`\log\sum_i u_i e^{s_i}` replaced by :math:`\gamma\sum_j u_j\log\sum_i e^{(s_i-M_{ij})/\gamma}`;
:func:`solve_ot_dual` uses the QR form of the solver.

**Shape convention.**  ``templates`` is ``(..., n, d)``.  A first argument (``z``, ``b`` or
``lam``) with as many dimensions as ``templates`` is a stack of queries ``(..., n_q, d)`` that share
the templates; with any other number of dimensions it is one vector ``(..., d)`` per template set,
its leading dimensions broadcast against those of ``templates``.  Preferences ``u`` broadcast (by
PyTorch's right-aligned rule) against the weights, ``(..., n)`` or ``(..., n_q, n)``; a preference
per template set in the query layout is therefore written ``(..., 1, n)``.  ``u=None`` is the
uniform preference.  Zeros in ``u`` remove the corresponding templates (the KL term forbids any
mass there); no gradient flows to those zero entries.  The hyper-parameters :math:`\alpha` and
:math:`\gamma` are numbers (a one-element tensor is read as a number): no gradient flows to them.
"""

from __future__ import annotations

import math

import torch

from ._validation import (
    all_finite,
    as_float_tensor,
    broadcast_shapes,
    check_bool_mask,
    check_choice,
    check_finite,
    check_no_overflow,
    check_int,
    check_positive,
    check_probability_vector,
    check_psd,
    check_same_device,
    check_same_dtype,
    check_shape_match,
    require,
)

__all__ = [
    "dual_objective",
    "exact_estimate",
    "gaussian_dual_maximizer",
    "gaussian_estimate",
    "generalized_attention",
    "ot_attention",
    "ot_dual_objective",
    "ot_exact_estimate",
    "relative_deviation",
    "solve_dual",
    "solve_ot_dual",
    "t5_preference",
    "true_preference",
]

# Line search: candidate steps 1, rho, rho^2, ...; Armijo constant on the merit ||grad D||^2.
_LS_RHO = 0.5
_LS_STEPS = 16
_LS_SIGMA = 1e-4
# Warm start of the Gram-space Newton solver: at most this many steepest-ascent steps, stopped once most
# problems' squared gradient falls by less than _CAUCHY_RATE per step.  Used on the CPU for n >= 16
# templates only: measured by benchmarks/dual_solver.py, it costs more than it saves below that (a
# Newton step's small factorization is cheap) and on a GPU (its steps are launch- and sync-bound).
_CAUCHY_STEPS = 12
_CAUCHY_RATE = 0.25
_CAUCHY_MIN_N = 16
_METHODS = ("auto", "gram", "span", "dense")


# ----------------------------------------------------------------------------------------------
# argument parsing and layout helpers (the checks themselves are those of attnopt._validation)
# ----------------------------------------------------------------------------------------------


def _templates(templates) -> torch.Tensor:
    t = as_float_tensor(templates, "templates", min_ndim=2)
    if t.shape[-2] == 0:
        raise ValueError(
            "templates must hold at least one template (shape (..., n, d) with n >= 1): with no templates "
            "there is no preference u in the simplex, and problem (4) has no solution"
        )
    check_finite(t, "templates")
    return t


def _vector(x, name: str, templates: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Validate ``x`` (``(..., d)`` or ``(..., n_q, d)``) and return it with a query axis."""
    x = as_float_tensor(x, name, min_ndim=1, like=templates)
    check_same_dtype(x, name, templates, "templates")
    check_same_device(x, name, templates, "templates")
    check_shape_match(x, name, templates, "templates", [(-1, -1)])
    single = x.ndim != templates.ndim
    xq = x.unsqueeze(-2) if single else x
    broadcast_shapes(**{f"{name}'s batch dimensions": xq.shape[:-2], "templates' batch dimensions": templates.shape[:-2]})
    check_finite(x, name)
    return xq, single


def _preference(u, templates: torch.Tensor, single: bool, name: str = "u") -> torch.Tensor | None:
    """Validate a preference and return it in the query layout ``(..., n_q or 1, n)``."""
    if u is None:
        return None
    u = as_float_tensor(u, name, min_ndim=1, like=templates)
    check_same_dtype(u, name, templates, "templates")
    check_same_device(u, name, templates, "templates")
    n = templates.shape[-2]
    if u.shape[-1] != n:
        raise ValueError(f"{name} must have one entry per template: {name}.shape[-1]={u.shape[-1]} but n={n}")
    check_finite(u, name)
    check_probability_vector(u, name)
    return u.unsqueeze(-2) if single else u


def _log_pref(u: torch.Tensor) -> torch.Tensor:
    """``log u`` with ``log 0 = -inf`` and no NaN gradient at the zeros."""
    pos = u > 0
    safe = torch.where(pos, u, torch.ones_like(u))
    return torch.where(pos, torch.log(safe), torch.full_like(u, float("-inf")))


def _scores(x: torch.Tensor, T: torch.Tensor, alpha: float | None, x_name: str) -> torch.Tensor:
    r"""The scores :math:`\alpha\langle x,t_i\rangle` (``alpha=None``: :math:`\langle x,t_i\rangle`), ``(..., n_q, n)``.

    :math:`\alpha<1` shrinks both factors by :math:`\sqrt\alpha` before the product (as PyTorch's
    reference SDPA does; :math:`\alpha` itself may be below the smallest float32); :math:`\alpha>1`
    multiplies the product, which is then smaller than the result, so no intermediate overflows.
    Scores beyond the dtype's range have no representation (the weights would be NaN):
    ``ValueError``, through :func:`require` (no host read off the CPU).
    """
    if alpha is None or alpha == 1.0:
        s = x @ T.mT
    elif alpha < 1.0:
        root = math.sqrt(alpha)
        s = (root * x) @ (root * T).mT
    else:
        s = alpha * (x @ T.mT)
    what, args = (f"<{x_name}, t_i>", f"{x_name} or templates") if alpha is None else \
        (f"alpha * <{x_name}, t_i>", f"{x_name}, templates or alpha")
    check_no_overflow(s, f"the scores {what}", args)
    return s


def _cost(cost, n: int, ref: torch.Tensor, ref_name: str) -> torch.Tensor:
    """Validate a cost matrix ``(..., n, n)``, finite or ``+inf``, in the dtype and on the device of ``ref``."""
    if cost is None:
        raise ValueError("cost is required: a (..., N, N) matrix M(t_i, t_j)")
    m = as_float_tensor(cost, "cost", min_ndim=2, like=ref)
    check_same_dtype(m, "cost", ref, ref_name)
    check_same_device(m, "cost", ref, ref_name)
    if m.shape[-1] != n or m.shape[-2] != n:
        raise ValueError(f"cost must be (..., n, n) with n={n} templates; got shape {tuple(m.shape)}")
    # NaN > -inf is False: one reduction refuses NaN and -inf
    require((m > float("-inf")).all(), "cost contains NaN or -inf; costs must be finite or +inf")
    require(
        (m < float("inf")).any(dim=-2).all(),
        "cost has a column that is +inf everywhere; each template must reach some template",
    )
    return m


# ----------------------------------------------------------------------------------------------
# the two log-partition families: KL (eqs. 9-11) and entropic OT (eqs. 36-39)
# ----------------------------------------------------------------------------------------------


def _mv(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Batched row-vector times matrix: ``x (..., a)``, ``m (..., a, b)`` -> ``(..., b)``."""
    return (x.unsqueeze(-2) @ m).squeeze(-2)


class _KL:
    r""":math:`\phi(s)=\log\sum_i u_i e^{s_i}`, :math:`\nabla\phi=p`, :math:`\nabla^2\phi=\operatorname{diag}p-pp^\top`.

    ``u`` is ``None`` (uniform) or laid out like the scores, ``(..., n_q or 1, n)`` or, once
    flattened for the solver, ``(B, n)``.
    """

    def __init__(self, u: torch.Tensor | None):
        self.u = u
        self.logu = None if u is None else _log_pref(u)

    def batch_shape(self) -> tuple[int, ...]:
        return () if self.u is None else tuple(self.u.shape[:-1])

    def flatten(self, batch: tuple[int, ...]) -> "_KL":
        if self.u is None:
            return self
        return _KL(self.u.expand(batch + self.u.shape[-1:]).reshape(-1, self.u.shape[-1]))

    def take(self, idx: torch.Tensor) -> "_KL":
        return self if self.u is None else _KL(self.u[idx])

    def detached(self) -> "_KL":
        return self if self.u is None else _KL(self.u.detach())

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return () if self.u is None else (self.u,)

    def probs(self, s: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s if self.logu is None else s + self.logu, dim=-1)

    def hess(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.probs(s)
        return p, torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)

    def rsr(self, s: torch.Tensor, p: torch.Tensor, Rp: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
        """``R S R^T`` for per-problem ``R (B, k, n)``, from ``p`` and ``R p`` without forming ``S``."""
        return torch.baddbmm(Rp.unsqueeze(-1) * Rp.unsqueeze(-2), R * p.unsqueeze(-2), R.mT, beta=-1.0)

    def value(self, s: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(s if self.logu is None else s + self.logu, dim=-1)

    def prior(self, like: torch.Tensor) -> torch.Tensor:
        if self.u is not None:
            return self.u
        n = like.shape[-1]
        return torch.full((1, n), 1.0 / n, dtype=like.dtype, device=like.device)


class _OT:
    r""":math:`\phi(s)=\gamma\sum_j u_j\log\sum_i e^{(s_i-M_{ij})/\gamma}` (eq. 36 without the constant).

    ``u`` is ``(..., n_q or 1, n)`` and ``cost`` ``(..., 1, n, n)`` (the query axis inserted), or
    ``(B, n)`` and ``(B, n, n)`` once flattened; ``cost[..., i, j] = M(t_i, t_j)``.
    """

    def __init__(self, u: torch.Tensor | None, cost: torch.Tensor, gamma: float):
        n = cost.shape[-1]
        self.u = u if u is not None else torch.full((1, n), 1.0 / n, dtype=cost.dtype, device=cost.device)
        self.cost = cost
        self.gamma = gamma
        # the divisor of the shifted scores (<= 0): gamma, or the dtype's smallest normal number when gamma
        # would round to 0 in it (0 / 0 = NaN at the maximum); the weights are then the gamma -> 0 limit
        self.div = max(gamma, torch.finfo(cost.dtype).tiny)

    def batch_shape(self) -> tuple[int, ...]:
        return tuple(torch.broadcast_shapes(self.u.shape[:-1], self.cost.shape[:-2]))

    def flatten(self, batch: tuple[int, ...]) -> "_OT":
        n = self.cost.shape[-1]
        u = self.u.expand(batch + (n,)).reshape(-1, n)
        return _OT(u, self.cost.expand(batch + (n, n)).reshape(-1, n, n), self.gamma)

    def take(self, idx: torch.Tensor) -> "_OT":
        return _OT(self.u[idx], self.cost[idx], self.gamma)

    def detached(self) -> "_OT":
        return _OT(self.u.detach(), self.cost.detach(), self.gamma)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.u, self.cost)

    def _shifted(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x[..., i, j] = s_i - M_ij`` less its column maximum ``top[..., j]`` (finite: some ``M_ij`` is).

        The shift comes *before* the division by gamma, which a small gamma would overflow; it is
        detached, since the softmax and log-sum-exp over ``i`` do not depend on it.
        """
        x = s.unsqueeze(-1) - self.cost
        top = x.detach().amax(dim=-2, keepdim=True)
        return x - top, top.squeeze(-2)

    def _plan_cols(self, s: torch.Tensor) -> torch.Tensor:
        # [..., i, j] = softmax over i of (s_i - M_ij) / gamma: column j of the optimal plan / u_j
        return torch.softmax(self._shifted(s)[0] / self.div, dim=-2)

    def probs(self, s: torch.Tensor) -> torch.Tensor:
        return (self._plan_cols(s) * self.u.unsqueeze(-2)).sum(-1)

    def hess(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self._plan_cols(s)
        qu = q * self.u.unsqueeze(-2)
        p = qu.sum(-1)
        return p, (torch.diag_embed(p) - qu @ q.mT) / self.gamma

    def rsr(self, s: torch.Tensor, p: torch.Tensor, Rp: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
        """``R S R^T`` for per-problem ``R (B, k, n)``."""
        return R @ self.hess(s)[1] @ R.mT

    def value(self, s: torch.Tensor) -> torch.Tensor:
        x, top = self._shifted(s)
        lse = top + self.div * torch.logsumexp(x / self.div, dim=-2)  # gamma log sum_i e^{(s_i - M_ij)/gamma}
        lse = torch.where(self.u > 0, lse, torch.zeros_like(lse))
        entropy = -torch.special.xlogy(self.u, self.u).sum(-1)
        return self.gamma * entropy + (self.u * lse).sum(-1)

    def prior(self, like: torch.Tensor) -> torch.Tensor:
        return _true_pref(self.u, self.cost, self.gamma)


# ----------------------------------------------------------------------------------------------
# Newton solvers
# ----------------------------------------------------------------------------------------------


def _ot_family(u, cost, gamma, T: torch.Tensor, xq: torch.Tensor, single: bool, x_name: str) -> "_OT":
    """The checked preference, cost and gamma of the OT problem (24), as the solver's family."""
    gamma = check_positive(gamma, "gamma")
    uq = _preference(u, T, single)
    m = _cost(cost, T.shape[-2], T, "templates").unsqueeze(-3)
    shapes = {f"{x_name}'s batch dimensions": xq.shape[:-1], "templates' batch dimensions": T.shape[:-2] + (1,),
              "cost's batch dimensions": m.shape[:-2]}
    if uq is not None:
        shapes["u's batch dimensions"] = uq.shape[:-1]
    broadcast_shapes(**shapes)
    return _OT(uq, m, gamma)


def _select_step(merits: torch.Tensor, m0: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Largest candidate step meeting Armijo on the merit; else the candidate of least merit."""
    shape = (-1,) + (1,) * m0.ndim
    ok = merits <= (1.0 - 2.0 * _LS_SIGMA * steps.view(shape)) * m0
    first_ok = torch.argmax(ok.to(torch.int8), dim=0)
    best = torch.argmin(torch.nan_to_num(merits, nan=float("inf")), dim=0)
    idx = torch.where(ok.any(dim=0), first_ok, best)
    return steps[idx]


def _floor(bq: torch.Tensor, T: torch.Tensor, alpha: float) -> torch.Tensor:
    r"""Rounding floor of :math:`\lVert\nabla D\rVert` in this dtype: :math:`\varepsilon\,(\lVert b\rVert+
    \max_i\lVert t_i\rVert)(32+4\alpha\max_i\lVert t_i\rVert^2)`.

    The first term is the rounding of :math:`b-\lambda/\alpha-T^\top p` itself.  The second is that of
    the scores, whose entries reach about :math:`\alpha\max\lVert t\rVert(\lVert b\rVert+\max\lVert t
    \rVert)`: an error :math:`\varepsilon` times that moves :math:`T^\top p` by up to
    :math:`\max\lVert t\rVert` times as much, so no iterate can be reliably more stationary.  The floor
    matters in float32 and for large templates, not for float64 at unit scale.
    """
    finfo = torch.finfo(bq.dtype)
    t2 = (T * T).sum(-1).amax(dim=-1, keepdim=True)
    floor = finfo.eps * (bq.norm(dim=-1) + t2.sqrt()) * (32.0 + 4.0 * alpha * t2)
    # the solvers compare squared gradients with floor^2: beyond sqrt(max) no iterate can be certified
    require(
        (floor < finfo.max**0.5).all(),
        f"b, templates or alpha are too large for the dual solver in {bq.dtype}: the rounding floor of |grad D| "
        "overflows; pass float64 tensors or smaller b, templates or alpha",
    )
    return floor


def _armijo_step(x, s, dx, ds, m, trial):
    r"""Newton step on coefficients ``x`` and scores ``s``, halved where it fails Armijo on the merit.

    The merit is :math:`\lVert\nabla D\rVert^2`, for which the Newton direction is a descent
    direction, so a small enough step passes.  ``trial(idx, x, s)`` evaluates the problems ``idx``
    (``None``: all of them) at ``x`` and ``s`` and returns ``(p, ..., merit)``; the result is
    ``[x, s, p, ..., merit]`` after the step.  Only the failing problems are re-evaluated.
    """
    x1, s1 = x + dx, s + ds
    state = [x1, s1, *trial(None, x1, s1)]
    bad = (state[-1] > (1.0 - 2.0 * _LS_SIGMA) * m).nonzero().squeeze(-1)
    for j in range(1, _LS_STEPS):
        if not bad.numel():
            break
        t = _LS_RHO**j
        xf, sf = x[bad] + t * dx[bad], s[bad] + t * ds[bad]
        tried = (xf, sf, *trial(bad, xf, sf))
        keep = (tried[-1] <= (1.0 - 2.0 * _LS_SIGMA * t) * m[bad]) | (j == _LS_STEPS - 1)
        for dst, src in zip(state, tried):
            dst[bad[keep]] = src[keep]
        bad = bad[~keep]
    return state


def _newton_span(bq, T, fam, alpha, tol, max_iter, what):
    r"""Newton on :math:`v` in :math:`\lambda=\alpha b+Q_Tv`, :math:`T^\top=Q_TR` (reduced QR).

    :math:`Q_T` (``d x k``, :math:`k=\min(n,d)`) is an orthonormal basis of a space containing the
    templates' span; :math:`R^\top R=TT^\top` is the Gram matrix.  Scores are
    :math:`T\lambda=\alpha Tb+R^\top v`, the dual gradient is :math:`-Q_T(v/\alpha+Rp)` (so its
    norm is computed in :math:`k` dimensions, exactly), and the Newton system
    :math:`(I_k/\alpha+RSR^\top)\Delta v=-(v/\alpha+Rp)` is ``k x k`` symmetric positive definite.
    Problems are flattened to one batch axis; converged ones are dropped from later iterations.
    """
    Qb, R = torch.linalg.qr(T.mT)  # (..., d, k), (..., k, n)
    k, n = R.shape[-2], R.shape[-1]
    sb = _scores(bq, T, alpha, "b")
    # start from the paper's approximation lambda = alpha z = alpha b - alpha T^T u (eq. 16): v = -alpha R u
    v0 = -alpha * (fam.prior(sb) @ R.mT)
    batch = tuple(torch.broadcast_shapes(sb.shape[:-1], v0.shape[:-1], fam.batch_shape()))
    Rb = R.unsqueeze(-3).expand(batch + (k, n)).reshape(-1, k, n)
    v = v0.expand(batch + (k,)).reshape(-1, k).clone()
    th = (torch.clamp(_floor(bq, T, alpha), min=tol) ** 2).expand(batch).reshape(-1)
    fa = fam.flatten(batch)
    eye = torch.eye(k, dtype=v.dtype, device=v.device) / alpha
    # KL: R diag(p) R^T = p @ [r_i r_i^T]_i is one GEMM per template set while every problem is
    # still iterating; worth its memory when the template sets are shared by enough queries
    outer = None
    if isinstance(fam, _KL) and R.shape[:-2].numel() * n <= 4 * v.shape[0]:
        outer = (R.mT.unsqueeze(-1) * R.mT.unsqueeze(-2)).reshape(R.shape[:-2] + (n, k * k))
    # state of the problems still iterating (indices idx into the flat batch; None: all of them)
    idx, Ra, va = None, Rb, v

    def trial(sel, v, s):  # p, R p, g = v / alpha + R p = -Q^T grad D and the merit |g|^2
        f, R = (fa, Ra) if sel is None else (fa.take(sel), Ra[sel])
        p = f.probs(s)
        Rp = _mv(p, R.mT)
        g = v / alpha + Rp
        return p, Rp, g, (g * g).sum(-1)

    s = sb.expand(batch + (n,)).reshape(-1, n) + _mv(va, Ra)
    p, Rp, g, m = trial(None, va, s)
    for _ in range(max_iter + 1):
        act = m > th
        if not bool(act.all()):
            if not bool(act.any()):
                return alpha * bq + v.reshape(batch + (k,)) @ Qb.mT
            sel = act.nonzero().squeeze(-1)
            idx = sel if idx is None else idx[sel]
            Ra, va, fa, th, s, p, Rp, g, m = (Ra[sel], va[sel], fa.take(sel), th[sel], s[sel], p[sel], Rp[sel],
                                              g[sel], m[sel])
        if idx is None and outer is not None:
            H = torch.addcmul(eye, Rp.unsqueeze(-1), Rp.unsqueeze(-2), value=-1.0)
            H += (p.reshape(batch + (n,)) @ outer).reshape(-1, k, k)
        else:
            H = eye + fa.rsr(s, p, Rp, Ra)
        L, _ = torch.linalg.cholesky_ex(H)
        dv = -torch.cholesky_solve(g.unsqueeze(-1), L).squeeze(-1)
        va, s, p, Rp, g, m = _armijo_step(va, s, dv, _mv(dv, Ra), m, trial)
        v = va if idx is None else v.index_copy(0, idx, va)
    raise RuntimeError(
        f"{what} did not converge in {max_iter} Newton iterations: "
        f"max |grad| = {m.max().sqrt().item():.3g} > tol"
    )


def _newton_gram(bq, T, fam, alpha, tol, max_iter, what):
    r"""Newton on :math:`c` in :math:`\lambda=\alpha b+T^\top c`, for the KL family, from the Gram matrix.

    Only :math:`G=TT^\top` and :math:`Tb` are needed: the scores are :math:`s=\alpha Tb+Gc`, the
    gradient is :math:`\nabla D=-T^\top r` with :math:`r=c/\alpha+p` (so
    :math:`\lVert\nabla D\rVert^2=r^\top Gr`), and at the optimum :math:`c=-\alpha\tilde p`.  The
    Newton step :math:`\Delta\lambda=T^\top\Delta c` solves :math:`(I+\alpha SG)\Delta c=-\alpha r`.
    With :math:`S=\operatorname{diag}(p)-pp^\top=AA^\top`, :math:`A=(I-p\mathbf 1^\top)
    \operatorname{diag}(\sqrt p)`, the push-through identity gives

    .. math::

        \Delta c=-\alpha r+\alpha^2 A\,M^{-1}A^\top Gr,\qquad
        M=I+\alpha A^\top GA=I+\alpha\,\sqrt p\sqrt p^\top\odot(G-g\mathbf 1^\top-\mathbf 1g^\top+p^\top g),

    :math:`g=Gp`: :math:`M-I` is the Gram matrix of the :math:`p`-centred templates scaled by
    :math:`\sqrt{p_i p_j}`, so :math:`M` is symmetric with eigenvalues :math:`\ge1` — its Cholesky
    factorization never fails, even when :math:`G` is singular (repeated or more than :math:`d`
    templates) or :math:`p` has zeros (masked templates).  Unlike :func:`_newton_span` there is no
    QR factorization and no :math:`n\times n` product per iteration: building :math:`M` is elementwise.
    While every problem iterates, products with :math:`G` are one batched GEMM per template set.

    The iteration starts from the paper's :math:`\lambda=\alpha z` (eq. 16), :math:`c=-\alpha u`.  On
    the CPU with :math:`n\ge16` it first takes up to ``_CAUCHY_STEPS`` steepest-ascent steps
    :math:`\Delta c=-\omega r`, :math:`\omega=\lVert\nabla D\rVert^2/(\nabla D^\top H\nabla D)
    =r^\top Gr/(r^\top Gr/\alpha+\operatorname{Var}_p(Gr))`, the maximizer of the local quadratic model
    along the gradient: each costs one product with :math:`G`.
    """
    n = T.shape[-2]
    sb = _scores(bq, T, alpha, "b")
    u = fam.prior(sb)
    batch = tuple(torch.broadcast_shapes(sb.shape[:-1], u.shape[:-1], fam.batch_shape()))
    nq = batch[-1]  # the query axis: G does not vary along it
    Gx = (T @ T.mT).expand(batch[:-1] + (n, n)).reshape(-1, n, n)  # one Gram matrix per template set
    B = Gx.shape[0] * nq
    th = (torch.clamp(_floor(bq, T, alpha), min=tol) ** 2).expand(batch).reshape(-1)
    fa = fam.flatten(batch)
    sb = sb.expand(batch + (n,)).reshape(B, n)
    grp = None  # template set of each problem still iterating (None: all problems, in order)
    Ga = Gx  # (groups, n, n) while grp is None, else (problems, n, n)

    def gmv(x: torch.Tensor) -> torch.Tensor:  # G x for each problem (G is symmetric)
        return (x.reshape(-1, nq, n) @ Ga).reshape(-1, n) if grp is None else _mv(x, Ga)

    def trial(sel, c, s):  # p, r = c / alpha + p (grad D = -T^T r), G r and the merit r^T G r
        p = (fa if sel is None else fa.take(sel)).probs(s)
        r = c / alpha + p
        Gr = gmv(r) if sel is None else _mv(r, Gx[sel // nq] if grp is None else Ga[sel])
        return p, r, Gr, (r * Gr).sum(-1)

    c = -alpha * u.expand(batch + (n,)).reshape(B, n)  # lambda = alpha z
    s = sb + gmv(c)
    p, r, Gr, m = trial(None, c, s)
    # first-order phase: steepest ascent on D, each step of length set by the exact curvature of D
    # along the gradient, r^T G r / (r^T G r / alpha + Var_p(G r)).  A step costs one product with G,
    # a Newton step an n x n factorization, so these pay while they converge fast.  A step that would
    # raise the merit is undone; the phase ends once half the problems gain less than _CAUCHY_RATE
    # per step (converged problems count as slow)
    tiny = torch.finfo(m.dtype).tiny
    for _ in range(_CAUCHY_STEPS if c.device.type == "cpu" and n >= _CAUCHY_MIN_N else 0):
        q = p * Gr
        pGr = q.sum(-1)
        den = torch.addcmul((q * Gr).sum(-1), pGr, pGr, value=-1.0).add_(m, alpha=1.0 / alpha)
        om = (m / den.clamp_min(tiny)).unsqueeze(-1)
        c1, s1 = torch.addcmul(c, om, r, value=-1.0), torch.addcmul(s, om, Gr, value=-1.0)
        p1, r1, Gr1, m1 = trial(None, c1, s1)
        gain = m1 / m  # NaN where m = 0: neither up nor slow, and such a problem is not stepped
        up = gain >= 1.0
        if bool(up.any()):
            k = up.unsqueeze(-1)
            c1, s1, p1, r1, Gr1 = (torch.where(k, x, x1) for x, x1 in ((c, c1), (s, s1), (p, p1), (r, r1), (Gr, Gr1)))
            m1 = torch.where(up, m, m1)
        c, s, p, r, Gr, m = c1, s1, p1, r1, Gr1, m1
        if bool(2 * (gain > _CAUCHY_RATE).sum() >= B):
            break
    idx, ca = None, c
    sqa = alpha**0.5
    for _ in range(max_iter + 1):
        act = m > th
        if not bool(act.all()):
            if not bool(act.any()):
                return (c.reshape(batch + (n,)) @ T).add_(bq, alpha=alpha)
            sel = act.nonzero().squeeze(-1)
            if grp is None:
                grp = torch.arange(B, device=c.device) // nq
            idx = sel if idx is None else idx[sel]
            grp = grp[sel]
            Ga = Gx[grp]
            ca, fa, th, s, p, r, Gr, m = ca[sel], fa.take(sel), th[sel], s[sel], p[sel], r[sel], Gr[sel], m[sel]
        # M = I + (a a^T) * (G - h 1^T - 1 h^T), a = sqrt(alpha p), h = G p - (p^T G p) / 2: one buffer, in place
        g = gmv(p)
        h = g - 0.5 * (p * g).sum(-1, keepdim=True)
        a = sqa * p.sqrt()
        if grp is None:
            M = (Ga.unsqueeze(1) - h.view(-1, nq, n, 1)).view(-1, n, n)
        else:
            M = Ga - h.unsqueeze(-1)
        M -= h.unsqueeze(-2)
        M *= a.unsqueeze(-1)
        M *= a.unsqueeze(-2)
        M.diagonal(dim1=-2, dim2=-1).add_(1.0)
        L, _ = torch.linalg.cholesky_ex(M)
        # y = M^{-1} A^T G r (times sqrt(alpha)), by two triangular solves
        rhs = (a * (Gr - (p * Gr).sum(-1, keepdim=True))).unsqueeze(-1)
        y = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, rhs, upper=False), upper=True)
        ay = a * y.squeeze(-1)  # A y / sqrt(alpha) = sqrt(p) y - p sum(sqrt(p) y), with the sqrt(alpha)'s folded in a
        dc = (ay - p * ay.sum(-1, keepdim=True) - r).mul_(alpha)
        ca, s, p, r, Gr, m = _armijo_step(ca, s, dc, gmv(dc), m, trial)
        c = ca if idx is None else c.index_copy(0, idx, ca)
    raise RuntimeError(
        f"{what} did not converge in {max_iter} Newton iterations: "
        f"max |grad| = {m.max().sqrt().item():.3g} > tol"
    )


def _newton_dense(bq, T, fam, alpha, tol, max_iter, what):
    """Textbook Newton in ``lambda`` with ``d x d`` Cholesky solves (the reference for benchmarks)."""
    sb = _scores(bq, T, alpha, "b")
    steps = _LS_RHO ** torch.arange(_LS_STEPS, dtype=bq.dtype, device=bq.device)
    u0 = fam.prior(sb)
    lam = (alpha * (bq - u0 @ T)).expand(fam.probs(sb).shape[:-1] + bq.shape[-1:]).clone()
    thr = torch.clamp(_floor(bq, T, alpha), min=tol)
    d = T.shape[-1]
    eye = torch.eye(d, dtype=T.dtype, device=T.device)
    Tq = T.unsqueeze(-3)
    for _ in range(max_iter + 1):
        s = lam @ T.mT
        p, S = fam.hess(s)
        g = bq - lam / alpha - p @ T
        gnorm = g.norm(dim=-1)
        active = gnorm > thr
        if not bool(active.any()):
            return lam
        H = eye / alpha + Tq.mT @ S @ Tq
        L = torch.linalg.cholesky(H)
        dl = torch.cholesky_solve(g.unsqueeze(-1), L).squeeze(-1) * active.unsqueeze(-1)
        w = dl @ T.mT
        st = steps.view((-1,) + (1,) * lam.ndim)
        gk = bq - (lam + st * dl) / alpha - fam.probs(s + st * w) @ T
        t = _select_step((gk * gk).sum(-1), gnorm**2, steps)
        lam = lam + t.unsqueeze(-1) * dl
    raise RuntimeError(
        f"{what} did not converge in {max_iter} Newton iterations: max |grad| = {gnorm.max().item():.3g} > tol"
    )


def _implicit(lam, bq, T, fam, alpha):
    r"""Attach :math:`d\lambda^*=(I/\alpha+T^\top ST)^{-1}\,\partial_\theta\nabla D\,d\theta` to ``lam``.

    ``lam`` is the detached maximizer; the value returned equals it exactly, and its gradient with
    respect to ``bq``, ``T`` and the family's tensors is the implicit-function-theorem one.  With
    :math:`T^\top=Q_TR`, :math:`(I/\alpha+T^\top ST)^{-1}=\alpha(I-Q_TQ_T^\top)+Q_T(I/\alpha+RSR^\top)^{-1}Q_T^\top`.
    """
    g = bq - lam / alpha - fam.probs(lam @ T.mT) @ T  # ~0 in value, carries the graph
    with torch.no_grad():
        Td = T.detach()
        Qb, R = torch.linalg.qr(Td.mT)
        _, S = fam.detached().hess(lam @ Td.mT)
        Rq = R.unsqueeze(-3)
        eye = torch.eye(R.shape[-2], dtype=R.dtype, device=R.device) / alpha
        H = eye + Rq @ S @ Rq.mT
    a = g @ Qb
    inner = torch.linalg.solve(H, a.unsqueeze(-1)).squeeze(-1)
    w = alpha * (g - a @ Qb.mT) + inner @ Qb.mT
    return lam + (w - w.detach())


def _solve(bq, T, fam, alpha, tol, max_iter, method, what):
    check_choice(method, "method", _METHODS)
    if method == "gram" and not isinstance(fam, _KL):
        raise ValueError("method='gram' is for the KL dual (9) only; use 'auto', 'span' or 'dense'")
    if method == "auto":  # Gram-space Newton unless the QR basis is smaller (more templates than dimensions)
        method = "gram" if isinstance(fam, _KL) and T.shape[-2] <= T.shape[-1] else "span"
    solvers = {"gram": _newton_gram, "span": _newton_span, "dense": _newton_dense}
    batch = torch.broadcast_shapes(bq.shape[:-1], T.shape[:-2] + (1,), fam.batch_shape())
    with torch.no_grad():
        bd, Td, fd = bq.detach(), T.detach(), fam.detached()
        if T.device.type == "meta" or batch.numel() * T.shape[-1] == 0:
            # no values to iterate on (meta tensors) or no problem to solve (an empty batch, d = 0):
            # the starting point alpha z of eq. (16) has the result's shape, dtype and device
            sb = bd @ Td.mT
            lam = (alpha * (bd - fd.prior(sb) @ Td)).expand(batch + bq.shape[-1:])
        else:
            lam = solvers[method](bd, Td, fd, alpha, tol, max_iter, what)
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (bq, T) + fam.tensors())
    return _implicit(lam, bq, T, fam, alpha) if needs_grad else lam


# ----------------------------------------------------------------------------------------------
# public API: KL problem
# ----------------------------------------------------------------------------------------------


def generalized_attention(z, templates, u=None, alpha=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Generalized attention, eq. (18) of the Fenchel-dual paper.

    .. math::

        \hat h=\sum_{i=1}^n p_i t_i,\qquad
        p_i=\frac{u_i\,e^{\alpha\langle t_i,z\rangle}}{\sum_j u_j\,e^{\alpha\langle t_j,z\rangle}}
        =\operatorname{softmax}_i\big(\log u_i+\alpha\langle t_i,z\rangle\big),

    the estimate of eq. (12) with :math:`\lambda^*` replaced by its small-:math:`\alpha`
    approximation :math:`\alpha z` (eq. 16).

    **Mapping to scaled dot-product attention.**  PyTorch's
    ``scaled_dot_product_attention(q, k, v, attn_mask=B, scale=sigma)`` computes
    :math:`\operatorname{softmax}(\sigma\,qk^\top+B)\,v` (``sigma`` defaults to :math:`1/\sqrt d`).
    With ``z = q``, ``templates = k``, ``alpha = sigma`` and

    * ``u = None`` (uniform :math:`u_i=1/n`, eq. 18 with the constant :math:`\log(1/n)` cancelling):
      ``weights`` equals the SDPA weights without a mask;
    * ``u`` uniform on the keys a boolean mask allows and ``0`` elsewhere: SDPA with that mask;
    * ``u = t5_preference(B, mask)`` (:math:`u\propto e^{B}` on the allowed keys, eq. 19):
      SDPA with the additive float mask ``B`` (``-inf`` where masked), i.e. eq. (20);

    then ``weights @ v`` is SDPA's output, and ``h`` is SDPA's output with ``v = k``.  Only the
    product :math:`\alpha\langle t_i,z\rangle` enters the weights, so ``(z=sigma*q, alpha=1)`` gives
    the same weights; the paper's BERT reading (Sec. 8) takes :math:`\alpha=1`,
    :math:`t_i=x_i/\sqrt{d'}`, :math:`z=K^\top Qx_k`.

    Args:
        z: evidence, ``(..., d)`` or ``(..., n_q, d)`` (see the module's shape convention).
        templates: ``(..., n, d)``.
        u: preference, broadcastable to the weights ``(..., n)`` / ``(..., n_q, n)``; non-negative,
            summing to one; ``None`` for uniform.  Zeros mask templates.
        alpha: :math:`\alpha>0`, the reliability of the evidence.

    Returns:
        ``(h, weights)``: ``(..., [n_q,] d)`` and ``(..., [n_q,] n)``.

    No query (``n_q = 0``) or an empty batch gives empty results of the shapes above.  The scores
    :math:`\alpha\langle t_i,z\rangle` are formed with :math:`\alpha` on the side that avoids an
    intermediate overflow; scores beyond the dtype's range raise (never NaN weights).

    Raises:
        ValueError: ``alpha`` not a finite number > 0; NaN/inf inputs; no template (``n = 0``: there
            is no preference over an empty set, so problem (4) has no solution); shape mismatch or
            shapes that do not broadcast; tensors on different devices; ``u`` negative or not
            summing to one; scores :math:`\alpha\langle t_i,z\rangle` beyond the dtype's range
            (pass float64 or smaller inputs).
        TypeError: non-float inputs, mixed dtypes, ``alpha`` not a real number.

    Example:
        >>> T = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> h, w = generalized_attention(torch.tensor([2.0, 0.0]), T, alpha=0.5)
        >>> w
        tensor([0.7311, 0.2689])
    """
    T = _templates(templates)
    zq, single = _vector(z, "z", T)
    alpha = check_positive(alpha, "alpha")
    uq = _preference(u, T, single)
    scores = _scores(zq, T, alpha, "z")
    if uq is not None:
        broadcast_shapes(**{"the weights of z and templates": scores.shape, "u": uq.shape})
        scores = scores + _log_pref(uq)
    weights = torch.softmax(scores, dim=-1)
    h = weights @ T
    if single:
        h, weights = h.squeeze(-2), weights.squeeze(-2)
    return h, weights


def dual_objective(lam, b, templates, u=None, alpha=1.0) -> torch.Tensor:
    r"""The Fenchel dual objective of eq. (9) of the Fenchel-dual paper, for a discrete preference.

    .. math::

        D(\lambda)=\langle\lambda,b\rangle-\frac{1}{2\alpha}\lVert\lambda\rVert^2
        -\log\sum_{i=1}^n u_i\,e^{\langle t_i,\lambda\rangle},\qquad b=\mu+z,

    the log moment generating function of eq. (10) evaluated for :math:`u=\sum_i u_i\delta_{t_i}`.

    Args:
        lam: dual variable :math:`\lambda`, ``(..., d)`` or ``(..., n_q, d)``.
        b: :math:`b=\mu+z`, broadcastable to ``lam``.
        templates: ``(..., n, d)``.
        u: preference (``None`` = uniform), zeros allowed.
        alpha: :math:`\alpha>0`.

    Returns:
        :math:`D(\lambda)`, shape ``(...)`` or ``(..., n_q)``.

    Raises:
        ValueError, TypeError: as :func:`generalized_attention`; also a value :math:`D(\lambda)`
            beyond the dtype's range.
    """
    T = _templates(templates)
    lq, single = _vector(lam, "lam", T)
    bq = _bq_like(b, T, single, lq, "lam")
    alpha = check_positive(alpha, "alpha")
    uq = _preference(u, T, single)
    s = _scores(lq, T, None, "lam")
    if uq is not None:
        broadcast_shapes(**{"the scores <lam, t_i>": s.shape, "u": uq.shape})
    val = (lq * bq).sum(-1) - (lq * lq).sum(-1) / (2 * alpha) - _KL(uq).value(s)
    require(all_finite(val), f"D(lam) overflows {val.dtype}: lam or b are too large for this dtype")
    return val.squeeze(-1) if single else val


def _bq_like(b, T, single, lq, lam_name):
    """``b`` in the layout of ``lq`` (the checked ``lam``)."""
    b = as_float_tensor(b, "b", min_ndim=1, like=T)
    check_same_dtype(b, "b", T, "templates")
    check_same_device(b, "b", T, "templates")
    check_shape_match(b, "b", T, "templates", [(-1, -1)])
    bq = b.unsqueeze(-2) if single else b
    broadcast_shapes(**{lam_name: lq.shape, "b": bq.shape})
    check_finite(b, "b")
    return bq


def solve_dual(b, templates, u=None, alpha=1.0, tol=1e-10, max_iter=100, *, method="auto") -> torch.Tensor:
    r"""The exact maximizer :math:`\lambda^*` of the dual (9) of the Fenchel-dual paper.

    Solves :math:`\nabla D(\lambda)=b-\lambda/\alpha-\sum_i p_i(\lambda)\,t_i=0` with
    :math:`p(\lambda)=\operatorname{softmax}(\log u+T\lambda)` by Newton's method with a
    backtracking line search on :math:`\lVert\nabla D\rVert^2` (globally convergent: :math:`-D` is
    :math:`1/\alpha`-strongly convex, so the Hessian is uniformly invertible), starting from the
    paper's approximation :math:`\lambda_0=\alpha z=\alpha(b-\mu)` (eq. 16).  By stationarity
    :math:`\lambda^*=\alpha z+\alpha\,T^\top(u-\tilde p)`, so the iteration runs in the span of the
    templates (see the module docstring): ``method="gram"`` on :math:`c` in
    :math:`\lambda=\alpha b+T^\top c` with :math:`n\times n` systems built elementwise from the Gram
    matrix, preceded on the CPU (for :math:`n\ge16`) by at most 12 steepest-ascent steps with exact
    curvature; ``method="span"`` on :math:`v` in :math:`\lambda=\alpha b+Q_Tv`, :math:`T^\top=Q_TR`,
    with :math:`\min(n,d)\times\min(n,d)` systems; ``"auto"`` (the default) takes ``"gram"`` when
    :math:`n\le d` and ``"span"`` otherwise.  Problems that have converged leave the batch.
    ``method="dense"`` is the textbook iteration on :math:`\lambda` with :math:`d\times d` Cholesky
    solves, kept as a reference.  The three return the same :math:`\lambda^*` to within ``tol``.
    Batched over all leading dimensions; one host synchronisation per iteration (the global
    convergence test), none per element.

    Gradients with respect to ``b``, ``templates`` and ``u`` are those of the implicit function
    theorem, :math:`d\lambda^*=(I/\alpha+T^\top ST)^{-1}\,d(\nabla D)|_{\lambda^*}` with
    :math:`S=\operatorname{diag}\tilde p-\tilde p\tilde p^\top` (first order only).

    Args:
        b: :math:`b=\mu+z`, ``(..., d)`` or ``(..., n_q, d)``.
        templates: ``(..., n, d)``.
        u: preference (``None`` = uniform); zeros mask templates.
        alpha: :math:`\alpha>0`.
        tol: stop when every :math:`\lVert\nabla D(\lambda)\rVert_2\le` ``tol`` (raised to the
            rounding floor :math:`\varepsilon(\lVert b\rVert+\max_i\lVert t_i\rVert)(32+4\alpha
            \max_i\lVert t_i\rVert^2)` of the dtype when below it, which happens in float32 or for
            large templates).
        max_iter: Newton iterations before giving up.
        method: ``"auto"``, ``"gram"``, ``"span"`` or ``"dense"``.

    Returns:
        :math:`\lambda^*`, same layout as ``b`` (broadcast against ``templates`` and ``u``).

    An empty batch (or ``d = 0``) returns an empty result without iterating; so do ``meta``
    tensors (which have shapes but no values), returning the result's shape.

    Raises:
        ValueError: as :func:`generalized_attention`; ``tol`` not a finite number > 0,
            ``max_iter < 1``, an unknown ``method``; ``b``, ``templates`` or ``alpha`` so large that
            no iterate can be certified in this dtype.
        TypeError: as :func:`generalized_attention`; ``max_iter`` not an int, ``method`` not a string.
        RuntimeError: no convergence within ``max_iter`` iterations.
    """
    T = _templates(templates)
    bq, single = _vector(b, "b", T)
    alpha = check_positive(alpha, "alpha")
    tol = check_positive(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", 1)
    uq = _preference(u, T, single)
    if uq is not None:
        broadcast_shapes(**{"b's batch dimensions": bq.shape[:-1], "templates' batch dimensions": T.shape[:-2] + (1,),
                            "u's batch dimensions": uq.shape[:-1]})
    lam = _solve(bq, T, _KL(uq), alpha, tol, max_iter, method, "solve_dual")
    return lam.squeeze(-2) if single else lam


def exact_estimate(b, templates, u=None, alpha=1.0, tol=1e-10, max_iter=100) -> torch.Tensor:
    r"""The exact estimate :math:`\hat h` of eq. (12) of the Fenchel-dual paper.

    .. math::

        \hat h=\sum_i t_i\,\frac{u_i e^{\langle t_i,\lambda^*\rangle}}{\sum_j u_j e^{\langle t_j,\lambda^*\rangle}},
        \qquad \lambda^*=\arg\max D ,

    with :math:`\lambda^*` the maximizer of the dual (eq. 9) from :func:`solve_dual`: the mean of the minimizer :math:`\tilde p` (eq. 11) of problem (4).  Compare with
    :func:`generalized_attention` at ``z = b - mu``: the two agree to :math:`O(\alpha^2)`.

    Args:
        b: :math:`b=\mu+z`, ``(..., d)`` or ``(..., n_q, d)``.
        templates, u, alpha, tol, max_iter: as in :func:`solve_dual`.

    Returns:
        :math:`\hat h`, same layout as ``b``.

    Raises:
        ValueError, TypeError, RuntimeError: as :func:`solve_dual`.
    """
    lam = solve_dual(b, templates, u, alpha, tol, max_iter)
    return generalized_attention(lam, templates, u, 1.0)[0]


def gaussian_dual_maximizer(mu, b, alpha, *, cov=None) -> torch.Tensor:
    r"""Closed-form dual maximizer for a Gaussian preference (Sec. 5 and eq. 15 of the Fenchel-dual paper).

    For :math:`u=\mathcal N(\mu,\Sigma)` the log-MGF is exactly quadratic, so eq. (15) is exact:

    .. math::

        \lambda^*=\alpha\,(I_d+\alpha\Sigma)^{-1}(b-\mu),

    which for :math:`\Sigma=I_d` (the default, Sec. 5) is :math:`\frac{\alpha}{1+\alpha}(b-\mu)`.

    Args:
        mu: :math:`\mu`, ``(..., d)``.
        b: :math:`b`, broadcastable to ``mu``.
        alpha: :math:`\alpha>0`.
        cov: optional symmetric positive semi-definite :math:`\Sigma`, ``(..., d, d)``.

    Returns:
        :math:`\lambda^*`, ``(..., d)`` (the broadcast of ``mu``, ``b`` and ``cov``'s batch).

    Raises:
        ValueError: ``alpha`` not a finite number > 0; NaN or infinite entries; shapes that do not
            match or broadcast; tensors on different devices; ``cov`` not symmetric positive
            semi-definite (e.g. :math:`-I`, which is no covariance).
        TypeError: non-float inputs or mixed dtypes; ``alpha`` not a real number.
    """
    mu, b, alpha, cov = _gauss_args(mu, b, alpha, cov)
    return _gauss_lambda(mu, b, alpha, cov)


def _gauss_lambda(mu, b, alpha, cov):
    if cov is None:
        return alpha / (1.0 + alpha) * (b - mu)
    d = mu.shape[-1]
    work = torch.float32 if mu.dtype in (torch.float16, torch.bfloat16) else mu.dtype  # no half-precision solve
    eye = torch.eye(d, dtype=work, device=mu.device)
    # solve_ex: no host read for the error check (I + alpha cov has eigenvalues >= 1 for a checked cov)
    lam = alpha * torch.linalg.solve_ex(eye + alpha * cov.to(work), (b - mu).to(work).unsqueeze(-1))[0].squeeze(-1)
    return lam.to(mu.dtype)


def gaussian_estimate(mu, b, alpha, *, cov=None) -> torch.Tensor:
    r"""Closed-form estimate for a Gaussian preference (Sec. 5 of the Fenchel-dual paper).

    With :math:`u=\mathcal N(\mu,I_d)` the minimizer of (4) is :math:`\mathcal N(\mu+\lambda^*,I_d)`
    and

    .. math::

        \hat h=\mu+\lambda^*=\frac{1}{1+\alpha}\,\mu+\frac{\alpha}{1+\alpha}\,b ;

    with a covariance :math:`\Sigma` (eq. 15, exact for Gaussians) :math:`\hat h=\mu+\Sigma\lambda^*`,
    :math:`\lambda^*=\alpha(I+\alpha\Sigma)^{-1}(b-\mu)`.

    Args:
        mu: :math:`\mu`, ``(..., d)``.
        b: :math:`b=\mu+z`, broadcastable to ``mu``.
        alpha: :math:`\alpha>0`.
        cov: optional :math:`\Sigma`, ``(..., d, d)``; ``None`` means :math:`I_d`.

    Returns:
        :math:`\hat h`, ``(..., d)``; without ``cov`` the convex combination above, computed as
        such (no overflow for any finite ``mu`` and ``b``).

    Raises:
        ValueError, TypeError: as :func:`gaussian_dual_maximizer`.
    """
    mu, b, alpha, cov = _gauss_args(mu, b, alpha, cov)
    if cov is None:
        return mu * (1.0 / (1.0 + alpha)) + b * (alpha / (1.0 + alpha))
    lam = _gauss_lambda(mu, b, alpha, cov)
    return mu + (cov @ lam.unsqueeze(-1)).squeeze(-1)


def _gauss_args(mu, b, alpha, cov):
    mu = as_float_tensor(mu, "mu", min_ndim=1)
    b = as_float_tensor(b, "b", min_ndim=1, like=mu)
    check_same_dtype(b, "b", mu, "mu")
    check_same_device(b, "b", mu, "mu")
    check_shape_match(b, "b", mu, "mu", [(-1, -1)])
    broadcast_shapes(mu=mu.shape, b=b.shape)
    alpha = check_positive(alpha, "alpha")
    check_finite(mu, "mu")
    check_finite(b, "b")
    if cov is not None:
        cov = as_float_tensor(cov, "cov", min_ndim=2, like=mu)
        check_same_dtype(cov, "cov", mu, "mu")
        check_same_device(cov, "cov", mu, "mu")
        d = mu.shape[-1]
        if cov.shape[-1] != d or cov.shape[-2] != d:
            raise ValueError(f"cov must be (..., d, d) with d={d}; got shape {tuple(cov.shape)}")
        broadcast_shapes(**{"mu's batch dimensions": mu.shape[:-1], "b's batch dimensions": b.shape[:-1],
                            "cov's batch dimensions": cov.shape[:-2]})
        check_psd(cov, "cov")
    return mu, b, alpha, cov


def t5_preference(position_bias, mask=None) -> torch.Tensor:
    r"""T5's relative-position bias and word mask as a preference, eq. (19) of the Fenchel-dual paper.

    .. math::

        u_i=\begin{cases}0 & \text{word } i \text{ masked}\\ e^{B_i}/Z & \text{otherwise,}\end{cases}
        \qquad Z=\sum_{i\ \text{unmasked}}e^{B_i},

    so that :func:`generalized_attention` with this :math:`u` and :math:`\alpha=1` is eq. (20): the
    bias and the mask are added to the scores before the softmax.

    Args:
        position_bias: ``(..., n)`` scores :math:`B` (e.g. T5's bucketed relative-position bias,
            ``(..., n_q, n)``); ``-inf`` entries count as masked.
        mask: optional boolean tensor broadcastable to ``position_bias``; ``True`` marks a word that
            may be attended to (PyTorch's SDPA convention).

    Returns:
        :math:`u`, the broadcast shape, summing to one over the last dimension.

    Raises:
        TypeError: ``mask`` not boolean, ``position_bias`` not floating.
        ValueError: NaN or ``+inf`` in the bias; no word (last dimension 0) or a row with every word
            masked (no preference exists over no word); shapes that do not broadcast; ``mask`` on
            another device.  An empty batch gives an empty result.
    """
    bias = as_float_tensor(position_bias, "position_bias", min_ndim=1)
    shape = bias.shape
    if mask is not None:
        check_bool_mask(mask, "mask", device=bias.device, meaning="True = may attend")
        shape = broadcast_shapes(position_bias=bias.shape, mask=mask.shape)
    if shape[-1] == 0:
        raise ValueError(f"position_bias must hold at least one word (shape (..., n) with n >= 1); got {tuple(shape)}")
    check_finite(bias, "position_bias", allow_neg_inf=True)
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    require(
        (bias > float("-inf")).any(dim=-1).all(),
        "every word of some row is masked (by mask or a -inf position_bias); a preference needs at least one allowed word",
    )
    return torch.softmax(bias, dim=-1)


def relative_deviation(lam_star, approx) -> torch.Tensor:
    r"""Relative deviation :math:`\lVert\lambda^*-\hat\lambda\rVert/\lVert\lambda^*\rVert` of Fig. 4.

    Fig. 4 of the Fenchel-dual paper measures how far the approximation
    :math:`\hat\lambda=\alpha z` (eq. 16) is from the exact maximizer :math:`\lambda^*` of (9) in
    BERT and T5.  A zero :math:`\lambda^*` gives ``inf`` (``0`` if ``approx`` is zero too, and for
    ``d = 0``).  Both vectors are divided by their largest entry before the norms, so that no
    square overflows.

    Args:
        lam_star: :math:`\lambda^*`, ``(..., d)``.
        approx: :math:`\hat\lambda`, broadcastable to ``lam_star``.

    Returns:
        ``(...)`` relative deviations.

    Raises:
        ValueError, TypeError: NaN, mismatched shapes or dtypes.
    """
    lam_star = as_float_tensor(lam_star, "lam_star", min_ndim=1)
    approx = as_float_tensor(approx, "approx", min_ndim=1, like=lam_star)
    check_same_dtype(approx, "approx", lam_star, "lam_star")
    check_same_device(approx, "approx", lam_star, "lam_star")
    shape = broadcast_shapes(lam_star=lam_star.shape, approx=approx.shape)
    check_finite(lam_star, "lam_star")
    check_finite(approx, "approx")
    lam_star, approx = lam_star.expand(shape), approx.expand(shape)
    if shape[-1] == 0:
        return lam_star.new_zeros(shape[:-1])
    scale = torch.maximum(lam_star.detach().abs().amax(-1), approx.detach().abs().amax(-1))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    diff = (lam_star / scale - approx / scale).norm(dim=-1)
    return torch.where(diff == 0, torch.zeros_like(diff), diff / (lam_star / scale).norm(dim=-1))


# ----------------------------------------------------------------------------------------------
# public API: entropic optimal-transport problem (Sec. 9, Appx D)
# ----------------------------------------------------------------------------------------------


def _true_pref(u: torch.Tensor, cost: torch.Tensor, gamma: float) -> torch.Tensor:
    """``u (..., n)`` and ``cost (..., n, n)`` with leading dimensions aligned."""
    # column j: where the mass u_j goes; each column is shifted by its (finite) minimum before the
    # division by gamma, which a small gamma would otherwise overflow
    low = cost.detach().amin(dim=-2, keepdim=True)
    q = torch.softmax((low - cost) / max(gamma, torch.finfo(cost.dtype).tiny), dim=-2)  # (0 / 0 for a gamma that rounds to 0)
    return (q * u.unsqueeze(-2)).sum(-1)


def true_preference(u, cost, gamma) -> torch.Tensor:
    r"""The true preference :math:`\tilde u`, eq. (40) / Prop. 1 of the Fenchel-dual paper.

    :math:`\tilde u` minimizes :math:`p\mapsto\mathcal W_\gamma(p,u;M)` (eq. 23): each unit of
    preference mass at :math:`t_j` spreads over the templates with a Gibbs kernel,

    .. math::

        \tilde u_i=\sum_j u_j\,\frac{e^{-M_{ij}/\gamma}}{\sum_{l}e^{-M_{lj}/\gamma}},

    and :math:`\tilde u\to u` as :math:`\gamma\to0` when :math:`M_{jj}<M_{ij}` for :math:`i\ne j`.
    ``cost[..., i, j]`` is :math:`M(t_i,t_j)`, :math:`t_i` the template that receives mass and
    :math:`t_j` the one where the preference puts it; the paper's symmetric :math:`M` makes the
    order immaterial.

    Args:
        u: preference ``(..., N)`` over all templates (zeros allowed).
        cost: :math:`M`, ``(..., N, N)``; finite or ``+inf``.
        gamma: :math:`\gamma>0`, the entropic regularization.

    Returns:
        :math:`\tilde u`, ``(..., N)``.

    Raises:
        ValueError, TypeError: bad ``gamma``, NaN, ``u`` not a probability vector, bad shapes.
    """
    u = as_float_tensor(u, "u", min_ndim=1)
    if u.shape[-1] == 0:
        raise ValueError("u must hold at least one entry (shape (..., N) with N >= 1): no preference exists over no template")
    m = _cost(cost, u.shape[-1], u, "u")
    gamma = check_positive(gamma, "gamma")
    broadcast_shapes(**{"u's batch dimensions": u.shape[:-1], "cost's batch dimensions": m.shape[:-2]})
    check_finite(u, "u")
    check_probability_vector(u, "u")
    return _true_pref(u, m, gamma)


def ot_attention(z, templates, u=None, cost=None, alpha=1.0, gamma=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Optimal-transport attention, eq. (25) of the Fenchel-dual paper.

    The small-:math:`\alpha`, small-:math:`\alpha/\gamma` solution of problem (24) (KL replaced by
    the entropic OT cost :math:`\mathcal W_\gamma(p,u;M)`, eq. 23):

    .. math::

        p_i=\sum_{j} u_j\,\frac{e^{(\alpha\langle t_i,z\rangle-M_{ij})/\gamma}}{Z_j},\qquad
        Z_j=\sum_{l}e^{(\alpha\langle t_l,z\rangle-M_{lj})/\gamma},\qquad \hat h=\sum_i p_i t_i .

    A template with :math:`u_i=0` still receives weight if it is cheap to reach from preferred
    ones.  As :math:`\alpha\to0` the weights tend to :func:`true_preference`.

    Args:
        z: evidence, ``(..., d)`` or ``(..., n_q, d)``.
        templates: all templates :math:`\mathcal A`, ``(..., N, d)``.
        u: preference over them (``None`` = uniform), zeros allowed.
        cost: :math:`M`, ``(..., N, N)`` (``cost[..., i, j] = M(t_i, t_j)``), finite or ``+inf``.
        alpha: :math:`\alpha>0`.
        gamma: :math:`\gamma>0`.

    Returns:
        ``(h, weights)`` of shapes ``(..., [n_q,] d)`` and ``(..., [n_q,] N)``.

    Raises:
        ValueError, TypeError: as :func:`generalized_attention`, plus a bad ``cost`` (NaN or
            ``-inf`` entries, a column that is ``+inf`` everywhere, a wrong shape) or ``gamma``.
    """
    T = _templates(templates)
    zq, single = _vector(z, "z", T)
    alpha = check_positive(alpha, "alpha")
    fam = _ot_family(u, cost, gamma, T, zq, single, "z")
    weights = fam.probs(_scores(zq, T, alpha, "z"))
    h = weights @ T
    if single:
        h, weights = h.squeeze(-2), weights.squeeze(-2)
    return h, weights


def ot_dual_objective(lam, b, templates, u=None, cost=None, alpha=1.0, gamma=1.0) -> torch.Tensor:
    r"""Dual objective of the OT problem (24), eqs. (36) and (39) of the Fenchel-dual paper.

    .. math::

        D_\gamma(\lambda)=\langle\lambda,b\rangle-\frac{1}{2\alpha}\lVert\lambda\rVert^2
        -\gamma\Big(H(u)+\sum_j u_j\log\sum_i e^{(\langle t_i,\lambda\rangle-M_{ij})/\gamma}\Big),

    with :math:`b=\tilde\mu+z`; the constant :math:`\gamma H(u)` (dropped in eq. 39) is kept so that
    the value equals the primal optimum (strong duality).

    Args:
        lam, b, templates, u: as :func:`dual_objective` (``templates`` are all of :math:`\mathcal A`).
        cost, alpha, gamma: as :func:`ot_attention`.

    Returns:
        ``(...)`` or ``(..., n_q)`` values.

    Raises:
        ValueError, TypeError: as :func:`ot_attention`.
    """
    T = _templates(templates)
    lq, single = _vector(lam, "lam", T)
    bq = _bq_like(b, T, single, lq, "lam")
    alpha = check_positive(alpha, "alpha")
    fam = _ot_family(u, cost, gamma, T, lq, single, "lam")
    val = (lq * bq).sum(-1) - (lq * lq).sum(-1) / (2 * alpha) - fam.value(_scores(lq, T, None, "lam"))
    require(all_finite(val), f"D(lam) overflows {val.dtype}: lam or b are too large for this dtype")
    return val.squeeze(-1) if single else val


def solve_ot_dual(b, templates, u=None, cost=None, alpha=1.0, gamma=1.0, tol=1e-10, max_iter=100, *, method="auto"):
    r"""Exact maximizer of the OT dual (39) of the Fenchel-dual paper.

    Same Newton solver as :func:`solve_dual`, with :math:`p(\lambda)=\sum_j u_j\,
    \operatorname{softmax}_i((\langle t_i,\lambda\rangle-M_{ij})/\gamma)` (eq. 37) and Hessian
    :math:`T^\top\gamma^{-1}\big(\operatorname{diag}p-\sum_j u_j q_jq_j^\top\big)T`; stationarity
    again puts :math:`\lambda^*-\alpha b` in the span of the templates.  Its Hessian is a sum of
    :math:`n` covariance matrices, not one, so the Gram form of :func:`solve_dual` does not apply:
    ``"auto"`` means ``"span"`` here, and ``method="gram"`` is an error.

    Args:
        b: :math:`b=\tilde\mu+z`, ``(..., d)`` or ``(..., n_q, d)``.
        templates, u, cost, alpha, gamma: as :func:`ot_attention`.
        tol, max_iter: as :func:`solve_dual`.
        method: ``"auto"`` (= ``"span"``), ``"span"`` or ``"dense"``.

    Returns:
        :math:`\lambda^*`, same layout as ``b``.

    Raises:
        ValueError, TypeError, RuntimeError: as :func:`solve_dual` and :func:`ot_attention`.
    """
    T = _templates(templates)
    bq, single = _vector(b, "b", T)
    alpha = check_positive(alpha, "alpha")
    tol = check_positive(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", 1)
    fam = _ot_family(u, cost, gamma, T, bq, single, "b")
    lam = _solve(bq, T, fam, alpha, tol, max_iter, method, "solve_ot_dual")
    return lam.squeeze(-2) if single else lam


def ot_exact_estimate(z, templates, u=None, cost=None, alpha=1.0, gamma=1.0, tol=1e-10, max_iter=100):
    r"""Exact solution of the OT problem (24) via its dual (39), eqs. (38)–(39) of the Fenchel-dual paper.

    With :math:`b=\tilde\mu+z` (:math:`\tilde\mu` the mean of :func:`true_preference`) and
    :math:`\lambda^*` from :func:`solve_ot_dual`,

    .. math::

        p^*_i=\sum_j u_j\,\frac{e^{(\langle t_i,\lambda^*\rangle-M_{ij})/\gamma}}
        {\sum_l e^{(\langle t_l,\lambda^*\rangle-M_{lj})/\gamma}},\qquad \hat h=\sum_i p^*_i t_i ;

    :func:`ot_attention` is this with :math:`\lambda^*\approx\alpha z`.

    Args:
        z, templates, u, cost, alpha, gamma: as :func:`ot_attention`.
        tol, max_iter: as :func:`solve_dual`.

    Returns:
        ``(h, weights)`` as :func:`ot_attention`.

    Raises:
        ValueError, TypeError, RuntimeError: as :func:`solve_ot_dual`.
    """
    T = _templates(templates)
    zq, single = _vector(z, "z", T)
    alpha = check_positive(alpha, "alpha")
    tol = check_positive(tol, "tol")
    max_iter = check_int(max_iter, "max_iter", 1)
    fam = _ot_family(u, cost, gamma, T, zq, single, "z")
    bq = zq + fam.prior(zq) @ T
    lam = _solve(bq, T, fam, alpha, tol, max_iter, "auto", "ot_exact_estimate")
    weights = fam.probs(lam @ T.mT)
    h = weights @ T
    if single:
        h, weights = h.squeeze(-2), weights.squeeze(-2)
    return h, weights
