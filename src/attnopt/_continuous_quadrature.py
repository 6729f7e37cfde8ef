r"""Engine of continuous sparsemax (:func:`attnopt.continuous.continuous_sparsemax`): the moments of
a Gaussian RBF over the ellipse that supports a truncated paraboloid, in 1D and 2D.

:func:`sparsemax_moments` is the forward pass (the quadrature over the disk, routed pair by pair),
and the tensors the backward pass of :mod:`attnopt._continuous_sparsemax` needs.  The method
(Farinhas, 2021, Appendix A.2 and Alg. 4), in the notation of the code:

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

* Lemma 1 (a_2 >= _STIFF): N(t; mu_j, Sigma_j) dt = N(u; mu~_j, Sigma~_j) du with Sigma~_j = A_j^{-1},
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
* slices (a_2 < _STIFF, and Lemma-1 pairs in the tails, where the radial closed forms cancel): Cartesian
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
from typing import NamedTuple

import torch

_SQRT_2PI = math.sqrt(2.0 * math.pi)
_SQRT_HALF = math.sqrt(0.5)

#: Smallest eigenvalue of A_j = M^T Sigma_j^{-1} M from which a pair takes the route of Lemma 1.
_STIFF = 1.0
#: Distance |mu~_j| beyond which a Lemma-1 pair counts as in the tails (see _lemma1_masks).
_FAR = 3.0
#: Z_l = int_{|u| <= 1} (1 - |u|^2)^l du, l = 1, 2, for D = 1, 2.
BALL_Z = {1: (4.0 / 3.0, 16.0 / 15.0), 2: (0.5 * math.pi, math.pi / 3.0)}
#: Refinement rounds of the read-free rule (no host reads): every remaining pair gets m 2^k nodes.
_READ_FREE_ROUNDS = 2
#: Refinement rounds of the read-free rule for the slice route (m 2^k angles), and the depth of its chord
#: windows (a chord rule that resolves an exponent varying by this much).
_READ_FREE_SLICE_ROUNDS = 1
_READ_FREE_DEPTH = 24.0
#: Axis ratio a1 / a2 of A_j above which the read-free rule integrates a Lemma-1 pair by slices.
_READ_FREE_ANISOTROPY = 8.0


def _delta_phi(x_lo: torch.Tensor, x_hi: torch.Tensor) -> torch.Tensor:
    r""":math:`\Phi(\sqrt2 x_{hi})-\Phi(\sqrt2 x_{lo})` for :math:`x_{lo}\le x_{hi}`, without cancellation in the tails."""
    # erfc(x) = 2 - erfc(-x): write erfc(x) = 2 [x < 0] + sign(x) erfc(|x|)
    e_lo = torch.special.erfc(x_lo.abs()).copysign(x_lo)
    e_hi = torch.special.erfc(x_hi.abs()).copysign(x_hi)
    straddle = ((x_lo < 0) & (x_hi >= 0)).to(x_lo.dtype)
    return 0.5 * (e_lo - e_hi) + straddle


def _ball_moments_1d(mu_t: torch.Tensor, var_t: torch.Tensor):
    """Moments of N(u; mu_t, var_t) over [-1, 1]; mu_t (B, N), var_t (B, N)."""
    s = var_t.sqrt()
    lo = (-1.0 - mu_t) / s
    hi = (1.0 - mu_t) / s
    I0 = _delta_phi(lo * _SQRT_HALF, hi * _SQRT_HALF)
    phi_lo = torch.exp(-0.5 * lo * lo) / _SQRT_2PI
    phi_hi = torch.exp(-0.5 * hi * hi) / _SQRT_2PI
    U0 = I0
    U1 = mu_t * I0 + s * (phi_lo - phi_hi)
    U2 = (mu_t * mu_t + var_t) * I0 + s * ((mu_t - 1.0) * phi_lo - (mu_t + 1.0) * phi_hi)
    return U0, U1.unsqueeze(-1), U2[..., None, None]


def psd_factor(S: torch.Tensor) -> torch.Tensor:
    r"""Lower-triangular :math:`M` with :math:`MM^\top=S` for PSD ``(B, D, D)`` matrices, :math:`D\in\{1,2\}`,
    in closed form and defined for singular :math:`S` (:math:`M=0` for :math:`S=0`); a negative
    pivot left by round-off counts as zero."""
    s00 = S[:, 0, 0].clamp_min(0.0)
    l00 = s00.sqrt()
    if S.shape[-1] == 1:
        return l00[:, None, None]
    l10 = torch.where(s00 > 0, S[:, 1, 0] / torch.where(s00 > 0, l00, 1.0), 0.0)
    l11 = (S[:, 1, 1] - l10 * l10).clamp_min(0.0).sqrt()
    zero = torch.zeros_like(l00)
    return torch.stack([torch.stack([l00, zero], -1), torch.stack([l10, l11], -1)], -2)


def _pairs(mu, M, centers, cov):
    r"""Per-pair quantities, ``(B, N)`` tensors (``(N,)`` for those of the basis alone), in closed form.

    With :math:`d_j=\mu_j-\mu`: ``logpsi0`` (:math:`\log\psi_j(\mu)`), ``q``
    (:math:`d_j^\top\Sigma_j^{-1}d_j`), the entries of :math:`A_j=M^\top\Sigma_j^{-1}M` (``A00``, ``A01``,
    ``A11``) and ``detA``, of :math:`b_j=M^\top\Sigma_j^{-1}d_j` (``b0``, ``b1``), of :math:`d_j`
    (``d0``, ``d1``), of :math:`\Sigma_j^{-1}` (``i00``, ``i01``, ``i11``), ``lognorm``
    (:math:`\log\max\psi_j`) and, for the Lemma-1 route,
    of :math:`\tilde\mu_j=M^{-1}d_j` (``mt0``, ``mt1``; inf or NaN where :math:`M` is singular, and then
    unused).  For :math:`D=1` only the ``*0``/``*00`` keys.  ``M`` is lower triangular.
    """
    if mu.shape[-1] == 1:
        m = M[:, 0, 0, None]  # (B, 1)
        v = cov[:, 0, 0]  # (N,)
        i00 = 1.0 / v
        d0 = centers[:, 0] - mu[:, :1]
        w0 = i00 * d0
        q = d0 * w0
        A00 = m * m * i00
        lognorm = -0.5 * torch.log(v) - 0.5 * math.log(2.0 * math.pi)
        return {"logpsi0": lognorm - 0.5 * q, "lognorm": lognorm, "q": q,
                "A00": A00, "detA": A00, "b0": m * w0, "d0": d0, "i00": i00, "mt0": d0 / m}
    m00, m10, m11 = M[:, 0, 0, None], M[:, 1, 0, None], M[:, 1, 1, None]  # (B, 1)
    v00, v01, v11 = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1]  # (N,)
    det_j = v00 * v11 - v01 * v01
    i00, i01, i11 = v11 / det_j, -v01 / det_j, v00 / det_j  # Sigma_j^{-1}
    d0 = centers[:, 0] - mu[:, :1]  # (B, N): mu_j - mu
    d1 = centers[:, 1] - mu[:, 1:]
    w0 = i00 * d0 + i01 * d1  # Sigma_j^{-1} (mu_j - mu)
    w1 = i01 * d0 + i11 * d1
    q = d0 * w0 + d1 * w1
    k10 = i01 * m00 + i11 * m10  # (Sigma_j^{-1} M)_{10}
    mt0 = d0 / m00  # mu~ = M^{-1}(mu_j - mu), M lower triangular
    lognorm = -0.5 * torch.log(det_j) - math.log(2.0 * math.pi)
    return {
        "logpsi0": lognorm - 0.5 * q, "lognorm": lognorm, "q": q,
        "A00": m00 * (i00 * m00 + i01 * m10) + m10 * k10, "A01": m11 * k10, "A11": m11 * m11 * i11,
        "detA": (m00 * m11) ** 2 / det_j, "b0": m00 * w0 + m10 * w1, "b1": m11 * w1,
        "d0": d0, "d1": d1, "i00": i00, "i01": i01, "i11": i11,
        "mt0": mt0, "mt1": (d1 - m10 * mt0) / m11,
    }


def _gather(pairs, idx, B, N):
    """The entries of ``pairs`` as flat ``(p,)`` tensors at the flat pair indices ``idx`` (``None``: all)."""
    out = {}
    for k, v in pairs.items():
        flat = v.expand(B, N).reshape(-1)
        out[k] = flat if idx is None else flat[idx]
    return out


def _eig2(A00, A01, A11, detA):
    """Eigenvalues ``a1 >= a2 >= 0`` and the angle of the eigenvector of ``a1`` of symmetric 2x2 PSD matrices;
    ``a2 = det / a1`` from the exact determinant, without the cancellation of ``mean - radius``."""
    mean = 0.5 * (A00 + A11)
    rad = torch.hypot(0.5 * (A00 - A11), A01)
    a1 = mean + rad
    a2 = torch.where(a1 > 0, detA / torch.where(a1 > 0, a1, 1.0), 0.0).clamp_min(0.0)
    angle = 0.5 * torch.atan2(2.0 * A01, A00 - A11)
    return a1, a2, angle


def _eig_small(pairs, a1):
    """The smaller eigenvalue of A_j (2D), from the exact determinant."""
    return torch.where(a1 > 0, pairs["detA"] / torch.where(a1 > 0, a1, 1.0), 0.0)


def _lemma1_pair_2d(pairs, route, all_route):
    r"""The dict of the Lemma-1 route (``P00, P01, P11`` of :math:`P=\tilde\Sigma^{-1}=A_j`, ``detP``,
    :math:`P\tilde\mu=b_j` as ``Pm0, Pm1``, :math:`\tilde\mu` as ``mt0, mt1`` and ``q``), with the
    standard Gaussian in place of the pairs that do not take the route (unless ``all_route``; their
    results are discarded), so that no inf or NaN enters the shared computations."""
    names = {"P00": "A00", "P01": "A01", "P11": "A11", "detP": "detA", "Pm0": "b0", "Pm1": "b1",
             "mt0": "mt0", "mt1": "mt1", "q": "q"}
    if all_route:
        return {k: pairs[v] for k, v in names.items()}
    benign = {"P00": 1.0, "P11": 1.0, "detP": 1.0}
    return {k: torch.where(route, pairs[v], benign.get(k, 0.0)) for k, v in names.items()}


_SQRT_PI = math.sqrt(math.pi)
_LOG_SQRT_PI = 0.5 * math.log(math.pi)


def _ray_params(pair):
    r"""The per-pair constants of :func:`_ray_terms` as ``(8, p)`` rows, ``p`` the number of pairs:
    :math:`(P_{00}+P_{11})/4`, :math:`(P_{00}-P_{11})/4`, :math:`P_{01}`, :math:`P\tilde\mu/2`,
    :math:`\tilde\mu\sqrt{\det P}/2` and :math:`e^{-q/2}/\sqrt\pi`."""
    P00, P01, P11 = pair["P00"], pair["P01"], pair["P11"]
    half_sd = 0.5 * pair["detP"].sqrt()
    rows = [0.25 * (P00 + P11), 0.25 * (P00 - P11), P01, 0.5 * pair["Pm0"], 0.5 * pair["Pm1"],
            pair["mt0"] * half_sd, pair["mt1"] * half_sd, torch.exp(-0.5 * pair["q"]) / _SQRT_PI]
    return torch.stack([x.reshape(-1) for x in rows])


def _ray_terms(prm, phi):
    r"""Angular integrands of the six unit-disk moments at the directions :math:`a=(\cos\varphi,\sin\varphi)`.

    ``prm`` is ``(8, p)`` (:func:`_ray_params`), ``phi`` is ``(p, m)`` or ``(1, m)``.  Along the ray
    :math:`u=\rho a`, Lemma 1 of Appendix A.2 gives a 1D Gaussian in :math:`\rho` with
    :math:`1/\sigma^2=a^\top Pa`, :math:`r_0=\sigma^2a^\top P\tilde\mu` and scale
    :math:`\tilde s\propto e^{-\mathrm{perp}^2/2}`, :math:`\mathrm{perp}^2=\det P\,(a\times\tilde\mu)^2/a^\top Pa`
    (eq. (A.17)); the radial integrals :math:`T_k=\tilde s\int_0^1\rho^k\mathcal N(\rho;r_0,\sigma^2)d\rho`,
    :math:`k=1,2,3`, are in closed form.  Returns a ``(6, p, m)`` tensor
    :math:`[T_1,\ T_2\cos,\ T_2\sin,\ T_3,\ T_3\cos2\varphi,\ T_3\cos\varphi\sin\varphi]` up to the factor
    :math:`\sqrt{\pi}/2` and the weight :math:`\sqrt{\det P}/(2\pi)` of an angle.

    Every intermediate lives in one preallocated workspace and is updated in place: with fresh
    tensors per operation, the page faults of the allocator cost more than the arithmetic on CPU.
    """
    dtype, device = phi.dtype, phi.device
    # Arguments of exp/erfc are clamped where the result would underflow: the clamped values
    # (~1e-35 in float32, ~1e-300 in float64) are negligible, and the underflowing inputs would take
    # the slow path of the vectorized exp/erfc (about 25x slower on CPU).
    log_tiny = -math.log(torch.finfo(dtype).tiny)
    exp_floor, erfc_ceil = -(log_tiny - 8.0), math.sqrt(log_tiny) - 0.5
    al, be, ga, b0, b1, c0, c1, llh = prm.unsqueeze(-1)  # (p, 1) each
    trig = torch.empty((4,) + tuple(phi.shape), dtype=dtype, device=device)
    ws = torch.empty((14, prm.shape[1], phi.shape[-1]), dtype=dtype, device=device)
    co, si, c2, cs = trig
    z, rz, p, y, r0, w, hh, sx = ws[:8]
    out = ws[8:]
    torch.cos(phi, out=co)
    torch.sin(phi, out=si)
    torch.mul(co, si, out=cs)
    torch.mul(co, co, out=c2).addcmul_(si, si, value=-1.0)  # cos 2 phi
    torch.addcmul(al, be, c2, out=z).addcmul_(ga, cs).sqrt_()  # z = sqrt(a^T P a / 2) = 1 / (sigma sqrt 2)
    torch.reciprocal(z, out=rz)  # sigma sqrt 2
    torch.mul(co, b0, out=p).addcmul_(b1, si).mul_(rz)  # r0 z = -x_lo,  x_lo = -r0 / (sigma sqrt 2)
    torch.mul(si, c0, out=y).addcmul_(c1, co, value=-1.0).mul_(rz)
    y.mul_(y)  # perp^2 / 2: det(P) (a x mu~)^2 / (2 a^T P a), without the cancellation of q - (a^T P mu~)^2 / a^T P a
    torch.mul(p, rz, out=r0)
    torch.mul(rz, rz, out=w)  # 2 sigma^2
    torch.sub(z, p, out=hh)  # x_hi = (1 - r0) / (sigma sqrt 2)
    hh.mul_(hh).add_(y).neg_().sub_(_LOG_SQRT_PI).clamp_(min=exp_floor).exp_()  # s~ phi(hi) / sqrt(pi), up to C
    e_perp = y.neg_().clamp_(min=exp_floor).exp_()
    # 2 [Phi(hi) - Phi(lo)] = |erfc(|x_lo|) - erfc(|x_lo| + sign(x_lo) z)|: both arguments have the sign
    # that keeps erfc away from 2 in the tails, so the difference does not cancel
    torch.copysign(z, p, out=sx)
    a = p.abs_()
    torch.sub(a, sx, out=sx)
    g = a.clamp_(max=erfc_ceil).erfc_().sub_(sx.clamp_(max=erfc_ceil).erfc_()).abs_()
    t1 = g.mul_(e_perp).mul_(rz)  # T_0 / (sqrt(pi) / 2)
    h2 = hh.mul_(w)
    # T_k = r0 T_{k-1} + sigma^2 ((k-1) T_{k-2} + s~ phi(lo) [k=1] - s~ phi(hi)), s~ phi(lo) = e^{-q/2}
    # (the closed forms (A.22), (A.31), (A.34), (A.40) of Farinhas (2021), regrouped), all over sqrt(pi)/2
    T1 = torch.mul(r0, t1, out=out[0]).addcmul_(llh, w).sub_(h2)
    T2 = torch.mul(r0, T1, out=z).addcmul_(w, t1, value=0.5).sub_(h2)
    T3 = torch.mul(r0, T2, out=out[3]).addcmul_(w, T1).sub_(h2)
    torch.mul(T2, trig[:2], out=out[1:3])
    torch.mul(T3, trig[2:], out=out[4:])
    return out


def _sum_last(x):
    """``x.sum(-1)`` as a matrix-vector product: about twice as fast for the short rows used here."""
    return torch.matmul(x, x.new_ones(x.shape[-1]))


def _moments_from_entries(E):
    """``(U0, U1 (..., 2), U2 (..., 2, 2))`` from ``E = [U0, U1x, U1y, tr U2, (U2)xx - (U2)yy, (U2)xy]``,
    the form in which :func:`_ray_terms` (up to a factor) produces them."""
    U0, U1x, U1y, T3, T3c2, T3cs = E
    Uxx, Uyy = 0.5 * (T3 + T3c2), 0.5 * (T3 - T3c2)
    U1 = torch.stack([U1x, U1y], -1)
    U2 = torch.stack([torch.stack([Uxx, T3cs], -1), torch.stack([T3cs, Uyy], -1)], -2)
    return U0, U1, U2


def _ball_moments_2d_entries(pair, n):
    r"""Moments over the unit disk of :math:`\mathcal N(u;\tilde\mu,\tilde\Sigma)` by the periodic trapezoid
    rule with ``n`` angular nodes :math:`\varphi_k = 2\pi k/n`, :math:`k=0,\dots,n-1`, for every pair, as
    ``(6, B, N)`` entries (see :func:`_moments_from_entries`)."""
    q = pair["q"]
    phi = torch.arange(n, dtype=q.dtype, device=q.device) * (2.0 * math.pi / n)  # no duplicated endpoint
    s = _sum_last(_ray_terms(_ray_params(pair), phi[None])).view(6, *q.shape)
    # the weight of a node, sqrt(det P) / (2 pi) * 2 pi / n, times the factor sqrt(pi) / 2 of _ray_terms
    return s * (pair["detP"].sqrt() * (0.5 * _SQRT_PI / n))


def _nodes_for_tol(tol: float) -> int:
    """Nodes per (batch, basis) pair in the first round of the adaptive rule (even, grows like log(1/tol))."""
    return 2 * math.ceil(2.0 + 0.65 * math.log(1.0 / tol))



def _lemma1_masks(pair, tol, route, lb_floor):
    r"""Closed forms, negligible pairs and the lower bound :math:`s_b` of the Lemma-1 route (2D).

    Returns ``(U, closed, quad, lb_b, lb_route, tail)``: ``U`` the ``(6, B*N)`` entries (closed forms
    filled in, zeros elsewhere), the ``(B, N)`` masks of the closed forms and of the pairs left to the
    angular rule, ``lb_b`` the lower bound of :math:`s_b=\max_jU_{0,bj}` that sets the tolerance (at least
    ``lb_floor``, a bound from elsewhere in these units, and at least :math:`\sqrt{\text{tiny}}`),
    ``lb_route`` the bound from this route's pairs alone, and the mask of the quadrature pairs in the
    tails that are better integrated by slices.
    """
    P00, P01, P11, detP = pair["P00"], pair["P01"], pair["P11"], pair["detP"]
    mt0, mt1 = pair["mt0"], pair["mt1"]
    dtype = P00.dtype
    tiny = torch.finfo(dtype).tiny
    rad = torch.hypot(mt0, mt1)  # |mu~|
    pmax = 0.5 * (P00 + P11) + torch.hypot(0.5 * (P00 - P11), P01)  # eigenvalues of P = Sigma~^{-1}
    pmin = detP / pmax
    smax = pmin.rsqrt()  # the largest standard deviation of N(mu~, Sigma~)
    peak = detP.sqrt() / (2.0 * math.pi)  # its largest density
    # 1. Gaussian well inside the disk: the disk contains the whitened ball of radius d_in around mu~;
    # outside that ball |u|^k <= (1 + smax |z|)^2, k <= 2, and |z| has the density r e^{-r^2/2} (2D), so
    # every moment entry outside the disk is at most e0 + 2 smax T1 + smax^2 T2, T_k = int_d^inf r^(k+1) e^(-r^2/2)
    inside = rad < 1
    d_in = ((1.0 - rad) * pmin.sqrt()).clamp_min(0.0)
    e_in = torch.exp(-0.5 * d_in * d_in)
    T1 = d_in * e_in + math.sqrt(0.5 * math.pi) * torch.erfc(d_in * _SQRT_HALF)
    bound_in = e_in + 2.0 * smax * T1 + smax * smax * (d_in * d_in + 2.0) * e_in
    # 2. Gaussian far outside: the disk is d_out whitened units away from mu~ and |u| <= 1 on it
    d_out = ((rad - 1.0) * pmin.sqrt()).clamp_min(0.0)
    bound_out = torch.exp(-0.5 * d_out * d_out) * (math.pi * peak).clamp_max(1.0)
    # lower bounds of U0: the whitened ball around mu~ (if inside), and the balls B((1 - rho) mu~/|mu~|, rho)
    # of the disk times the smallest density on them; s_b is at least their maximum over j
    # (rho = 1, 1/2, and the rho that maximizes the bound for a Gaussian outside the disk)
    lb = torch.where(inside, -torch.expm1(-0.5 * d_in * d_in), 0.0)
    gap = (rad - 1.0).clamp_min(0.0)
    rho_opt = (8.0 / pmax / (gap + (gap * gap + 8.0 / pmax).sqrt())).clamp_max(1.0)  # 2 rho^2 + gap rho = 1 / pmax
    for rho in (1.0, 0.5, rho_opt):
        dist = (rad - (1.0 - rho)).abs() + rho
        lb = torch.maximum(lb, (math.pi * rho * rho) * peak * torch.exp(-0.5 * pmax * dist * dist))
    # below sqrt(tiny), s_b is round-off of underflowing terms (an ellipse that no basis function reaches)
    lb_route = torch.where(route, lb, 0.0).amax(-1)
    lb_b = torch.maximum(lb_route, lb_floor).clamp_min(math.sqrt(tiny))
    tol_abs = tol * lb_b[:, None]  # (B, 1)
    closed = route & inside & (bound_in <= tol_abs)
    quad = route & ~closed & (bound_out > tol_abs)
    # In the tails (mu~ far from the disk, or the disk in its tail) the radial closed forms cancel: their
    # round-off, up to about 256 eps relative to the pair's own mass, would exceed tol * s_b for a pair
    # that may carry more than tol / (256 eps) of s_b (float32, or an ellipse that every psi_j is far from)
    # (the mass of a convex set d_out whitened units from the centre is at most that of a half-plane)
    far = (rad > _FAR) | (d_out > 2.0)
    mass_out = torch.minimum(bound_out, 0.5 * torch.erfc(d_out * _SQRT_HALF))
    tail = quad & far & (mass_out > (tol / (256.0 * torch.finfo(dtype).eps)) * lb_b[:, None])
    # Results are kept as [U0, U1x, U1y, tr U2, (U2)xx - (U2)yy, (U2)xy] (see _moments_from_entries), first
    # the closed forms U0 = 1, U1 = mu~, U2 = Sigma~ + mu~ mu~^T, Sigma~ = P^{-1}
    xx, yy = P11 / detP + mt0 * mt0, P00 / detP + mt1 * mt1
    exact = torch.stack([torch.ones_like(rad), mt0, mt1, xx + yy, xx - yy, -P01 / detP + mt0 * mt1])
    U = torch.where(closed, exact, 0.0).view(6, -1)
    return U, closed, quad, lb_b, lb_route, tail


def _angular_windows(sub, tol, lb, m):
    r"""Start angle, node spacing, ray constants and node weight of the windowed periodic trapezoid rule
    for the Lemma-1 pairs in ``sub`` (a dict of 1D tensors), each with its lower bound ``lb`` of :math:`s_b`."""
    qq, P00, P01, P11, detP, m0, m1 = (sub[k] for k in ("q", "P00", "P01", "P11", "detP", "mt0", "mt1"))
    dtype = qq.dtype
    # Angular window.  The P-distance from mu~ to the ray {rho a, 0 <= rho <= 1} is at least perp(a),
    # perp^2 = det(P) (a x mu~)^2 / a^T P a, and at least sqrt(q) if a^T P mu~ < 0; the ray integrand
    # is at most rho * peak * exp(-dist^2 / 2), so all directions with dist >= d, d^2 = 2 log(4 pi peak /
    # tol_abs), add at most tol_abs / 4 to any moment entry, and are skipped.  perp(a) < d <=> a^T Q a < 0
    # with Q = det(P) n n^T - d^2 P, n = (-mu~_2, mu~_1), det Q = d^2 det(P) (d^2 - q): if q > d^2 the window
    # is the cone of half-width w = atan(sqrt(-l_- / l_+)) around the eigenvector of l_- facing mu~.
    peak = detP.sqrt() / (2.0 * math.pi)
    d2 = 2.0 * torch.log(4.0 * math.pi * peak / (tol * lb))
    windowed = qq > d2
    Q00 = detP * m1 * m1 - d2 * P00
    Q01 = -detP * m0 * m1 - d2 * P01
    Q11 = detP * m0 * m0 - d2 * P11
    qmean, qrad = 0.5 * (Q00 + Q11), torch.hypot(0.5 * (Q00 - Q11), Q01)
    tiny = torch.finfo(dtype).tiny
    w = torch.atan(((qrad - qmean) / (qmean + qrad).clamp_min(tiny)).clamp_min(0.0).sqrt())
    theta = 0.5 * torch.atan2(2.0 * Q01, Q00 - Q11) + 0.5 * math.pi  # eigenvector of l_-
    facing = theta.cos() * sub["Pm0"] + theta.sin() * sub["Pm1"] >= 0
    theta = torch.where(facing, theta, theta + math.pi)
    # m nodes of T_n, n = 2 floor((m - 1) pi / (2 w)) >= m, centred on theta cover the window (T_n is
    # shift invariant); without a window, T_m on the whole circle.
    n_win = 2.0 * torch.floor((m - 1) * math.pi / (2.0 * w).clamp_min(tiny)).clamp_max(2.0**40)
    h = 2.0 * math.pi / torch.where(windowed, n_win.clamp_min(m), float(m))
    start = torch.where(windowed, theta - 0.5 * (m - 1) * h, 0.0)
    wt = detP.sqrt() / (4.0 * _SQRT_PI)  # times the spacing: the weight of a node, sqrt(det P) / (2 pi) * sqrt(pi) / 2
    return start, h, _ray_params(sub), wt


_PAIR_KEYS = ("q", "P00", "P01", "P11", "detP", "mt0", "mt1", "Pm0", "Pm1")


def _lemma1_adaptive(pair, idx, tol, lb_b, closed, U, info, max_nodes):
    """The windowed, adaptive periodic trapezoid rule for the pairs ``idx``; writes ``U[:, idx]``."""
    B, N = pair["q"].shape
    dtype, device = U.dtype, U.device
    m = min(_nodes_for_tol(tol), 2 * (max_nodes // 2))
    sub = dict(zip(_PAIR_KEYS, torch.stack([pair[k].reshape(-1) for k in _PAIR_KEYS])[:, idx].unbind(0)))
    bidx = idx // N
    start, h, prm, wt = _angular_windows(sub, tol, lb_b[bidx], m)
    # round 0: even-numbered nodes first, so that T_{n/2} is a sum over the first half
    j = torch.cat([torch.arange(0, m, 2), torch.arange(1, m, 2)]).to(dtype=dtype, device=device)
    halves = _sum_last(_ray_terms(prm, start[:, None] + j * h[:, None]).view(6, -1, 2, m // 2))
    tot = halves.sum(-1)
    I_cur = tot * (wt * h)
    est = (I_cur - halves[..., 0] * (wt * 2.0 * h)).abs().amax(0)  # |T_n - T_{n/2}|
    conv = torch.zeros_like(est, dtype=torch.bool)
    s_closed = torch.maximum(closed.any(-1).to(dtype), lb_b)  # U0 = 1 on closed-form pairs
    nodes, rounds, m_r = idx.numel() * m, 0, m
    while True:
        for _ in range(2):  # s_b from closed forms and converged pairs, at least its lower bound; it grows
            s_b = s_closed.scatter_reduce(0, bidx, torch.where(conv, I_cur[0], 0.0), "amax")
            # a pair is also accepted relative to its own mass (which is at most s_b)
            conv = est <= tol * torch.maximum(s_b[bidx], I_cur[0])
        act = (~conv).nonzero().squeeze(-1)
        if act.numel() == 0 or 2 * m_r > max_nodes:
            break
        # refine: T_{2n} adds the midpoints of the m_r evaluated nodes (and one past the last)
        rounds += 1
        h_a = h[act] / 2 ** (rounds - 1)
        phi = start[act, None] + (torch.arange(m_r, dtype=dtype, device=device) + 0.5) * h_a[:, None]
        tot_a = tot[:, act] + _sum_last(_ray_terms(prm[:, act], phi))
        I_new = tot_a * (wt[act] * h_a * 0.5)
        est[act] = (I_new - I_cur[:, act]).abs().amax(0)
        tot[:, act], I_cur[:, act] = tot_a, I_new
        nodes += act.numel() * m_r
        m_r *= 2
    U.index_copy_(1, idx, I_cur)
    info["lemma1"].update(rounds=rounds, nodes=nodes, unconverged=act.numel(),
                          max_error_estimate=float((est / s_b[bidx]).max()))


def _lemma1_read_free(pair, quad, tol, lb_b, U, max_nodes):
    """The read-free variant: the same windows, ``m 2^k`` nodes (``k = _READ_FREE_ROUNDS``, at most
    ``max_nodes``) for every pair, kept where ``quad``; no host read, no error estimate."""
    B, N = pair["q"].shape
    dtype, device = U.dtype, U.device
    m = min(_nodes_for_tol(tol), 2 * (max_nodes // 2))
    n = m * 2**_READ_FREE_ROUNDS
    while n > max_nodes:
        n //= 2
    sub = {k: pair[k].reshape(-1) for k in _PAIR_KEYS}
    start, h, prm, wt = _angular_windows(sub, tol, lb_b.repeat_interleave(N), m)
    h = h * (m / n)  # the spacing of T_{n'} with n' = n_win n / m nodes on the circle
    start = start + 0.5 * (m - 1) * h * (n / m) - 0.5 * (n - 1) * h  # still centred on the window
    phi = start[:, None] + torch.arange(n, dtype=dtype, device=device) * h[:, None]
    I_all = _sum_last(_ray_terms(prm, phi)) * (wt * h)
    return torch.where(quad.view(-1), I_all, U)


# Gauss-Legendre rules for the chords of the slice route.  _GL_ERROR[i][k] is the largest relative error
# (measured against scipy.integrate.quad) of the _GL_NODES[k]-point rule for int_{-1}^{1} (1 - x^2)^l x^k
# exp(-a x^2 / 2 + c x) dx, l <= 2, k <= 2, a in {0, 1, V, 2 V}, c = V - a / 2 (V = _GL_VARIATION[i]:
# tilted, Gaussian, or both), relative to int exp(-a x^2 / 2 + c x) dx.
_GL_VARIATION = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 40.0, 56.0)
_GL_NODES = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64)
_GL_ERROR = (
    (2e-07, 3e-10, 2e-13, 4e-16, 2e-15, 6e-16, 9e-16, 3e-15, 3e-15, 1e-15),
    (5e-06, 3e-08, 9e-11, 6e-16, 2e-15, 9e-16, 1e-15, 4e-15, 5e-15, 1e-15),
    (1e-04, 2e-06, 3e-08, 2e-12, 6e-15, 3e-15, 2e-15, 1e-14, 1e-14, 4e-15),
    (3e-03, 1e-04, 5e-06, 4e-09, 9e-13, 7e-15, 5e-15, 2e-14, 3e-14, 9e-15),
    (1e-02, 1e-03, 1e-04, 2e-07, 2e-10, 1e-13, 8e-15, 4e-14, 4e-14, 1e-14),
    (4e-02, 6e-03, 7e-04, 4e-06, 9e-09, 1e-11, 9e-15, 5e-14, 6e-14, 2e-14),
    (1e-01, 3e-02, 6e-03, 1e-04, 1e-06, 5e-09, 2e-14, 7e-14, 9e-14, 2e-14),
    (2e-01, 8e-02, 2e-02, 1e-03, 2e-05, 2e-07, 7e-12, 1e-13, 1e-13, 3e-14),
    (3e-01, 1e-01, 5e-02, 4e-03, 1e-04, 3e-06, 4e-10, 1e-13, 1e-13, 3e-14),
    (5e-01, 3e-01, 1e-01, 2e-02, 2e-03, 1e-04, 9e-08, 2e-11, 2e-13, 4e-14),
)
#: The largest exponent variation along a chord assumed by the read-free and fixed rules.
_GL_READ_FREE_VARIATION = 16.0


def _gl_count(variation: float, tol: float) -> int:
    """Nodes of the chord rule for an exponent that varies by at most ``variation`` (within tol / 100)."""
    row = next((i for i, v in enumerate(_GL_VARIATION) if v >= variation), len(_GL_VARIATION) - 1)
    return next((n for n, e in zip(_GL_NODES, _GL_ERROR[row]) if e <= 0.01 * tol), _GL_NODES[-1])


def _legendre_gauss(n: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights of the ``n``-point Gauss-Legendre rule on [-1, 1]: Newton's method on P_n in
    float64, on ``device`` (no host transfer), from the asymptotic guesses cos(pi (k - 1/4) / (n + 1/2))."""
    k = torch.arange(1, n + 1, dtype=torch.float64, device=device)
    x = torch.cos(math.pi * (k - 0.25) / (n + 0.5))

    def legendre(x):  # P_n(x) and P_n'(x)
        p = torch.special.legendre_polynomial_p(x, n)
        return p, n * (x * p - torch.special.legendre_polynomial_p(x, n - 1)) / (x * x - 1.0)

    for _ in range(6):  # quadratic convergence from guesses within O(1/n^2)
        p, dp = legendre(x)
        x = x - p / dp
    _, dp = legendre(x)
    w = 2.0 / ((1.0 - x * x) * dp * dp)
    return x.to(dtype), w.to(dtype)


