"""Tests for attnopt.continuous (and the basis and ridge regression of attnopt.value_functions) against
SciPy quadrature, finite differences and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

import attnopt
from attnopt.continuous import _sparsemax as CS
from attnopt import continuous as C
from attnopt.continuous._sparsemax import sparsemax_from_S
from attnopt.continuous import (
    DEFAULT_N_QUADRATURE,
    continuous_density,
    continuous_softmax,
    continuous_sparsemax,
    moment_match,
    truncated_paraboloid_threshold,
)
from attnopt.continuous_attention import ContinuousAttention
from attnopt.value_functions import GaussianRBF, grid_locations, padding_locations, ridge_value_function

F64 = torch.float64


# ------------------------------------------------------------------------------------------------
# independent reference implementations (NumPy / SciPy)
# ------------------------------------------------------------------------------------------------


def np_minus_lambda(Sigma):
    d = Sigma.shape[0]
    return (math.gamma(d / 2 + 2) / math.sqrt(np.linalg.det(2 * math.pi * Sigma))) ** (2 / (d + 2))


def make_tp(mu, Sigma):
    """Fast closure t -> TP(t; mu, Sigma) (eq. 3.14 with lambda of eq. 3.15)."""
    Si, ml = np.linalg.inv(Sigma), np_minus_lambda(Sigma)

    def tp(t):
        d = np.asarray(t, dtype=float) - mu
        return max(ml - 0.5 * d @ Si @ d, 0.0)

    return tp


def make_psi(c, V):
    """Fast closure t -> N(t; c, V)."""
    Vi = np.linalg.inv(V)
    norm = 1.0 / math.sqrt(np.linalg.det(2 * math.pi * V))

    def psi(t):
        e = np.asarray(t, dtype=float) - c
        return norm * math.exp(-0.5 * e @ Vi @ e)

    return psi


def np_psi(t, c, V):
    return stats.multivariate_normal(mean=c, cov=V).pdf(t)


def ellipse_dblquad(f, mu, Sigma, epsrel=1e-10, epsabs=1e-13):
    """Integrate f(x, y) over the support of TP(mu, Sigma) (2D) with scipy's dblquad."""
    Si = np.linalg.inv(Sigma)
    R2 = 2 * np_minus_lambda(Sigma)
    wx = math.sqrt(R2 * Sigma[0, 0])

    def bounds(x):
        dx = x - mu[0]
        a, b, c = Si[1, 1], 2 * Si[0, 1] * dx, Si[0, 0] * dx * dx - R2
        disc = math.sqrt(max(b * b - 4 * a * c, 0.0))
        return mu[1] + (-b - disc) / (2 * a), mu[1] + (-b + disc) / (2 * a)

    val, _ = integrate.dblquad(
        lambda y, x: f(x, y), mu[0] - wx, mu[0] + wx, lambda x: bounds(x)[0], lambda x: bounds(x)[1],
        epsabs=epsabs, epsrel=epsrel,
    )
    return val


def interval_quad(f, mu, Sigma):
    w = math.sqrt(2 * np_minus_lambda(Sigma) * Sigma[0, 0])
    return integrate.quad(f, mu[0] - w, mu[0] + w, epsabs=1e-14, epsrel=1e-12)[0]


def sparsemax_reference(mu, Sigma, basis):
    """r_j and the beta=0 covariance rows cov(t, psi_j), cov(tt^T, psi_j) by quadrature."""
    mu, Sigma = mu.numpy(), Sigma.numpy()
    C, V = basis.centers.numpy(), basis.covariance.numpy()
    d = mu.shape[0]
    integ = interval_quad if d == 1 else ellipse_dblquad

    def I(g):
        if d == 1:
            return integ(lambda x: g(np.array([x])), mu, Sigma)
        return integ(lambda x, y: g(np.array([x, y])), mu, Sigma)

    area = I(lambda t: 1.0)
    mean_t = np.array([I(lambda t, a=a: t[a]) for a in range(d)]) / area
    mean_tt = np.array([[I(lambda t, a=a, b=b: t[a] * t[b]) for b in range(d)] for a in range(d)]) / area
    r, J1, J2 = [], [], []
    tp = make_tp(mu, Sigma)
    for j in range(C.shape[0]):
        psi = make_psi(C[j], V[j])
        r.append(I(lambda t: tp(t) * psi(t)))
        m0 = I(psi)
        m1 = np.array([I(lambda t, a=a: t[a] * psi(t)) for a in range(d)])
        m2 = np.array([[I(lambda t, a=a, b=b: t[a] * t[b] * psi(t)) for b in range(d)] for a in range(d)])
        J1.append(m1 - mean_t * m0)
        J2.append(m2 - mean_tt * m0)
    return torch.tensor(np.array(r)), torch.tensor(np.array(J1)), torch.tensor(np.array(J2))


def grads_from_theta_jacobian(J1, J2, g, mu, Sigma):
    """(mu, Sigma)-gradient of <g, r> given dr/dtheta, through theta = [Sigma^{-1} mu, -Sigma^{-1}/2]."""
    mu, Sigma = mu.clone().requires_grad_(), Sigma.clone().requires_grad_()
    Si = torch.linalg.inv(Sigma)
    th1, th2 = Si @ mu, -0.5 * Si
    lin = (g[:, None] * J1).sum(0) @ th1 + ((g[:, None, None] * J2).sum(0) * th2).sum()
    gm, gS = torch.autograd.grad(lin, (mu, Sigma))
    return gm, 0.5 * (gS + gS.T)


def our_grads(fn, mu, Sigma, g):
    mu, Sigma = mu.clone().requires_grad_(), Sigma.clone().requires_grad_()
    (fn(mu, Sigma) * g).sum().backward()
    return mu.grad, Sigma.grad


# small test problems ------------------------------------------------------------------------------

MU2 = torch.tensor([0.45, 0.55], dtype=F64)
SIGMA2 = torch.tensor([[0.02, 0.006], [0.006, 0.015]], dtype=F64)
MU1 = torch.tensor([0.4], dtype=F64)
SIGMA1 = torch.tensor([[0.03]], dtype=F64)


def basis2():
    # two isotropic bumps and one anisotropic, rotated one; one centre outside the support
    centers = torch.tensor([[0.5, 0.5], [0.2, 0.7], [0.9, 0.2]], dtype=F64)
    cov = torch.tensor([[[0.01, 0.0], [0.0, 0.01]], [[0.02, 0.0], [0.0, 0.02]], [[0.03, 0.01], [0.01, 0.01]]], dtype=F64)
    return GaussianRBF(centers, covariance=cov)


def basis1():
    return GaussianRBF(torch.tensor([[0.1], [0.45], [0.9]], dtype=F64), torch.tensor([0.05, 0.1, 0.2], dtype=F64))


def rand_spd(B, d, gen, scale=0.05):
    A = torch.randn(B, d, d, generator=gen, dtype=F64) * scale
    return A @ A.transpose(-1, -2) + 0.01 * torch.eye(d, dtype=F64)


# ------------------------------------------------------------------------------------------------
# basis, locations
# ------------------------------------------------------------------------------------------------


def test_gaussian_rbf_is_a_gaussian_density():
    b = basis2()
    t = torch.rand(7, 2, dtype=F64)
    want = np.stack([np_psi(t.numpy(), b.centers[j].numpy(), b.covariance[j].numpy()) for j in range(3)], -1)
    torch.testing.assert_close(b(t), torch.tensor(want), rtol=1e-12, atol=0)
    g = GaussianRBF.grid([3, 2], [0.1, 0.2], dim=2, dtype=F64)
    assert g.n_basis == 9 + 4 and g.dim == 2
    torch.testing.assert_close(g.covariance[-1], 0.04 * torch.eye(2, dtype=F64))
    assert grid_locations(14).shape == (196, 2)


def test_padding_locations_surround_the_grid():
    pad = padding_locations(5, 2)
    inside = ((pad >= 0) & (pad <= 1)).all(-1)
    assert not inside.any()
    assert pad.min() == pytest.approx(-0.5) and pad.max() == pytest.approx(1.5)
    assert pad.shape[0] == 9**2 - 5**2


# ------------------------------------------------------------------------------------------------
# continuous softmax
# ------------------------------------------------------------------------------------------------


def test_softmax_forward_matches_quadrature():
    b1 = basis1()
    r1 = continuous_softmax(MU1, SIGMA1, b1)
    sd = math.sqrt(SIGMA1.item())
    for j in range(3):
        c, s = b1.centers[j, 0].item(), math.sqrt(b1.covariance[j, 0, 0].item())
        ref = integrate.quad(lambda x: stats.norm.pdf(x, MU1.item(), sd) * stats.norm.pdf(x, c, s), -2.0, 3.0,
                             points=[MU1.item(), c], limit=200, epsabs=1e-15, epsrel=1e-12)[0]
        assert r1[j].item() == pytest.approx(ref, rel=1e-9)
    b2 = basis2()
    r2 = continuous_softmax(MU2, SIGMA2, b2)
    g = make_psi(MU2.numpy(), SIGMA2.numpy())
    for j in range(2):
        psi = make_psi(b2.centers[j].numpy(), b2.covariance[j].numpy())
        ref = integrate.dblquad(lambda y, x: g([x, y]) * psi([x, y]), -0.6, 1.5, -0.6, 1.6, epsabs=1e-12, epsrel=1e-9)[0]
        assert r2[j].item() == pytest.approx(ref, rel=1e-7)


