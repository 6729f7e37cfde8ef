r"""The engines of :mod:`attnopt.continuous` on checked arguments: densities (Farinhas 2021, eqs.
(3.12), (3.14)-(3.15)) and the expectations of the basis functions under continuous softmax and
sparsemax (Algs. 3-4), batched.  A composite that has checked its tensors calls these, not the
public functions, which would check them again (issue 29)."""

from __future__ import annotations

import math

import torch

from .._numerics import compute_dtype, symmetric_part
from ._moments import gaussian_const
from ._softmax import softmax_flat
from ._sparsemax import sparsemax_from_S

#: Relative tolerance of 2D continuous sparsemax's adaptive rule in float64 (``DEFAULT_TOL`` of
#: :mod:`attnopt.continuous`, which documents it).
DEFAULT_TOL = 1e-10


def minus_lambda(L: torch.Tensor) -> torch.Tensor:
    r""":math:`-\lambda=(\kappa_D/\sqrt{\det\Sigma})^{2/(D+2)}` of eq. (3.15), from the Cholesky
    factor ``L`` of :math:`\Sigma`."""
    d = L.shape[-1]
    half_logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    return torch.exp((2.0 / (d + 2)) * (math.log(gaussian_const(d)) - half_logdet))



def default_tol(dtype: torch.dtype) -> float:
    """``DEFAULT_TOL`` in float64; 32 machine epsilons (about 3.8e-6) in float32 and below."""
    return DEFAULT_TOL if dtype == torch.float64 else 32.0 * torch.finfo(torch.float32).eps



def sparsemax_scale(Sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r""":math:`S=-2\lambda\Sigma` (eq. (3.15)) for SPD ``(B, D, D)`` scales, differentiable, without reading
    values, and its factor :math:`M=\sqrt{-2\lambda}\operatorname{chol}\Sigma` (detached: a factor of the
    rounded :math:`S` would lose digits on needle-like scales)."""
    L = torch.linalg.cholesky_ex(Sigma)[0]
    minus_lam = minus_lambda(L)
    S = (2.0 * minus_lam)[:, None, None] * Sigma
    return S, ((2.0 * minus_lam).sqrt()[:, None, None] * L).detach()


def density(t: torch.Tensor, mu: torch.Tensor, Sigma: torch.Tensor, family: str) -> torch.Tensor:
    """:func:`attnopt.continuous.continuous_density` on checked, broadcastable arguments."""
    d = mu.shape[-1]
    L = torch.linalg.cholesky_ex(symmetric_part(Sigma))[0]
    diff = (t - mu).unsqueeze(-1)
    L = L.expand(*diff.shape[:-2], d, d) if L.ndim < diff.ndim else L
    z = torch.linalg.solve_triangular(L, diff, upper=False).squeeze(-1)
    quad = 0.5 * (z * z).sum(-1)
    half_logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    if family == "gaussian":
        return torch.exp(-quad - half_logdet - 0.5 * d * math.log(2 * math.pi))
    return torch.clamp(minus_lambda(L) - quad, min=0.0)


def flatten(mu: torch.Tensor, Sigma: torch.Tensor, basis, batch) -> tuple[torch.Tensor, ...]:
    """``(mu_f (B, D), Sigma_f (B, D, D), centers, cov)``: the batch flattened, in the compute dtype,
    on the device of ``mu``."""
    d = mu.shape[-1]
    cdt = compute_dtype(mu.dtype)
    mu_f = mu.expand(*batch, d).reshape(-1, d).to(cdt)
    Sigma_f = symmetric_part(Sigma.expand(*batch, d, d).reshape(-1, d, d).to(cdt))
    return mu_f, Sigma_f, basis.centers.to(device=mu.device, dtype=cdt), basis.covariance.to(device=mu.device, dtype=cdt)


def softmax_expectations(mu: torch.Tensor, Sigma: torch.Tensor, basis, batch) -> torch.Tensor:
    """:func:`attnopt.continuous.continuous_softmax` on checked arguments of batch shape ``batch``."""
    r = softmax_flat(*flatten(mu, Sigma, basis, batch))
    return r.reshape(*batch, basis.n_basis).to(mu.dtype)


def sparsemax_expectations(mu: torch.Tensor, Sigma: torch.Tensor, basis, batch, n_quadrature=None, tol=None,
                           max_quadrature: int = 4096) -> torch.Tensor:
    """:func:`attnopt.continuous.continuous_sparsemax` on checked arguments (``D`` in {1, 2})."""
    mu_f, Sigma_f, centers, cov = flatten(mu, Sigma, basis, batch)
    tol = default_tol(mu_f.dtype) if tol is None else tol
    S, M = sparsemax_scale(Sigma_f) if mu_f.shape[0] else (Sigma_f, Sigma_f)
    r = sparsemax_from_S(mu_f, S, centers, cov, n_quadrature, tol, max_quadrature, M=M)
    return r.reshape(*batch, basis.n_basis).to(mu.dtype)
