"""Tests for attnopt.fenchel (the Fenchel-dual paper): each against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
import scipy.optimize
import scipy.special
import torch
import torch.nn.functional as tF
from hypothesis import given, settings
from hypothesis import strategies as st

from attnopt import fenchel as F

f64 = torch.float64
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def rand_pref(*shape, zeros=0, gen=None, dtype=f64):
    u = torch.rand(*shape, generator=gen, dtype=dtype) + 0.1
    if zeros:
        u[..., :zeros] = 0.0
    return u / u.sum(-1, keepdim=True)


def problem(seed, batch=(), n=5, d=4, zeros=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    T = scale * torch.randn(*batch, n, d, generator=g, dtype=f64)
    u = rand_pref(*batch, n, zeros=zeros, gen=g)
    z = torch.randn(*batch, d, generator=g, dtype=f64)
    b = (u.unsqueeze(-2) @ T).squeeze(-2) + z
    return T, u, z, b


# ------------------------------------------------------------------------------------------------
# the exact dual solver
# ------------------------------------------------------------------------------------------------


def numpy_dual(lam, b, T, u, alpha):
    """Eq. (9) and its gradient, written independently in NumPy."""
    logu = np.where(u > 0, np.log(np.where(u > 0, u, 1.0)), -np.inf)
    s = logu + T @ lam
    lse = scipy.special.logsumexp(s)
    p = np.exp(s - lse)
    val = lam @ b - lam @ lam / (2 * alpha) - lse
    return val, b - lam / alpha - T.T @ p


@pytest.mark.parametrize("seed", range(6))
def test_solve_dual_matches_scipy(seed):
    alpha = [0.3, 1.0, 4.0][seed % 3]
    T, u, z, b = problem(seed, n=6, d=4, zeros=seed % 2, scale=1.5)
    lam = F.solve_dual(b, T, u, alpha)
    Tn, un, bn = T.numpy(), u.numpy(), b.numpy()
    res = scipy.optimize.minimize(
        lambda x: tuple(-v for v in numpy_dual(x, bn, Tn, un, alpha)),
        x0=np.zeros(4),
        jac=True,
        method="BFGS",
        options={"gtol": 1e-12, "maxiter": 10_000},
    )
    np.testing.assert_allclose(lam.numpy(), res.x, atol=1e-7, rtol=0)
    # and the maximizer beats scipy's (or ties)
    assert numpy_dual(lam.numpy(), bn, Tn, un, alpha)[0] >= -res.fun - 1e-12


@pytest.mark.parametrize("method", ["auto", "gram", "span", "dense"])
@pytest.mark.parametrize("n,d", [(7, 5), (3, 8), (9, 2)])
def test_autograd_gradient_of_dual_vanishes_at_solution(method, n, d):
    g = torch.Generator().manual_seed(n * d)
    T = 2.0 * torch.randn(2, 3, n, d, generator=g, dtype=f64)  # (batch, heads, n, d)
    b = 2.0 * torch.randn(2, 3, 4, d, generator=g, dtype=f64)  # 4 queries per head
    u = rand_pref(2, 3, 1, n, zeros=1, gen=g)
    lam = F.solve_dual(b, T, u, 1.7, tol=1e-10, method=method).requires_grad_(True)
    assert lam.shape == b.shape
    (grad,) = torch.autograd.grad(F.dual_objective(lam, b, T, u, 1.7).sum(), lam)
    assert grad.norm(dim=-1).max() <= 1e-10


def test_methods_agree_and_stationarity_form():
    T, u, z, b = problem(3, batch=(4,), n=6, d=9, zeros=2)
    alpha = 0.8
    lam = F.solve_dual(b, T, u, alpha)
    lam_dense = F.solve_dual(b, T, u, alpha, method="dense")
    torch.testing.assert_close(lam, lam_dense, atol=1e-10, rtol=0)
    # stationarity: lambda* = alpha z + alpha T^T (u - p~), p~ the weights of eq. (11)
    p = torch.softmax(torch.log(u) + (lam.unsqueeze(-2) @ T.mT).squeeze(-2), -1)
    rhs = alpha * z + alpha * ((u - p).unsqueeze(-2) @ T).squeeze(-2)
    torch.testing.assert_close(lam, rhs, atol=1e-10, rtol=0)


def test_gram_solver_on_a_mixed_hard_batch():
    """The Gram-space Newton solver against dense Newton and against stationarity, on a batch that
    exercises every branch: problems that converge at different iterations (so converged ones leave
    the batch), backtracking (large templates and alpha), a first-order phase that stalls, a
    preference per query with zeros, broadcasting of u over an extra leading axis, and n > d."""
    g = torch.Generator().manual_seed(7)
    for n, d in ((20, 24), (18, 3)):  # n >= 16 also runs the first-order warm start on the CPU
        scale = torch.tensor([0.1, 1.0, 4.0, 12.0], dtype=f64).view(4, 1, 1)
        T = scale * torch.randn(1, 4, n, d, generator=g, dtype=f64)  # four template sets, easy to hard
        b = (scale * torch.randn(4, 6, d, generator=g, dtype=f64)).expand(2, 4, 6, d)  # 6 queries each
        u = rand_pref(2, 1, 6, n, zeros=2, gen=g)  # per query, two masked templates, extra leading axis
        u[1, ..., 2:4] = 0.0
        u = _norm(u)
        for alpha in (0.3, 5.0):
            lam = F.solve_dual(b, T, u, alpha, tol=1e-10, method="gram")
            assert lam.shape == (2, 4, 6, d)
            # the documented stopping rule: |grad D| <= tol, or the rounding floor where that is larger
            # (the set of scale 12 has |t|^2 ~ 3e3: rounded scores move the gradient by ~1e-10 or more)
            t2 = (T * T).sum(-1).amax(-1, keepdim=True)
            stop = torch.clamp(torch.finfo(f64).eps * (b.norm(dim=-1) + t2.sqrt()) * (32 + 4 * alpha * t2), min=1e-10)
            lq = lam.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(F.dual_objective(lq, b, T, u, alpha).sum(), lq)
            assert (grad.norm(dim=-1) <= 1.5 * stop).all()
            assert grad[:, :2].norm(dim=-1).max() <= 1.5e-10  # the sets of scale 0.1 and 1 reach tol
            # -D is (1/alpha)-strongly convex: |lambda - lambda*| <= alpha |grad D(lambda)|
            close = (2 * alpha * 1.5 * stop).unsqueeze(-1)
            assert ((lam - F.solve_dual(b, T, u, alpha, method="dense")).abs() <= close).all()
            # stationarity: lambda* = alpha b - alpha T^T p~
            p = torch.softmax(torch.log(u) + lam @ T.mT, -1)
            assert ((lam - alpha * (b - p @ T)).abs() <= close).all()


def test_strong_duality_with_primal_problem_4():
    """Thm 1: the primal (4) at p~ of eq. (11) equals the dual (9) at lambda*."""
    T, u, z, b = problem(11, batch=(3,), n=6, d=3, zeros=2)
    alpha = 2.5
    lam = F.solve_dual(b, T, u, alpha)
    _, p = F.generalized_attention(lam, T, u, 1.0)  # eq. (11): p ~ u exp<t, lambda*>
    h = (p.unsqueeze(-2) @ T).squeeze(-2)
    kl = torch.special.xlogy(p, p).sum(-1) - torch.special.xlogy(p, u).sum(-1)
    primal = alpha / 2 * ((b - h) ** 2).sum(-1) + kl
    torch.testing.assert_close(primal, F.dual_objective(lam, b, T, u, alpha), atol=1e-10, rtol=0)
    torch.testing.assert_close(h, F.exact_estimate(b, T, u, alpha), atol=1e-12, rtol=0)


def test_float32_and_nonconvergence():
    T, u, z, b = problem(5, batch=(2,), n=5, d=3)
    lam32 = F.solve_dual(b.float(), T.float(), u.float(), 1.0)
    assert lam32.dtype == torch.float32
    torch.testing.assert_close(lam32.double(), F.solve_dual(b, T, u, 1.0), atol=1e-5, rtol=0)
    for method in ("gram", "span", "dense"):
        with pytest.raises(RuntimeError, match="did not converge"):
            F.solve_dual(3 * b, 3 * T, u, 5.0, max_iter=1, method=method)


# ------------------------------------------------------------------------------------------------
# Gaussian preference (Sec. 5, eq. 15)
# ------------------------------------------------------------------------------------------------


def hermite_gaussian(mu, cov, m=20):
    """A discrete u whose moment generating function matches N(mu, cov) to quadrature precision."""
    x, w = np.polynomial.hermite_e.hermegauss(m)
    w = w / w.sum()
    X = np.stack(np.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
    W = np.outer(w, w).reshape(-1)
    L = np.linalg.cholesky(cov)
    return torch.tensor(mu + X @ L.T), torch.tensor(W)


@pytest.mark.parametrize("cov", [np.eye(2), np.array([[0.7, 0.3], [0.3, 0.4]])])
@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_gaussian_closed_form_matches_solver_on_gauss_hermite_preference(cov, alpha):
    mu = np.array([0.3, -0.2])
    T, u = hermite_gaussian(mu, cov)  # 400 templates in d = 2: n > d
    b = torch.tensor([[1.0, 0.5], [-0.4, 0.8]], dtype=f64)
    lam = F.solve_dual(b, T, u.expand(2, -1), alpha)
    mu_t, cov_t = torch.tensor(mu), torch.tensor(cov)
    if np.allclose(cov, np.eye(2)):
        expected = alpha / (1 + alpha) * (b - mu_t)  # Sec. 5, written out independently
        torch.testing.assert_close(F.gaussian_dual_maximizer(mu_t, b, alpha), expected, atol=1e-15, rtol=0)
        torch.testing.assert_close(F.gaussian_estimate(mu_t, b, alpha), (mu_t + alpha * b) / (1 + alpha))
    torch.testing.assert_close(lam, F.gaussian_dual_maximizer(mu_t, b, alpha, cov=cov_t), atol=1e-9, rtol=0)
    h = F.exact_estimate(b, T, u.expand(2, -1), alpha)
    torch.testing.assert_close(h, F.gaussian_estimate(mu_t, b, alpha, cov=cov_t), atol=1e-9, rtol=0)


def test_gaussian_closed_form_maximizes_gaussian_dual():
    g = torch.Generator().manual_seed(0)
    mu, b = torch.randn(3, 4, generator=g, dtype=f64), torch.randn(3, 4, generator=g, dtype=f64)
    A = torch.randn(4, 4, generator=g, dtype=f64)
    cov = A @ A.T
    lam = F.gaussian_dual_maximizer(mu, b, 0.6, cov=cov).requires_grad_(True)
    dual = (lam * b).sum(-1) - (lam * lam).sum(-1) / 1.2 - (lam * mu).sum(-1) - 0.5 * ((lam @ cov) * lam).sum(-1)
    (grad,) = torch.autograd.grad(dual.sum(), lam)
    assert grad.abs().max() < 1e-12


# ------------------------------------------------------------------------------------------------
# generalized attention (eq. 18) and its special cases
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_uniform_preference_is_sdpa(dtype, tol):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=g, dtype=dtype)
    k = torch.randn(2, 3, 7, 8, generator=g, dtype=dtype)
    v = torch.randn(2, 3, 7, 4, generator=g, dtype=dtype)
    # default SDPA scale 1/sqrt(d) <-> alpha = 1/sqrt(d), z = q, templates = k
    h, w = F.generalized_attention(q, k, None, alpha=1 / math.sqrt(8))
    torch.testing.assert_close(h, tF.scaled_dot_product_attention(q, k, k), atol=tol, rtol=tol)
    torch.testing.assert_close(w @ v, tF.scaled_dot_product_attention(q, k, v), atol=tol, rtol=tol)
    # explicit uniform u, and another scale
    u = torch.full((7,), 1 / 7, dtype=dtype)
    h2, _ = F.generalized_attention(q, k, u, alpha=0.37)
    torch.testing.assert_close(h2, tF.scaled_dot_product_attention(q, k, k, scale=0.37), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_zeros_in_preference_are_a_boolean_mask(dtype, tol):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 6, generator=g, dtype=dtype)
    k = torch.randn(3, 5, 6, generator=g, dtype=dtype)
    mask = torch.rand(3, 4, 5, generator=g) > 0.4
    mask[..., 0] = True
    u = mask.to(dtype) / mask.sum(-1, keepdim=True)
    h, w = F.generalized_attention(q, k, u, alpha=0.5)
    ref = tF.scaled_dot_product_attention(q, k, k, attn_mask=mask, scale=0.5)
    torch.testing.assert_close(h, ref, atol=tol, rtol=tol)
    assert (w[~mask] == 0).all()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_t5_preference_is_sdpa_with_float_bias(dtype, tol):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 6, 8, generator=g, dtype=dtype)
    k = torch.randn(2, 4, 9, 8, generator=g, dtype=dtype)
    bias = torch.randn(4, 6, 9, generator=g, dtype=dtype)  # per head, query, key (T5's relative bias)
    mask = torch.rand(2, 1, 1, 9, generator=g) > 0.3  # padding mask per sequence
    mask[..., 0] = True
    u = F.t5_preference(bias, mask)
    torch.testing.assert_close(u.sum(-1), torch.ones_like(u.sum(-1)))
    h, _ = F.generalized_attention(q, k, u, alpha=1.0)  # eq. (20): alpha = 1
    ref = tF.scaled_dot_product_attention(q, k, k, attn_mask=bias.masked_fill(~mask, float("-inf")), scale=1.0)
    torch.testing.assert_close(h, ref, atol=tol, rtol=tol)


def test_single_vector_layout_and_broadcasting():
    T, u, z, b = problem(4, batch=(3,), n=5, d=4)
    h, w = F.generalized_attention(z, T, u, 0.7)  # z (3, d): one query per template set
    assert h.shape == (3, 4) and w.shape == (3, 5)
    hq, wq = F.generalized_attention(z.unsqueeze(-2), T, u.unsqueeze(-2), 0.7)  # query layout
    torch.testing.assert_close(hq.squeeze(-2), h)
    lam = F.solve_dual(b, T, u, 0.7)
    lamq = F.solve_dual(b.unsqueeze(-2), T, u.unsqueeze(-2), 0.7)
    torch.testing.assert_close(lamq.squeeze(-2), lam)


def test_alpha_to_zero_gives_preference_mean():
    T, u, z, b = problem(6, batch=(2, 3), n=6, d=4, zeros=2)
    mu = (u.unsqueeze(-2) @ T).squeeze(-2)
    h, w = F.generalized_attention(z, T, u, 1e-9)
    torch.testing.assert_close(h, mu, atol=1e-7, rtol=0)
    torch.testing.assert_close(w, u, atol=1e-7, rtol=0)
    torch.testing.assert_close(F.exact_estimate(b, T, u, 1e-9), mu, atol=1e-7, rtol=0)


def slope(xs, ys):
    return np.polyfit(np.log(xs), np.log(ys), 1)[0]


def test_small_alpha_error_orders():
    """Thm 2: h from eq. (18) is O(alpha^2) from eq. (12); lambda* - alpha z = O(alpha^2) so the
    relative deviation of Fig. 4 is O(alpha); eq. (15) is one order better (O(alpha^3))."""
    T, u, z, b = problem(7, batch=(4,), n=6, d=5, zeros=1)
    mu = (u.unsqueeze(-2) @ T).squeeze(-2)
    cov = T.mT @ (u.unsqueeze(-1) * T) - mu.unsqueeze(-1) * mu.unsqueeze(-2)
    alphas = np.geomspace(1e-3, 3e-2, 5)
    err_h, dev, err15 = [], [], []
    for a in alphas:
        lam = F.solve_dual(b, T, u, a, tol=1e-14)
        err_h.append((F.exact_estimate(b, T, u, a, tol=1e-14) - F.generalized_attention(z, T, u, a)[0]).norm())
        dev.append(F.relative_deviation(lam, a * z).max())
        err15.append((lam - F.gaussian_dual_maximizer(mu, b, a, cov=cov)).norm())
    assert abs(slope(alphas, err_h) - 2) < 0.1
    assert abs(slope(alphas, dev) - 1) < 0.1
    assert abs(slope(alphas, err15) - 3) < 0.15


def test_relative_deviation_against_numpy():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 5, 6, generator=g, dtype=f64), torch.randn(4, 5, 6, generator=g, dtype=f64)
    ref = np.linalg.norm(a.numpy() - b.numpy(), axis=-1) / np.linalg.norm(a.numpy(), axis=-1)
    np.testing.assert_allclose(F.relative_deviation(a, b).numpy(), ref, rtol=1e-14)
    assert F.relative_deviation(torch.zeros(3, dtype=f64), torch.zeros(3, dtype=f64)) == 0


# ------------------------------------------------------------------------------------------------
# optimal-transport attention (Sec. 9, Appx D)
# ------------------------------------------------------------------------------------------------


def ot_problem(seed, N=6, d=3, sentence=3):
    g = torch.Generator().manual_seed(seed)
    T = torch.randn(N, d, generator=g, dtype=f64)
    M = torch.cdist(T, T)
    u = torch.zeros(N, dtype=f64)
    u[:sentence] = rand_pref(sentence, gen=g)  # the sentence's words; the rest of the vocabulary has u = 0
    z = torch.randn(d, generator=g, dtype=f64)
    return T, M, u, z


@pytest.mark.parametrize("gamma", [0.3, 1.0])
def test_true_preference_is_pot_sinkhorn_minimizer(gamma):
    """Prop 1: the entropic plan between (u~, u) has a constant potential on the u~ side, i.e.
    u~ is a stationary point (hence the minimizer) of p -> W_gamma(p, u; M)."""
    T, M, u, _ = ot_problem(0)
    ut = F.true_preference(u, M, gamma)
    torch.testing.assert_close(ut.sum(), torch.tensor(1.0, dtype=f64))
    plan = ot.sinkhorn(ut.numpy(), u.numpy(), M.numpy(), reg=gamma, stopThr=1e-14, numItermax=20_000)
    closed = u.numpy()[None, :] * scipy.special.softmax(-M.numpy() / gamma, axis=0)
    np.testing.assert_allclose(plan, closed, atol=1e-10)
    # gamma -> 0: u~ -> u
    torch.testing.assert_close(F.true_preference(u, M, 1e-3), u, atol=1e-12, rtol=0)


def entropic_ot(p, u, M, gamma):
    """W_gamma(p, u; M) of eq. (23), from POT's Sinkhorn plan (H(X) = -sum X log X)."""
    X = ot.sinkhorn(p, u, M, reg=gamma, stopThr=1e-13, numItermax=20_000)
    return float((M * X).sum() + gamma * scipy.special.xlogy(X, X).sum())


