r"""Engine of continuous sparsemax: the route of Lemma 1 (Farinhas, 2021, Appendix A.2).

The moments :math:`U_0, U_1, U_2` of :math:`\mathcal N(u;\tilde\mu_j,\tilde\Sigma_j)` over the unit disk
(or the interval :math:`[-1,1]`): closed forms in 1D, polar coordinates in 2D with the radial integral
in closed form and the periodic trapezoid rule in the angle (adaptive, or fixed and read-free), with
the tail bounds that decide which pairs need it; also the per-pair quantities both routes share and the
constants of the method.  The method is described at the head of :mod:`attnopt.continuous._sparsemax`.
"""

from __future__ import annotations

import math

import torch

_SQRT_2PI = math.sqrt(2.0 * math.pi)
_SQRT_HALF = math.sqrt(0.5)

#: Smallest eigenvalue of A_j = M^T Sigma_j^{-1} M from which a pair takes the route of Lemma 1.
STIFF = 1.0
#: Distance |mu~_j| beyond which a Lemma-1 pair counts as in the tails (see lemma1_masks).
FAR = 3.0
#: Z_l = int_{|u| <= 1} (1 - |u|^2)^l du, l = 1, 2, for D = 1, 2.
BALL_Z = {1: (4.0 / 3.0, 16.0 / 15.0), 2: (0.5 * math.pi, math.pi / 3.0)}
#: Refinement rounds of the read-free rule (no host reads): every remaining pair gets m 2^k nodes.
_READ_FREE_ROUNDS = 2
#: Refinement rounds of the read-free rule for the slice route (m 2^k angles), and the depth of its chord
#: windows (a chord rule that resolves an exponent varying by this much).
READ_FREE_SLICE_ROUNDS = 1
READ_FREE_DEPTH = 24.0
#: Axis ratio a1 / a2 of A_j above which the read-free rule integrates a Lemma-1 pair by slices.
READ_FREE_ANISOTROPY = 8.0


def _delta_phi(x_lo: torch.Tensor, x_hi: torch.Tensor) -> torch.Tensor:
    r""":math:`\Phi(\sqrt2 x_{hi})-\Phi(\sqrt2 x_{lo})` for :math:`x_{lo}\le x_{hi}`, without cancellation in the tails."""
    # erfc(x) = 2 - erfc(-x): write erfc(x) = 2 [x < 0] + sign(x) erfc(|x|)
    e_lo = torch.special.erfc(x_lo.abs()).copysign(x_lo)
    e_hi = torch.special.erfc(x_hi.abs()).copysign(x_hi)
    straddle = ((x_lo < 0) & (x_hi >= 0)).to(x_lo.dtype)
    return 0.5 * (e_lo - e_hi) + straddle


def ball_moments_1d(mu_t: torch.Tensor, var_t: torch.Tensor):
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


def pair_terms(mu, M, centers, cov):
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


def gather_pairs(pairs, idx, B, N):
    """The entries of ``pairs`` as flat ``(p,)`` tensors at the flat pair indices ``idx`` (``None``: all)."""
    out = {}
    for k, v in pairs.items():
        flat = v.expand(B, N).reshape(-1)
        out[k] = flat if idx is None else flat[idx]
    return out


def eig2(A00, A01, A11, detA):
    """Eigenvalues ``a1 >= a2 >= 0`` and the angle of the eigenvector of ``a1`` of symmetric 2x2 PSD matrices;
    ``a2 = det / a1`` from the exact determinant, without the cancellation of ``mean - radius``."""
    mean = 0.5 * (A00 + A11)
    rad = torch.hypot(0.5 * (A00 - A11), A01)
    a1 = mean + rad
    a2 = torch.where(a1 > 0, detA / torch.where(a1 > 0, a1, 1.0), 0.0).clamp_min(0.0)
    angle = 0.5 * torch.atan2(2.0 * A01, A00 - A11)
    return a1, a2, angle


def eig_small(pairs, a1):
    """The smaller eigenvalue of A_j (2D), from the exact determinant."""
    return torch.where(a1 > 0, pairs["detA"] / torch.where(a1 > 0, a1, 1.0), 0.0)


