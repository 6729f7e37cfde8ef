r"""The engine of :mod:`attnopt.fenchel`: Newton solvers for the Fenchel duals (9) and (39).

Anonymous authors (2024) solve the dual (9) of problem (4),
:math:`\max_\lambda D(\lambda)=\langle\lambda,b\rangle-\lVert\lambda\rVert^2/(2\alpha)-\phi(T\lambda)`,
by gradient ascent.  This module solves it, and the optimal-transport dual (39), by Newton's method.

**The dual in the span of the templates.**  Setting :math:`\nabla D=0` gives
:math:`\lambda^*=\alpha b-\alpha\,T^\top p(\lambda^*)=\alpha z+\alpha T^\top(u-p(\lambda^*))`, where
:math:`T\in\mathbb{R}^{n\times d}` stacks the templates and :math:`p=\nabla\phi`: the exact maximizer is
the approximation :math:`\alpha z` of eq. (16) plus a correction in the row space of :math:`T`.
Writing :math:`\lambda=\alpha b+T^\top c`, the problem becomes :math:`n`-dimensional and needs only the
Gram matrix :math:`G=TT^\top` (:func:`newton_gram`, KL dual only); writing
:math:`\lambda=\alpha b+Q_Tv` with a reduced QR factorization :math:`T^\top=Q_TR`, it is
:math:`\min(n,d)`-dimensional (:func:`newton_span`, both duals).  :func:`newton_dense` is the textbook
iteration on :math:`\lambda` with :math:`d\times d` systems, kept as the reference of the benchmarks.

Every solver globalizes Newton by a backtracking (Armijo) line search on the merit
:math:`\lVert\nabla D\rVert^2` (:func:`armijo_step`), works on one flat batch of problems and retires
the converged ones; the iterate of the problems still iterating is an :class:`Iterate`.
:func:`solve` dispatches, and attaches the implicit-function-theorem gradient
(:func:`implicit_gradient`).

The two log-partition functions :math:`\phi` are :class:`KLFamily`,
:math:`\phi(s)=\log\sum_iu_ie^{s_i}` (eqs. 9–11), and :class:`OTFamily`,
:math:`\phi(s)=\gamma\sum_ju_j\log\sum_ie^{(s_i-M_{ij})/\gamma}` (eqs. 36–39).  For a Gaussian
preference the dual needs no solver: :func:`gaussian_lambda` is its maximizer in closed form (eq. 15).

References:
    Anonymous authors (2024), *Deciphering Attention Mechanisms: Optimization and Fenchel Dual
    Solutions*, eqs. (9)–(12), (15)–(16), (36)–(41).  Nocedal and Wright (2006), *Numerical
    Optimization*, Sec. 3.1 (backtracking line search) and Sec. 11.2 (merit functions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .._numerics import log_or_neg_inf
from .._validation import check_choice, check_no_overflow, require

#: Line search: candidate steps 1, rho, rho^2, ...; Armijo constant on the merit |grad D|^2.
LS_RHO = 0.5
LS_STEPS = 16
LS_SIGMA = 1e-4
#: Warm start of the Gram-space Newton solver: at most this many steepest-ascent steps, stopped once
#: most problems' squared gradient falls by less than CAUCHY_RATE per step.  Used on the CPU for
#: n >= CAUCHY_MIN_N templates only: measured by benchmarks/dual_solver.py, it costs more than it
#: saves below that (a Newton step's small factorization is cheap) and on a GPU (its steps are
#: launch- and sync-bound).
CAUCHY_STEPS = 12
CAUCHY_RATE = 0.25
CAUCHY_MIN_N = 16
METHODS = ("auto", "gram", "span", "dense")


# ----------------------------------------------------------------------------------------------
# scores and the two log-partition families
# ----------------------------------------------------------------------------------------------


def scores(x: torch.Tensor, T: torch.Tensor, alpha: float | None, x_name: str) -> torch.Tensor:
    r"""The scores :math:`\alpha\langle x,t_i\rangle` (``alpha=None``: :math:`\langle x,t_i\rangle`), ``(..., n_q, n)``.

    :math:`\alpha<1` shrinks both factors by :math:`\sqrt\alpha` before the product (as PyTorch's
    reference SDPA does; :math:`\alpha` itself may be below the smallest float32); :math:`\alpha>1`
    multiplies the product, which is then smaller than the result, so no intermediate overflows.
    Scores beyond the dtype's range have no representation (the weights would be NaN):
    ``ValueError``, through :func:`~attnopt._validation.require` (no host read off the CPU).
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