def test_ot_exact_estimate_strong_duality_with_pot():
    T, M, u, z = ot_problem(1)
    alpha, gamma = 0.7, 1.0
    h, p = F.ot_exact_estimate(z, T, u, M, alpha, gamma)
    bt = F.true_preference(u, M, gamma) @ T + z
    primal = alpha / 2 * float(((bt - h) ** 2).sum()) + entropic_ot(p.numpy(), u.numpy(), M.numpy(), gamma)
    lam = F.solve_ot_dual(bt, T, u, M, alpha, gamma)
    dual = float(F.ot_dual_objective(lam, bt, T, u, M, alpha, gamma))
    assert abs(primal - dual) < 1e-9
    lam_r = lam.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.ot_dual_objective(lam_r, bt, T, u, M, alpha, gamma), lam_r)
    assert grad.norm() < 1e-10
    torch.testing.assert_close(F.solve_ot_dual(bt, T, u, M, alpha, gamma, method="dense"), lam, atol=1e-10, rtol=0)


def test_ot_attention_limits_and_order():
    T, M, u, z = ot_problem(2)
    gamma = 1.0
    ut = F.true_preference(u, M, gamma)
    _, w0 = F.ot_attention(z, T, u, M, 1e-9, gamma)
    torch.testing.assert_close(w0, ut, atol=1e-8, rtol=0)
    assert (w0[3:] > 0).all()  # words outside the sentence get weight
    alphas = np.geomspace(1e-3, 3e-2, 5)
    errs = [(F.ot_exact_estimate(z, T, u, M, a, gamma, tol=1e-14)[0] - F.ot_attention(z, T, u, M, a, gamma)[0]).norm()
            for a in alphas]
    assert abs(slope(alphas, errs) - 2) < 0.1