def lemma1_pair_2d(pairs, route, all_route):
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


def sum_last(x):
    """``x.sum(-1)`` as a matrix-vector product: about twice as fast for the short rows used here."""
    return torch.matmul(x, x.new_ones(x.shape[-1]))


def moments_from_entries(E):
    """``(U0, U1 (..., 2), U2 (..., 2, 2))`` from ``E = [U0, U1x, U1y, tr U2, (U2)xx - (U2)yy, (U2)xy]``,
    the form in which :func:`_ray_terms` (up to a factor) produces them."""
    U0, U1x, U1y, T3, T3c2, T3cs = E
    Uxx, Uyy = 0.5 * (T3 + T3c2), 0.5 * (T3 - T3c2)
    U1 = torch.stack([U1x, U1y], -1)
    U2 = torch.stack([torch.stack([Uxx, T3cs], -1), torch.stack([T3cs, Uyy], -1)], -2)
    return U0, U1, U2


def ball_moments_2d_entries(pair, n):
    r"""Moments over the unit disk of :math:`\mathcal N(u;\tilde\mu,\tilde\Sigma)` by the periodic trapezoid
    rule with ``n`` angular nodes :math:`\varphi_k = 2\pi k/n`, :math:`k=0,\dots,n-1`, for every pair, as
    ``(6, B, N)`` entries (see :func:`moments_from_entries`)."""
    q = pair["q"]
    phi = torch.arange(n, dtype=q.dtype, device=q.device) * (2.0 * math.pi / n)  # no duplicated endpoint
    s = sum_last(_ray_terms(_ray_params(pair), phi[None])).view(6, *q.shape)
    # the weight of a node, sqrt(det P) / (2 pi) * 2 pi / n, times the factor sqrt(pi) / 2 of _ray_terms
    return s * (pair["detP"].sqrt() * (0.5 * _SQRT_PI / n))


def nodes_for_tol(tol: float) -> int:
    """Nodes per (batch, basis) pair in the first round of the adaptive rule (even, grows like log(1/tol))."""
    return 2 * math.ceil(2.0 + 0.65 * math.log(1.0 / tol))



def lemma1_masks(pair, tol, route, lb_floor):
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
    far = (rad > FAR) | (d_out > 2.0)
    mass_out = torch.minimum(bound_out, 0.5 * torch.erfc(d_out * _SQRT_HALF))
    tail = quad & far & (mass_out > (tol / (256.0 * torch.finfo(dtype).eps)) * lb_b[:, None])
    # Results are kept as [U0, U1x, U1y, tr U2, (U2)xx - (U2)yy, (U2)xy] (see moments_from_entries), first
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


def refine_by_doubling(I_cur, tot, est, start, h, wt, s_start, bidx, mean, tol, max_nodes, m, terms):
    r"""Refine the windowed periodic trapezoid rules of ``p`` pairs by doubling until each converges.

    ``I_cur`` ``(k, p)`` holds the rules :math:`T_n` (the sums ``tot`` times ``wt h``) of ``k``
    moments on ``m`` nodes, ``est`` :math:`|T_n-T_{n/2}|`, ``start``/``h`` the first node and spacing,
    ``bidx`` the batch of each pair and ``s_start`` ``(B,)`` a lower bound of the batch's scale
    :math:`s_b` (the largest mass ``I_cur[mean]``).  A pair has converged when its estimate is below
    ``tol`` times :math:`\max(s_b, \text{its own mass})`; the others get the midpoints of their nodes,
    ``terms(act, nodes)`` the summed integrand of pairs ``act`` at ``(a, m_r)`` nodes, until ``max_nodes``.
    Updates ``I_cur``, ``tot`` and ``est`` in place; returns ``(s_b, rounds, nodes, n_unconverged)``.
    """
    dtype, device = I_cur.dtype, I_cur.device
    conv = torch.zeros_like(est, dtype=torch.bool)
    nodes, rounds, m_r = est.numel() * m, 0, m
    while True:
        for _ in range(2):  # s_b from the lower bound and the converged pairs; it grows
            s_b = s_start.scatter_reduce(0, bidx, torch.where(conv, I_cur[mean], 0.0), "amax")
            conv = est <= tol * torch.maximum(s_b[bidx], I_cur[mean])
        act = (~conv).nonzero().squeeze(-1)
        if act.numel() == 0 or 2 * m_r > max_nodes:
            break
        # refine: T_{2n} adds the midpoints of the m_r evaluated nodes (and one past the last)
        rounds += 1
        h_a = h[act] / 2 ** (rounds - 1)
        nodes_a = start[act, None] + (torch.arange(m_r, dtype=dtype, device=device) + 0.5) * h_a[:, None]
        tot_a = tot[:, act] + terms(act, nodes_a)
        I_new = tot_a * (wt[..., act] * h_a * 0.5)
        est[act] = (I_new - I_cur[:, act]).abs().amax(0)
        tot[:, act], I_cur[:, act] = tot_a, I_new
        nodes += act.numel() * m_r
        m_r *= 2
    return s_b, rounds, nodes, act.numel()


