r"""Engine of continuous sparsemax: the route by slices (Farinhas, 2021, Appendix A.2, computed differently).

Cartesian slices of the disk in a frame :math:`(v_i, v_o)`: the periodic trapezoid rule in the angle
of the outer direction on a window of angles, Gauss--Legendre on each chord (or on the window of the
chord where a stiff inner factor is not negligible), the exponent written around an anchor so that no
large terms cancel.  The method is described at the head of :mod:`attnopt.continuous._sparsemax`.
"""

from __future__ import annotations

import math

import torch

from ._quadrature import (
    BALL_Z,
    READ_FREE_DEPTH,
    READ_FREE_SLICE_ROUNDS,
    STIFF,
    nodes_for_tol,
    refine_by_doubling,
    sum_last,
)


# Gauss-Legendre rules for the chords of the slice route.  _GL_ERROR[i][k] is the largest relative error
# (measured against scipy.integrate.quad) of the _GL_NODES[k]-point rule for int_{-1}^{1} (1 - x^2)^l x^k
# exp(-a x^2 / 2 + c x) dx, l <= 2, k <= 2, a in {0, 1, V, 2 V}, c = V - a / 2 (V = GL_VARIATION[i]:
# tilted, Gaussian, or both), relative to int exp(-a x^2 / 2 + c x) dx.
GL_VARIATION = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 40.0, 56.0)
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
GL_READ_FREE_VARIATION = 16.0


def _gl_count(variation: float, tol: float) -> int:
    """Nodes of the chord rule for an exponent that varies by at most ``variation`` (within tol / 100)."""
    row = next((i for i, v in enumerate(GL_VARIATION) if v >= variation), len(GL_VARIATION) - 1)
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


def slice_setup_2d(pp, a1, angle, Mp):
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
    stiff = a1 >= STIFF
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
    ro, go = _anchor(ao, bo, ao >= STIFF)
    ri, gi = _anchor(ai, bi, ai >= STIFF)
    go, gi = go - ci * ri, gi - ci * ro  # the gradient b - A u_a at the anchor
    # log psi_j at t_a = mu + M u_a: e = t_a - mu_j = M u_a - d
    ua0, ua1 = ri * ei0 + ro * eo0, ri * ei1 + ro * eo1
    e0 = Mp[:, 0, 0] * ua0 - pp["d0"]
    e1 = Mp[:, 1, 0] * ua0 + Mp[:, 1, 1] * ua1 - pp["d1"]
    q_a = pp["i00"] * e0 * e0 + 2.0 * pp["i01"] * e0 * e1 + pp["i11"] * e1 * e1
    log_a = pp["lognorm"] - 0.5 * q_a
    return {"ei0": ei0, "ei1": ei1, "eo0": eo0, "eo1": eo1, "ao": ao, "ai": ai, "ci": ci,
            "ro": ro, "ri": ri, "go": go, "gi": gi, "log_a": log_a}


def slice_bounds_2d(pp, fr, a1):
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
    return sum(sum_last(_slice_terms(prm, theta[:, k:k + block], x, w)) for k in range(0, theta.shape[-1], block))


def _slice_norms(D, dtype, device):
    """Normalizers of the fifteen entries: Z1 (E_w), Z2 (E_w2), the volume of the ball (means)."""
    Z1, Z2 = BALL_Z[D]
    vol = 2.0 if D == 1 else math.pi
    full = lambda n, value: torch.full((n,), value, dtype=dtype, device=device)  # noqa: E731  (no host-to-device copy)
    return torch.cat([full(3, Z1), full(6, Z2), full(6, vol)])[:, None]