def test_ot_attention_group_example():
    """Sec. 9: with M = 0 inside groups and +inf across, a group shares the weight of its member."""
    T = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=f64)
    grp = torch.tensor([0, 0, 0, 1, 1])
    M = torch.where(grp[:, None] == grp[None, :], 0.0, float("inf")).to(f64)
    u = torch.tensor([0.6, 0.0, 0.0, 0.4, 0.0], dtype=f64)
    _, w = F.ot_attention(torch.tensor([0.3, -0.2], dtype=f64), T, u, M, 0.5, 1.0)
    torch.testing.assert_close(w, torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=f64))


# ------------------------------------------------------------------------------------------------
# gradients
# ------------------------------------------------------------------------------------------------


def _norm(u):
    return u / u.sum(-1, keepdim=True)


def gradcheck(fn, inputs):
    return torch.autograd.gradcheck(fn, inputs, fast_mode=True)


def test_gradcheck_closed_forms():
    g = torch.Generator().manual_seed(8)
    T, u, z, b = problem(8, batch=(2,), n=4, d=3)
    T, z, b = T.requires_grad_(), z.requires_grad_(), b.requires_grad_()
    v = u.clone().requires_grad_()
    lam = torch.randn(2, 3, generator=g, dtype=f64, requires_grad=True)
    assert gradcheck(lambda z, T, v: F.generalized_attention(z, T, _norm(v), 0.8), (z, T, v))
    assert gradcheck(lambda lam, b, T, v: F.dual_objective(lam, b, T, _norm(v), 0.8), (lam, b, T, v))
    mu = torch.randn(2, 3, generator=g, dtype=f64, requires_grad=True)
    A = torch.randn(3, 3, generator=g, dtype=f64)
    cov = (A @ A.T).requires_grad_()
    assert gradcheck(lambda mu, b: F.gaussian_estimate(mu, b, 0.5), (mu, b))
    # gradcheck moves one entry at a time; a covariance must stay symmetric, so differentiate along (c + c^T) / 2
    assert gradcheck(lambda mu, b, c: F.gaussian_estimate(mu, b, 0.5, cov=(c + c.mT) / 2), (mu, b, cov))
    bias = torch.randn(3, 5, generator=g, dtype=f64, requires_grad=True)
    mask = torch.tensor([True, True, False, True, True])
    assert gradcheck(lambda x: F.t5_preference(x, mask), (bias,))
    a2 = torch.randn(2, 3, generator=g, dtype=f64, requires_grad=True)
    assert gradcheck(F.relative_deviation, (lam, a2))


