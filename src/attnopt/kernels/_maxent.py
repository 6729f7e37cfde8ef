r"""The engine of :func:`attnopt.kernels.maximum_entropy_tilt`: Newton's method on the convex dual.

The maximum-entropy problem of Thm. 14 of Vuckovic, Baratin and Tachet des Combes (2020) has the
solution :math:`\Psi_G(\nu)`, :math:`G(y)=e^{\langle\lambda,k(y)\rangle}`, where :math:`\lambda`
minimises the convex dual :math:`\lambda\mapsto\log\nu(e^{\langle\lambda,k\rangle})-\langle\lambda,f\rangle`,
whose gradient is the moment error :math:`\Psi_G(\nu)(k)-f` and Hessian the covariance of :math:`k`
under :math:`\Psi_G(\nu)`.

References:
    Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Thm. 14.
    Nocedal and Wright (2006), *Numerical Optimization*, Sec. 3.1 (backtracking line search).
"""

from __future__ import annotations

import torch


def newton_tilt(log_weights, statistics, target, lam, max_iter: int, tol: float) -> torch.Tensor:
    """The multiplier :math:`\\lambda` after at most ``max_iter`` Newton steps with batched backtracking.

    ``log_weights (..., N)`` is :math:`\\log\\nu`, ``statistics (..., N, l)`` the values :math:`k(y_j)`,
    ``target (..., l)`` the moments :math:`f`, ``lam (..., l)`` the start; the iteration stops once
    every moment error is at most ``tol``.
    """
    k, f, logw = statistics, target, log_weights
    steps = 0.5 ** torch.arange(0, 30, dtype=k.dtype, device=k.device)  # candidate step sizes
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)

    def dual(lmb):  # (..., l) -> (...)
        return torch.logsumexp(logw + (k @ lmb.unsqueeze(-1)).squeeze(-1), dim=-1) - (lmb * f).sum(-1)

    for _ in range(max_iter):
        p = torch.softmax(logw + (k @ lam.unsqueeze(-1)).squeeze(-1), dim=-1)
        mean = (p.unsqueeze(-1) * k).sum(-2)
        grad = mean - f
        if grad.abs().max() <= tol:
            break
        centred = k - mean.unsqueeze(-2)
        hess = (p.unsqueeze(-1) * centred).transpose(-2, -1) @ centred
        ridge = 1e-12 * hess.diagonal(dim1=-2, dim2=-1).amax(-1).clamp_min(1.0)
        direction = -torch.linalg.solve(hess + ridge[..., None, None] * eye, grad.unsqueeze(-1)).squeeze(-1)
        # Armijo backtracking, all candidate steps at once: (S, ..., l).
        cand = lam.unsqueeze(0) + steps.view(-1, *([1] * lam.ndim)) * direction.unsqueeze(0)
        vals, current = dual(cand), dual(lam)
        # Near the solution the decrease of a Newton step is below the rounding error of the dual's
        # value, and an exact Armijo test would reject every step: allow a few ulps of slack.
        slack = 8 * torch.finfo(k.dtype).eps * (1 + current.abs())
        ok = vals <= (current + slack).unsqueeze(0) + 1e-4 * steps.view(-1, *([1] * (lam.ndim - 1))) * (grad * direction).sum(-1)
        first = torch.where(ok.any(0), ok.int().argmax(0), torch.full_like(ok[0], steps.numel() - 1, dtype=torch.long))
        lam = torch.gather(cand, 0, first.view(1, *first.shape, 1).expand(1, *lam.shape)).squeeze(0)
    return lam