def _chord_matrix(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``(n, 8)`` columns w (1-x^2), w (1-x^2) x, w (1-x^2)^2, w (1-x^2)^2 x, w (1-x^2)^2 x^2, w, w x, w x^2."""
    om = (1.0 - x) * (1.0 + x)
    return torch.stack([w * om, w * om * x, w * om * om, w * om * om * x, w * om * om * x * x, w, w * x, w * x * x], -1)


def _max_quadratic(a, c, lo, hi):
    """``max_{lo <= x <= hi} (-a x^2 / 2 + c x)`` for ``a >= 0`` (``lo <= hi``), and its argument."""
    x = torch.where(a > 0, torch.minimum(torch.maximum(c / torch.where(a > 0, a, 1.0), lo), hi),
                    torch.where(c > 0, hi, lo))
    return x * (c - 0.5 * a * x), x


def _anchor(a, b, stiff):
    """The anchor coordinate ``b / a`` along a stiff direction (0 along a soft one) and the slope there:
    exactly 0 along a stiff direction, where ``b - a (b / a)`` would only be round-off."""
    centre = torch.where(stiff, b / torch.where(stiff, a, 1.0), 0.0)
    return centre, torch.where(stiff, 0.0, b)


def _slice_setup_2d(pp, a1, angle, Mp):
    r"""Frame and constants of the slice route (2D), for flat per-pair entries ``pp`` and factors ``Mp``.

    The outer axis :math:`e_o` is the stiff eigenvector of :math:`A_j` if :math:`a_1\ge1`, else the
    direction of :math:`b_j`; the inner one is :math:`e_i=(-e_{o,2}, e_{o,1})`; :math:`u=v_ie_i+v_oe_o`.
    The exponent is written around an anchor :math:`u_a=r_ie_i+r_oe_o` (the centre :math:`b/a` along
    each stiff axis, 0 along a soft one) as

    .. math::

        \log\psi_j(\mu+Mu_a)-\tfrac12(a_i\delta_i^2+2c_i\delta_i\delta_o+a_o\delta_o^2)+g_i\delta_i+g_o\delta_o,
        \qquad \delta=v-r,

    with :math:`\log\psi_j(\mu+Mu_a)` evaluated directly: the expanded form
    :math:`\log\psi_j(\mu)+b^\top u-\frac12u^\top Au` cancels (in float32, badly) when :math:`\psi_j` is
    narrow along a long ellipse.
    """
    b0, b1 = pp["b0"], pp["b1"]
    stiff = a1 >= _STIFF
    nb = torch.hypot(b0, b1)
    has_b = nb > 0
    nb_safe = torch.where(has_b, nb, 1.0)
    eo0 = torch.where(stiff, torch.cos(angle), torch.where(has_b, b0 / nb_safe, 1.0))
    eo1 = torch.where(stiff, torch.sin(angle), torch.where(has_b, b1 / nb_safe, 0.0))
    ei0, ei1 = -eo1, eo0
    A00, A01, A11 = pp["A00"], pp["A01"], pp["A11"]
    form = lambda x0, x1, y0, y1: x0 * (A00 * y0 + A01 * y1) + x1 * (A01 * y0 + A11 * y1)  # noqa: E731
    ao, ai = form(eo0, eo1, eo0, eo1).clamp_min(0.0), form(ei0, ei1, ei0, ei1).clamp_min(0.0)
    ci = form(ei0, ei1, eo0, eo1)
    bo, bi = eo0 * b0 + eo1 * b1, ei0 * b0 + ei1 * b1
    ro, go = _anchor(ao, bo, ao >= _STIFF)
    ri, gi = _anchor(ai, bi, ai >= _STIFF)
    go, gi = go - ci * ri, gi - ci * ro  # the gradient b - A u_a at the anchor
    # log psi_j at t_a = mu + M u_a: e = t_a - mu_j = M u_a - d
    ua0, ua1 = ri * ei0 + ro * eo0, ri * ei1 + ro * eo1
    e0 = Mp[:, 0, 0] * ua0 - pp["d0"]
    e1 = Mp[:, 1, 0] * ua0 + Mp[:, 1, 1] * ua1 - pp["d1"]
    q_a = pp["i00"] * e0 * e0 + 2.0 * pp["i01"] * e0 * e1 + pp["i11"] * e1 * e1
    log_a = pp["lognorm"] - 0.5 * q_a
    return {"ei0": ei0, "ei1": ei1, "eo0": eo0, "eo1": eo1, "ao": ao, "ai": ai, "ci": ci,
            "ro": ro, "ri": ri, "go": go, "gi": gi, "log_a": log_a}


def _slice_bounds_2d(pp, fr, a1):
    r"""Upper bound ``log_sup`` of :math:`\log\psi_j(\mu+Mu)` on the disk, the bound ``i_max`` of its
    inner part (its coupling to the outer coordinate included), and a lower bound ``lb`` of the mean of
    :math:`\psi_j(\mu+Mu)` over the disk."""
    ao, ai, ci, ro, ri, go, gi, log_a = (fr[k] for k in ("ao", "ai", "ci", "ro", "ri", "go", "gi", "log_a"))
    e_max, _ = _max_quadratic(ao, go, -1.0 - ro, 1.0 - ro)
    # |coupling| <= |c_i| |delta_i| |delta_o| <= |c_i| (1 + |r_i|) (1 + |r_o|)
    i_max = _max_quadratic(ai, gi, -1.0 - ri, 1.0 - ri)[0] + ci.abs() * (1.0 + ri.abs()) * (1.0 + ro.abs())
    # the ball of radius rho around a point v* of the disk: E(v) >= E(v*) - |grad E(v*)| rho - a1 rho^2 / 2
    rho = torch.where(a1 > 4.0, a1.clamp_min(4.0).rsqrt(), 0.5)
    lim = 1.0 - rho
    _, do = _max_quadratic(ao, go, -lim - ro, lim - ro)
    vo = ro + do
    reach = (lim * lim - vo * vo).clamp_min(0.0).sqrt()
    _, di = _max_quadratic(ai, gi - ci * do, -reach - ri, reach - ri)
    energy = -0.5 * (ai * di * di + 2.0 * ci * di * do + ao * do * do) + gi * di + go * do
    grad = torch.hypot(gi - ai * di - ci * do, go - ci * di - ao * do)
    at_centre = -0.5 * (ai * ri * ri + 2.0 * ci * ri * ro + ao * ro * ro) - gi * ri - go * ro  # v = 0, rho = 1
    grad_centre = torch.hypot(gi + ai * ri + ci * ro, go + ci * ri + ao * ro)
    lb = torch.maximum(torch.exp(log_a + at_centre - 0.5 * a1 - grad_centre),
                       rho * rho * torch.exp(log_a + energy - grad * rho - 0.5 * a1 * rho * rho))
    return log_a + e_max + i_max, i_max, lb


def _slice_windows(fr, log_a, i_max, log_tol_abs, m):
    r"""The window of angles :math:`\theta` (:math:`v_o=\sin\theta`) outside which every slice adds less
    than ``tol_abs / 8`` to any moment entry, as ``(start, span, factor)``: nodes ``start + k span / m``.

    Slices with :math:`\log\psi_j(\mu+Mu_a)+E(\delta_o)+I_{max}<\log(\mathrm{tol_{abs}}/24)`,
    :math:`E(\delta)=-\frac12a_o\delta^2+g_o\delta`, are skipped: each moment entry is a mean over the
    disk with a weight at most :math:`\pi/Z_2=3`.  :math:`F(\theta)=F(\pi-\theta)`, so a window that
    reaches :math:`v_o=\pm1` is mirrored about :math:`\theta=\pm\pi/2` (and its sum halved) and its ends
    stay negligible; one that reaches both ends is the whole circle (periodic, halved).
    """
    ao, go, ro = fr["ao"], fr["go"], fr["ro"]
    c = log_tol_abs - math.log(24.0) - log_a - i_max  # keep E(delta) >= c
    disc = (go * go - 2.0 * ao * c).clamp_min(0.0)
    qv = go + torch.copysign(disc.sqrt(), go)
    ok = qv != 0
    r_a = torch.where(ao > 0, qv / torch.where(ao > 0, ao, 1.0), torch.copysign(torch.full_like(qv, math.inf), qv))
    r_b = 2.0 * c / torch.where(ok, qv, 1.0)
    lo = torch.where(ok, ro + torch.minimum(r_a, r_b), -1.0).clamp(-1.0, 1.0)
    hi = torch.where(ok, ro + torch.maximum(r_a, r_b), 1.0).clamp(-1.0, 1.0)
    top, bot = hi >= 1.0, lo <= -1.0
    t_lo, t_hi = torch.asin(lo), torch.asin(hi)
    half_pi = 0.5 * math.pi
    start = torch.where(top & bot, -half_pi, torch.where(bot, -math.pi - t_hi, t_lo))
    span = torch.where(top, math.pi - 2.0 * t_lo, torch.where(bot, math.pi + 2.0 * t_hi, t_hi - t_lo))
    span = torch.where(top & bot, 2.0 * math.pi, span)
    factor = torch.where(top | bot, 0.5, 1.0)
    return start, span, factor


_SLICE_ROWS = ("log_a", "ao", "ai", "ci", "ro", "ri", "go", "gi", "wi")


def _slice_terms(prm, theta, x, w):
    r"""The ten slice integrands at the angles ``theta`` (``(p, m)``), ``prm`` ``(7, p)`` (:data:`_SLICE_ROWS`).

    :math:`v_o=\sin\theta` and the chord :math:`|v_i|\le h=|\cos\theta|`; :math:`dv_o=h\,d\theta` (with
    :math:`|\cos\theta|`, the integrand :math:`G(h)h` of an odd :math:`G` is analytic and
    :math:`\pi`-periodic in :math:`\theta`), :math:`1-|v|^2=h^2-v_i^2`.  On each chord the inner factor
    :math:`e^{-a_iv_i^2/2+(b_i-c_iv_o)v_i}` is integrated by Gauss--Legendre (nodes ``x``, weights ``w``)
    on the chord, or, for a stiff one, on its window of half-width ``wi`` around the inner maximum
    (where the factor stays within a given depth of its peak).  Returns ``(15, p, m)``:
    :math:`h\int(1-|v|^2)^l v^\alpha f\,dv_i` for :math:`(l,\alpha)` = (1, 1), (1, v_i), (1, v_o), (2, 1),
    (2, v_i), (2, v_o), (2, v_i^2), (2, v_iv_o), (2, v_o^2), (0, 1), (0, v_i), (0, v_o), (0, v_i^2),
    (0, v_iv_o), (0, v_o^2).
    """
    log_a, ao, ai, ci, ro, ri, go, gi, wi = prm.unsqueeze(-1)
    vo = torch.sin(theta)
    h = torch.cos(theta).abs()
    do = vo - ro
    outer = log_a + do * (go - 0.5 * ao * do)  # (p, m)
    beta = gi - ci * do  # the inner slope at v_i = r_i
    centre = ri + torch.where(ai > 0, beta / torch.where(ai > 0, ai, 1.0), 0.0)
    lo = torch.maximum(-h, centre - wi)
    hi = torch.maximum(torch.minimum(h, centre + wi), lo)
    mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    v = mid.unsqueeze(-1) + half.unsqueeze(-1) * x  # (p, m, n)
    di = v - ri.unsqueeze(-1)
    expo = outer.unsqueeze(-1) + di * (beta.unsqueeze(-1) - (0.5 * ai).unsqueeze(-1) * di)
    f = torch.exp(expo.clamp_min(math.log(torch.finfo(expo.dtype).tiny))) * w
    hv = h.unsqueeze(-1)
    fg = f * ((hv - v) * (hv + v))  # weight 1 - |v|^2 = h^2 - v_i^2, without cancellation at the ends
    fgg = fg * ((hv - v) * (hv + v))
    fggv = fgg * v
    scale = h * half  # dv_o = h dtheta, dv_i = half dx
    fv = f * v
    T0, T2 = fg.sum(-1) * scale, fgg.sum(-1) * scale
    T1, T3 = (fg * v).sum(-1) * scale, fggv.sum(-1) * scale
    T4, T5 = (fggv * v).sum(-1) * scale, f.sum(-1) * scale
    T6, T7 = fv.sum(-1) * scale, (fv * v).sum(-1) * scale
    return torch.stack([T0, T1, vo * T0, T2, T3, vo * T2, T4, vo * T3, vo * vo * T2, T5,
                        T6, vo * T5, T7, vo * T6, vo * vo * T5])


def _slice_sum(prm, theta, x, w, block=32):
    """``_slice_terms`` summed over the angles, in blocks of angles to bound the memory."""
    return sum(_sum_last(_slice_terms(prm, theta[:, k:k + block], x, w)) for k in range(0, theta.shape[-1], block))


def _slice_norms(D, dtype, device):
    """Normalizers of the fifteen entries: Z1 (E_w), Z2 (E_w2), the volume of the ball (means)."""
    Z1, Z2 = BALL_Z[D]
    vol = 2.0 if D == 1 else math.pi
    full = lambda n, value: torch.full((n,), value, dtype=dtype, device=device)  # noqa: E731  (no host-to-device copy)
    return torch.cat([full(3, Z1), full(6, Z2), full(6, vol)])[:, None]


def _slice_quadrature_2d(pp, fr, log_sup, i_max, lb, mask, B, bidx, tol, rule, info):
    r"""Moments of the slice route (2D) for flat pairs: ``(10, p)`` entries
    :math:`[E_wf, E_wv_if, E_wv_of, E_{w2}f, E_{w2}v_if, E_{w2}v_of, E_{w2}v_i^2f, E_{w2}v_iv_of,
    E_{w2}v_o^2f, \bar f]` in the frame ``fr`` (zero for the negligible pairs and those not in ``mask``;
    ``mask=None``: all).  ``lb`` is the per-pair lower bound of :math:`s_b` (a mean over the disk) that
    sets the tolerance, ``bidx`` the batch element of each pair."""
    p = lb.shape[0]
    dtype, device = lb.dtype, lb.device
    log_a = fr["log_a"]
    log_tol_abs = math.log(tol) + torch.log(lb)
    quad = log_sup + math.log(12.0) > log_tol_abs  # the others add less than tol_abs / 4
    if mask is not None:
        quad = quad & mask
    m = min(_nodes_for_tol(tol), 2 * (rule.max_quadrature // 2))
    # chord windows: points where the inner factor is below e^{-depth} of its peak add less than
    # tol_abs / 24 (each moment entry is a mean with a weight at most pi / Z2 = 3); the rule there has to
    # resolve an exponent that varies by the depth (a stiff chord) or by a_i / 2 + |b_i| + |c_i| (a whole one)
    ai = fr["ai"]
    depth = (log_sup - log_tol_abs + math.log(72.0)).clamp_min(1.0)
    if rule.read_free:
        depth = depth.clamp_max(_READ_FREE_DEPTH)
    wi = torch.where(ai > 0, (2.0 * depth / torch.where(ai > 0, ai, 1.0)).sqrt(), math.inf)
    whole = wi >= 2.0
    wi = torch.where(whole, math.inf, wi)
    reach = 1.0 + fr["ri"].abs()  # |delta_i| on a chord
    chord = 0.5 * ai * reach**2 + (fr["gi"].abs() + fr["ci"].abs() * (1.0 + fr["ro"].abs())) * reach
    variation = torch.where(whole, chord, depth)
    prm = torch.stack([fr[k] if k != "wi" else wi for k in _SLICE_ROWS])
    start, span, factor = _slice_windows(fr, log_a, i_max, log_tol_abs, m)
    if rule.n_quadrature is not None:  # the fixed rule: n angles on the whole circle
        start = torch.full_like(start, -0.5 * math.pi)
        span, factor = torch.full_like(span, 2.0 * math.pi), torch.full_like(factor, 0.5)
    norms = _slice_norms(2, dtype, device)
    if rule.read_free:
        n = rule.n_quadrature or min(m * 2**_READ_FREE_SLICE_ROUNDS, 2 * (rule.max_quadrature // 2))
        x, w = _legendre_gauss(_gl_count(_READ_FREE_DEPTH, tol), dtype, device)
        theta = start[:, None] + (span[:, None] / n) * torch.arange(n, dtype=dtype, device=device)
        E = _slice_sum(prm, theta, x, w) * ((span * factor) / n / norms)
        return torch.where(quad, E, 0.0)
    E = torch.zeros(15, p, dtype=dtype, device=device)
    idx = quad.nonzero().squeeze(-1)
    info["slices"].update(quadrature=idx.numel(), skipped=p - idx.numel() if mask is None else int((mask & ~quad).sum()))
    if idx.numel() == 0:
        return E
    n_in = _gl_count(float(variation[idx].max()), tol)
    info["slices"]["chord_nodes"] = n_in
    x, w = _legendre_gauss(n_in, dtype, device)
    if rule.n_quadrature is not None:
        n = rule.n_quadrature
        theta = start[idx, None] + (span[idx, None] / n) * torch.arange(n, dtype=dtype, device=device)
        E[:, idx] = _slice_sum(prm[:, idx], theta, x, w) * ((span * factor)[idx] / n / norms)
        return E
    _slice_adaptive(prm[:, idx], start[idx], span[idx], factor[idx], idx, bidx[idx], B, lb, tol,
                    rule.max_quadrature, m, x, w, norms, E, info)
    return E


def _slice_adaptive(prm, start, span, factor, idx, bidx, B, lb, tol, max_nodes, m, x, w, norms, E, info):
    """Refine the windowed trapezoid rule of the slice route by doubling, as :func:`_lemma1_adaptive`."""
    dtype, device = prm.dtype, prm.device
    h = span / m
    j = torch.cat([torch.arange(0, m, 2), torch.arange(1, m, 2)]).to(dtype=dtype, device=device)
    halves = _sum_last(_slice_terms(prm, start[:, None] + j * h[:, None], x, w).view(15, -1, 2, m // 2))
    tot = halves.sum(-1)
    wt = factor / norms  # (15, p)
    I_cur = tot * (wt * h)
    est = (I_cur - halves[..., 0] * (wt * 2.0 * h)).abs().amax(0)
    conv = torch.zeros_like(est, dtype=torch.bool)
    s_start = torch.zeros(B, dtype=dtype, device=device).scatter_reduce(0, bidx, lb[idx], "amax")
    mean = 9  # the entry of the mean of f over the disk
    nodes, rounds, m_r = idx.numel() * m, 0, m
    while True:
        for _ in range(2):  # s_b from the lower bound and the converged pairs; it grows
            s_b = s_start.scatter_reduce(0, bidx, torch.where(conv, I_cur[mean], 0.0), "amax")
            conv = est <= tol * torch.maximum(s_b[bidx], I_cur[mean])
        act = (~conv).nonzero().squeeze(-1)
        if act.numel() == 0 or 2 * m_r > max_nodes:
            break
        rounds += 1
        h_a = h[act] / 2 ** (rounds - 1)
        theta = start[act, None] + (torch.arange(m_r, dtype=dtype, device=device) + 0.5) * h_a[:, None]
        tot_a = tot[:, act] + _slice_sum(prm[:, act], theta, x, w)
        I_new = tot_a * (wt[:, act] * h_a * 0.5)
        est[act] = (I_new - I_cur[:, act]).abs().amax(0)
        tot[:, act], I_cur[:, act] = tot_a, I_new
        nodes += act.numel() * m_r
        m_r *= 2
    E[:, idx] = I_cur
    info["slices"].update(rounds=rounds, nodes=nodes, unconverged=act.numel(),
                          max_error_estimate=float((est / s_b[bidx]).max()))


def _slice_setup_1d(pp, Mp):
    """The anchor (``b / a`` if ``a >= 1``, else 0), the slope there and ``log psi_j(mu + m r)`` (1D)."""
    a, b = pp["A00"], pp["b0"]
    r, g = _anchor(a, b, a >= _STIFF)
    e = Mp[:, 0, 0] * r - pp["d0"]
    return {"a": a, "r": r, "g": g, "log_a": pp["lognorm"] - 0.5 * pp["i00"] * e * e}


def _slice_bounds_1d(fr):
    """Upper bound of log psi_j(mu + M u) on [-1, 1] and a lower bound of its mean there (1D)."""
    a, r, g, log_a = fr["a"], fr["r"], fr["g"], fr["log_a"]
    e_max, _ = _max_quadratic(a, g, -1.0 - r, 1.0 - r)
    rho = torch.where(a > 4.0, a.clamp_min(4.0).rsqrt(), 0.5)
    e_c, x_c = _max_quadratic(a, g, -(1.0 - rho) - r, (1.0 - rho) - r)
    grad = (g - a * x_c).abs()
    lb = rho * torch.exp(log_a + e_c - grad * rho - 0.5 * a * rho * rho)
    return log_a + e_max, lb


def _slice_quadrature_1d(fr, log_sup, lb, mask, tol, rule, info):
    """The slice route in 1D: one chord, [-1, 1], by Gauss-Legendre; ``(15, p)`` entries as in 2D (the
    v_o entries zero).  The number of nodes covers the pairs that are not negligible."""
    dtype, device = lb.dtype, lb.device
    a, r, g, log_a = fr["a"], fr["r"], fr["g"], fr["log_a"]
    variation = 0.5 * a * (1.0 + r.abs()) ** 2 + g.abs() * (1.0 + r.abs())
    if rule.read_free:
        n_in = _gl_count(_GL_VARIATION[-1], tol)
    else:
        relevant = log_sup + math.log(12.0) > math.log(tol) + torch.log(lb)
        n_in = _gl_count(float(torch.where(relevant, variation, 0.0).max()), tol)
        info["slices"].update(quadrature=lb.shape[0], chord_nodes=n_in)
    x, w = _legendre_gauss(n_in, dtype, device)
    dx = x - r.unsqueeze(-1)
    expo = log_a.unsqueeze(-1) + dx * (g.unsqueeze(-1) - 0.5 * a.unsqueeze(-1) * dx)
    f = torch.exp(expo.clamp_min(math.log(torch.finfo(dtype).tiny)))
    S0, S1, S2, S3, S4, S5, S6, S7 = (f @ _chord_matrix(x, w)).unbind(-1)
    zero = torch.zeros_like(S0)
    E = torch.stack([S0, S1, zero, S2, S3, zero, S4, zero, zero, S5, S6, zero, S7, zero, zero])
    E = E / _slice_norms(1, dtype, device)
    return E if mask is None else torch.where(mask, E, 0.0)


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
    :func:`_lemma1_masks` for the ones moved there); the largest eigenvalue of :math:`A_j`, and the angle
    of its eigenvector (2D)."""
    if D == 1:
        a1 = a2 = pairs["A00"]
        stiff = a2 >= _STIFF
        v_max = _GL_READ_FREE_VARIATION if rule.read_free else _GL_VARIATION[-1]
        return stiff, stiff & (0.5 * a2 + pairs["b0"].abs() <= v_max), a1, None
    # in 2D the chords of the slice route are windowed: they take any pair
    a1, a2, angle = _eig2(pairs["A00"], pairs["A01"], pairs["A11"], pairs["detA"])
    return a2 >= _STIFF, a2 >= _STIFF, a1, angle


def sparsemax_moments(mu, M, centers, cov, rule):
    r"""Forward of continuous sparsemax for the lower-triangular factor ``M`` (``(B, D, D)``) of
    :math:`S=MM^\top=-2\lambda\Sigma=(D+4)V`.

    Returns ``(r, saved, info)``: ``r`` ``(B, N)``, the tensors the backward pass needs, and the
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
    pairs = _pairs(mu, M, centers, cov)
    info = None if rule.read_free else _empty_info() | {"pairs": P}
    stiff, movable, a1, angle = _routes(pairs, D, rule)
    # ---- route 1: Lemma 1 (U moments: masses on the ellipse E, of area |E| = vol det M).  Pairs in the tails
    # whose round-off there could exceed the tolerance go to the slice route instead (see _lemma1_masks).
    zero_b = torch.zeros(B, dtype=dtype, device=device)
    if D == 1:
        lemma1 = stiff & ~(movable & (pairs["mt0"].abs() > _FAR))
        U0, U1, U2 = _ball_moments_1d(torch.where(lemma1, pairs["mt0"], 0.0), 1.0 / torch.where(lemma1, a1, 1.0))
        U0, U1, U2 = (torch.where(lemma1.view(B, N, *([1] * k)), x, 0.0) for k, x in ((0, U0), (1, U1), (2, U2)))
        lb1_route = zero_b
    elif not rule.read_free and not bool(stiff.any()):  # no Lemma-1 pair
        lemma1 = stiff
        U0 = torch.zeros(B, N, dtype=dtype, device=device)
        U1, U2 = U0.new_zeros(B, N, D), U0.new_zeros(B, N, D, D)
        lb1_route = zero_b
    else:
        pair = _lemma1_pair_2d(pairs, stiff, all_route=not rule.read_free and bool(stiff.all()))
        U, closed, quad1, lb1_b, lb1_route, tail = _lemma1_masks(pair, tol, stiff, zero_b)
        moved = movable & tail
        if rule.read_free:  # needles: the rays would need more angles than the fixed rule has
            moved = moved | (quad1 & (a1 > _READ_FREE_ANISOTROPY * _eig_small(pairs, a1)))
        lemma1, quad1 = stiff & ~moved, quad1 & ~moved
        if rule.n_quadrature is not None:  # the fixed rule for every pair of the route
            U = torch.where(lemma1.view(-1), _ball_moments_2d_entries(pair, rule.n_quadrature).view(6, -1), U)
        elif rule.read_free:
            U = _lemma1_read_free(pair, quad1, tol, lb1_b, U, rule.max_quadrature)
        else:
            idx = quad1.view(-1).nonzero().squeeze(-1)
            n_closed = int(closed.sum())
            info["lemma1"].update(closed_form=n_closed, quadrature=idx.numel(),
                                  skipped=int(lemma1.sum()) - n_closed - idx.numel())
            if idx.numel() > 0:
                _lemma1_adaptive(pair, idx, tol, lb1_b, closed, U, info, rule.max_quadrature)
        U0, U1, U2 = _moments_from_entries(U.view(6, B, N))
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
        pp = _gather(pairs, sel, B, N)
        if D == 1:
            fr = _slice_setup_1d(pp, M[bidx2])
            log_sup, lb2 = _slice_bounds_1d(fr)
        else:
            a1_2, angle_2 = (x.reshape(-1) if sel is None else x.reshape(-1)[sel] for x in (a1, angle))
            fr = _slice_setup_2d(pp, a1_2, angle_2, M[bidx2])
            log_sup, i_max, lb2 = _slice_bounds_2d(pp, fr, a1_2)
        lb2_b = zero_b.scatter_reduce(0, bidx2, lb2 if mask2 is None else torch.where(mask2, lb2, 0.0), "amax")
        ellipse_safe = vol * detM_safe
        floor = torch.maximum(torch.maximum(lb2_b, lb1_route / ellipse_safe),
                              torch.where(lemma1, U0 / ellipse_safe[:, None], 0.0).amax(-1))
        lb_b = floor.clamp_min(math.sqrt(tiny))
        if D == 1:
            E = _slice_quadrature_1d(fr, log_sup, lb_b[bidx2], mask2, tol, rule, info)
            one, zero = torch.ones_like(pp["q"]), torch.zeros_like(pp["q"])
            e_i, e_o = one[:, None], zero[:, None]
        else:
            E = _slice_quadrature_2d(pp, fr, log_sup, i_max, lb_b[bidx2], mask2, B, bidx2, tol, rule, info)
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
        route2 = (W0, W1, X0, X1, X2, K0, K1, K2, stiff2, d2, Sinv2, bidx2, mask2 if sel is None else sel)
    else:
        route2 = ()
    saved = (M, lemma1, minus_lam, U0, U1, U2) + route2
    return r.view(B, N), saved, info