def test_gradcheck_implicit_dual_solution():
    T, u, z, b = problem(9, batch=(2,), n=4, d=3)
    T, b = T.requires_grad_(), b.requires_grad_()
    v = u.clone().requires_grad_()
    for method in ("gram", "span", "dense"):
        assert gradcheck(
            lambda b, T, v: F.solve_dual(b, T, _norm(v), 0.9, tol=1e-13, method=method), (b, T, v)
        )
    assert gradcheck(lambda b, T, v: F.exact_estimate(b, T, _norm(v), 0.9, tol=1e-13), (b, T, v))


def test_gradcheck_ot():
    T, M, u, z = ot_problem(3, N=4, d=2, sentence=2)
    T, z, M = T.requires_grad_(), z.requires_grad_(), M.clone().requires_grad_()
    v = (u + 0.05).requires_grad_()
    assert gradcheck(lambda v, M: F.true_preference(_norm(v), M, 0.5), (v, M))
    assert gradcheck(lambda z, T, v, M: F.ot_attention(z, T, _norm(v), M, 0.6, 0.5), (z, T, v, M))
    assert gradcheck(
        lambda z, T, v, M: F.ot_exact_estimate(z, T, _norm(v), M, 0.6, 0.5, tol=1e-13), (z, T, v, M)
    )