def generalized_weights(x: torch.Tensor, T: torch.Tensor, alpha: float, log_u: torch.Tensor | None,
                        x_name: str = "z") -> torch.Tensor:
    r"""The weights :math:`p_i\propto u_ie^{\alpha\langle x,t_i\rangle}` of generalized attention (eq. 18),
    on checked arguments (``log_u=None``: uniform :math:`u`)."""
    s = scores(x, T, alpha, x_name)
    return torch.softmax(s if log_u is None else s + log_u, dim=-1)


def estimate(weights: torch.Tensor, T: torch.Tensor, single: bool) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(h, weights)``, :math:`\hat h=\sum_ip_it_i` (eq. 12), without the query axis when ``single``."""
    h = weights @ T
    return (h.squeeze(-2), weights.squeeze(-2)) if single else (h, weights)


def true_preference_weights(u: torch.Tensor, cost: torch.Tensor, gamma: float) -> torch.Tensor:
    r""":math:`\tilde u` of eq. (40) for ``u (..., n)`` and ``cost (..., n, n)`` with aligned leading dimensions.

    Column :math:`j` of the Gibbs kernel says where the mass :math:`u_j` goes; each column is shifted
    by its (finite) minimum before the division by :math:`\gamma`, which a small :math:`\gamma` would
    otherwise overflow (and :math:`\gamma` is replaced by the dtype's smallest normal number where it
    would round to 0: 0/0 otherwise).
    """
    low = cost.detach().amin(dim=-2, keepdim=True)
    q = torch.softmax((low - cost) / max(gamma, torch.finfo(cost.dtype).tiny), dim=-2)
    return (q * u.unsqueeze(-2)).sum(-1)


def vecmat(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Batched row vector times matrix: ``x (..., a)``, ``m (..., a, b)`` -> ``(..., b)``."""
    return (x.unsqueeze(-2) @ m).squeeze(-2)


