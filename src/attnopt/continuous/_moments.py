"""Moment matching (Farinhas 2021, Theorem 1) and the truncated paraboloid's constants (eqs.
(3.14)-(3.15)), shared by the continuous view and the course's explorers: an engine, so its inputs
arrive checked."""

from __future__ import annotations

import math

import torch

from .._numerics import symmetric_part


def gaussian_const(d: int) -> float:
    r""":math:`\kappa_d=\Gamma(d/2+2)/(2\pi)^{d/2}` of eq. (3.15)."""
    return math.exp(math.lgamma(d / 2 + 2) - (d / 2) * math.log(2 * math.pi))


def paraboloid_scale(var: torch.Tensor) -> torch.Tensor:
    r"""The scale :math:`\Sigma=k^{-(1+D/2)}|V|^{1/2}V` of the truncated paraboloid with covariance ``var``
    (zero for a singular covariance, where :math:`\lambda=-\infty`)."""
    d = var.shape[-1]
    k = gaussian_const(d) ** (2.0 / (d + 2)) / (d / 2 + 2)
    if d == 1:
        det = var[..., 0, 0]
    elif d == 2:
        det = var[..., 0, 0] * var[..., 1, 1] - var[..., 0, 1] * var[..., 1, 0]
    else:
        det = torch.linalg.det(var)
    scale = det.clamp_min(0).sqrt() * k ** (-(1 + d / 2))
    return scale[..., None, None] * var


def match_moments(p: torch.Tensor, locations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of the discrete distribution ``p`` (``(..., L)``, normalized) on ``locations``."""
    mu = torch.einsum("...l,...ld->...d", p, locations)
    centred = locations - mu.unsqueeze(-2)
    var = torch.einsum("...l,...ld,...le->...de", p, centred, centred)
    return mu, symmetric_part(var)
