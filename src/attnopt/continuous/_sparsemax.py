r"""Engine of continuous sparsemax (:func:`attnopt.continuous.continuous_sparsemax`): the forward pass
(:func:`sparsemax_moments`, which routes each (batch, basis) pair to the quadrature of
:mod:`attnopt.continuous._quadrature` or of :mod:`attnopt.continuous._slices`), the backward pass from
the saved moments, and the custom autograd function.

The method (Farinhas, 2021, Appendix A.2 and Alg. 4), in the notation of the code:

Write the support E = {t : p(t) > 0} as t = mu + M u, |u| <= 1, with M M^T = S := -2 lambda Sigma
= (D + 4) V, V the covariance of p (Thm. 1).  M is the lower-triangular factor of S: for an SPD
scale Sigma it is sqrt(-2 lambda) chol(Sigma); for a singular covariance (a density on a segment, or
the point mass V = 0) it is still defined, and M = 0 at the point mass.  Then p(t) dt = w(u) du with
w = (1 - |u|^2) / Z1 on the unit ball (eq. (3.14)), and
    r_j = E_w[psi_j(mu + M u)],  psi_j(mu + M u) = psi_j(mu) exp(-u^T A_j u / 2 + b_j^T u),
    A_j = M^T Sigma_j^{-1} M,  b_j = M^T Sigma_j^{-1} (mu_j - mu),
with no inverse of M: A_j, b_j -> 0 as M -> 0 and r_j -> psi_j(mu).  Each pair (b, j) takes one of
two routes, chosen by the smallest eigenvalue a_2 of A_j (psi_j narrower than the ellipse in every
direction, or not):

* Lemma 1 (a_2 >= STIFF): N(t; mu_j, Sigma_j) dt = N(u; mu~_j, Sigma~_j) du with Sigma~_j = A_j^{-1},
  mu~_j = A_j^{-1} b_j (Lemma 1 of App. A.2), and everything follows from the moments over the disk
      U0_j = int N(u),   U1_j = int u N(u),   U2_j = int u u^T N(u):
      r_j = -lambda (U0_j - tr U2_j)                                              (A.15)
  In 2D they are integrals in polar coordinates u = rho a(phi): the radial integral is in closed form
  (eqs. A.18-A.22, A.31, A.34, A.40), the angular one uses the periodic trapezoid rule, which
  converges geometrically for smooth periodic integrands.  The closed forms lose accuracy as A_j gets
  small (the Gaussian N(u; mu~, Sigma~) becomes flat and far), which is why the route is kept for
  a_2 >= 1.  Backward, by differentiating under the integral (p = 0 on the boundary of E; the
  covariance (A.24)-(A.25) of eq. (3.20), written in S instead of theta):
      dr_j/dmu = 2 (-lambda) M^{-T} U1_j,   dr_j/dS = (-lambda) M^{-T} (U2_j - (U0_j - tr U2_j) I / 2) M^{-1}.
* slices (a_2 < STIFF, and Lemma-1 pairs in the tails, where the radial closed forms cancel): Cartesian
  slices of the disk in a frame (v_i, v_o): the outer direction v_o is the stiff eigenvector of A_j
  (or b_j when both are soft), integrated by the periodic trapezoid rule in theta, v_o = sin theta, on
  a window of angles; the inner one by Gauss-Legendre on each chord, or on the window of the chord
  where a stiff inner factor is not negligible.  The exponent is written around an anchor point (the
  centre along stiff axes) at which log psi_j is evaluated directly, so that no large terms cancel.
  The moments E_w[{1, u} f_j] and E_w2[{1, u, uu^T} f_j], f_j = psi_j(mu + M u), w2 = (1 - |u|^2)^2 / Z2,
  give the backward pass without M^{-1}:
      dr_j/dmu = E_w[grad psi_j] = Sigma_j^{-1} ((mu_j - mu) E_w f_j - M E_w[u f_j]),
      dr_j/dS  = Z2 / (8 Z1) E_w2[Hess psi_j]
  (integrating (1 - |u|^2) u = -grad (1 - |u|^2)^2 / 4 by parts: w2 vanishes on the sphere); for the
  stiff pairs, whose Hessian terms would cancel, the Lemma-1 formulas from the unweighted means.
The gradient w.r.t. S is chained to Sigma (S = -2 lambda(Sigma) Sigma) or to V (S = (D + 4) V) by
autograd outside the Function.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch

from ._quadrature import (
    BALL_Z,
    FAR,
    READ_FREE_ANISOTROPY,
    STIFF,
    ball_moments_1d,
    ball_moments_2d_entries,
    eig2,
    eig_small,
    gather_pairs,
    lemma1_adaptive,
    lemma1_masks,
    lemma1_pair_2d,
    lemma1_read_free,
    moments_from_entries,
    pair_terms,
    psd_factor,
)
from ._slices import (
    GL_READ_FREE_VARIATION,
    GL_VARIATION,
    slice_bounds_1d,
    slice_bounds_2d,
    slice_quadrature_1d,
    slice_quadrature_2d,
    slice_setup_1d,
    slice_setup_2d,
)
from .._numerics import differentiable_once, symmetric_part
from .._validation import host_reads_allowed


class DiskMoments(NamedTuple):
    r"""What the backward pass keeps of the Lemma-1 route, ``(B, ...)`` tensors: the factor ``M`` of
    :math:`S`, the ``(B, N)`` mask of the pairs on the route, :math:`-\lambda` (0 for a batch with no such
    pair) and the moments :math:`U_0, U_1, U_2` over the disk (0 off the route)."""

    M: torch.Tensor
    on_route: torch.Tensor
    minus_lam: torch.Tensor
    U0: torch.Tensor
    U1: torch.Tensor
    U2: torch.Tensor


class SliceMoments(NamedTuple):
    r"""What the backward pass keeps of the slice route, one row per pair taken by it: the means over the
    disk ``W`` (weight :math:`w`) and ``X`` (weight :math:`w_2`) of :math:`\{1, u, uu^\top\}f_j`, the
    unweighted means ``K`` (for the stiff pairs), the mask of those stiff pairs, :math:`\mu_j-\mu`,
    :math:`\Sigma_j^{-1}`, the batch index of each pair and the pairs' selection (a ``(B N,)`` mask on
    the read-free path, their flat indices otherwise)."""

    W0: torch.Tensor
    W1: torch.Tensor
    X0: torch.Tensor
    X1: torch.Tensor
    X2: torch.Tensor
    K0: torch.Tensor
    K1: torch.Tensor
    K2: torch.Tensor
    stiff: torch.Tensor
    offset: torch.Tensor
    Sigma_inv: torch.Tensor
    batch_index: torch.Tensor
    selection: torch.Tensor


class SavedMoments(NamedTuple):
    """The tensors the backward pass needs: the Lemma-1 route's, and the slice route's (``None``
    when no pair takes it)."""

    disk: DiskMoments
    slices: SliceMoments | None

    def flat(self) -> tuple:
        return tuple(self.disk) + (() if self.slices is None else tuple(self.slices))

    @classmethod
    def from_flat(cls, tensors) -> "SavedMoments":
        n = len(DiskMoments._fields)
        return cls(DiskMoments(*tensors[:n]), SliceMoments(*tensors[n:]) if len(tensors) > n else None)


class Rule(NamedTuple):
    """How the moments are integrated: ``n_quadrature`` (``None``: adaptive), ``tol``, ``max_quadrature``,
    and ``read_free`` (no host reads: fixed refinement instead of the adaptive loop)."""

    n_quadrature: int | None
    tol: float
    max_quadrature: int
    read_free: bool


def _empty_info():
    keys = ("closed_form", "skipped", "quadrature", "rounds", "nodes", "unconverged")
    return {"lemma1": dict.fromkeys(keys, 0) | {"max_error_estimate": 0.0},
            "slices": dict.fromkeys(keys[1:], 0) | {"chord_nodes": 0, "max_error_estimate": 0.0}}


def _routes(pairs, D, rule):
    r"""``(stiff, movable, a1, angle)``: the ``(B, N)`` masks of the pairs whose :math:`\psi_j` is narrower
    than the ellipse in every direction (:math:`a_2\ge1`, which makes :math:`M` invertible: the route of
    Lemma 1) and of those among them that the chords of the slice route can take (see
    :func:`lemma1_masks` for the ones moved there); the largest eigenvalue of :math:`A_j`, and the angle
    of its eigenvector (2D)."""
    if D == 1:
        a1 = a2 = pairs["A00"]
        stiff = a2 >= STIFF
        v_max = GL_READ_FREE_VARIATION if rule.read_free else GL_VARIATION[-1]
        return stiff, stiff & (0.5 * a2 + pairs["b0"].abs() <= v_max), a1, None
    # in 2D the chords of the slice route are windowed: they take any pair
    a1, a2, angle = eig2(pairs["A00"], pairs["A01"], pairs["A11"], pairs["detA"])
    return a2 >= STIFF, a2 >= STIFF, a1, angle


def sparsemax_moments(mu, M, centers, cov, rule):
    r"""Forward of continuous sparsemax for the lower-triangular factor ``M`` (``(B, D, D)``) of
    :math:`S=MM^\top=-2\lambda\Sigma=(D+4)V`.

    Returns ``(r, saved, info)``: ``r`` ``(B, N)``, the :class:`SavedMoments` the backward pass needs, and the
    diagnostics (``None`` on the read-free path).
    """
    B, D = mu.shape
    N = centers.shape[0]
    P = B * N
    dtype, device = mu.dtype, mu.device
    tol = rule.tol
    detM = torch.diagonal(M, dim1=-2, dim2=-1).prod(-1)  # (B,)
    Z1 = BALL_Z[D][0]
    vol = 2.0 if D == 1 else math.pi  # the volume of the unit ball
    tiny = torch.finfo(dtype).tiny
    pairs = pair_terms(mu, M, centers, cov)
    info = None if rule.read_free else _empty_info() | {"pairs": P}
    stiff, movable, a1, angle = _routes(pairs, D, rule)
    # ---- route 1: Lemma 1 (U moments: masses on the ellipse E, of area |E| = vol det M).  Pairs in the tails
    # whose round-off there could exceed the tolerance go to the slice route instead (see lemma1_masks).
    zero_b = torch.zeros(B, dtype=dtype, device=device)
    if D == 1:
        lemma1 = stiff & ~(movable & (pairs["mt0"].abs() > FAR))
        U0, U1, U2 = ball_moments_1d(torch.where(lemma1, pairs["mt0"], 0.0), 1.0 / torch.where(lemma1, a1, 1.0))
        U0, U1, U2 = (torch.where(lemma1.view(B, N, *([1] * k)), x, 0.0) for k, x in ((0, U0), (1, U1), (2, U2)))
        lb1_route = zero_b
    elif not rule.read_free and not bool(stiff.any()):  # no Lemma-1 pair
        lemma1 = stiff
        U0 = torch.zeros(B, N, dtype=dtype, device=device)
        U1, U2 = U0.new_zeros(B, N, D), U0.new_zeros(B, N, D, D)
        lb1_route = zero_b
    else:
        pair = lemma1_pair_2d(pairs, stiff, all_route=not rule.read_free and bool(stiff.all()))
        U, closed, quad1, lb1_b, lb1_route, tail = lemma1_masks(pair, tol, stiff, zero_b)
        moved = movable & tail
        if rule.read_free:  # needles: the rays would need more angles than the fixed rule has
            moved = moved | (quad1 & (a1 > READ_FREE_ANISOTROPY * eig_small(pairs, a1)))
        lemma1, quad1 = stiff & ~moved, quad1 & ~moved
        if rule.n_quadrature is not None:  # the fixed rule for every pair of the route
            U = torch.where(lemma1.view(-1), ball_moments_2d_entries(pair, rule.n_quadrature).view(6, -1), U)
        elif rule.read_free:
            U = lemma1_read_free(pair, quad1, tol, lb1_b, U, rule.max_quadrature)
        else:
            idx = quad1.view(-1).nonzero().squeeze(-1)
            n_closed = int(closed.sum())
            info["lemma1"].update(closed_form=n_closed, quadrature=idx.numel(),
                                  skipped=int(lemma1.sum()) - n_closed - idx.numel())
            if idx.numel() > 0:
                lemma1_adaptive(pair, idx, tol, lb1_b, closed, U, info, rule.max_quadrature)
        U0, U1, U2 = moments_from_entries(U.view(6, B, N))
    if info is not None and D == 1:
        info["lemma1"]["closed_form"] = int(lemma1.sum())
    # The pairs of the slice route: all of them, masked, without host reads; else their list.
    if rule.read_free:
        sel, mask2 = None, ~lemma1.reshape(-1)
        bidx2 = torch.arange(P, device=device) // N
    else:
        sel, mask2 = (~lemma1).reshape(-1).nonzero().squeeze(-1), None
        bidx2 = sel // N
    n2 = P if sel is None else sel.numel()
    has1 = lemma1.any(-1)
    detM_safe = torch.where(has1, detM, 1.0)
    minus_lam = torch.where(has1, 1.0 / (Z1 * detM_safe), 0.0)  # -lambda = 1 / (Z1 det M)
    trU2 = torch.diagonal(U2, dim1=-2, dim2=-1).sum(-1)
    r = (minus_lam[:, None] * (U0 - trU2)).reshape(-1)  # (A.15)/(A.23)
    # ---- route 2: slices (means over the disk), with s_b at least the Lemma-1 results
    if n2:
        pp = gather_pairs(pairs, sel, B, N)
        if D == 1:
            fr = slice_setup_1d(pp, M[bidx2])
            log_sup, lb2 = slice_bounds_1d(fr)
        else:
            a1_2, angle_2 = (x.reshape(-1) if sel is None else x.reshape(-1)[sel] for x in (a1, angle))
            fr = slice_setup_2d(pp, a1_2, angle_2, M[bidx2])
            log_sup, i_max, lb2 = slice_bounds_2d(pp, fr, a1_2)
        lb2_b = zero_b.scatter_reduce(0, bidx2, lb2 if mask2 is None else torch.where(mask2, lb2, 0.0), "amax")
        ellipse_safe = vol * detM_safe
        floor = torch.maximum(torch.maximum(lb2_b, lb1_route / ellipse_safe),
                              torch.where(lemma1, U0 / ellipse_safe[:, None], 0.0).amax(-1))
        lb_b = floor.clamp_min(math.sqrt(tiny))
        if D == 1:
            E = slice_quadrature_1d(fr, log_sup, lb_b[bidx2], mask2, tol, rule, info)
            one, zero = torch.ones_like(pp["q"]), torch.zeros_like(pp["q"])
            e_i, e_o = one[:, None], zero[:, None]
        else:
            E = slice_quadrature_2d(pp, fr, log_sup, i_max, lb_b[bidx2], mask2, B, bidx2, tol, rule, info)
            e_i, e_o = torch.stack([fr["ei0"], fr["ei1"]], -1), torch.stack([fr["eo0"], fr["eo1"]], -1)
        W0, Wi, Wo, X0, Xi, Xo, Xii, Xio, Xoo, K0, Ki, Ko, Kii, Kio, Koo = E
        outer = lambda x, y: x.unsqueeze(-1) * y.unsqueeze(-2)  # noqa: E731
        io = outer(e_i, e_o) + outer(e_o, e_i)

        def vec(a, b):  # back to u = v_i e_i + v_o e_o
            return a[:, None] * e_i + b[:, None] * e_o

        def mat(a, b, c):
            return a[:, None, None] * outer(e_i, e_i) + b[:, None, None] * io + c[:, None, None] * outer(e_o, e_o)

        W1, X1, X2 = vec(Wi, Wo), vec(Xi, Xo), mat(Xii, Xio, Xoo)
        K1, K2 = vec(Ki, Ko), mat(Kii, Kio, Koo)
        stiff2 = stiff.reshape(-1) if sel is None else stiff.reshape(-1)[sel]
        r = torch.where(mask2, W0, r) if sel is None else r.index_copy(0, sel, W0)
        if D == 1:
            d2 = pp["d0"][:, None]
            Sinv2 = pp["i00"][:, None, None]
        else:
            d2 = torch.stack([pp["d0"], pp["d1"]], -1)
            Sinv2 = torch.stack([torch.stack([pp["i00"], pp["i01"]], -1), torch.stack([pp["i01"], pp["i11"]], -1)], -2)
        slices = SliceMoments(W0, W1, X0, X1, X2, K0, K1, K2, stiff2, d2, Sinv2, bidx2, mask2 if sel is None else sel)
    else:
        slices = None
    saved = SavedMoments(DiskMoments(M, lemma1, minus_lam, U0, U1, U2), slices)
    return r.view(B, N), saved, info


def sparsemax_grads(grad_r: torch.Tensor, mu: torch.Tensor, saved: SavedMoments):
    """``(dL/dmu, dL/dS)`` from the saved moments (see the head of this module)."""
    M, lemma1, minus_lam, U0, U1, U2 = saved.disk
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
    if saved.slices is not None:
        W0, W1, X0, X1, X2, K0, K1, K2, stiff2, d, Sinv, bidx, sel = saved.slices
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
        ctx.save_for_backward(mu, *saved.flat())
        ctx.graph_inputs = (mu, S, M, centers, cov)  # a second derivative raises (differentiable_once)
        return r

    @staticmethod
    @differentiable_once
    def backward(ctx, grad_r):
        mu, *saved = ctx.saved_tensors
        grad_mu, grad_S = sparsemax_grads(grad_r, mu, SavedMoments.from_flat(saved))
        return grad_mu, grad_S, None, None, None, None


def sparsemax_from_S(mu_f, S, centers, cov, n_quadrature, tol, max_quadrature, M=None):
    """Continuous sparsemax for validated ``(B, D)`` means and ``S = (D + 4) V`` in the compute dtype
    (``M``: a lower-triangular factor of ``S`` computed more accurately than from ``S``, if any)."""
    if mu_f.shape[0] == 0:
        return mu_f.new_zeros((0, centers.shape[0]))
    rule = Rule(n_quadrature, tol, max_quadrature, not host_reads_allowed(mu_f, S))
    M = psd_factor(S.detach()) if M is None else M
    return ContinuousSparsemaxFn.apply(mu_f, S, M, centers, cov, rule)
