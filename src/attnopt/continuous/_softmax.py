r"""Engine of continuous softmax (:func:`attnopt.continuous.continuous_softmax`): the closed form
:math:`r_j=\mathcal N(\mu;\mu_j,\Sigma+\Sigma_j)` (Farinhas, 2021, eq. (4.10)) as an autograd function whose
backward pass differentiates it in :math:`S_j=\Sigma+\Sigma_j` (no :math:`\Sigma^{-1}`)."""

from __future__ import annotations

import math

import torch

from .._numerics import differentiable_once, symmetric_part


def chol_inverse(L: torch.Tensor) -> torch.Tensor:
    """``(L L^T)^{-1}`` from the Cholesky factor ``L``, without host reads."""
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
    L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
    return L_inv.transpose(-1, -2) @ L_inv


class ContinuousSoftmaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mu, Sigma, centers, cov):
        # mu (B, D), Sigma (B, D, D) PSD, centers (N, D), cov (N, D, D) SPD
        d = mu.shape[-1]
        S = Sigma.unsqueeze(-3) + cov  # (B, N, D, D): S_j = Sigma + Sigma_j, SPD
        diff = mu.unsqueeze(-2) - centers  # (B, N, D): mu - mu_j
        if d == 2:  # the 2x2 inverse in closed form: batched LAPACK calls on tiny matrices are slow
            a, b, c = S[..., 0, 0], S[..., 0, 1], S[..., 1, 1]
            det = a * c - b * b
            S_inv = torch.stack([torch.stack([c, -b], -1), torch.stack([-b, a], -1)], -2) / det[..., None, None]
            half_logdet = 0.5 * torch.log(det)
        else:
            Ls = torch.linalg.cholesky_ex(S)[0]
            S_inv = chol_inverse(Ls)
            half_logdet = torch.log(torch.diagonal(Ls, dim1=-2, dim2=-1)).sum(-1)
        w = (S_inv @ diff.unsqueeze(-1)).squeeze(-1)  # S^{-1}(mu - mu_j)
        quad = (diff * w).sum(-1)
        r = torch.exp(-0.5 * quad - half_logdet - 0.5 * d * math.log(2 * math.pi))  # eq. (4.10)
        ctx.save_for_backward(S_inv, w, r)
        ctx.graph_inputs = (mu, Sigma, centers, cov)  # a second derivative raises (differentiable_once)
        return r

    @staticmethod
    @differentiable_once
    def backward(ctx, grad_r):
        S_inv, w, r = ctx.saved_tensors
        # r_j = N(mu; mu_j, S_j), S_j = Sigma + Sigma_j: dr_j/dmu = -r_j w_j and
        # dr_j/dSigma = dr_j/dS_j = r_j (w_j w_j^T - S_j^{-1}) / 2, w_j = S_j^{-1}(mu - mu_j); no Sigma^{-1},
        # so Sigma may be singular (eqs. (4.11)-(4.12) chained to (mu, Sigma) give the same)
        gs = grad_r * r
        grad_mu = -torch.einsum("bn,bnd->bd", gs, w)
        outer = w.unsqueeze(-1) * w.unsqueeze(-2)
        grad_Sigma = 0.5 * torch.einsum("bn,bnde->bde", gs, outer - S_inv)
        return grad_mu, symmetric_part(grad_Sigma), None, None


def softmax_flat(mu_f, Sigma_f, centers, cov):
    if mu_f.shape[0] == 0:
        return mu_f.new_zeros((0, centers.shape[0]))
    return ContinuousSoftmaxFn.apply(mu_f, Sigma_f, centers, cov)