# ------------------------------------------------------------------------------------------------
# properties
# ------------------------------------------------------------------------------------------------


@st.composite
def batched_problems(draw):
    B, Q = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n, d = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    T = draw(st.floats(0.2, 2.0)) * torch.randn(B, n, d, generator=g, dtype=f64)
    z = torch.randn(B, Q, d, generator=g, dtype=f64)
    u = rand_pref(B, Q, n, gen=g)
    if n > 1 and draw(st.booleans()):
        u[..., 0] = 0
        u = _norm(u)
    alpha = draw(st.floats(0.05, 5.0))
    return T, z, u, alpha


@SETTINGS
@given(batched_problems())
def test_batched_equals_looped(prob):
    T, z, u, alpha = prob
    h, w = F.generalized_attention(z, T, u, alpha)
    lam = F.solve_dual(z, T, u, alpha)
    for i in range(T.shape[0]):
        for j in range(z.shape[1]):
            hi, wi = F.generalized_attention(z[i, j], T[i], u[i, j], alpha)
            torch.testing.assert_close(h[i, j], hi, atol=1e-13, rtol=1e-13)
            torch.testing.assert_close(w[i, j], wi, atol=1e-13, rtol=1e-13)
            torch.testing.assert_close(lam[i, j], F.solve_dual(z[i, j], T[i], u[i, j], alpha), atol=1e-9, rtol=0)