def slice_quadrature_2d(pp, fr, log_sup, i_max, lb, mask, B, bidx, tol, rule, info):
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
    m = min(nodes_for_tol(tol), 2 * (rule.max_quadrature // 2))
    # chord windows: points where the inner factor is below e^{-depth} of its peak add less than
    # tol_abs / 24 (each moment entry is a mean with a weight at most pi / Z2 = 3); the rule there has to
    # resolve an exponent that varies by the depth (a stiff chord) or by a_i / 2 + |b_i| + |c_i| (a whole one)
    ai = fr["ai"]
    depth = (log_sup - log_tol_abs + math.log(72.0)).clamp_min(1.0)
    if rule.read_free:
        depth = depth.clamp_max(READ_FREE_DEPTH)
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
        n = rule.n_quadrature or min(m * 2**READ_FREE_SLICE_ROUNDS, 2 * (rule.max_quadrature // 2))
        x, w = _legendre_gauss(_gl_count(READ_FREE_DEPTH, tol), dtype, device)
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
    """Refine the windowed trapezoid rule of the slice route by doubling, as :func:`lemma1_adaptive`."""
    dtype, device = prm.dtype, prm.device
    h = span / m
    j = torch.cat([torch.arange(0, m, 2), torch.arange(1, m, 2)]).to(dtype=dtype, device=device)
    halves = sum_last(_slice_terms(prm, start[:, None] + j * h[:, None], x, w).view(15, -1, 2, m // 2))
    tot = halves.sum(-1)
    wt = factor / norms  # (15, p)
    I_cur = tot * (wt * h)
    est = (I_cur - halves[..., 0] * (wt * 2.0 * h)).abs().amax(0)
    s_start = torch.zeros(B, dtype=dtype, device=device).scatter_reduce(0, bidx, lb[idx], "amax")
    mean = 9  # the entry of the mean of f over the disk
    s_b, rounds, nodes, unconverged = refine_by_doubling(
        I_cur, tot, est, start, h, wt, s_start, bidx, mean, tol, max_nodes, m,
        lambda act, theta: _slice_sum(prm[:, act], theta, x, w))
    E[:, idx] = I_cur
    info["slices"].update(rounds=rounds, nodes=nodes, unconverged=unconverged,
                          max_error_estimate=float((est / s_b[bidx]).max()))


def slice_setup_1d(pp, Mp):
    """The anchor (``b / a`` if ``a >= 1``, else 0), the slope there and ``log psi_j(mu + m r)`` (1D)."""
    a, b = pp["A00"], pp["b0"]
    r, g = _anchor(a, b, a >= STIFF)
    e = Mp[:, 0, 0] * r - pp["d0"]
    return {"a": a, "r": r, "g": g, "log_a": pp["lognorm"] - 0.5 * pp["i00"] * e * e}


def slice_bounds_1d(fr):
    """Upper bound of log psi_j(mu + M u) on [-1, 1] and a lower bound of its mean there (1D)."""
    a, r, g, log_a = fr["a"], fr["r"], fr["g"], fr["log_a"]
    e_max, _ = _max_quadratic(a, g, -1.0 - r, 1.0 - r)
    rho = torch.where(a > 4.0, a.clamp_min(4.0).rsqrt(), 0.5)
    e_c, x_c = _max_quadratic(a, g, -(1.0 - rho) - r, (1.0 - rho) - r)
    grad = (g - a * x_c).abs()
    lb = rho * torch.exp(log_a + e_c - grad * rho - 0.5 * a * rho * rho)
    return log_a + e_max, lb


def slice_quadrature_1d(fr, log_sup, lb, mask, tol, rule, info):
    """The slice route in 1D: one chord, [-1, 1], by Gauss-Legendre; ``(15, p)`` entries as in 2D (the
    v_o entries zero).  The number of nodes covers the pairs that are not negligible."""
    dtype, device = lb.dtype, lb.device
    a, r, g, log_a = fr["a"], fr["r"], fr["g"], fr["log_a"]
    variation = 0.5 * a * (1.0 + r.abs()) ** 2 + g.abs() * (1.0 + r.abs())
    if rule.read_free:
        n_in = _gl_count(GL_VARIATION[-1], tol)
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