class KLFamily:
    r""":math:`\phi(s)=\log\sum_i u_i e^{s_i}`, :math:`\nabla\phi=p`, :math:`\nabla^2\phi=\operatorname{diag}p-pp^\top`.

    ``u`` is ``None`` (uniform) or laid out like the scores, ``(..., n_q or 1, n)`` or, once
    flattened for the solver, ``(B, n)``.
    """

    def __init__(self, u: torch.Tensor | None):
        self.u = u
        self.log_u = None if u is None else log_or_neg_inf(u)

    def batch_shape(self) -> tuple[int, ...]:
        return () if self.u is None else tuple(self.u.shape[:-1])

    def flatten(self, batch: tuple[int, ...]) -> "KLFamily":
        if self.u is None:
            return self
        return KLFamily(self.u.expand(batch + self.u.shape[-1:]).reshape(-1, self.u.shape[-1]))

    def take(self, rows: torch.Tensor) -> "KLFamily":
        return self if self.u is None else KLFamily(self.u[rows])

    def detached(self) -> "KLFamily":
        return self if self.u is None else KLFamily(self.u.detach())

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return () if self.u is None else (self.u,)

    def probs(self, s: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s if self.log_u is None else s + self.log_u, dim=-1)

    def hessian(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.probs(s)
        return p, torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)

    def projected_hessian(self, s, p, Rp, R) -> torch.Tensor:
        """``R S R^T`` for per-problem ``R (B, k, n)``, from ``p`` and ``R p`` without forming ``S``."""
        return torch.baddbmm(Rp.unsqueeze(-1) * Rp.unsqueeze(-2), R * p.unsqueeze(-2), R.mT, beta=-1.0)

    def value(self, s: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(s if self.log_u is None else s + self.log_u, dim=-1)

    def prior(self, like: torch.Tensor) -> torch.Tensor:
        if self.u is not None:
            return self.u
        n = like.shape[-1]
        return torch.full((1, n), 1.0 / n, dtype=like.dtype, device=like.device)


class OTFamily:
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

    def flatten(self, batch: tuple[int, ...]) -> "OTFamily":
        n = self.cost.shape[-1]
        u = self.u.expand(batch + (n,)).reshape(-1, n)
        return OTFamily(u, self.cost.expand(batch + (n, n)).reshape(-1, n, n), self.gamma)

    def take(self, rows: torch.Tensor) -> "OTFamily":
        return OTFamily(self.u[rows], self.cost[rows], self.gamma)

    def detached(self) -> "OTFamily":
        return OTFamily(self.u.detach(), self.cost.detach(), self.gamma)

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

    def _plan_columns(self, s: torch.Tensor) -> torch.Tensor:
        # [..., i, j] = softmax over i of (s_i - M_ij) / gamma: column j of the optimal plan / u_j (eq. 37)
        return torch.softmax(self._shifted(s)[0] / self.div, dim=-2)

    def probs(self, s: torch.Tensor) -> torch.Tensor:
        return (self._plan_columns(s) * self.u.unsqueeze(-2)).sum(-1)

    def hessian(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self._plan_columns(s)
        qu = q * self.u.unsqueeze(-2)
        p = qu.sum(-1)
        return p, (torch.diag_embed(p) - qu @ q.mT) / self.gamma

    def projected_hessian(self, s, p, Rp, R) -> torch.Tensor:
        """``R S R^T`` for per-problem ``R (B, k, n)``."""
        return R @ self.hessian(s)[1] @ R.mT

    def value(self, s: torch.Tensor) -> torch.Tensor:
        x, top = self._shifted(s)
        lse = top + self.div * torch.logsumexp(x / self.div, dim=-2)  # gamma log sum_i e^{(s_i - M_ij)/gamma}
        lse = torch.where(self.u > 0, lse, torch.zeros_like(lse))
        entropy = -torch.special.xlogy(self.u, self.u).sum(-1)
        return self.gamma * entropy + (self.u * lse).sum(-1)

    def prior(self, like: torch.Tensor) -> torch.Tensor:
        return true_preference_weights(self.u, self.cost, self.gamma)


# ----------------------------------------------------------------------------------------------
# the state of an iteration, the stopping floor and the line search
# ----------------------------------------------------------------------------------------------


@dataclass
class Iterate:
    r"""The Newton iterate of the problems still iterating, one row per problem.

    ``coef`` is :math:`v` in :math:`\lambda=\alpha b+Q_Tv` (span form) or :math:`c` in
    :math:`\lambda=\alpha b+T^\top c` (Gram form); ``residual`` is :math:`v/\alpha+Rp=-Q_T^\top\nabla D`
    or :math:`r=c/\alpha+p` (:math:`\nabla D=-T^\top r`); ``image`` is :math:`Rp` or :math:`Gr`;
    ``merit`` is :math:`\lVert\nabla D\rVert^2`.
    """

    coef: torch.Tensor
    scores: torch.Tensor
    probs: torch.Tensor
    residual: torch.Tensor
    image: torch.Tensor
    merit: torch.Tensor

    def _tensors(self):
        return [getattr(self, f.name) for f in fields(self)]

    def take(self, rows) -> "Iterate":
        """The iterate of the problems ``rows`` (indices or a boolean mask)."""
        return Iterate(*(t[rows] for t in self._tensors()))

    def put(self, rows: torch.Tensor, other: "Iterate") -> None:
        """Overwrite, in place, the problems ``rows`` with ``other``."""
        for dst, src in zip(self._tensors(), other._tensors()):
            dst[rows] = src

    def where(self, keep: torch.Tensor, other: "Iterate") -> "Iterate":
        """This iterate where ``keep`` (one flag per problem), ``other`` elsewhere."""
        k = keep.unsqueeze(-1)
        coef, s, p, residual, image = (torch.where(k, x, y) for x, y in zip(self._tensors()[:-1], other._tensors()[:-1]))
        return Iterate(coef, s, p, residual, image, torch.where(keep, self.merit, other.merit))


def rounding_floor(bq: torch.Tensor, T: torch.Tensor, alpha: float) -> torch.Tensor:
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


def _squared_tolerance(bq, T, alpha, tol, batch) -> torch.Tensor:
    """The stopping threshold on the merit of each flat problem: ``max(floor, tol)^2``."""
    return (torch.clamp(rounding_floor(bq, T, alpha), min=tol) ** 2).expand(batch).reshape(-1)


def armijo_step(point: Iterate, dcoef: torch.Tensor, dscores: torch.Tensor, evaluate) -> Iterate:
    r"""The Newton step from ``point``, halved where it fails Armijo's condition on the merit.

    The merit is :math:`\lVert\nabla D\rVert^2`, for which the Newton direction is a descent
    direction, so a small enough step passes.  ``evaluate(rows, coef, scores)`` returns the
    :class:`Iterate` of the problems ``rows`` (``None``: all of them) at ``coef`` and ``scores``.
    Only the failing problems are evaluated again.
    """
    coef, s = point.coef + dcoef, point.scores + dscores
    new = evaluate(None, coef, s)
    failing = (new.merit > (1.0 - 2.0 * LS_SIGMA) * point.merit).nonzero().squeeze(-1)
    for j in range(1, LS_STEPS):
        if not failing.numel():
            break
        t = LS_RHO**j
        coef, s = point.coef[failing] + t * dcoef[failing], point.scores[failing] + t * dscores[failing]
        tried = evaluate(failing, coef, s)
        accept = (tried.merit <= (1.0 - 2.0 * LS_SIGMA * t) * point.merit[failing]) | (j == LS_STEPS - 1)
        new.put(failing[accept], tried.take(accept))
        failing = failing[~accept]
    return new


def select_step(merits: torch.Tensor, m0: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Largest candidate step meeting Armijo on the merit; else the candidate of least merit."""
    shape = (-1,) + (1,) * m0.ndim
    ok = merits <= (1.0 - 2.0 * LS_SIGMA * steps.view(shape)) * m0
    first_ok = torch.argmax(ok.to(torch.int8), dim=0)
    best = torch.argmin(torch.nan_to_num(merits, nan=float("inf")), dim=0)
    idx = torch.where(ok.any(dim=0), first_ok, best)
    return steps[idx]


def _not_converged(what: str, max_iter: int, largest_gradient: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        f"{what} did not converge in {max_iter} Newton iterations: max |grad| = {largest_gradient.item():.3g} > tol"
    )


# ----------------------------------------------------------------------------------------------
# the three Newton solvers
# ----------------------------------------------------------------------------------------------


def newton_span(bq, T, family, alpha, tol, max_iter, what):
    r"""Newton on :math:`v` in :math:`\lambda=\alpha b+Q_Tv`, :math:`T^\top=Q_TR` (reduced QR).

    :math:`Q_T` (``d x k``, :math:`k=\min(n,d)`) is an orthonormal basis of a space containing the
    templates' span; :math:`R^\top R=TT^\top` is the Gram matrix.  Scores are
    :math:`T\lambda=\alpha Tb+R^\top v`, the dual gradient is :math:`-Q_T(v/\alpha+Rp)` (so its
    norm is computed in :math:`k` dimensions, exactly), and the Newton system
    :math:`(I_k/\alpha+RSR^\top)\Delta v=-(v/\alpha+Rp)` is ``k x k`` symmetric positive definite.
    Problems are flattened to one batch axis; converged ones are dropped from later iterations.
    """
    Q, R = torch.linalg.qr(T.mT)  # (..., d, k), (..., k, n)
    k, n = R.shape[-2], R.shape[-1]
    s_b = scores(bq, T, alpha, "b")
    # start from the approximation lambda = alpha z = alpha b - alpha T^T u of eq. (16): v = -alpha R u
    v0 = -alpha * (family.prior(s_b) @ R.mT)
    batch = tuple(torch.broadcast_shapes(s_b.shape[:-1], v0.shape[:-1], family.batch_shape()))
    v_all = v0.expand(batch + (k,)).reshape(-1, k).clone()  # every problem's v, converged ones included
    eye = torch.eye(k, dtype=v_all.dtype, device=v_all.device) / alpha
    # KL: R diag(p) R^T = p @ [r_i r_i^T]_i is one GEMM per template set while every problem is
    # still iterating; worth its memory when the template sets are shared by enough queries
    outer = None
    if isinstance(family, KLFamily) and R.shape[:-2].numel() * n <= 4 * v_all.shape[0]:
        outer = (R.mT.unsqueeze(-1) * R.mT.unsqueeze(-2)).reshape(R.shape[:-2] + (n, k * k))
    # the problems still iterating: their rows in the flat batch (None: all, in order), data and threshold
    rows, R_rows = None, R.unsqueeze(-3).expand(batch + (k, n)).reshape(-1, k, n)
    family, threshold = family.flatten(batch), _squared_tolerance(bq, T, alpha, tol, batch)

    def evaluate(sel, v, s):
        fam, R_sel = (family, R_rows) if sel is None else (family.take(sel), R_rows[sel])
        p = fam.probs(s)
        Rp = vecmat(p, R_sel.mT)
        g = v / alpha + Rp  # = -Q^T grad D
        return Iterate(v, s, p, g, Rp, (g * g).sum(-1))

    point = evaluate(None, v_all, s_b.expand(batch + (n,)).reshape(-1, n) + vecmat(v_all, R_rows))
    for _ in range(max_iter + 1):
        active = point.merit > threshold
        if not bool(active.all()):
            if not bool(active.any()):
                return alpha * bq + v_all.reshape(batch + (k,)) @ Q.mT
            sel = active.nonzero().squeeze(-1)
            rows = sel if rows is None else rows[sel]
            point, R_rows, family, threshold = point.take(sel), R_rows[sel], family.take(sel), threshold[sel]
        if rows is None and outer is not None:
            H = torch.addcmul(eye, point.image.unsqueeze(-1), point.image.unsqueeze(-2), value=-1.0)
            H += (point.probs.reshape(batch + (n,)) @ outer).reshape(-1, k, k)
        else:
            H = eye + family.projected_hessian(point.scores, point.probs, point.image, R_rows)
        L, _ = torch.linalg.cholesky_ex(H)
        dv = -torch.cholesky_solve(point.residual.unsqueeze(-1), L).squeeze(-1)
        point = armijo_step(point, dv, vecmat(dv, R_rows), evaluate)
        v_all = point.coef if rows is None else v_all.index_copy(0, rows, point.coef)
    raise _not_converged(what, max_iter, point.merit.max().sqrt())


def newton_gram(bq, T, family, alpha, tol, max_iter, what):
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
    templates) or :math:`p` has zeros (masked templates).  Unlike :func:`newton_span` there is no
    QR factorization and no :math:`n\times n` product per iteration: building :math:`M` is elementwise.
    While every problem iterates, products with :math:`G` are one batched GEMM per template set.

    The iteration starts from :math:`\lambda=\alpha z` (eq. 16), :math:`c=-\alpha u`.  On the CPU
    with :math:`n\ge16` it first takes up to ``CAUCHY_STEPS`` steepest-ascent steps
    :math:`\Delta c=-\omega r`, :math:`\omega=\lVert\nabla D\rVert^2/(\nabla D^\top H\nabla D)
    =r^\top Gr/(r^\top Gr/\alpha+\operatorname{Var}_p(Gr))`, the maximizer of the local quadratic model
    along the gradient: each costs one product with :math:`G`.
    """
    n = T.shape[-2]
    s_b = scores(bq, T, alpha, "b")
    u = family.prior(s_b)
    batch = tuple(torch.broadcast_shapes(s_b.shape[:-1], u.shape[:-1], family.batch_shape()))
    n_queries = batch[-1]  # the query axis: G does not vary along it
    G_sets = (T @ T.mT).expand(batch[:-1] + (n, n)).reshape(-1, n, n)  # one Gram matrix per template set
    n_problems = G_sets.shape[0] * n_queries
    s_b = s_b.expand(batch + (n,)).reshape(n_problems, n)
    # the problems still iterating: their rows in the flat batch (None: all, in order), the template
    # set of each (None while all iterate: G_rows is then G_sets, and G x one GEMM per set), data, threshold
    rows, group, G_rows = None, None, G_sets
    family, threshold = family.flatten(batch), _squared_tolerance(bq, T, alpha, tol, batch)

    def gram_times(x: torch.Tensor) -> torch.Tensor:  # G x for each problem (G is symmetric)
        return (x.reshape(-1, n_queries, n) @ G_rows).reshape(-1, n) if group is None else vecmat(x, G_rows)

    def evaluate(sel, c, s):
        p = (family if sel is None else family.take(sel)).probs(s)
        r = c / alpha + p  # grad D = -T^T r
        if sel is None:
            Gr = gram_times(r)
        else:
            Gr = vecmat(r, G_sets[sel // n_queries] if group is None else G_rows[sel])
        return Iterate(c, s, p, r, Gr, (r * Gr).sum(-1))

    c_all = -alpha * u.expand(batch + (n,)).reshape(n_problems, n)  # every problem's c: lambda = alpha z
    point = evaluate(None, c_all, s_b + gram_times(c_all))
    # first-order phase: steepest ascent on D, each step of length set by the exact curvature of D
    # along the gradient, r^T G r / (r^T G r / alpha + Var_p(G r)).  A step costs one product with G,
    # a Newton step an n x n factorization, so these pay while they converge fast.  A step that would
    # raise the merit is undone; the phase ends once half the problems gain less than CAUCHY_RATE
    # per step (converged problems count as slow)
    tiny = torch.finfo(point.merit.dtype).tiny
    for _ in range(CAUCHY_STEPS if c_all.device.type == "cpu" and n >= CAUCHY_MIN_N else 0):
        p, r, Gr, merit = point.probs, point.residual, point.image, point.merit
        pGr = p * Gr
        mean = pGr.sum(-1)  # E_p[G r]; the curvature below is r^T G r / alpha + Var_p(G r)
        curvature = torch.addcmul((pGr * Gr).sum(-1), mean, mean, value=-1.0).add_(merit, alpha=1.0 / alpha)
        step = (merit / curvature.clamp_min(tiny)).unsqueeze(-1)
        trial = evaluate(None, torch.addcmul(point.coef, step, r, value=-1.0),
                         torch.addcmul(point.scores, step, Gr, value=-1.0))
        gain = trial.merit / merit  # NaN where the merit is 0: neither up nor slow, and such a problem is not stepped
        up = gain >= 1.0
        point = point.where(up, trial) if bool(up.any()) else trial
        if bool(2 * (gain > CAUCHY_RATE).sum() >= n_problems):
            break
    c_all = point.coef
    root_alpha = alpha**0.5
    for _ in range(max_iter + 1):
        active = point.merit > threshold
        if not bool(active.all()):
            if not bool(active.any()):
                return (c_all.reshape(batch + (n,)) @ T).add_(bq, alpha=alpha)
            sel = active.nonzero().squeeze(-1)
            if group is None:
                group = torch.arange(n_problems, device=c_all.device) // n_queries
            rows = sel if rows is None else rows[sel]
            group = group[sel]
            G_rows = G_sets[group]
            point, family, threshold = point.take(sel), family.take(sel), threshold[sel]
        p = point.probs
        # M = I + (a a^T) * (G - h 1^T - 1 h^T), a = sqrt(alpha p), h = G p - (p^T G p) / 2: one buffer, in place
        Gp = gram_times(p)
        h = Gp - 0.5 * (p * Gp).sum(-1, keepdim=True)
        a = root_alpha * p.sqrt()
        if group is None:
            M = (G_rows.unsqueeze(1) - h.view(-1, n_queries, n, 1)).view(-1, n, n)
        else:
            M = G_rows - h.unsqueeze(-1)
        M -= h.unsqueeze(-2)
        M *= a.unsqueeze(-1)
        M *= a.unsqueeze(-2)
        M.diagonal(dim1=-2, dim2=-1).add_(1.0)
        L, _ = torch.linalg.cholesky_ex(M)
        # y = M^{-1} A^T G r (times sqrt(alpha)), by two triangular solves
        Gr = point.image
        rhs = (a * (Gr - (p * Gr).sum(-1, keepdim=True))).unsqueeze(-1)
        y = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, rhs, upper=False), upper=True)
        ay = a * y.squeeze(-1)  # A y / sqrt(alpha) = sqrt(p) y - p sum(sqrt(p) y), with the sqrt(alpha)'s folded in a
        dc = (ay - p * ay.sum(-1, keepdim=True) - point.residual).mul_(alpha)
        point = armijo_step(point, dc, gram_times(dc), evaluate)
        c_all = point.coef if rows is None else c_all.index_copy(0, rows, point.coef)
    raise _not_converged(what, max_iter, point.merit.max().sqrt())


def newton_dense(bq, T, family, alpha, tol, max_iter, what):
    """Textbook Newton in ``lambda`` with ``d x d`` Cholesky solves (the reference for benchmarks)."""
    s_b = scores(bq, T, alpha, "b")
    steps = LS_RHO ** torch.arange(LS_STEPS, dtype=bq.dtype, device=bq.device)
    lam = (alpha * (bq - family.prior(s_b) @ T)).expand(family.probs(s_b).shape[:-1] + bq.shape[-1:]).clone()
    threshold = torch.clamp(rounding_floor(bq, T, alpha), min=tol)
    eye = torch.eye(T.shape[-1], dtype=T.dtype, device=T.device)
    Tq = T.unsqueeze(-3)
    for _ in range(max_iter + 1):
        s = lam @ T.mT
        p, S = family.hessian(s)
        grad = bq - lam / alpha - p @ T
        grad_norm = grad.norm(dim=-1)
        active = grad_norm > threshold
        if not bool(active.any()):
            return lam
        L = torch.linalg.cholesky(eye / alpha + Tq.mT @ S @ Tq)
        dlam = torch.cholesky_solve(grad.unsqueeze(-1), L).squeeze(-1) * active.unsqueeze(-1)
        candidates = steps.view((-1,) + (1,) * lam.ndim)
        grad_at = bq - (lam + candidates * dlam) / alpha - family.probs(s + candidates * (dlam @ T.mT)) @ T
        t = select_step((grad_at * grad_at).sum(-1), grad_norm**2, steps)
        lam = lam + t.unsqueeze(-1) * dlam
    raise _not_converged(what, max_iter, grad_norm.max())


def implicit_gradient(lam, bq, T, family, alpha):
    r"""Attach :math:`d\lambda^*=(I/\alpha+T^\top ST)^{-1}\,\partial_\theta\nabla D\,d\theta` to ``lam``.

    ``lam`` is the detached maximizer; the value returned equals it exactly, and its gradient with
    respect to ``bq``, ``T`` and the family's tensors is the implicit-function-theorem one.  With
    :math:`T^\top=Q_TR`, :math:`(I/\alpha+T^\top ST)^{-1}=\alpha(I-Q_TQ_T^\top)+Q_T(I/\alpha+RSR^\top)^{-1}Q_T^\top`.
    """
    grad = bq - lam / alpha - family.probs(lam @ T.mT) @ T  # ~0 in value, carries the graph
    with torch.no_grad():
        Td = T.detach()
        Q, R = torch.linalg.qr(Td.mT)
        _, S = family.detached().hessian(lam @ Td.mT)
        Rq = R.unsqueeze(-3)
        eye = torch.eye(R.shape[-2], dtype=R.dtype, device=R.device) / alpha
        H = eye + Rq @ S @ Rq.mT
    a = grad @ Q
    inner = torch.linalg.solve(H, a.unsqueeze(-1)).squeeze(-1)
    w = alpha * (grad - a @ Q.mT) + inner @ Q.mT
    return lam + (w - w.detach())


def solve(bq, T, family, alpha, tol, max_iter, method, what):
    """The maximizer of the dual of ``family`` for ``bq`` (query layout), with its implicit gradient.

    ``method`` is checked here; ``what`` names the public function in a convergence error.
    """
    check_choice(method, "method", METHODS)
    if method == "gram" and not isinstance(family, KLFamily):
        raise ValueError("method='gram' is for the KL dual (9) only; use 'auto', 'span' or 'dense'")
    if method == "auto":  # Gram-space Newton unless the QR basis is smaller (more templates than dimensions)
        method = "gram" if isinstance(family, KLFamily) and T.shape[-2] <= T.shape[-1] else "span"
    solvers = {"gram": newton_gram, "span": newton_span, "dense": newton_dense}
    batch = torch.broadcast_shapes(bq.shape[:-1], T.shape[:-2] + (1,), family.batch_shape())
    with torch.no_grad():
        bd, Td, fd = bq.detach(), T.detach(), family.detached()
        if T.device.type == "meta" or batch.numel() * T.shape[-1] == 0:
            # no values to iterate on (meta tensors) or no problem to solve (an empty batch, d = 0):
            # the starting point alpha z of eq. (16) has the result's shape, dtype and device
            lam = (alpha * (bd - fd.prior(bd @ Td.mT) @ Td)).expand(batch + bq.shape[-1:])
        else:
            lam = solvers[method](bd, Td, fd, alpha, tol, max_iter, what)
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (bq, T) + family.tensors())
    return implicit_gradient(lam, bq, T, family, alpha) if needs_grad else lam


# ----------------------------------------------------------------------------------------------
# a Gaussian preference: the dual maximizer in closed form (Sec. 5, eq. 15)
# ----------------------------------------------------------------------------------------------


def gaussian_lambda(mu, b, alpha, cov):
    r"""The dual maximizer :math:`\lambda^*=\alpha(I+\alpha\Sigma)^{-1}(b-\mu)` of eq. (15).

    ``cov=None`` stands for :math:`\Sigma=I`, where :math:`\lambda^*=\alpha(b-\mu)/(1+\alpha)`.  The
    arguments come checked (``attnopt.fenchel._checks.gaussian_args``).
    """
    if cov is None:
        return alpha / (1.0 + alpha) * (b - mu)
    d = mu.shape[-1]
    work = torch.float32 if mu.dtype in (torch.float16, torch.bfloat16) else mu.dtype  # no half-precision solve
    eye = torch.eye(d, dtype=work, device=mu.device)
    # solve_ex: no host read for the error check (I + alpha cov has eigenvalues >= 1 for a checked cov)
    lam = alpha * torch.linalg.solve_ex(eye + alpha * cov.to(work), (b - mu).to(work).unsqueeze(-1))[0].squeeze(-1)
    return lam.to(mu.dtype)