@SETTINGS
@given(batched_problems(), st.randoms(use_true_random=False))
def test_permuting_templates(prob, rnd):
    T, z, u, alpha = prob
    perm = list(range(T.shape[-2]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    h, w = F.generalized_attention(z, T, u, alpha)
    hp, wp = F.generalized_attention(z, T[:, perm], u[..., perm], alpha)
    torch.testing.assert_close(hp, h, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(wp, w[..., perm], atol=1e-12, rtol=1e-12)
    lam = F.solve_dual(z, T, u, alpha)
    torch.testing.assert_close(F.solve_dual(z, T[:, perm], u[..., perm], alpha), lam, atol=1e-9, rtol=0)


@SETTINGS
@given(batched_problems())
def test_zero_preference_equals_removing_the_template(prob):
    T, z, u, alpha = prob
    n = T.shape[-2]
    if n < 2:
        return
    um = u.clone()
    um[..., -1] = 0
    if (um.sum(-1) == 0).any():
        return
    um = _norm(um)
    h, w = F.generalized_attention(z, T, um, alpha)
    hr, wr = F.generalized_attention(z, T[:, :-1], um[..., :-1], alpha)
    torch.testing.assert_close(h, hr, atol=1e-12, rtol=1e-12)
    assert (w[..., -1] == 0).all()
    lam = F.solve_dual(z, T, um, alpha)
    torch.testing.assert_close(lam, F.solve_dual(z, T[:, :-1], um[..., :-1], alpha), atol=1e-9, rtol=0)


# ------------------------------------------------------------------------------------------------
# numerics at the edges of the dtype's range
# ------------------------------------------------------------------------------------------------


def test_scores_are_scaled_before_the_product():
    """float32 z, templates ~ 1e25 with alpha = 1e-50 (below float32's range): <z, t> overflows and alpha
    rounds to 0 in float32, yet the weights are those of the float64 problem at unit scale."""
    g = torch.Generator().manual_seed(21)
    z, T = torch.randn(3, 4, generator=g, dtype=f64), torch.randn(6, 4, generator=g, dtype=f64)
    ref = torch.softmax(0.7 * z @ T.T, -1)
    h, w = F.generalized_attention((z * 1e25).float(), (T * 1e25).float(), alpha=0.7e-50)
    assert w.dtype == torch.float32 and torch.isfinite(h).all()
    torch.testing.assert_close(w.double(), ref, atol=1e-5, rtol=0)
    # a zero cost leaves every column of the plan the softmax of the scores: the OT weights are the KL ones
    _, w_ot = F.ot_attention((z * 1e25).float(), (T * 1e25).float(), None, torch.zeros(6, 6), alpha=0.7e-50, gamma=1.0)
    torch.testing.assert_close(w_ot.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype,gamma", [(f64, 1e-310), (torch.float32, 1e-60)])
def test_ot_weights_at_vanishing_gamma_are_the_hard_assignment(dtype, gamma):
    """gamma -> 0 in eq. (25): the mass u_j goes to argmax_i (alpha <t_i, z> - M_ij); and the true
    preference (40) tends to u when M_jj < M_ij.  Both would be 0 / 0 = NaN without the shift."""
    g = torch.Generator().manual_seed(22)
    T, z = torch.randn(5, 3, generator=g, dtype=f64), torch.randn(2, 3, generator=g, dtype=f64)
    u = rand_pref(5, gen=g)
    M = torch.cdist(T, T) ** 2
    _, w = F.ot_attention(z.to(dtype), T.to(dtype), u.to(dtype), M.to(dtype), 0.8, gamma)
    target = torch.argmax(0.8 * (z @ T.T).unsqueeze(-1) - M, dim=-2)  # (2, n_j): where u_j goes
    hard = torch.zeros(2, 5, dtype=f64).scatter_add_(-1, target, u.expand(2, 5))
    torch.testing.assert_close(w.double(), hard, atol=1e-6, rtol=0)
    torch.testing.assert_close(F.true_preference(u.to(dtype), M.to(dtype), gamma).double(), u, atol=1e-6, rtol=0)


def test_gaussian_estimate_and_relative_deviation_near_the_largest_float():
    big = torch.finfo(f64).max / 2
    mu, b = torch.tensor([big, -big, 1.0], dtype=f64), torch.tensor([-big, big, 3.0], dtype=f64)
    h = F.gaussian_estimate(mu, b, 3.0)  # (mu + 3 b) / 4, though b - mu overflows
    torch.testing.assert_close(h / big, torch.tensor([-0.5, 0.5, 2.5 / big], dtype=f64))
    x = torch.tensor([3e300, 4e300], dtype=f64)
    torch.testing.assert_close(F.relative_deviation(x, 0.5 * x), torch.tensor(0.5, dtype=f64))


def test_psd_check_of_cov_allows_rounding_but_not_negative_curvature():
    A = torch.randn(3, 2, generator=torch.Generator().manual_seed(23), dtype=f64)
    cov = A @ A.T  # singular: one eigenvalue is 0 up to rounding, possibly slightly negative
    mu, b = torch.zeros(3, dtype=f64), torch.ones(3, dtype=f64)
    lam = F.gaussian_dual_maximizer(mu, b, 2.0, cov=cov)
    torch.testing.assert_close(lam, 2.0 * torch.linalg.solve(torch.eye(3, dtype=f64) + 2.0 * cov, b))
    with pytest.raises(ValueError, match="cov must be positive semi-definite"):
        F.gaussian_dual_maximizer(mu, b, 0.5, cov=cov - 1e-3 * torch.eye(3, dtype=f64))


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------


def test_bad_input_raises():
    T, u, z, b = problem(10, batch=(2,), n=4, d=3)
    for alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            F.generalized_attention(z, T, u, alpha)
        with pytest.raises(ValueError, match="alpha"):
            F.solve_dual(b, T, u, alpha)
    neg = u.clone()
    neg[0, 0] = -0.1
    neg[0, 1] += 0.1
    with pytest.raises(ValueError, match="non-negative"):
        F.generalized_attention(z, T, neg)
    with pytest.raises(ValueError, match="sum to 1"):
        F.solve_dual(b, T, 2 * u)
    with pytest.raises(ValueError, match="templates"):
        F.generalized_attention(z[..., :2], T, u)  # d mismatch
    with pytest.raises(ValueError, match="one entry per template"):
        F.exact_estimate(b, T, u[..., :3] / u[..., :3].sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="broadcast"):
        F.solve_dual(torch.zeros(3, 3, dtype=f64), T, None)  # 3 vectors for 2 template sets
    for name, args in (("z", (z.clone().fill_(float("nan")), T, u)), ("templates", (z, T * float("nan"), u)),
                       ("u", (z, T, u * float("nan")))):
        with pytest.raises(ValueError, match=f"{name} contains NaN"):
            F.generalized_attention(*args)
    with pytest.raises(TypeError, match="floating"):
        F.generalized_attention(torch.ones(2, 3, dtype=torch.long), T, u)
    with pytest.raises(TypeError, match="dtype"):
        F.generalized_attention(z.float(), T, u)
    with pytest.raises(ValueError, match="method"):
        F.solve_dual(b, T, u, method="lbfgs")
    To, Mo, uo, zo = ot_problem(1)
    with pytest.raises(ValueError, match="KL dual"):
        F.solve_ot_dual(zo, To, uo, Mo, method="gram")
    with pytest.raises(ValueError, match="tol"):
        F.solve_dual(b, T, u, tol=0)
    with pytest.raises(ValueError, match="max_iter"):
        F.solve_dual(b, T, u, max_iter=0)
    with pytest.raises(ValueError, match="masked"):
        F.t5_preference(torch.zeros(2, 3), torch.tensor([[True, False, True], [False, False, False]]))
    with pytest.raises(TypeError, match="boolean"):
        F.t5_preference(torch.zeros(3), torch.ones(3))
    M = torch.cdist(T[0], T[0])
    with pytest.raises(ValueError, match="gamma"):
        F.ot_attention(z, T, u, M, 1.0, 0.0)
    with pytest.raises(ValueError, match="cost"):
        F.ot_attention(z, T, u, M[:3, :3], 1.0, 1.0)
    with pytest.raises(ValueError, match="cost contains NaN"):
        F.true_preference(u[0], M * float("nan"), 1.0)
    with pytest.raises(ValueError, match="alpha"):
        F.gaussian_estimate(z, b, -1.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    T, u, z, b = problem(12, batch=(3, 4), n=6, d=5, zeros=1)
    lam = F.solve_dual(b, T, u, 1.3)
    lam_cuda = F.solve_dual(b.cuda(), T.cuda(), u.cuda(), 1.3)
    assert lam_cuda.device.type == "cuda"
    torch.testing.assert_close(lam_cuda.cpu(), lam, atol=1e-10, rtol=0)
    h, _ = F.ot_exact_estimate(z.cuda(), T.cuda(), u.cuda(), torch.cdist(T, T).cuda() ** 2, 0.5, 1.0)
    assert h.device.type == "cuda"
