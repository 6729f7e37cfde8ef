r"""The engine of :func:`attnopt.transforms.one_sided_eot`: a reference solver that needs only :math:`\omega'`.

For a separable strictly convex :math:`\Omega(p)=\sum_j\omega_j(p_j)`, the minimizer of
:math:`\sum_jC_jp_j+\varepsilon\Omega(p)` over the simplex satisfies
:math:`p_j=(\omega_j')^{-1}((\lambda-C_j)/\varepsilon)` clipped to :math:`[0,1]`, increasing in the
multiplier :math:`\lambda` of :math:`\sum_jp_j=1`.  :func:`solve_one_sided` finds :math:`\lambda` by
bisection and, inside, inverts :math:`\omega'` by bisection: it never calls a closed form, so the
closed forms of :mod:`attnopt.transforms` can be tested against it.  :class:`OneSidedEOTFunction`
differentiates the solution by the implicit function theorem, again with :math:`\omega''` only.

References:
    MTandHJ (2025), blog note on Litman (2025), eqs. (4) and (13).  Boyd and Vandenberghe (2004),
    *Convex Optimization*, Sec. 5.5.3 (the KKT conditions).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import Function

from ._thresholds import entmax_vjp


def regularizer_gradient(regularizer, alpha: float, log_prior: torch.Tensor | None) -> Callable:
    r"""Return :math:`\omega'` for a separable :math:`\Omega(p)=\sum_j\omega_j(p_j)`."""
    if callable(regularizer):
        return regularizer
    if regularizer == "entropy":  # omega = p log p
        return lambda p: torch.log(p) + 1
    if regularizer in ("sparsemax", "l2"):  # omega = p^2 / 2
        return lambda p: p
    if regularizer == "tsallis":  # omega = (p^alpha - p) / (alpha (alpha - 1))
        return lambda p: (alpha * p ** (alpha - 1) - 1) / (alpha * (alpha - 1))
    if regularizer == "kl":  # omega_j = p log(p / pi_j)
        return lambda p: torch.log(p) - log_prior + 1
    raise ValueError(
        f"regularizer must be 'entropy', 'sparsemax'/'l2', 'tsallis', 'kl' or a callable giving "
        f"the elementwise gradient of a separable strictly convex Omega; got {regularizer!r}"
    )


def solve_one_sided(cost: torch.Tensor, eps: float, grad_omega: Callable, active: torch.Tensor, n_iter: int) -> torch.Tensor:
    r"""Nested bisection on the KKT conditions, using nothing but :math:`\omega'`.

    Stationarity gives :math:`p_j(\lambda) = (\omega_j')^{-1}((\lambda - C_j)/\varepsilon)`
    clipped to :math:`[0,1]`, increasing in the multiplier :math:`\lambda` of
    :math:`\sum_j p_j = 1`.  The inner bisection inverts :math:`\omega'` on :math:`[0,1]`; the
    outer one finds :math:`\lambda`.  Bracket: at :math:`\lambda_{hi}=\min_j C_j+\varepsilon\omega_j'(1)`
    some :math:`p_j\ge1`; at :math:`\lambda_{lo}=\min_j C_j+\varepsilon\omega_j'(1/n)` all
    :math:`p_j\le 1/n`.
    """
    c = torch.where(active, cost, torch.zeros_like(cost))
    n = active.sum(dim=-1, keepdim=True).clamp(min=1).to(c.dtype)
    big = torch.finfo(c.dtype).max

    def omega_prime(p):
        return grad_omega(p).expand_as(c)

    at_one = c + eps * omega_prime(torch.ones_like(c))
    at_uniform = c + eps * omega_prime((1 / n).expand_as(c))
    lam_hi = torch.where(active, at_one, torch.full_like(c, big)).amin(dim=-1, keepdim=True)
    lam_lo = torch.where(active, at_uniform, torch.full_like(c, big)).amin(dim=-1, keepdim=True)

    def primal(lam):
        target = (lam - c) / eps
        lo = torch.zeros_like(c)
        hi = torch.ones_like(c)
        for _ in range(n_iter):
            mid = (lo + hi) / 2
            below = omega_prime(mid) <= target
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        # The lower end is exactly 0 for coordinates off the support.
        return torch.where(active, lo, torch.zeros_like(lo))

    for _ in range(n_iter):
        mid = (lam_lo + lam_hi) / 2
        under = primal(mid).sum(dim=-1, keepdim=True) <= 1
        lam_lo = torch.where(under, mid, lam_lo)
        lam_hi = torch.where(under, lam_hi, mid)
    p = primal((lam_lo + lam_hi) / 2)
    total = p.sum(dim=-1, keepdim=True)
    return p / torch.where(total > 0, total, torch.ones_like(total))


class OneSidedEOTFunction(Function):
    r""":func:`solve_one_sided` with the gradient of the implicit function theorem on its KKT system.

    Twice differentiable: in a double backward :math:`\Omega''` stays a differentiable function of
    the solution, so autograd differentiates the backward pass itself (checked by
    ``gradgradcheck``).
    """

    @staticmethod
    def forward(ctx, cost, eps, grad_omega, active, n_iter):
        p = solve_one_sided(cost, eps, grad_omega, active, n_iter)
        ctx.eps = eps
        ctx.grad_omega = grad_omega
        ctx.save_for_backward(p)
        ctx.graph_inputs = (cost,)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        # Implicit function theorem on the KKT system: dp/dC = -(diag(h) - h h^T / sum h) / eps
        # with h = 1 / omega''(p) on the support, omega'' obtained by autograd of omega'.
        # In a double backward (create_graph=True, so grad mode is on here) omega'' stays a
        # differentiable function of p, and autograd differentiates this whole expression.
        on = p > 0
        create = torch.is_grad_enabled()
        with torch.enable_grad():
            q = torch.where(on, p, torch.full_like(p, 0.5))
            if not (create and q.requires_grad):
                q = q.detach().requires_grad_(True)
            (second,) = torch.autograd.grad(ctx.grad_omega(q).expand_as(q).sum(), q, create_graph=create)
        h = torch.where(on, 1 / second, torch.zeros_like(p))
        return -entmax_vjp(h, grad) / ctx.eps, None, None, None, None


def one_sided_plan(cost: torch.Tensor, eps: float, regularizer, alpha: float = 1.5, n_iter: int = 60,
                   active: torch.Tensor | None = None, log_prior: torch.Tensor | None = None) -> torch.Tensor:
    r"""The solution of :math:`\min_{p\in\Delta}\sum_jC_jp_j+\varepsilon\Omega(p)` along the last
    dimension of a checked ``float64`` cost, differentiable (:class:`OneSidedEOTFunction`).

    ``active`` (default: the finite costs) marks the keys that may carry mass; ``regularizer`` is
    one of :func:`regularizer_gradient`'s names or :math:`\omega'` itself."""
    active = torch.isfinite(cost) if active is None else active
    grad_omega = regularizer_gradient(regularizer, alpha, log_prior)
    return OneSidedEOTFunction.apply(cost, eps, grad_omega, active, n_iter)