def lemma1_adaptive(pair, idx, tol, lb_b, closed, U, info, max_nodes):
    """The windowed, adaptive periodic trapezoid rule for the pairs ``idx``; writes ``U[:, idx]``."""
    N = pair["q"].shape[1]
    dtype, device = U.dtype, U.device
    m = min(nodes_for_tol(tol), 2 * (max_nodes // 2))
    sub = dict(zip(_PAIR_KEYS, torch.stack([pair[k].reshape(-1) for k in _PAIR_KEYS])[:, idx].unbind(0)))
    bidx = idx // N
    start, h, prm, wt = _angular_windows(sub, tol, lb_b[bidx], m)
    # round 0: even-numbered nodes first, so that T_{n/2} is a sum over the first half
    j = torch.cat([torch.arange(0, m, 2), torch.arange(1, m, 2)]).to(dtype=dtype, device=device)
    halves = sum_last(_ray_terms(prm, start[:, None] + j * h[:, None]).view(6, -1, 2, m // 2))
    tot = halves.sum(-1)
    I_cur = tot * (wt * h)
    est = (I_cur - halves[..., 0] * (wt * 2.0 * h)).abs().amax(0)  # |T_n - T_{n/2}|
    s_closed = torch.maximum(closed.any(-1).to(dtype), lb_b)  # U0 = 1 on closed-form pairs
    s_b, rounds, nodes, unconverged = refine_by_doubling(
        I_cur, tot, est, start, h, wt, s_closed, bidx, 0, tol, max_nodes, m,
        lambda act, phi: sum_last(_ray_terms(prm[:, act], phi)))
    U.index_copy_(1, idx, I_cur)
    info["lemma1"].update(rounds=rounds, nodes=nodes, unconverged=unconverged,
                          max_error_estimate=float((est / s_b[bidx]).max()))


def lemma1_read_free(pair, quad, tol, lb_b, U, max_nodes):
    """The read-free variant: the same windows, ``m 2^k`` nodes (``k = _READ_FREE_ROUNDS``, at most
    ``max_nodes``) for every pair, kept where ``quad``; no host read, no error estimate."""
    N = pair["q"].shape[1]
    dtype, device = U.dtype, U.device
    m = min(nodes_for_tol(tol), 2 * (max_nodes // 2))
    n = m * 2**_READ_FREE_ROUNDS
    while n > max_nodes:
        n //= 2
    sub = {k: pair[k].reshape(-1) for k in _PAIR_KEYS}
    start, h, prm, wt = _angular_windows(sub, tol, lb_b.repeat_interleave(N), m)
    h = h * (m / n)  # the spacing of T_{n'} with n' = n_win n / m nodes on the circle
    start = start + 0.5 * (m - 1) * h * (n / m) - 0.5 * (n - 1) * h  # still centred on the window
    phi = start[:, None] + torch.arange(n, dtype=dtype, device=device) * h[:, None]
    I_all = sum_last(_ray_terms(prm, phi)) * (wt * h)
    return torch.where(quad.view(-1), I_all, U)
