"""Engine of continuous sparsemax: the custom autograd function, its backward pass from the saved
moments (see :mod:`attnopt._continuous_quadrature` for the method), and the entry point from validated,
flattened arguments."""

from __future__ import annotations

import math
import warnings

import torch
from torch.autograd.function import once_differentiable

from ._continuous_quadrature import BALL_Z, Rule, psd_factor, sparsemax_moments
from ._numerics import symmetric_part
from ._validation import host_reads_allowed


def sparsemax_grads(grad_r, mu, saved):
    """``(dL/dmu, dL/dS)`` from the saved moments (see the comment at the head of this section)."""
    M, lemma1, minus_lam, U0, U1, U2, *route2 = saved
    D = mu.shape[-1]
    Z1, Z2 = BALL_Z[D]
    eye = torch.eye(D, dtype=mu.dtype, device=mu.device)
    # route 1: 2 (-lambda) M^{-T} sum_j g_j U1_j and (-lambda) M^{-T} sum_j g_j (U2_j - (U0_j - tr U2_j) I / 2) M^{-1}
    g1 = torch.where(lemma1, grad_r, 0.0)
    V1 = torch.einsum("bn,bnd->bd", g1, U1)
    trU2 = torch.diagonal(U2, dim1=-2, dim2=-1).sum(-1)
    Q = torch.einsum("bn,bnde->bde", g1, U2) - 0.5 * torch.einsum("bn,bn->b", g1, U0 - trU2)[:, None, None] * eye
    has1 = lemma1.any(-1)[:, None, None]
    M_inv = torch.where(has1, torch.linalg.solve_triangular(torch.where(has1, M, eye), eye, upper=False), 0.0)
    grad_mu = 2.0 * minus_lam[:, None] * (M_inv.transpose(-1, -2) @ V1.unsqueeze(-1)).squeeze(-1)
    grad_S = minus_lam[:, None, None] * (M_inv.transpose(-1, -2) @ Q @ M_inv)
    if route2:
        W0, W1, X0, X1, X2, K0, K1, K2, stiff2, d, Sinv, bidx, sel = route2
        g = grad_r.reshape(-1)
        g2 = torch.where(sel, g, 0.0) if sel.dtype == torch.bool else g[sel]
        Mp = M[bidx]  # (p, D, D)
        outer = lambda x, y: x.unsqueeze(-1) * y.unsqueeze(-2)  # noqa: E731
        # route 2, soft pairs, per pair: E_w[grad psi_j] and Z2 / (8 Z1) E_w2[Hess psi_j], with grad psi_j =
        # Sigma_j^{-1} e psi_j and Hess psi_j = (Sigma_j^{-1} e e^T Sigma_j^{-1} - Sigma_j^{-1}) psi_j, e = mu_j - t
        # = d - M u: no M^{-1}, but the Hessian's terms cancel by about a_1 (psi_j narrow along a direction)
        MW1 = (Mp @ W1.unsqueeze(-1)).squeeze(-1)
        MX1 = (Mp @ X1.unsqueeze(-1)).squeeze(-1)
        e_w = d * W0[:, None] - MW1  # E_w[e f]
        ee = X0[:, None, None] * outer(d, d) - outer(d, MX1) - outer(MX1, d) + Mp @ X2 @ Mp.transpose(-1, -2)
        mu_soft = (Sinv @ e_w.unsqueeze(-1)).squeeze(-1)
        S_soft = (Z2 / (8.0 * Z1)) * (Sinv @ ee @ Sinv - X0[:, None, None] * Sinv)
        # stiff pairs (a_2 >= 1, M invertible; moved here from the tails of Lemma 1): the first form, from the
        # means K of u^k f over the ball, -lambda det M = 1 / Z1: U_k = vol det M K_k
        vol = 2.0 if D == 1 else math.pi
        Mp_inv = torch.linalg.solve_triangular(torch.where(stiff2[:, None, None], Mp, eye), eye, upper=False)
        mu_stiff = (2.0 * vol / Z1) * (Mp_inv.transpose(-1, -2) @ K1.unsqueeze(-1)).squeeze(-1)
        trK2 = torch.diagonal(K2, dim1=-2, dim2=-1).sum(-1)
        S_stiff = (vol / Z1) * (Mp_inv.transpose(-1, -2) @ (K2 - 0.5 * (K0 - trK2)[:, None, None] * eye) @ Mp_inv)
        mu_pair = torch.where(stiff2[:, None], mu_stiff, mu_soft)
        S_pair = torch.where(stiff2[:, None, None], S_stiff, S_soft)
        grad_mu = grad_mu.index_add(0, bidx, g2[:, None] * mu_pair)
        grad_S = grad_S.index_add(0, bidx, g2[:, None, None] * S_pair)
    return grad_mu, symmetric_part(grad_S)


class ContinuousSparsemaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mu, S, M, centers, cov, rule):
        r, saved, info = sparsemax_moments(mu, M, centers, cov, rule)
        if info is not None:
            bad = {k: v for k, v in info.items() if isinstance(v, dict) and v["unconverged"]}
            if bad:
                worst = max(v["max_error_estimate"] for v in bad.values())
                count = sum(v["unconverged"] for v in bad.values())
                warnings.warn(
                    f"continuous_sparsemax: the adaptive angular rule reached max_quadrature={rule.max_quadrature} "
                    f"nodes for {count} of {info['pairs']} (batch, basis) pairs; largest error estimate "
                    f"{worst:.1e} (relative), tol={rule.tol:.1e}",
                    RuntimeWarning,
                    stacklevel=4,
                )
        ctx.save_for_backward(mu, *saved)
        return r

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_r):
        mu, *saved = ctx.saved_tensors
        grad_mu, grad_S = sparsemax_grads(grad_r, mu, saved)
        return grad_mu, grad_S, None, None, None, None


def sparsemax_from_S(mu_f, S, centers, cov, n_quadrature, tol, max_quadrature, M=None):
    """Continuous sparsemax for validated ``(B, D)`` means and ``S = (D + 4) V`` in the compute dtype
    (``M``: a lower-triangular factor of ``S`` computed more accurately than from ``S``, if any)."""
    if mu_f.shape[0] == 0:
        return mu_f.new_zeros((0, centers.shape[0]))
    rule = Rule(n_quadrature, tol, max_quadrature, not host_reads_allowed(mu_f, S))
    M = psd_factor(S.detach()) if M is None else M
    return ContinuousSparsemaxFn.apply(mu_f, S, M, centers, cov, rule)