def test_softmax_jacobian_is_a_covariance_1d():
    """Our (mu, Sigma)-gradient = cov_p(phi, psi) (eq. 3.20, beta=1) by quadrature, chained to (mu, Sigma)."""
    b1 = basis1()
    mu, s2 = MU1.item(), SIGMA1.item()
    p = stats.norm(mu, math.sqrt(s2))
    J1, J2 = [], []
    for j in range(3):
        psi = stats.norm(b1.centers[j, 0].item(), math.sqrt(b1.covariance[j, 0, 0].item()))
        E = lambda f: integrate.quad(lambda x: p.pdf(x) * f(x), -2.0, 3.0, points=[mu, psi.mean()], limit=200,  # noqa: E731
                                     epsabs=1e-15, epsrel=1e-13)[0]
        m0 = E(psi.pdf)
        J1.append([E(lambda x: x * psi.pdf(x)) - mu * m0])
        J2.append([[E(lambda x: x * x * psi.pdf(x)) - (s2 + mu * mu) * m0]])
    g = torch.tensor([0.3, -1.0, 2.0], dtype=F64)
    want = grads_from_theta_jacobian(torch.tensor(J1, dtype=F64), torch.tensor(J2, dtype=F64), g, MU1, SIGMA1)
    got = our_grads(lambda m, S: continuous_softmax(m, S, b1), MU1, SIGMA1, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("D", [1, 2, 3])
def test_softmax_gradcheck(D):
    gen = torch.Generator().manual_seed(D)
    basis = GaussianRBF.grid(3 if D < 3 else 2, [0.1, 0.3], dim=D, dtype=F64)
    mu = (0.5 + 0.2 * torch.randn(2, D, generator=gen, dtype=F64)).requires_grad_()
    S = rand_spd(2, D, gen).requires_grad_()
    f = lambda m, A: continuous_softmax(m, 0.5 * (A + A.transpose(-1, -2)), basis)  # noqa: E731
    assert torch.autograd.gradcheck(f, (mu, S))


# ------------------------------------------------------------------------------------------------
# continuous sparsemax
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sparsemax_refs():
    return {1: sparsemax_reference(MU1, SIGMA1, basis1()), 2: sparsemax_reference(MU2, SIGMA2, basis2())}


@pytest.mark.parametrize("D", [1, 2])
def test_sparsemax_forward_and_jacobian_match_quadrature(D, sparsemax_refs):
    mu, Sigma, basis = (MU1, SIGMA1, basis1()) if D == 1 else (MU2, SIGMA2, basis2())
    r_ref, J1, J2 = sparsemax_refs[D]
    r = continuous_sparsemax(mu, Sigma, basis)
    torch.testing.assert_close(r, r_ref, rtol=1e-8, atol=1e-12)
    g = torch.tensor([1.0, -0.7, 0.4], dtype=F64)
    want = grads_from_theta_jacobian(J1, J2, g, mu, Sigma)
    got = our_grads(lambda m, S: continuous_sparsemax(m, S, basis), mu, Sigma, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_sparsemax_default_rule_error_below_1e8_vs_dblquad():
    """Thesis setting (Sigma_j = 0.001 I); ellipse moment-matched from a smooth attention map."""
    basis = GaussianRBF.grid(10, 0.001**0.5, dim=2, dtype=F64)
    loc = grid_locations(14, dtype=F64)
    scores = -((loc - torch.tensor([0.35, 0.6], dtype=F64)) ** 2 * torch.tensor([1.0, 3.0], dtype=F64)).sum(-1) / 0.08
    mu, Sigma = moment_match(torch.softmax(scores, -1), loc, "truncated_paraboloid")
    r = continuous_sparsemax(mu, Sigma, basis)
    keep = torch.argsort(r, descending=True)[:4]  # the largest entries carry the norm
    sub = GaussianRBF(basis.centers[keep], covariance=basis.covariance[keep])
    tp = make_tp(mu.numpy(), Sigma.numpy())
    psis = [make_psi(sub.centers[j].numpy(), sub.covariance[j].numpy()) for j in range(4)]
    ref = torch.tensor([
        ellipse_dblquad(lambda x, y, f=f: tp([x, y]) * f([x, y]), mu.numpy(), Sigma.numpy(), epsrel=1e-12, epsabs=1e-14)
        for f in psis
    ], dtype=F64)
    err = lambda n: ((continuous_sparsemax(mu, Sigma, sub, n_quadrature=n) - ref).norm() / ref.norm()).item()  # noqa: E731
    assert err(DEFAULT_N_QUADRATURE) <= 1e-8
    # geometric convergence of the periodic trapezoid rule: each doubling at least squares the error
    e = [err(n) for n in (16, 32, 64)]
    assert e[1] < e[0] ** 1.5 and e[2] < max(e[1] ** 1.5, 1e-13)


@pytest.mark.parametrize("D, rule", [(1, {}), (2, {"n_quadrature": 64}), (2, {"tol": 1e-13})])
def test_sparsemax_gradcheck(D, rule):
    # the adaptive rule's choices (closed forms, windows, node counts) change the output by at most
    # tol * s_b across a finite-difference step: tol = 1e-13 keeps that far below gradcheck's atol
    gen = torch.Generator().manual_seed(10 + D)
    basis = GaussianRBF.grid(3, [0.1, 0.3], dim=D, dtype=F64)
    mu = (0.5 + 0.1 * torch.randn(2, D, generator=gen, dtype=F64)).requires_grad_()
    S = rand_spd(2, D, gen).requires_grad_()
    f = lambda m, A: continuous_sparsemax(m, 0.5 * (A + A.transpose(-1, -2)), basis, **rule)  # noqa: E731
    assert torch.autograd.gradcheck(f, (mu, S))


@pytest.mark.parametrize("fn", [continuous_softmax, continuous_sparsemax])
def test_second_forward_does_not_change_first_gradient(fn):
    basis = GaussianRBF.grid(4, 0.15, dim=2, dtype=F64)
    gen = torch.Generator().manual_seed(3)
    mu_a, S_a = 0.5 + 0.1 * torch.randn(3, 2, generator=gen, dtype=F64), rand_spd(3, 2, gen)
    mu_b, S_b = 0.3 + 0.1 * torch.randn(3, 2, generator=gen, dtype=F64), rand_spd(3, 2, gen)
    g = torch.randn(3, 16, generator=gen, dtype=F64)
    alone = our_grads(lambda m, S: fn(m, S, basis), mu_a, S_a, g)
    ma, Sa = mu_a.clone().requires_grad_(), S_a.clone().requires_grad_()
    ra = fn(ma, Sa, basis)
    rb = fn(mu_b.clone().requires_grad_(), S_b.clone().requires_grad_(), basis)  # second forward
    (ra * g).sum().backward()
    torch.testing.assert_close(ma.grad, alone[0], rtol=0, atol=0)
    torch.testing.assert_close(Sa.grad, alone[1], rtol=0, atol=0)
    assert rb.grad_fn is not None


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, 2]))
def test_sparsemax_is_a_sub_expectation_of_softmax_like_quantities(seed, D):
    """Properties: r >= 0, sum_j r_j <= max psi, batching/broadcasting agree with one-by-one calls."""
    gen = torch.Generator().manual_seed(seed)
    basis = GaussianRBF.grid(3, 0.2, dim=D, dtype=F64)
    mu = 0.5 + 0.2 * torch.randn(4, D, generator=gen, dtype=F64)
    S = rand_spd(4, D, gen)
    r = continuous_sparsemax(mu, S, basis, n_quadrature=96)
    assert (r >= -1e-14).all()
    peak = basis(basis.centers).diagonal().max()
    assert (r.sum(-1) <= basis.n_basis * peak).all()
    one = torch.stack([continuous_sparsemax(mu[i], S[i], basis, n_quadrature=96) for i in range(4)])
    torch.testing.assert_close(r, one, rtol=1e-12, atol=1e-14)
    shared = continuous_sparsemax(mu, S[0], basis, n_quadrature=96)  # Sigma broadcast over the batch
    torch.testing.assert_close(shared[0], r[0], rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------------
# the adaptive angular rule of 2D continuous sparsemax
# ------------------------------------------------------------------------------------------------


def sparsemax_moments(mu, Sigma, basis, tol, n_quadrature, read_free=False):
    """``(r, saved, info)`` of the forward pass (the moments the backward pass keeps, the diagnostics)."""
    mu_f, Sigma_f, centers, cov, _, _ = C._prepare(mu, Sigma, basis, "test", definite=True)
    rule = CS.Rule(n_quadrature, tol, max(8192, n_quadrature or 0), read_free)
    return CS.sparsemax_moments(mu_f, C._sparsemax_scale(Sigma_f)[1], centers, cov, rule)


def slice_reference(mu, Sigma, basis, epsrel=1e-12):
    """An independent reference for every basis function j, by Cartesian slices of the ellipse E:

    r_j = int_E p psi_j and the moments int_E (t - mu)^(k) psi_j, k <= 2, as ``(7, N)`` rows
    [r, m0, m1_x, m1_y, m2_xx, m2_xy, m2_yy].  For fixed t1 the t2-integral of a quadratic times the
    conditional Gaussian of psi_j is in closed form (truncated normal moments); SciPy's quad_vec
    integrates over t1.  (No polar coordinates, no unit disk, no trapezoid rule.)
    """
    mu, Sigma = mu.numpy(), Sigma.numpy()
    C, V = basis.centers.numpy(), basis.covariance.numpy()
    Si, ml = np.linalg.inv(Sigma), np_minus_lambda(Sigma)
    wx = math.sqrt(2 * ml * Sigma[0, 0])
    v00, v01, v11 = V[:, 0, 0], V[:, 0, 1], V[:, 1, 1]
    s = np.sqrt(v11 - v01**2 / v00)
    root2pi = math.sqrt(2 * math.pi)

    def f(x):
        dx = x - mu[0]
        qa, qb, qc = Si[1, 1], 2 * Si[0, 1] * dx, Si[0, 0] * dx * dx - 2 * ml
        disc = math.sqrt(max(qb * qb - 4 * qa * qc, 0.0))
        lo, hi = (-qb - disc) / (2 * qa), (-qb + disc) / (2 * qa)  # e = t2 - mu2 on the chord of E
        m = C[:, 1] + v01 / v00 * (x - C[:, 0]) - mu[1]  # conditional mean of e given t1 = x
        nx = np.exp(-0.5 * (x - C[:, 0]) ** 2 / v00) / np.sqrt(2 * np.pi * v00)
        a, b = (lo - m) / s, (hi - m) / s
        P = np.where(a > 0, special.ndtr(-a) - special.ndtr(-b), special.ndtr(b) - special.ndtr(a))
        pa, pb = np.exp(-0.5 * a * a) / root2pi, np.exp(-0.5 * b * b) / root2pi
        E1 = m * P + s * (pa - pb)
        E2 = m * m * P + 2 * m * s * (pa - pb) + s * s * (P + a * pa - b * pb)
        p = ml * P - 0.5 * (Si[0, 0] * dx * dx * P + 2 * Si[0, 1] * dx * E1 + Si[1, 1] * E2)  # eq. (3.14)
        return nx * np.stack([p, P, dx * P, E1, dx * dx * P, dx * E1, E2])

    pts = [x for x in C[:, 0] if abs(x - mu[0]) < wx]
    val, _ = integrate.quad_vec(f, mu[0] - wx, mu[0] + wx, epsabs=0, epsrel=epsrel, points=pts, limit=10000, norm="max")
    return torch.tensor(val)


def grads_from_moments(ref, g, mu, Sigma):
    """(mu, Sigma)-gradient of <g, r> by differentiating under the integral (p = 0 on the boundary of E,
    lambda proportional to det(Sigma)^(-1/4)): d/dmu = Sigma^-1 int (t - mu) psi,
    d/dSigma = int (lambda / 4 Sigma^-1 + 1/2 Sigma^-1 (t - mu)(t - mu)^T Sigma^-1) psi."""
    G = ref[1:] @ g
    Si = torch.linalg.inv(Sigma)
    lam = -np_minus_lambda(Sigma.numpy())
    m2 = torch.stack([torch.stack([G[3], G[4]]), torch.stack([G[4], G[5]])])
    return Si @ G[1:3], lam / 4 * G[0] * Si + 0.5 * Si @ m2 @ Si


GRID14 = grid_locations(14, dtype=F64)
VQA_BASIS = GaussianRBF.grid(10, 0.001**0.5, dim=2, dtype=F64)  # Table 6.1 of the thesis


def hard_case(name):
    """Ellipses moment-matched from attention over the 14 x 14 grid that need the most angular nodes."""
    w = torch.full((196,), 1e-3, dtype=F64)
    if name == "near_uniform":  # the widest ellipse
        w = 1 + 0.05 * torch.rand(196, generator=torch.Generator().manual_seed(0), dtype=F64)
    elif name == "four_corners":  # mass piled on the corners: an ellipse far larger than the image
        w[[0, 13, 182, 195]] = 1.0
    elif name == "two_corners":  # a needle along the diagonal
        w[[0, 195]] = 1.0
    elif name == "one_corner":  # a small ellipse in a corner, half of it outside the basis grid
        w[[0, 1, 14]] = 1.0
    elif name == "benchmark":  # an ellipse of benchmarks/continuous.py
        centre, width = torch.tensor([0.7, 0.35], dtype=F64), 0.06
        w = torch.softmax(-((GRID14 - centre) ** 2).sum(-1) / (2 * width**2), -1)
    return moment_match(w, GRID14, "truncated_paraboloid")


HARD = ["near_uniform", "four_corners", "two_corners", "one_corner", "benchmark"]


@pytest.fixture(scope="module")
def hard_refs():
    return {name: slice_reference(*hard_case(name), VQA_BASIS) for name in HARD}


def test_slice_reference_agrees_with_dblquad(hard_refs):
    mu, Sigma = hard_case("one_corner")
    j = int(hard_refs["one_corner"][0].argmax())
    tp, psi = make_tp(mu.numpy(), Sigma.numpy()), make_psi(VQA_BASIS.centers[j].numpy(), VQA_BASIS.covariance[j].numpy())
    ref = ellipse_dblquad(lambda x, y: tp([x, y]) * psi([x, y]), mu.numpy(), Sigma.numpy(), epsrel=1e-12, epsabs=1e-14)
    assert hard_refs["one_corner"][0, j].item() == pytest.approx(ref, rel=1e-11)


@pytest.mark.parametrize("name", HARD)
def test_default_rule_matches_scipy_on_hard_cases(name, hard_refs):
    """The default (adaptive) rule: forward and gradient within 1e-8 of the SciPy reference."""
    mu, Sigma = hard_case(name)
    ref = hard_refs[name]
    g = torch.randn(VQA_BASIS.n_basis, generator=torch.Generator().manual_seed(7), dtype=F64)
    m, S = mu.clone().requires_grad_(), Sigma.clone().requires_grad_()
    r = continuous_sparsemax(m, S, VQA_BASIS)
    (r * g).sum().backward()
    assert ((r.detach() - ref[0]).norm() / ref[0].norm()).item() < 1e-8
    want_mu, want_S = grads_from_moments(ref, g, mu, Sigma)
    assert ((m.grad - want_mu).norm() / want_mu.norm()).item() < 1e-8
    assert ((S.grad - want_S).norm() / want_S.norm()).item() < 1e-8


@pytest.mark.parametrize("tol", [1e-4, 1e-7, 1e-10])
def test_adaptive_error_is_within_tol(tol):
    """Every moment entry within tol * s_b (s_b = max_j U0), against the fixed rule at 8192 nodes (which
    matches SciPy to round-off, see above); the returned error estimate is below tol as well."""
    mus, Sigmas = zip(*(hard_case(name) for name in HARD))
    mu, Sigma = torch.stack(mus), torch.stack(Sigmas)
    _, saved, info = sparsemax_moments(mu, Sigma, VQA_BASIS, tol, None)
    _, saved_ref, _ = sparsemax_moments(mu, Sigma, VQA_BASIS, tol, 8192)
    lemma1 = saved.disk.on_route
    assert torch.equal(lemma1, saved_ref.disk.on_route) and lemma1.float().mean() > 0.8  # these ellipses take Lemma 1
    U, ref = saved.disk[3:6], saved_ref.disk[3:6]
    info = info["lemma1"]
    assert info["unconverged"] == 0 and info["max_error_estimate"] <= tol
    assert info["closed_form"] > 0 and info["skipped"] > 0 and info["quadrature"] > 0  # all three paths ran
    s_b = ref[0].amax(-1)
    for u, u_ref in zip(U, ref):
        err = (u - u_ref).abs().flatten(2) if u.ndim > 2 else (u - u_ref).abs()[..., None]
        assert (err.amax((1, 2)) <= tol * s_b).all()
    r = continuous_sparsemax(mu, Sigma, VQA_BASIS, tol=tol)
    r_ref = continuous_sparsemax(mu, Sigma, VQA_BASIS, n_quadrature=8192)
    assert (((r - r_ref).norm(dim=-1) / r_ref.norm(dim=-1)) <= 10 * tol).all()


def test_adaptive_rule_in_float32_and_node_count():
    """float32 with its default tolerance: within 1e-5 of the float64 reference, with far fewer
    angular nodes than the fixed 256 of earlier versions."""
    mus, Sigmas = zip(*(hard_case(name) for name in HARD))
    mu, Sigma = torch.stack(mus), torch.stack(Sigmas)
    basis32 = GaussianRBF.grid(10, 0.001**0.5, dim=2, dtype=torch.float32)
    r32 = continuous_sparsemax(mu.float(), Sigma.float(), basis32)
    assert r32.dtype == torch.float32
    r_ref = continuous_sparsemax(mu, Sigma, VQA_BASIS, n_quadrature=8192)
    assert (((r32.double() - r_ref).norm(dim=-1) / r_ref.norm(dim=-1)) < 1e-5).all()
    info = C._sparsemax_diagnostics(mu.float(), Sigma.float(), basis32)
    assert info["lemma1"]["unconverged"] == info["slices"]["unconverged"] == 0
    assert info["lemma1"]["nodes"] < 64 * info["pairs"]


def np_periodic_rule(n, mu, Sigma, c, V):
    """r_j by the periodic trapezoid rule with n nodes on the angular integrand, written in NumPy
    (unit disk, radial integral by truncated Gaussian moments), independently of the library."""
    lam = -np_minus_lambda(Sigma)
    Minv = np.linalg.inv(math.sqrt(-2 * lam) * np.linalg.cholesky(Sigma))
    mt, P = Minv @ (c - mu), np.linalg.inv(Minv @ V @ Minv.T)
    phi = 2 * np.pi * np.arange(n) / n
    a = np.stack([np.cos(phi), np.sin(phi)])
    A, b = np.einsum("in,ij,jn->n", a, P, a), a.T @ (P @ mt)
    s2 = 1 / A
    s, r0 = np.sqrt(s2), b * s2
    Cn = math.sqrt(np.linalg.det(P)) / (2 * math.pi) * np.exp(-0.5 * (mt @ P @ mt - b * b / A))
    lo, hi = -r0 / s, (1 - r0) / s
    I0 = 0.5 * (special.erf(hi / math.sqrt(2)) - special.erf(lo / math.sqrt(2)))
    N0, N1 = np.exp(-0.5 * lo**2) / (math.sqrt(2 * math.pi) * s), np.exp(-0.5 * hi**2) / (math.sqrt(2 * math.pi) * s)
    I1 = r0 * I0 + s2 * (N0 - N1)
    I2 = r0 * I1 + s2 * (I0 - N1)
    I3 = r0 * I2 + s2 * (2 * I1 - N1)
    return (-lam * Cn * math.sqrt(2 * math.pi) * s * (I1 - I3)).sum() * 2 * np.pi / n


@pytest.mark.parametrize("n", [7, 40])
def test_fixed_rule_is_the_periodic_trapezoid_rule(n):
    """n_quadrature=n still gives the plain periodic rule T_n for every pair (not the adaptive one)."""
    mu, Sigma = MU2.numpy(), SIGMA2.numpy()
    b = basis2()
    r = continuous_sparsemax(MU2, SIGMA2, b, n_quadrature=n)
    want = [np_periodic_rule(n, mu, Sigma, b.centers[j].numpy(), b.covariance[j].numpy()) for j in range(3)]
    torch.testing.assert_close(r, torch.tensor(want, dtype=F64), rtol=1e-13, atol=1e-15)


def test_adaptive_rule_warns_at_the_node_cap():
    mu, Sigma = hard_case("two_corners")
    with pytest.warns(RuntimeWarning, match="max_quadrature=16"):
        continuous_sparsemax(mu, Sigma, VQA_BASIS, tol=1e-12, max_quadrature=16)


def test_continuous_attention_passes_the_rule():
    basis, loc = GaussianRBF.grid(5, 0.1, dim=2, dtype=F64), grid_locations(8, dtype=F64)
    scores = torch.randn(3, 64, generator=torch.Generator().manual_seed(5), dtype=F64)
    values = torch.randn(3, 64, 4, generator=torch.Generator().manual_seed(6), dtype=F64)
    mu, Sigma = moment_match(torch.softmax(scores, -1), loc, "truncated_paraboloid")
    B = ridge_value_function(values, loc, basis, 0.01)
    for kwargs in ({}, {"tol": 1e-6}, {"n_quadrature": 32}):
        att = ContinuousAttention(basis, loc, family="truncated_paraboloid", **kwargs)
        r = continuous_sparsemax(mu, Sigma, basis, **kwargs)
        torch.testing.assert_close(att(scores, values), (B @ r.unsqueeze(-1)).squeeze(-1), rtol=1e-12, atol=1e-12)
    assert ContinuousAttention(basis, loc).n_quadrature is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_adaptive_rule_on_cuda_matches_cpu():
    """On a GPU the default is the read-free rule; in checks mode "eager" the adaptive one (which reads)."""
    mus, Sigmas = zip(*(hard_case(name) for name in HARD))
    mu, Sigma = torch.stack(mus), torch.stack(Sigmas)
    g = torch.randn(len(HARD), 100, generator=torch.Generator().manual_seed(8), dtype=F64)
    basis_gpu = GaussianRBF(VQA_BASIS.centers.cuda(), covariance=VQA_BASIS.covariance.cuda())
    cpu = our_grads(lambda m, S: continuous_sparsemax(m, S, VQA_BASIS), mu, Sigma, g)
    with attnopt.checks("eager"):
        gpu = our_grads(lambda m, S: continuous_sparsemax(m, S, basis_gpu), mu.cuda(), Sigma.cuda(), g.cuda())
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-9, atol=1e-12)
    gpu = our_grads(lambda m, S: continuous_sparsemax(m, S, basis_gpu), mu.cuda(), Sigma.cuda(), g.cuda())
    for a, b in zip(gpu, cpu):  # the read-free rule (see test_read_free_rule_is_accurate)
        assert ((a.cpu() - b).norm() / b.norm()).item() < 1e-8
    r_cpu = continuous_sparsemax(mu.float(), Sigma.float(), GaussianRBF.grid(10, 0.001**0.5, dim=2))
    r_gpu = continuous_sparsemax(mu.float().cuda(), Sigma.float().cuda(), GaussianRBF.grid(10, 0.001**0.5, dim=2, device="cuda"))
    torch.testing.assert_close(r_gpu.cpu(), r_cpu, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Theorem 1 and moment matching
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("D", [1, 2])
def test_theorem1_variance_of_truncated_paraboloid(D):
    mu, Sigma = (MU1, SIGMA1) if D == 1 else (MU2, SIGMA2)
    m, S = mu.numpy(), Sigma.numpy()
    tp = make_tp(m, S)
    if D == 1:
        I = lambda f: interval_quad(lambda x: tp([x]) * f(np.array([x])), m, S)  # noqa: E731
    else:
        I = lambda f: ellipse_dblquad(lambda x, y: tp([x, y]) * f(np.array([x, y])), m, S)  # noqa: E731
    mass = I(lambda t: 1.0)
    mean = np.array([I(lambda t, a=a: t[a]) for a in range(D)])
    var = np.array([[I(lambda t, a=a, b=b: (t[a] - m[a]) * (t[b] - m[b])) for b in range(D)] for a in range(D)])
    assert mass == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(mean, m, atol=1e-9)
    lam = truncated_paraboloid_threshold(Sigma).item()
    np.testing.assert_allclose(var, -lam * S / (D / 2 + 2), rtol=1e-8, atol=1e-12)
    # the inversion recovers Sigma from the variance: weights = two Dirac masses per axis reproduce var
    ev, Q = np.linalg.eigh(var)
    pts = np.concatenate([m + s * math.sqrt(e * D) * Q[:, k] for k, e in enumerate(ev) for s in (-1, 1)]).reshape(-1, D)
    w = torch.full((pts.shape[0],), 1.0 / pts.shape[0], dtype=F64)
    mu_hat, Sigma_hat = moment_match(w, torch.tensor(pts), "truncated_paraboloid")
    torch.testing.assert_close(mu_hat, mu, rtol=0, atol=1e-12)
    torch.testing.assert_close(Sigma_hat, Sigma, rtol=1e-9, atol=1e-12)


def test_moment_match_recovers_sigma_from_samples():
    rng = np.random.default_rng(0)
    m, S = MU2.numpy(), SIGMA2.numpy()
    # rejection sampling of TP(m, S) from its bounding box
    R = math.sqrt(2 * np_minus_lambda(S))
    L = np.linalg.cholesky(S)
    u = rng.uniform(-1, 1, size=(400_000, 2))
    u = u[(u**2).sum(1) <= 1]
    keep = rng.uniform(0, 1, size=u.shape[0]) <= 1 - (u**2).sum(1)
    t = m + R * u[keep] @ L.T
    w = torch.ones(t.shape[0], dtype=F64)
    mu_hat, Sigma_hat = moment_match(w, torch.tensor(t), "truncated_paraboloid")
    torch.testing.assert_close(mu_hat, MU2, rtol=0, atol=3e-3)
    torch.testing.assert_close(Sigma_hat, SIGMA2, rtol=0, atol=6e-4)
    mu_g, Sigma_g = moment_match(w, torch.tensor(t), "gaussian")
    torch.testing.assert_close(Sigma_g, torch.tensor(np.cov(t.T, bias=True)), rtol=1e-10, atol=0)


def test_moment_match_closed_forms_eqs_4_3_and_4_6():
    gen = torch.Generator().manual_seed(0)
    loc2 = grid_locations(6, dtype=F64)
    w = torch.rand(3, 36, generator=gen, dtype=F64)
    _, var = moment_match(w, loc2, "gaussian")
    _, Sig = moment_match(w, loc2, "truncated_paraboloid")
    want = 9 * math.pi * torch.linalg.det(var).sqrt()[:, None, None] * var  # eq. (4.6)
    torch.testing.assert_close(Sig, want)
    loc1 = torch.linspace(0, 1, 9, dtype=F64)[:, None]
    _, v1 = moment_match(w[:, :9], loc1, "gaussian")
    _, s1 = moment_match(w[:, :9], loc1, "truncated_paraboloid")
    torch.testing.assert_close(s1, 2 / 3 * (5 * v1) ** 1.5)  # eq. (4.3)


@pytest.mark.parametrize("family", ["gaussian", "truncated_paraboloid"])
def test_moment_matched_densities_integrate_to_one(family):
    loc = grid_locations(8, dtype=F64)
    noise = torch.randn(64, dtype=F64, generator=torch.Generator().manual_seed(11))
    w = torch.softmax(-((loc - 0.4) ** 2).sum(-1) / 0.05 + 0.3 * noise, -1)
    mu, Sigma = moment_match(w, loc, family)
    m, S = mu.numpy(), Sigma.numpy()
    L = np.linalg.cholesky(S)
    if family == "gaussian":
        # t = mu + L z over a box of +-12 standard deviations (the rest is < 1e-30)
        def f(z):
            t = torch.tensor(m + z @ L.T)
            return continuous_density(t, mu, Sigma, family).numpy() * np.linalg.det(L)

        res = integrate.cubature(f, [-12.0, -12.0], [12.0, 12.0], rtol=1e-11, atol=1e-13)
    else:
        # polar coordinates on the supporting ellipse: t = mu + R L (rho cos phi, rho sin phi)
        R = math.sqrt(2 * np_minus_lambda(S))

        def f(x):
            rho, phi = x[:, 0], x[:, 1]
            t = torch.tensor(m + R * np.stack([rho * np.cos(phi), rho * np.sin(phi)], -1) @ L.T)
            return continuous_density(t, mu, Sigma, family).numpy() * R**2 * np.linalg.det(L) * rho

        res = integrate.cubature(f, [0.0, 0.0], [1.0, 2 * math.pi], rtol=1e-11, atol=1e-13)
    assert res.estimate == pytest.approx(1.0, abs=1e-9)
    # 1D
    mu1, S1 = moment_match(w[:8], loc[:8, 1:], family)
    d1 = lambda x: continuous_density(torch.tensor([x], dtype=F64), mu1, S1, family).item()  # noqa: E731
    # Integrate over the support, so that quad never straddles the kinks at its ends.
    half_width = 4.0 if family == "gaussian" else math.sqrt(2 * np_minus_lambda(S1.numpy()) * S1.item())
    ends = (mu1.item() - half_width, mu1.item() + half_width) if family != "gaussian" else (-3.0, 4.0)
    total1 = integrate.quad(d1, *ends, points=[mu1.item()], limit=200, epsabs=1e-12)[0]
    assert total1 == pytest.approx(1.0, abs=1e-8)


# ------------------------------------------------------------------------------------------------
# ridge value function
# ------------------------------------------------------------------------------------------------


def test_ridge_value_function_matches_normal_equations_and_sklearn():
    from sklearn.linear_model import Ridge

    basis = GaussianRBF.grid(4, 0.2, dim=2, dtype=F64)
    loc = grid_locations(9, dtype=F64)
    H = torch.randn(2, 81, 5, dtype=F64)
    B = ridge_value_function(H, loc, basis, 0.1)
    assert B.shape == (2, 5, 16)
    F = basis(loc).numpy()
    for i in range(2):
        sk = Ridge(alpha=0.1, fit_intercept=False, solver="cholesky").fit(F, H[i].numpy())
        np.testing.assert_allclose(B[i].numpy(), sk.coef_, rtol=1e-8, atol=1e-10)
    # padding: the regression also sees zero targets outside the grid
    pad = padding_locations(9, dtype=F64)
    Bp = ridge_value_function(H, loc, basis, 0.1, padding=pad)
    Fa = np.concatenate([F, basis(pad).numpy()])
    Ha = np.concatenate([H[0].numpy(), np.zeros((pad.shape[0], 5))])
    sk = Ridge(alpha=0.1, fit_intercept=False, solver="cholesky").fit(Fa, Ha)
    np.testing.assert_allclose(Bp[0].numpy(), sk.coef_, rtol=1e-8, atol=1e-10)


def test_ridge_value_function_reconstruction_improves_with_n():
    loc = grid_locations(30, dtype=F64)

    def f(t):
        return torch.stack([torch.sin(2 * math.pi * t[:, 0]) * torch.cos(math.pi * t[:, 1]), t[:, 0] * t[:, 1]], -1)

    test_pts = 0.05 + 0.9 * torch.rand(200, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    errs = []
    for n in (3, 6, 12):
        basis = GaussianRBF.grid(n, 1.5 / n, dim=2, dtype=F64)
        B = ridge_value_function(f(loc), loc, basis, 1e-8)
        V = basis(test_pts) @ B.T
        errs.append(((V - f(test_pts)).norm() / f(test_pts).norm()).item())
    assert errs[0] > errs[1] > errs[2] and errs[2] < 5e-3


# ------------------------------------------------------------------------------------------------
# the module
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gaussian", "truncated_paraboloid"])
def test_continuous_attention_pipeline(family):
    basis = GaussianRBF.grid(5, 0.1, dim=2)
    loc = grid_locations(8)
    att = ContinuousAttention(basis, loc, family=family, penalty=0.01, padding=True, n_quadrature=64)
    scores = torch.randn(3, 64, requires_grad=True)
    values = torch.randn(3, 64, 7, requires_grad=True)
    ctx, density = att(scores, values, return_density=True)
    assert ctx.shape == (3, 7) and ctx.dtype == torch.float32
    # equals the pipeline written with the public functions
    mu2, S2 = moment_match(torch.softmax(scores, -1), loc, family)
    assert density.family == family and torch.equal(density.mixing, torch.ones(3, 1))
    torch.testing.assert_close(density.means[:, 0], mu2)
    torch.testing.assert_close(density.scales[:, 0], S2)
    r = continuous_softmax(mu2, S2, basis) if family == "gaussian" else continuous_sparsemax(mu2, S2, basis, 64)
    B = ridge_value_function(values, loc, basis, 0.01, padding=padding_locations(8))
    torch.testing.assert_close(ctx, (B @ r.unsqueeze(-1)).squeeze(-1), rtol=1e-4, atol=1e-5)
    ctx.square().sum().backward()
    assert scores.grad.abs().sum() > 0 and values.grad.abs().sum() > 0


def test_dtype_is_respected():
    basis = GaussianRBF.grid(3, 0.2, dim=2)
    mu = torch.tensor([0.5, 0.5], dtype=torch.bfloat16)
    S = (0.02 * torch.eye(2)).to(torch.bfloat16)
    assert continuous_sparsemax(mu, S, basis).dtype == torch.bfloat16
    assert continuous_softmax(mu.float(), S.float(), basis).dtype == torch.float32


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    basis = GaussianRBF.grid(3, 0.2, dim=2, dtype=F64)
    mu = torch.tensor([0.5, 0.5], dtype=F64)
    good = 0.02 * torch.eye(2, dtype=F64)
    with pytest.raises(ValueError, match="symmetric"):
        continuous_sparsemax(mu, torch.tensor([[0.02, 0.01], [0.0, 0.02]], dtype=F64), basis)
    with pytest.raises(ValueError, match="Sigma must be positive semi-definite"):  # singular is fine for softmax
        continuous_softmax(mu, torch.tensor([[0.02, 0.03], [0.03, 0.02]], dtype=F64), basis)
    with pytest.raises(ValueError, match="Sigma must be positive definite"):  # not for sparsemax (lambda = -inf)
        continuous_sparsemax(mu, torch.tensor([[0.02, 0.0], [0.0, 0.0]], dtype=F64), basis)
    with pytest.raises(ValueError, match="n_quadrature"):
        continuous_sparsemax(mu, good, basis, n_quadrature=0)
    with pytest.raises(TypeError, match="n_quadrature"):
        continuous_sparsemax(mu, good, basis, n_quadrature=2.5)
    for tol in (0.0, -1e-8, 1.0, float("nan")):
        with pytest.raises(ValueError, match="tol"):
            continuous_sparsemax(mu, good, basis, tol=tol)
    with pytest.raises(ValueError, match="tol applies to the adaptive rule"):
        continuous_sparsemax(mu, good, basis, n_quadrature=64, tol=1e-8)
    with pytest.raises(ValueError, match="max_quadrature"):
        continuous_sparsemax(mu, good, basis, max_quadrature=4)
    with pytest.raises(TypeError, match="max_quadrature"):
        continuous_sparsemax(mu, good, basis, max_quadrature=100.0)
    with pytest.raises(ValueError, match="tol"):
        ContinuousAttention(basis, grid_locations(4, dtype=F64), family="truncated_paraboloid", tol=0.0)
    with pytest.raises(ValueError, match="dimension"):
        continuous_softmax(torch.zeros(3, dtype=F64), torch.eye(3, dtype=F64), basis)
    with pytest.raises(ValueError, match="D in"):
        continuous_sparsemax(torch.zeros(3, dtype=F64), torch.eye(3, dtype=F64), GaussianRBF.grid(2, 0.2, dim=3))
    with pytest.raises(ValueError, match="non-negative"):
        moment_match(torch.tensor([0.5, -0.1, 0.6]), torch.rand(3, 2))
    with pytest.raises(ValueError, match="do not match"):
        moment_match(torch.rand(4), torch.rand(3, 2))
    with pytest.raises(ValueError, match="family"):
        moment_match(torch.rand(3), torch.rand(3, 2), family="laplace")
    with pytest.raises(ValueError, match="N, D >= 1"):
        GaussianRBF(torch.zeros(0, 2), 0.1)
    with pytest.raises(ValueError, match="sigma"):
        GaussianRBF(torch.zeros(2, 2), -0.1)
    with pytest.raises(ValueError, match="n_per_axis"):
        GaussianRBF.grid(0, 0.1)
    with pytest.raises(ValueError, match="positive definite"):
        GaussianRBF(torch.zeros(1, 2), covariance=torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="do not match"):
        ridge_value_function(torch.rand(5, 3), torch.rand(4, 2), basis, 0.1)
    with pytest.raises(ValueError, match="dimension"):
        ridge_value_function(torch.rand(4, 3), torch.rand(4, 3), basis, 0.1)
    with pytest.raises(ValueError, match="singular"):
        ridge_value_function(torch.rand(2, 3, dtype=F64), torch.rand(2, 2, dtype=F64), basis, 0.0)
    with pytest.raises(ValueError, match="penalty"):
        ridge_value_function(torch.rand(4, 3), torch.rand(4, 2), basis, -1.0)
    with pytest.raises(ValueError, match="locations"):
        ContinuousAttention(basis, grid_locations(4)).forward(torch.rand(2, 15), torch.rand(2, 15, 3))
    with pytest.raises(TypeError, match="GaussianRBF"):
        continuous_softmax(mu, good, "not a basis")


# ------------------------------------------------------------------------------------------------
# issue 14: stable for every SPD scale down to the point mass, peaked scores, no host reads
# ------------------------------------------------------------------------------------------------


def np_disk_mean(mu, M, c, V, weight=1, poly=lambda u: 1.0, epsrel=1e-11):
    """E_w[poly(u) psi(mu + M u)] over the unit disk, w proportional to (1 - |u|^2)^weight, by dblquad
    (in the coordinates of the disk: smooth however small M is)."""
    psi = make_psi(c, V)
    h = lambda x: math.sqrt(max(1.0 - x * x, 0.0))  # noqa: E731
    val = integrate.dblquad(lambda y, x: (1 - x * x - y * y) ** weight * poly(np.array([x, y])) * psi(mu + M @ np.array([x, y])),
                            -1, 1, lambda x: -h(x), h, epsabs=0, epsrel=epsrel)[0]
    return val / (math.pi / (weight + 1))


def np_scale_factor(Sigma):
    """M = sqrt(-2 lambda) chol(Sigma), eq. (3.15), in NumPy."""
    return math.sqrt(2 * np_minus_lambda(Sigma)) * np.linalg.cholesky(Sigma)


def np_grad_hess(t, c, V):
    """Gradient and Hessian of N(t; c, V)."""
    Vi = np.linalg.inv(V)
    g = Vi @ (c - t)
    p = make_psi(c, V)(t)
    return p * g, p * (np.outer(g, g) - Vi)


B3 = GaussianRBF.grid(3, 0.3, dim=2, dtype=F64)  # every psi_j <= 1.77
B4 = GaussianRBF.grid(4, 0.1, dim=2, dtype=F64)


def top_entries(r, k=3):
    return torch.argsort(r, descending=True)[:k].tolist()


def basis_as(basis, dtype):
    return GaussianRBF(basis.centers.to(dtype), covariance=basis.covariance.to(dtype))


def test_issue_reproducers_give_the_point_mass():
    """Near the point mass r = psi(mu) + tr(Hess psi(mu) V) / 2 + O(|V|^2), V = -lambda Sigma / 3 (Thm. 1)."""
    mu = torch.tensor([0.5, 0.5])
    for Sigma, dtype, tol in ((1e-10 * np.eye(2), torch.float32, 1e-6), (1e-22 * np.eye(2), F64, 1e-13)):
        # entries up to 88 (float32) and down to -8.9e4 (float64) before
        r = continuous_sparsemax(mu.to(dtype), torch.tensor(Sigma, dtype=dtype), basis_as(B3, dtype))
        V = np_minus_lambda(Sigma) * Sigma / 3
        want = [B3(mu.double())[j].item() + 0.5 * np.trace(np_grad_hess(mu.double().numpy(), B3.centers[j].numpy(),
                                                                          B3.covariance[j].numpy())[1] @ V) for j in range(9)]
        torch.testing.assert_close(r.double(), torch.tensor(want), rtol=tol, atol=0)


@pytest.mark.parametrize("dtype, scale", [(F64, 1e-12), (F64, 1e-20), (F64, 1e-30),
                                          (torch.float32, 1e-6), (torch.float32, 1e-12), (torch.float32, 1e-20)])
def test_sparsemax_tiny_sigma_matches_quadrature(dtype, scale):
    """Tiny scales: r against dblquad over the disk (t = mu + M u), and the limit r -> psi(mu)."""
    mu = torch.tensor([0.52, 0.47], dtype=dtype)
    Sigma = scale * torch.tensor([[1.0, 0.3], [0.3, 0.5]], dtype=dtype)
    r = continuous_sparsemax(mu, Sigma, basis_as(B4, dtype))
    assert r.dtype == dtype and torch.isfinite(r).all()
    m, S = mu.double().numpy(), Sigma.double().numpy()
    idx = top_entries(r.double())
    ref = np.array([np_disk_mean(m, np_scale_factor(S), B4.centers[j].numpy(), B4.covariance[j].numpy()) for j in idx])
    err = np.abs(r.double().numpy()[idx] - ref).max() / np.abs(ref).max()
    assert err < (1e-12 if dtype == F64 else 3e-6)
    # the density's covariance is about sqrt(scale): r - psi(mu) = O(sqrt(scale)), up to the tolerance
    # (entries below tol * max_j r_j may be zero)
    gap = ((r.double() - B4(mu.double())).abs().max() / B4(mu.double()).max()).item()
    assert gap < 100 * math.sqrt(scale) + (1e-10 if dtype == F64 else 4e-6)


def separable_disk_mean(mu, m, c, s):
    """E_w[psi(mu + diag(m) u)] for an isotropic psi = N(c, s^2 I): nested quad, the inner integral over the
    chord, the outer with a breakpoint at the peak (needles)."""
    g0 = lambda x: math.exp(-0.5 * ((mu[0] + m[0] * x - c[0]) / s) ** 2)  # noqa: E731
    g1 = lambda y: math.exp(-0.5 * ((mu[1] + m[1] * y - c[1]) / s) ** 2)  # noqa: E731
    inner = lambda x: integrate.quad(lambda y: (1 - x * x - y * y) * g1(y), -math.sqrt(1 - x * x), math.sqrt(1 - x * x),  # noqa: E731
                                     epsabs=0, epsrel=1e-12, limit=200)[0]
    peak = min(max((c[0] - mu[0]) / m[0], -1.0), 1.0)
    val = integrate.quad(lambda x: g0(x) * inner(x), -1, 1, points=[peak], epsabs=0, epsrel=1e-12, limit=400)[0]
    return val / (2 * math.pi * s * s) / (math.pi / 2)


@pytest.mark.parametrize("ratio", [1e-3, 1e-8, 1e-14])
def test_sparsemax_needles_match_quadrature(ratio):
    """Needle ellipses (axis ratio down to 1e-7): diagonal scales, so that M = diag(m) is exact."""
    mu = torch.tensor([0.45, 0.55], dtype=F64)
    Sigma = torch.diag(torch.tensor([0.02, 0.02 * ratio], dtype=F64))
    r = continuous_sparsemax(mu, Sigma, B4)
    m = np.diag(np_scale_factor(Sigma.numpy()))
    idx = top_entries(r)
    ref = np.array([separable_disk_mean(mu.numpy(), m, B4.centers[j].numpy(), 0.1) for j in idx])
    assert np.abs(r.numpy()[idx] - ref).max() / np.abs(ref).max() < 1e-10


def test_sparsemax_huge_sigma_and_far_basis_match_quadrature():
    sub = GaussianRBF(VQA_BASIS.centers[::7], covariance=VQA_BASIS.covariance[::7])
    mu, Sigma = torch.tensor([0.5, 0.5], dtype=F64), 1e3 * torch.eye(2, dtype=F64)  # the ellipse covers the grid
    r = continuous_sparsemax(mu, Sigma, sub)
    ref = slice_reference(mu, Sigma, sub)[0]
    assert ((r - ref).abs().max() / ref.abs().max()).item() < 1e-10
    for scale in (1e-6, 1e-2, 1.0):  # every basis function far away: r ~ 1e-20 ... 1e-11, relative accuracy kept
        mu, Sigma = torch.tensor([3.0, -2.0], dtype=F64), scale * torch.eye(2, dtype=F64)
        M = np_scale_factor(Sigma.numpy())
        for dtype, tol in ((F64, 1e-10), (torch.float32, 1e-5)):
            r = continuous_sparsemax(mu.to(dtype), Sigma.to(dtype), basis_as(B3, dtype)).double()
            idx = top_entries(r)
            ref = np.array([np_disk_mean(mu.numpy(), M, B3.centers[j].numpy(), B3.covariance[j].numpy()) for j in idx])
            assert np.abs(r.numpy()[idx] - ref).max() / np.abs(ref).max() < tol


@pytest.mark.parametrize("mu, var", [(0.4, 1e-30), (0.4, 1e-12), (0.4, 1e-4), (0.4, 10.0), (2.5, 3e-2), (-3.0, 1e-6)])
def test_sparsemax_1d_regimes_match_quadrature(mu, var):
    b1 = basis1()
    r = continuous_sparsemax(torch.tensor([mu], dtype=F64), torch.tensor([[var]], dtype=F64), b1)
    m = math.sqrt(2 * np_minus_lambda(np.array([[var]])) * var)
    for j in range(3):
        c, s = b1.centers[j, 0].item(), math.sqrt(b1.covariance[j, 0, 0].item())
        f = lambda u: 0.75 * (1 - u * u) * stats.norm.pdf(mu + m * u, c, s)  # noqa: E731
        peak = min(max((c - mu) / m, -1.0), 1.0)
        ref = integrate.quad(f, -1, 1, points=[peak], epsabs=0, epsrel=1e-13, limit=400)[0]
        assert r[j].item() == pytest.approx(ref, rel=1e-10, abs=1e-300)


def directional_derivative_check(fn, mu, Sigma, g, h=1e-5):
    """<grad, direction> against central differences along a direction that keeps Sigma positive definite."""
    gen = torch.Generator().manual_seed(11)
    m, S = mu.clone().requires_grad_(), Sigma.clone().requires_grad_()
    (fn(m, S) * g).sum().backward()
    L = torch.linalg.cholesky(Sigma)
    X = torch.randn(*Sigma.shape, generator=gen, dtype=F64)
    dS = L @ (X + X.transpose(-1, -2)) @ L.transpose(-1, -2)
    dm = torch.randn(*mu.shape, generator=gen, dtype=F64) * torch.diagonal(L, dim1=-2, dim2=-1).mean()
    F = lambda t: (fn(mu + t * dm, Sigma + t * dS) * g).sum().item()  # noqa: E731
    fd = (F(h) - F(-h)) / (2 * h)
    an = ((m.grad * dm).sum() + (S.grad * dS).sum()).item()
    return abs(fd - an) / abs(fd), bool(torch.isfinite(m.grad).all() and torch.isfinite(S.grad).all())


@pytest.mark.parametrize("case", ["small", "needle", "far", "huge", "1d small", "1d far"])
def test_sparsemax_gradients_match_finite_differences(case):
    mu, Sigma, basis = {
        "small": ((0.5, 0.45), 1e-6 * torch.tensor([[1.0, 0.2], [0.2, 0.5]]), B3),
        "needle": ((0.45, 0.5), torch.diag(torch.tensor([0.02, 2e-6])), B4),
        "far": ((3.0, -2.0), 1e-2 * torch.eye(2), B3),
        "huge": ((0.5, 0.5), 1e2 * torch.eye(2), GaussianRBF(VQA_BASIS.centers[::9], covariance=VQA_BASIS.covariance[::9])),
        "1d small": ((0.4,), torch.tensor([[1e-8]]), basis1()),
        "1d far": ((2.5,), torch.tensor([[3e-2]]), basis1()),
    }[case]
    mu, Sigma = torch.tensor(mu, dtype=F64), Sigma.to(F64)
    g = torch.randn(basis.n_basis, generator=torch.Generator().manual_seed(3), dtype=F64)
    rel, finite = directional_derivative_check(lambda m, S: continuous_sparsemax(m, S, basis, tol=1e-13), mu, Sigma, g)
    assert finite and rel < 1e-6


def test_sparsemax_gradients_at_the_point_mass_limit():
    """Sigma -> 0: dr/dmu -> grad psi(mu); w.r.t. the covariance V (S = 6 V), dr/dV -> Hess psi(mu) / 2 at
    V = 0 exactly (the path of ContinuousAttention); finite in float32 at Sigma = 1e-20 I."""
    mu = torch.tensor([0.45, 0.6], dtype=F64)
    m = mu.clone().requires_grad_()
    continuous_sparsemax(m, 1e-24 * torch.eye(2, dtype=F64), B3).sum().backward()
    want_mu = sum(np_grad_hess(mu.numpy(), B3.centers[j].numpy(), B3.covariance[j].numpy())[0] for j in range(9))
    np.testing.assert_allclose(m.grad.numpy(), want_mu, rtol=1e-6)
    g = torch.randn(9, generator=torch.Generator().manual_seed(4), dtype=F64)
    m, V = mu.clone()[None].requires_grad_(), torch.zeros(1, 2, 2, dtype=F64, requires_grad=True)
    r = sparsemax_from_S(m, 6.0 * V, B3.centers, B3.covariance, None, 1e-12, 4096)
    torch.testing.assert_close(r[0], B3(mu), rtol=1e-13, atol=0)
    (r[0] * g).sum().backward()
    grads = [np_grad_hess(mu.numpy(), B3.centers[j].numpy(), B3.covariance[j].numpy()) for j in range(9)]
    np.testing.assert_allclose(m.grad[0].numpy(), sum(gj * gr for gj, (gr, _) in zip(g.tolist(), grads)), rtol=1e-10)
    np.testing.assert_allclose(V.grad[0].numpy(), sum(gj * hs for gj, (_, hs) in zip(g.tolist(), grads)) / 2, rtol=1e-10, atol=1e-12)
    m32, S32 = torch.tensor([0.45, 0.6], requires_grad=True), (1e-20 * torch.eye(2)).requires_grad_()
    continuous_sparsemax(m32, S32, basis_as(B3, torch.float32)).sum().backward()
    assert torch.isfinite(m32.grad).all() and torch.isfinite(S32.grad).all()
    torch.testing.assert_close(m32.grad.double(), torch.tensor(want_mu), rtol=1e-4, atol=1e-5)


def test_softmax_accepts_singular_sigma():
    """Sigma = 0 is the point mass, a rank-one Sigma a Gaussian on a line; gradients from S = Sigma + Sigma_j."""
    mu = torch.tensor([0.3, 0.6], dtype=F64)
    torch.testing.assert_close(continuous_softmax(mu, torch.zeros(2, 2, dtype=F64), B3), B3(mu), rtol=1e-14, atol=0)
    e, var = np.array([0.6, 0.8]), 0.02
    r = continuous_softmax(mu, torch.tensor(var * np.outer(e, e)), B3)
    for j in range(9):
        psi = make_psi(B3.centers[j].numpy(), B3.covariance[j].numpy())
        ref = integrate.quad(lambda s: stats.norm.pdf(s, 0, math.sqrt(var)) * psi(mu.numpy() + s * e), -2, 2,
                             epsabs=0, epsrel=1e-12, limit=200)[0]
        assert r[j].item() == pytest.approx(ref, rel=1e-10)
    g = torch.randn(9, generator=torch.Generator().manual_seed(2), dtype=F64)
    m, S = mu.clone().requires_grad_(), torch.zeros(2, 2, dtype=F64, requires_grad=True)
    (continuous_softmax(m, S, B3) * g).sum().backward()
    grads = [np_grad_hess(mu.numpy(), B3.centers[j].numpy(), B3.covariance[j].numpy()) for j in range(9)]
    np.testing.assert_allclose(m.grad.numpy(), sum(gj * gr for gj, (gr, _) in zip(g.tolist(), grads)), rtol=1e-12)
    np.testing.assert_allclose(S.grad.numpy(), sum(gj * hs for gj, (_, hs) in zip(g.tolist(), grads)) / 2, rtol=1e-12, atol=1e-14)


def tp_segment_mean(mu, half_axis, c, V):
    """E[psi] under the truncated paraboloid on a segment, the limit of a rank-one covariance: in 2D the disk's
    weight (1 - |u|^2) projected on an axis is proportional to (1 - x^2)^{3/2} (normalizer 3 pi / 8)."""
    psi = make_psi(c, V)
    peak = min(max(float((c - mu) @ half_axis / (half_axis @ half_axis)), -1.0), 1.0)
    f = lambda x: (1 - x * x) ** 1.5 * psi(mu + x * half_axis)  # noqa: E731
    return integrate.quad(f, -1, 1, points=[peak], epsabs=0, epsrel=1e-12, limit=200)[0] / (3 * math.pi / 8)


@pytest.mark.parametrize("family", ["gaussian", "truncated_paraboloid"])
def test_continuous_attention_with_peaked_scores_gives_the_limits(family):
    """One location: the point mass, r = psi(t_l); two tied locations: a density on the segment through them
    (independent quadrature of the moment-matched density); any score gap: finite, with finite gradients."""
    loc = grid_locations(6, dtype=F64)
    att = ContinuousAttention(B3, loc, family=family)
    values = torch.randn(36, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    B = ridge_value_function(values, loc, B3, 0.01)
    one = torch.full((36,), -math.inf, dtype=F64)
    one[14] = 0.0
    torch.testing.assert_close(att(one, values), B @ B3(loc[14]), rtol=1e-12, atol=1e-12)
    two = one.clone()
    two[33] = 0.0
    mu = 0.5 * (loc[14] + loc[33])
    delta = (loc[33] - loc[14]).numpy()
    r_ref = []
    for j in range(9):
        c, V = B3.centers[j].numpy(), B3.covariance[j].numpy()
        if family == "gaussian":  # N(mu, delta delta^T / 4): a Gaussian of standard deviation |delta| / 2 on the line
            psi, e, sd = make_psi(c, V), delta / np.linalg.norm(delta), np.linalg.norm(delta) / 2
            r_ref.append(integrate.quad(lambda s: stats.norm.pdf(s, 0, sd) * psi(mu.numpy() + s * e), -10 * sd, 10 * sd,
                                        epsabs=0, epsrel=1e-12, limit=200)[0])
        else:  # covariance delta delta^T / 4 = (D + 4) M M^T / 6: the half-axis is sqrt(6) delta / 2
            r_ref.append(tp_segment_mean(mu.numpy(), math.sqrt(6) * delta / 2, c, V))
    torch.testing.assert_close(att(two, values), B @ torch.tensor(r_ref, dtype=F64), rtol=1e-9, atol=1e-11)
    for dtype in (F64, torch.float32):
        a = ContinuousAttention(basis_as(B3, dtype), loc.to(dtype), family=family)
        for gap in (20.0, 50.0, 100.0, 1e4):
            s = (torch.eye(36, dtype=dtype)[14] * gap).requires_grad_()
            v = values.detach().to(dtype).requires_grad_()
            ctx = a(s, v)
            assert torch.isfinite(ctx).all()
            torch.testing.assert_close(ctx.double(), B @ B3(loc[14]), rtol=1e-3 if gap < 50 else 2e-5, atol=1e-5)
            ctx.square().sum().backward()
            assert torch.isfinite(s.grad).all() and torch.isfinite(v.grad).all()


def test_continuous_attention_issue_reproducer_matches_quadrature():
    """ContinuousAttention(basis, grid_locations(14), "truncated_paraboloid") on scores eye(196)[50] * 20:
    the context of the moment-matched paraboloid by dblquad, in float32 (a context of 2.5e5 before)."""
    basis = GaussianRBF.grid(3, 0.3, dim=2)
    loc = grid_locations(14)
    att = ContinuousAttention(basis, loc, family="truncated_paraboloid")
    values = torch.ones(196, 2)
    ctx = att(torch.eye(196)[50] * 20, values)
    p = torch.softmax(torch.eye(196, dtype=F64)[50] * 20, -1).numpy()
    t = loc.double().numpy()
    mu = p @ t
    V = (p[:, None, None] * np.einsum("ld,le->lde", t - mu, t - mu)).sum(0)
    ev, Q = np.linalg.eigh(V)
    M = math.sqrt(6) * Q @ np.diag(np.sqrt(ev.clip(0))) @ Q.T  # (D + 4) V = M M^T
    r = np.array([np_disk_mean(mu, M, basis.centers[j].double().numpy(), basis.covariance[j].double().numpy()) for j in range(9)])
    want = ridge_value_function(values.double(), loc.double(), basis_as(basis, F64), 0.01) @ torch.tensor(r)
    torch.testing.assert_close(ctx.double(), want, rtol=2e-5, atol=0)
    assert abs(ctx[0].item() - 1.0) < 0.05  # the value function is fitted to ones


def test_read_free_rule_is_accurate():
    """The rule without host reads (a GPU's default, or checks mode "async") on the hard cases and the regimes
    above, against the adaptive rule's references."""
    mus, Sigmas = zip(*(hard_case(name) for name in HARD))
    mu, Sigma = torch.stack(mus), torch.stack(Sigmas)
    ref = continuous_sparsemax(mu, Sigma, VQA_BASIS, n_quadrature=8192)
    g = torch.randn(len(HARD), 100, generator=torch.Generator().manual_seed(8), dtype=F64)
    want = our_grads(lambda m, S: continuous_sparsemax(m, S, VQA_BASIS, tol=1e-13), mu, Sigma, g)
    with attnopt.checks("async"):
        r = continuous_sparsemax(mu, Sigma, VQA_BASIS)
        got = our_grads(lambda m, S: continuous_sparsemax(m, S, VQA_BASIS), mu, Sigma, g)
        r32 = continuous_sparsemax(mu.float(), Sigma.float(), basis_as(VQA_BASIS, torch.float32))
        tiny = continuous_sparsemax(torch.tensor([0.52, 0.47], dtype=F64), 1e-20 * torch.eye(2, dtype=F64), B4)
        far = continuous_sparsemax(torch.tensor([3.0, -2.0], dtype=F64), 1e-2 * torch.eye(2, dtype=F64), B3)
    rel = lambda a, b: ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()  # noqa: E731
    assert rel(r, ref) < 1e-9 and rel(r32.double(), ref) < 5e-6
    for a, b in zip(got, want):
        assert rel(a.flatten(1), b.flatten(1)) < 1e-8
    assert rel(tiny, continuous_sparsemax(torch.tensor([0.52, 0.47], dtype=F64), 1e-20 * torch.eye(2, dtype=F64), B4)) < 1e-12
    assert rel(far, continuous_sparsemax(torch.tensor([3.0, -2.0], dtype=F64), 1e-2 * torch.eye(2, dtype=F64), B3)) < 1e-9


def forward_backward(fn, *args):
    leaves = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    out = fn(*leaves)
    out.square().sum().backward()


@pytest.mark.parametrize("case", ["softmax", "sparsemax 2d", "sparsemax 2d tiny", "sparsemax 1d", "attention gaussian",
                                  "attention paraboloid"])
def test_no_host_reads(case):
    """Forward and backward of the three entry points read nothing back to the host in checks mode "async"
    (the adaptive rule would: nonzero, int(...), the warning's diagnostics)."""
    from host_reads import host_reads

    mus, Sigmas = zip(*(hard_case(name) for name in HARD))
    mu, Sigma = torch.stack(mus), torch.stack(Sigmas)
    scores = torch.randn(2, 36, generator=torch.Generator().manual_seed(1), dtype=F64)
    values = torch.randn(2, 36, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    gauss = ContinuousAttention(B3, grid_locations(6, dtype=F64))
    tp = ContinuousAttention(B3, grid_locations(6, dtype=F64), family="truncated_paraboloid")
    run = {
        "softmax": lambda: forward_backward(continuous_softmax, mu, torch.zeros_like(Sigma), VQA_BASIS),
        "sparsemax 2d": lambda: forward_backward(continuous_sparsemax, mu, Sigma, VQA_BASIS),
        "sparsemax 2d tiny": lambda: forward_backward(continuous_sparsemax, mu, 1e-12 * Sigma, VQA_BASIS),
        "sparsemax 1d": lambda: forward_backward(continuous_sparsemax, MU1, SIGMA1, basis1()),
        "attention gaussian": lambda: forward_backward(gauss, scores, values),
        "attention paraboloid": lambda: forward_backward(tp, scores, values),
    }[case]
    assert host_reads(run) == []
