"""Tests for attnopt.mixture: weighted EM, model selection (5.20) and multimodal continuous attention.

Independent references: scikit-learn's GaussianMixture (same initialization, uniform weights), EM
on explicitly repeated points (integer weights), moment matching of attention.continuous, the
unimodal ContinuousAttention module, finite differences (gradcheck), and per-example loops.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from attnopt.continuous import moment_match
from attnopt.continuous_attention import ContinuousAttention
from attnopt.mixture import (
    MultimodalContinuousAttention,
    select_components,
    weighted_em,
    weighted_log_likelihood,
)
from attnopt.value_functions import GaussianRBF, grid_locations, ridge_value_function

GaussianMixture = pytest.importorskip("sklearn.mixture").GaussianMixture

F64 = torch.float64
sys.path.insert(0, str(Path(__file__).parent))  # tests/lib/host_reads.py


pytestmark = pytest.mark.usefixtures("one_thread")


def _blobs(seed, n_per=40, d=2):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n_per, d, generator=g, dtype=F64) * 0.3 + 1.5
    b = torch.randn(n_per, d, generator=g, dtype=F64) * torch.tensor([0.6, 0.2][:d] + [0.4] * (d - 2), dtype=F64) - 1.0
    c = torch.randn(n_per // 2, d, generator=g, dtype=F64) * 0.5 + torch.tensor([2.0, -2.0][:d] + [0.0] * (d - 2), dtype=F64)
    return torch.cat([a, b, c])


def _random_init(x, k, seed):
    g = torch.Generator().manual_seed(seed)
    n, d = x.shape
    means = x[torch.randperm(n, generator=g)[:k]].clone()
    a = torch.randn(k, d, d, generator=g, dtype=F64) * 0.3
    covs = a @ a.transpose(-1, -2) + 0.5 * torch.eye(d, dtype=F64)
    mix = torch.rand(k, generator=g, dtype=F64) + 0.5
    mix = mix / mix.sum()
    return {"means": means, "covariances": covs, "mixing": mix}


def _sklearn_fit(x, init, n_iter, reg, tol=0.0):
    with threadpool_limits(1):
        return _sklearn_fit_(x, init, n_iter, reg, tol)


def _sklearn_fit_(x, init, n_iter, reg, tol):
    mix = init["mixing"].numpy().copy()
    mix[-1] = 1.0 - mix[:-1].sum()  # sklearn checks the sum to 1e-16-ish
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: we ask for exactly n_iter steps
        gm = GaussianMixture(
            n_components=init["means"].shape[0], covariance_type="full", reg_covar=reg, max_iter=n_iter, tol=tol,
            means_init=init["means"].numpy(), precisions_init=np.linalg.inv(init["covariances"].numpy()),
            weights_init=mix, n_init=1,
        ).fit(x.numpy())
    return gm


grid = grid_locations(14, dtype=F64)


def _bump(center, s):
    return torch.exp(-0.5 * ((grid - torch.tensor(center, dtype=F64)) ** 2).sum(-1) / s**2)


ONE_BLOB = _bump([0.5, 0.4], 0.12)
TWO_BLOBS = _bump([0.2, 0.2], 0.07) + _bump([0.8, 0.75], 0.09)
TWO_BLOBS_UNEQUAL = _bump([0.25, 0.5], 0.1) + 0.5 * _bump([0.75, 0.5], 0.1)
CELL_VARIANCE = (1 / 13) ** 2 / 12  # of a uniform distribution on a cell of the 14x14 grid


# --------------------------------------------------------------------------------------------
# weighted EM
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed,k,d", [(0, 3, 2), (1, 2, 2), (2, 4, 3)])
@pytest.mark.parametrize("n_iter", [1, 7, 40])
def test_uniform_weights_match_sklearn(seed, k, d, n_iter):
    x = _blobs(seed, d=d)
    n = x.shape[0]
    init = _random_init(x, k, seed)
    gm = _sklearn_fit(x, init, n_iter, reg=1e-6)
    res = weighted_em(x, torch.full((n,), 1.0 / n, dtype=F64), k, n_iter=n_iter, init=init, tol=None, cov_floor=1e-6)
    assert res.n_iter == n_iter and res.history.shape == (n_iter,)
    np.testing.assert_allclose(res.means.numpy(), gm.means_, atol=1e-8)
    np.testing.assert_allclose(res.covariances.numpy(), gm.covariances_, atol=1e-8)
    np.testing.assert_allclose(res.mixing.numpy(), gm.weights_, atol=1e-8)
    # with w = 1/N the weighted log-likelihood is sklearn's average log-likelihood
    np.testing.assert_allclose(res.log_likelihood.item(), gm.score(x.numpy()), atol=1e-8)
    # unnormalized uniform weights (w = 1): same parameters, log-likelihood = N x average
    res1 = weighted_em(x, torch.ones(n, dtype=F64), k, n_iter=n_iter, init=init, tol=None, cov_floor=1e-6)
    np.testing.assert_allclose(res1.means.numpy(), gm.means_, atol=1e-8)
    np.testing.assert_allclose(res1.mixing.numpy(), gm.weights_, atol=1e-8)
    np.testing.assert_allclose(res1.log_likelihood.item(), n * gm.score(x.numpy()), rtol=1e-10)


def test_convergence_matches_sklearn_at_convergence():
    x = _blobs(5)
    n = x.shape[0]
    init = _random_init(x, 3, 5)
    res = weighted_em(x, torch.full((n,), 1.0 / n, dtype=F64), 3, n_iter=2000, init=init, tol=1e-13, cov_floor=1e-6)
    assert res.n_iter < 2000  # stopped by tol
    gm = _sklearn_fit(x, init, 2000, reg=1e-6, tol=1e-13)  # sklearn's own stopping rule
    assert gm.converged_
    np.testing.assert_allclose(res.means.numpy(), gm.means_, atol=1e-6)
    np.testing.assert_allclose(res.covariances.numpy(), gm.covariances_, atol=1e-6)
    np.testing.assert_allclose(res.mixing.numpy(), gm.weights_, atol=1e-6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(1, 4))
def test_integer_weights_equal_repeated_points(seed, k):
    g = torch.Generator().manual_seed(seed)
    x = _blobs(seed % 7, n_per=15)
    counts = torch.randint(0, 4, (x.shape[0],), generator=g)
    counts[0] = 1
    init = _random_init(x[counts > 0], k, seed)
    w = counts.to(F64)
    res = weighted_em(x, w, k, n_iter=12, init=init, tol=None, cov_floor=1e-6)
    xr = x.repeat_interleave(counts, dim=0)
    rep = weighted_em(xr, torch.ones(xr.shape[0], dtype=F64), k, n_iter=12, init=init, tol=None, cov_floor=1e-6)
    torch.testing.assert_close(res.means, rep.means, atol=1e-9, rtol=0)
    torch.testing.assert_close(res.covariances, rep.covariances, atol=1e-9, rtol=0)
    torch.testing.assert_close(res.mixing, rep.mixing, atol=1e-9, rtol=0)
    torch.testing.assert_close(res.history, rep.history, atol=1e-8, rtol=1e-10)


@pytest.mark.parametrize("cov_floor", [0.0, 1e-6])
@pytest.mark.parametrize("init", ["kmeans++", "random", "regions"])
def test_history_monotone_and_parameters_valid(cov_floor, init):
    g = torch.Generator().manual_seed(3)
    if cov_floor > 0:  # attention-like weights on the grid (needs the floor: components can collapse)
        pts = grid
        scores = torch.randn(6, 196, generator=g, dtype=F64) * 2.0
        w = torch.cat([torch.softmax(scores, -1), torch.stack([ONE_BLOB, TWO_BLOBS])], dim=0)
    else:  # no floor: the monotonicity theorem exactly, on points in general position
        pts = _blobs(3)
        w = torch.rand(8, pts.shape[0], generator=g, dtype=F64) + 0.05
    w = w / w.sum(-1, keepdim=True)
    res = weighted_em(pts, w, 3, n_iter=40, init=init, tol=None, cov_floor=cov_floor, generator=g)
    diffs = res.history[1:] - res.history[:-1]
    assert diffs.min() >= -1e-10
    # the returned log-likelihood is the one of the returned parameters (independent evaluation)
    ll = weighted_log_likelihood(pts, w, res.means, res.covariances, res.mixing)
    torch.testing.assert_close(ll, res.log_likelihood, atol=1e-10, rtol=0)
    torch.testing.assert_close(res.history[-1], res.log_likelihood)
    torch.testing.assert_close(res.mixing.sum(-1), torch.ones(8, dtype=F64))
    assert (res.mixing >= 0).all()
    torch.testing.assert_close(res.covariances, res.covariances.transpose(-1, -2), atol=0, rtol=0)
    eig = torch.linalg.eigvalsh(res.covariances)
    assert (eig > 0).all()
    if cov_floor > 0:
        assert (eig >= cov_floor * (1 - 1e-9)).all()


def test_one_component_is_moment_matching():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(5, 196, generator=g, dtype=F64), -1)
    mu, var = moment_match(w, grid)
    res = weighted_em(grid, w, 1, n_iter=3, init="kmeans++", tol=None, cov_floor=1e-4, generator=g)
    torch.testing.assert_close(res.means[..., 0, :], mu)
    torch.testing.assert_close(res.covariances[..., 0, :, :], var + 1e-4 * torch.eye(2, dtype=F64))
    torch.testing.assert_close(res.mixing, torch.ones(5, 1, dtype=F64))


def test_weight_scale_invariance():
    g = torch.Generator().manual_seed(1)
    w = torch.softmax(torch.randn(3, 196, generator=g, dtype=F64) * 3, -1)
    a = weighted_em(grid, w, 3, n_iter=15, init="regions", tol=None)
    b = weighted_em(grid, 7.5 * w, 3, n_iter=15, init="regions", tol=None)
    torch.testing.assert_close(a.means, b.means)
    torch.testing.assert_close(a.covariances, b.covariances)
    torch.testing.assert_close(a.mixing, b.mixing)
    torch.testing.assert_close(7.5 * a.log_likelihood, b.log_likelihood)


@pytest.mark.parametrize("init", ["regions", "given"])
def test_batched_equals_looped(init):
    g = torch.Generator().manual_seed(4)
    w = torch.softmax(torch.randn(2, 3, 196, generator=g, dtype=F64) * 2.5, -1)
    if init == "given":
        means = torch.rand(2, 3, 4, 2, generator=g, dtype=F64)
        a = torch.randn(2, 3, 4, 2, 2, generator=g, dtype=F64) * 0.1
        init_b = {"means": means, "covariances": a @ a.transpose(-1, -2) + 0.01 * torch.eye(2, dtype=F64),
                  "mixing": torch.full((2, 3, 4), 0.25, dtype=F64)}
        init_of = lambda i, j: {key: v[i, j] for key, v in init_b.items()}
    else:
        init_b = "regions"
        init_of = lambda i, j: "regions"
    res = weighted_em(grid, w, 4, n_iter=20, init=init_b, tol=None)
    for i in range(2):
        for j in range(3):
            one = weighted_em(grid, w[i, j], 4, n_iter=20, init=init_of(i, j), tol=None)
            torch.testing.assert_close(res.means[i, j], one.means)
            torch.testing.assert_close(res.covariances[i, j], one.covariances)
            torch.testing.assert_close(res.mixing[i, j], one.mixing)
            torch.testing.assert_close(res.history[:, i, j], one.history)
    # per-example points (..., N, D) give the same as shared points
    res2 = weighted_em(grid.expand(2, 3, 196, 2), w, 4, n_iter=20, init=init_b, tol=None)
    torch.testing.assert_close(res2.means, res.means)


def test_tol_stops_when_all_examples_converged():
    w = torch.stack([TWO_BLOBS, TWO_BLOBS_UNEQUAL])
    w = w / w.sum(-1, keepdim=True)
    res = weighted_em(grid, w, 2, n_iter=500, init="regions", tol=1e-9)
    assert 1 < res.n_iter < 500
    assert res.history.shape == (res.n_iter, 2)
    last = res.history[-1] - res.history[-2]
    assert (last < 1e-9).all()
    prev = res.history[-2] - res.history[-3] if res.n_iter > 2 else None
    if prev is not None:
        assert (prev >= 1e-9).any()


def test_regions_init_separates_two_blobs():
    w = TWO_BLOBS_UNEQUAL / TWO_BLOBS_UNEQUAL.sum()
    res = weighted_em(grid, w, 2, n_iter=50, init="regions", tol=None)
    order = res.means[:, 0].argsort()
    torch.testing.assert_close(res.means[order], torch.tensor([[0.25, 0.5], [0.75, 0.5]], dtype=F64), atol=5e-3, rtol=0)
    torch.testing.assert_close(res.mixing[order], torch.tensor([2 / 3, 1 / 3], dtype=F64), atol=5e-3, rtol=0)


def test_gradient_through_unrolled_em():
    pts = grid_locations(4, dtype=F64)
    g = torch.Generator().manual_seed(0)
    s = torch.randn(16, generator=g, dtype=F64, requires_grad=True)

    def f(s):
        r = weighted_em(pts, torch.softmax(s, -1), 2, n_iter=3, init="regions", tol=None, cov_floor=1e-3)
        return r.means, r.covariances, r.mixing, r.log_likelihood

    assert torch.autograd.gradcheck(f, (s,))


# --------------------------------------------------------------------------------------------
# model selection
# --------------------------------------------------------------------------------------------


def test_select_components_one_vs_two_blobs():
    w = torch.stack([ONE_BLOB, TWO_BLOBS, TWO_BLOBS_UNEQUAL, _bump([0.3, 0.7], 0.2)])
    g = torch.Generator().manual_seed(0)
    # the floor of a grid cell's variance h^2/12 (see the docstring): below it a random start may find
    # a component collapsed onto a row of the grid, whose gain beats the penalty
    sel = select_components(grid, 3.0 * w, max_components=4, penalty=0.1, n_init=3, n_iter=40, generator=g,
                            cov_floor=CELL_VARIANCE)
    assert sel.n_components.tolist() == [1, 2, 2, 1]
    assert sel.criterion.shape == (4, 4)
    # padding components have zero mixing; the real ones sum to one
    k = sel.n_components
    pad = torch.arange(4)[None, :] >= k[:, None]
    assert (sel.mixing[pad] == 0).all()
    torch.testing.assert_close(sel.mixing.sum(-1), torch.ones(4, dtype=F64))
    # the reported criterion of the chosen K is (5.20) recomputed from the returned mixture
    wn = w / w.sum(-1, keepdim=True)
    safe_mix = sel.mixing.clamp_min(1e-300)
    ll = weighted_log_likelihood(grid, wn, sel.means, sel.covariances, safe_mix)
    torch.testing.assert_close(ll, sel.log_likelihood, atol=1e-9, rtol=0)
    crit = -2 * ll + 0.1 * k.to(F64)
    torch.testing.assert_close(crit, sel.criterion.gather(-1, (k - 1)[:, None]).squeeze(-1), atol=1e-9, rtol=0)
    assert (sel.criterion.gather(-1, (k - 1)[:, None]) <= sel.criterion + 1e-12).all()


def test_select_components_penalty_monotone():
    w = TWO_BLOBS_UNEQUAL
    ks = []
    for pen in (0.0, 0.1, 1e3):
        sel = select_components(grid, w, max_components=3, penalty=pen, n_iter=30, generator=torch.Generator().manual_seed(0))
        ks.append(int(sel.n_components))
    assert ks[0] >= ks[1] >= ks[2] == 1


# --------------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------------

BASIS = GaussianRBF.grid(6, 0.05, dtype=F64)


def test_module_one_component_equals_continuous_attention():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 196, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(3, 196, 5, generator=g, dtype=F64, requires_grad=True)
    mm = MultimodalContinuousAttention(BASIS, grid, 1, cov_floor=0.0, n_iter=2)
    ref = ContinuousAttention(BASIS, grid)
    c1, c0 = mm(s, v), ref(s, v)
    torch.testing.assert_close(c1, c0, atol=1e-12, rtol=1e-9)
    gs1, gv1 = torch.autograd.grad(c1.square().sum(), (s, v))
    gs0, gv0 = torch.autograd.grad(c0.square().sum(), (s, v))
    torch.testing.assert_close(gs1, gs0, atol=1e-12, rtol=1e-8)
    torch.testing.assert_close(gv1, gv0, atol=1e-12, rtol=1e-8)


def test_module_context_is_mixture_of_component_contexts():
    g = torch.Generator().manual_seed(1)
    s = torch.log(torch.stack([TWO_BLOBS, ONE_BLOB])) + 0.1 * torch.randn(2, 196, generator=g, dtype=F64)
    v = torch.randn(2, 196, 4, generator=g, dtype=F64)
    mm = MultimodalContinuousAttention(BASIS, grid, 2, n_iter=10)
    c, (pi, mu, Sigma, _) = mm(s, v, return_density=True)
    ref = ContinuousAttention(BASIS, grid)
    # r = E_p[psi] for the mixture density p = sum_k pi_k N(mu_k, Sigma_k), by an independent
    # midpoint quadrature on a fine grid, then c = B r (eqs. (5.4)-(5.5))
    t = grid_locations(121, low=-0.5, high=1.5, dtype=F64)
    dens = torch.exp(-0.5 * torch.einsum("bkld,bkde,bkle->bkl", t - mu[..., None, :], torch.linalg.inv(Sigma), t - mu[..., None, :]))
    dens = dens / (2 * torch.pi * torch.linalg.det(Sigma).sqrt())[..., None]
    dA = (2.0 / 120) ** 2
    r = torch.einsum("bk,bkl,ln->bn", pi, dens, BASIS(t)) * dA
    B = ridge_value_function(v, grid, BASIS, 0.01)
    torch.testing.assert_close(c, (B @ r.unsqueeze(-1)).squeeze(-1), atol=1e-4, rtol=1e-3)
    assert not torch.allclose(c[0], ref(s, v)[0], atol=1e-3)  # bimodal differs from unimodal


@pytest.mark.parametrize("k", [2, "auto"])
def test_module_forward_backward(k):
    g = torch.Generator().manual_seed(2)
    s = torch.randn(2, 196, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(2, 196, 3, generator=g, dtype=F64, requires_grad=True)
    mm = MultimodalContinuousAttention(BASIS, grid, k, max_components=3, n_iter=5, n_init=2)
    c = mm(s * 3, v)
    assert c.shape == (2, 3) and torch.isfinite(c).all()
    c.sum().backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().max() > 0
    assert torch.isfinite(v.grad).all() and v.grad.abs().max() > 0


def test_module_gradcheck_small():
    pts = grid_locations(4, dtype=F64)
    basis = GaussianRBF.grid(3, 0.3, dtype=F64)
    mm = MultimodalContinuousAttention(basis, pts, 2, n_iter=3, cov_floor=1e-3)
    g = torch.Generator().manual_seed(0)
    s = torch.randn(16, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(16, 2, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, v: mm(s, v), (s, v))


def test_module_detached_em_gives_no_score_gradient():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(196, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(196, 3, generator=g, dtype=F64, requires_grad=True)
    a = MultimodalContinuousAttention(BASIS, grid, 2, differentiate_em=False)
    b = MultimodalContinuousAttention(BASIS, grid, 2, differentiate_em=True)
    ca, cb = a(s, v), b(s, v)
    torch.testing.assert_close(ca, cb)
    ca.sum().backward()
    assert s.grad is None or (s.grad == 0).all()
    assert v.grad.abs().max() > 0


@pytest.mark.parametrize("dtype, padded", [(F64, False), (F64, True), (torch.float32, True)])
def test_module_precomputed_ridge_operator_matches_ridge_value_function(dtype, padded):
    """The ridge operator is computed once at construction; the context equals the old path, which
    called ridge_value_function on every forward (same basis dtype as the inputs)."""
    from attnopt.continuous import continuous_softmax
    from attnopt.value_functions import padding_locations

    basis = GaussianRBF.grid(6, 0.08, dim=2, dtype=dtype)
    locs = grid_locations(14, dtype=dtype)
    pad = padding_locations(14, dtype=dtype) if padded else None
    g = torch.Generator().manual_seed(4)
    s = torch.randn(3, 196, generator=g, dtype=F64).to(dtype)
    v = torch.randn(3, 196, 5, generator=g, dtype=F64).to(dtype)
    mm = MultimodalContinuousAttention(basis, locs, 2, padding=pad)
    c, (pi, mu, Sigma, _) = mm(s, v, return_density=True)
    r = torch.einsum("bk,bkn->bn", pi, continuous_softmax(mu, Sigma, basis))
    B = ridge_value_function(v, locs, basis, 0.01, padding=pad)
    tol = {"rtol": 1e-12, "atol": 1e-13} if dtype == F64 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(c, (B @ r.unsqueeze(-1)).squeeze(-1), **tol)
    assert "ridge_operator" not in mm.state_dict()  # derived, not saved
    assert mm.double().ridge_operator.dtype == F64  # the buffer follows the module


@pytest.mark.parametrize("seed", [0, 1])
def test_gaussian_log_prob_2d_closed_form_matches_scipy(seed):
    from scipy import stats

    from attnopt.continuous._mixture_em import gaussian_log_prob as _gaussian_log_prob

    x = _blobs(seed)
    init = _random_init(x, 3, seed)
    covs = init["covariances"]
    covs[1] = torch.tensor([[1.0, 0.999], [0.999, 1.0]], dtype=F64) * 1e-2  # nearly degenerate
    got = _gaussian_log_prob(x, init["means"], covs)
    want = np.stack([stats.multivariate_normal(init["means"][k].numpy(), covs[k].numpy()).logpdf(x.numpy()) for k in range(3)], -1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-9)


def test_float32_runs():
    basis = GaussianRBF.grid(6, 0.05)
    mm = MultimodalContinuousAttention(basis, grid_locations(14), 2)
    c = mm(torch.randn(4, 196), torch.randn(4, 196, 8))
    assert c.dtype == torch.float32 and torch.isfinite(c).all()


# --------------------------------------------------------------------------------------------
# degenerate points, range, precision, host reads
# --------------------------------------------------------------------------------------------


def _weighted_moments(x, w):
    w = w / w.sum()
    mean = (w[:, None] * x).sum(0)
    diff = x - mean
    return mean, (w[:, None, None] * diff[:, :, None] * diff[:, None, :]).sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_collinear_points_without_floor_are_moment_matched_with_the_resolution_floor(dtype):
    """K = 1 on collinear points with cov_floor = 0: the weighted moments (independent, float64) plus
    the documented floor 10 u (tr + u s^2) along the missing direction; finite, positive definite."""
    g = torch.Generator().manual_seed(0)
    u = torch.rand(30, generator=g, dtype=F64) * 3 - 1
    x = torch.stack([u, 0.5 - 2 * u], -1)  # on a line
    w = torch.rand(30, generator=g, dtype=F64) + 0.1
    fit = weighted_em(x.to(dtype), w.to(dtype), 1, n_iter=3, init="regions", tol=None, cov_floor=0.0)
    mean, cov = _weighted_moments(x, w)
    eps = torch.finfo(dtype).eps
    floor = 10 * eps * cov.trace()
    assert fit.covariances.dtype == dtype
    torch.testing.assert_close(fit.means[0].double(), mean, atol=50 * eps, rtol=0)
    torch.testing.assert_close(fit.covariances[0].double(), cov, atol=50 * eps * cov.trace(), rtol=0)
    eig = torch.linalg.eigvalsh(fit.covariances[0].double())
    assert 0.5 * floor < eig[0] < 1.5 * floor  # the null direction gets the floor, nothing else
    # closed form of (5.16) at the fit: -W/2 (D log 2 pi + log det S + tr(S^-1 C)), S = C + floor I
    S = cov + eig[0] * torch.eye(2, dtype=F64)
    want = -0.5 * w.sum() * (2 * math.log(2 * math.pi) + torch.logdet(S) + torch.linalg.solve(S, cov).trace())
    torch.testing.assert_close(fit.log_likelihood.double(), want, rtol=1e-3 if dtype == F64 else 1e-2, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("k", [1, 3])
def test_coincident_points_without_floor_give_a_finite_point_mass(dtype, k):
    x = torch.tensor([[0.3, -0.7]], dtype=dtype).expand(6, 2)
    w = torch.tensor([1.0, 2.0, 0.0, 1.0, 3.0, 0.5], dtype=dtype)
    fit = weighted_em(x, w, k, n_iter=5, init="kmeans++", tol=None, cov_floor=0.0, generator=torch.Generator().manual_seed(0))
    assert all(torch.isfinite(t).all() for t in fit[:5])
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(fit.means, x[:1].expand(k, 2), atol=100 * eps, rtol=0)
    eig = torch.linalg.eigvalsh(fit.covariances.double())
    assert (eig > 0).all() and (eig < 1e3 * eps**2).all()  # a point mass, up to the resolution floor
    assert fit.log_likelihood > w.sum() * math.log(1 / eps)  # a density above 1/eps at the point, finite


@pytest.mark.parametrize("c", [2.0**40, 1e-30, 3e120])
def test_fit_is_equivariant_under_scaling_at_any_magnitude(c):
    """N(c t; c mu, c^2 Sigma) = N(t; mu, Sigma) / c^D: the fit to c t (floor c^2 f) is the fit to t,
    scaled, far beyond the range where the squares of the coordinates are representable unscaled."""
    g = torch.Generator().manual_seed(2)
    w = torch.softmax(torch.randn(3, 196, generator=g, dtype=F64) * 2, -1)
    a = weighted_em(grid, w, 3, n_iter=15, init="regions", tol=None, cov_floor=1e-6)
    b = weighted_em(c * grid, w, 3, n_iter=15, init="regions", tol=None, cov_floor=c * c * 1e-6)
    torch.testing.assert_close(b.means, c * a.means, rtol=1e-9, atol=0)
    torch.testing.assert_close(b.covariances, c * c * a.covariances, rtol=1e-9, atol=1e-9 * c * c * 1e-6)
    torch.testing.assert_close(b.mixing, a.mixing, rtol=0, atol=1e-9)
    torch.testing.assert_close(b.log_likelihood, a.log_likelihood - 2 * math.log(c) * w.sum(-1), rtol=1e-9, atol=1e-9)


def test_weights_of_any_magnitude_give_the_same_fit():
    """The fit does not depend on the scale of the weights (5.12)-(5.15), and l_w is linear in it: in
    float32, weights near 1e36 (whose sum overflows) or 1e-40 (subnormal) too."""
    g = torch.Generator().manual_seed(3)
    w = torch.softmax(torch.randn(196, generator=g) * 2, -1)
    a = weighted_em(grid_locations(14), w, 2, n_iter=10, init="regions", tol=None)
    for c in (2.0**120, 2.0**-100):  # exact scalings of the weights: the same rounding
        b = weighted_em(grid_locations(14), c * w, 2, n_iter=10, init="regions", tol=None)
        for x, y in zip(a[:3], b[:3]):
            assert torch.equal(x, y)
        assert torch.equal(b.log_likelihood, c * a.log_likelihood)
    b = weighted_em(grid_locations(14), 1e-40 * w, 2, n_iter=10, init="regions", tol=None)  # ~3 digits left
    torch.testing.assert_close(b.means, a.means, rtol=0, atol=1e-3)
    torch.testing.assert_close(b.mixing, a.mixing, rtol=0, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    g = torch.Generator().manual_seed(4)
    w = torch.softmax(torch.randn(2, 196, generator=g) * 2, -1).to(dtype)
    pts = grid_locations(14).to(dtype)
    half = weighted_em(pts, w, 2, n_iter=5, init="regions", tol=None)
    full = weighted_em(pts.float(), w.float(), 2, n_iter=5, init="regions", tol=None)
    assert half.means.dtype == half.covariances.dtype == half.log_likelihood.dtype == dtype
    assert (torch.linalg.eigvalsh(half.covariances.double()) > 0).all()  # after rounding to the dtype
    # the same fit up to the dtype's rounding and its resolution floor 10 u tr(Sigma) in every
    # iteration (u = 2^-7 for bfloat16, 2^-10 for float16)
    u = torch.finfo(dtype).eps
    torch.testing.assert_close(half.means.float(), full.means, atol=10 * u, rtol=0)
    torch.testing.assert_close(half.mixing.float(), full.mixing, atol=10 * u, rtol=0)
    trace = full.covariances.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]
    assert ((half.covariances.float() - full.covariances).abs() <= 50 * u * trace).all()


def test_tol_without_host_reads_freezes_at_the_same_fit():
    """Under checks("async") (as on a GPU) early stopping cannot read: every iteration runs, and the
    parameters stop changing at the iteration where the eager loop stops."""
    import attnopt

    w = torch.stack([TWO_BLOBS, TWO_BLOBS_UNEQUAL])
    w = w / w.sum(-1, keepdim=True)
    eager = weighted_em(grid, w, 2, n_iter=400, init="regions", tol=1e-9)
    with attnopt.checks("async"):
        quiet = weighted_em(grid, w, 2, n_iter=400, init="regions", tol=1e-9)
    assert 1 < eager.n_iter < 400 and quiet.n_iter == 400
    for a, b in zip(eager[:4], quiet[:4]):
        assert torch.equal(a, b)
    assert torch.equal(quiet.history[: eager.n_iter], eager.history)
    assert (quiet.history[eager.n_iter :] == eager.log_likelihood).all()


@pytest.mark.parametrize("init", ["regions", "kmeans++", "random", "given"])
def test_em_without_tol_makes_no_host_read(init):
    from host_reads import host_reads

    w = torch.softmax(torch.randn(3, 196, dtype=F64) * 2, -1)
    if init == "given":
        init = {"means": torch.rand(3, 2, dtype=F64), "covariances": 0.01 * torch.eye(2, dtype=F64).expand(3, 2, 2),
                "mixing": torch.full((3,), 1 / 3, dtype=F64)}
    assert host_reads(weighted_em, grid, w, 3, n_iter=4, init=init, tol=None, generator=torch.Generator()) == []


def test_module_forward_and_backward_make_no_host_read():
    from host_reads import host_reads

    mm = MultimodalContinuousAttention(BASIS, grid, 2, n_iter=4)
    s = torch.randn(3, 196, dtype=F64, requires_grad=True)
    v = torch.randn(3, 196, 4, dtype=F64, requires_grad=True)
    assert host_reads(mm.fit_mixture, torch.softmax(s, -1)) == []  # the mixture side alone
    assert host_reads(mm, s, v) == []
    c = mm(s, v)
    assert host_reads(lambda: c.square().sum().backward()) == []


def test_module_rows_with_every_score_masked_attend_to_nothing():
    g = torch.Generator().manual_seed(5)
    s = torch.randn(3, 196, generator=g, dtype=F64)
    s[1] = -math.inf
    s[2, :100] = -math.inf  # partly masked: those locations get weight 0
    s.requires_grad_(True)
    v = torch.randn(3, 196, 4, generator=g, dtype=F64, requires_grad=True)
    mm = MultimodalContinuousAttention(BASIS, grid, 2, n_iter=5)
    c, (pi, mu, Sigma, _) = mm(s, v, return_density=True)
    assert torch.equal(c[1], torch.zeros(4, dtype=F64)) and torch.equal(pi[1], torch.zeros(2, dtype=F64))
    assert torch.isfinite(mu).all() and (torch.linalg.eigvalsh(Sigma) > 0).all()
    rest = mm(s.detach()[[0, 2]], v.detach()[[0, 2]])
    torch.testing.assert_close(c[[0, 2]], rest, rtol=1e-12, atol=1e-12)
    c.square().sum().backward()
    assert torch.isfinite(s.grad).all() and (s.grad[1] == 0).all() and (s.grad[2, :100] == 0).all()
    assert torch.isfinite(v.grad).all()


@pytest.mark.parametrize("rule", ["random", "kmeans++"])
def test_random_seeds_are_drawn_in_proportion_to_the_weights(rule):
    """Regression: the Gumbel noise of the seeding was NaN, so every seed was location 0 and the
    "random"/"kmeans++" initializations were neither.  The first seed of both rules is a draw from w
    (Gumbel-max): over many examples its frequencies are w; the seeds of an example are distinct."""
    from attnopt.continuous._mixture_em import seed_kmeanspp as _seed_kmeanspp, seed_random as _seed_random

    seed_fn = _seed_random if rule == "random" else _seed_kmeanspp
    w = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4], dtype=F64)
    n = 20000
    pts = torch.arange(5, dtype=F64)[:, None].expand(n, 5, 1)
    seeds = seed_fn(pts, torch.log(w).expand(n, 5), 2, torch.Generator().manual_seed(0))  # (n, 2, 1)
    freq = torch.bincount(seeds[:, 0, 0].long(), minlength=5).to(F64) / n
    torch.testing.assert_close(freq, w, atol=4 * math.sqrt(0.25 / n), rtol=0)  # 4 standard deviations
    assert freq[0] == 0 and (seeds[:, 0] != seeds[:, 1]).all()


def test_random_initializations_of_an_example_do_not_depend_on_later_examples():
    """With the same generator state, the first examples of a batch are fitted (and selected) as in a
    call on them alone: the notebook's check of the shifted criterion relies on it."""
    g = torch.Generator().manual_seed(6)
    w = torch.softmax(torch.randn(9, 196, generator=g, dtype=F64) * 3, -1)
    for init in ("kmeans++", "random"):
        whole = weighted_em(grid, w, 3, n_iter=5, init=init, tol=None, generator=torch.Generator().manual_seed(1))
        first = weighted_em(grid, w[:4], 3, n_iter=5, init=init, tol=None, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(whole.means[:4], first.means, rtol=1e-12, atol=1e-14)
    whole = select_components(grid, w, max_components=3, n_iter=5, generator=torch.Generator().manual_seed(1))
    first = select_components(grid, w[:4], max_components=3, n_iter=5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(whole.criterion[:4], first.criterion, rtol=1e-12, atol=1e-12)


def test_more_components_than_weighted_points():
    """Two locations carry all the weight: EM with K = 4 stays finite and select_components keeps 2."""
    w = torch.zeros(196, dtype=F64)
    w[[20, 150]] = torch.tensor([0.6, 0.4], dtype=F64)
    fit = weighted_em(grid, w, 4, n_iter=20, init="kmeans++", tol=None, generator=torch.Generator().manual_seed(0))
    assert all(torch.isfinite(t).all() for t in fit[:5])
    sel = select_components(grid, w, max_components=4, n_iter=20, generator=torch.Generator().manual_seed(0))
    assert int(sel.n_components) == 2
    order = sel.means[:2, 0].argsort()
    torch.testing.assert_close(sel.means[:2][order], grid[[20, 150]], atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------
# invalid input
# --------------------------------------------------------------------------------------------


def test_bad_inputs():
    w = torch.full((196,), 1 / 196, dtype=F64)
    with pytest.raises(ValueError, match="non-negative"):
        weighted_em(grid, -w, 2)
    with pytest.raises(ValueError, match="positive sum"):
        weighted_em(grid, torch.zeros(196, dtype=F64), 2)
    with pytest.raises(ValueError, match="do not match"):
        weighted_em(grid, w[:100], 2)
    with pytest.raises(ValueError, match="n_components"):
        weighted_em(grid, w, 0)
    with pytest.raises(TypeError, match="n_components"):
        weighted_em(grid, w, 2.0)
    with pytest.raises(ValueError, match="exceeds"):
        weighted_em(grid[:3], w[:3], 4)
    with pytest.raises(ValueError, match="init"):
        weighted_em(grid, w, 2, init="nope")
    with pytest.raises(ValueError, match="initial means"):
        weighted_em(grid, w, 2, init=torch.zeros(3, 2, dtype=F64))
    with pytest.raises(ValueError, match="positive definite"):
        weighted_em(grid, w, 2, init={"means": torch.zeros(2, 2, dtype=F64), "covariances": -torch.eye(2, dtype=F64).expand(2, 2, 2)})
    with pytest.raises(TypeError, match="floating"):
        weighted_em(grid, torch.ones(196, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="NaN"):
        weighted_em(grid, w * float("nan"), 2)
    with pytest.raises(ValueError, match="cov_floor"):
        weighted_em(grid, w, 2, cov_floor=-1.0)
    with pytest.raises(ValueError, match="min_components"):
        select_components(grid, w, max_components=2, min_components=3)
    with pytest.raises(TypeError, match="basis"):
        MultimodalContinuousAttention("basis", grid, 2)
    with pytest.raises(ValueError, match="n_components"):
        MultimodalContinuousAttention(BASIS, grid, 0)
    mm = MultimodalContinuousAttention(BASIS, grid, 2)
    with pytest.raises(ValueError, match="do not match"):
        mm(torch.randn(100, dtype=F64), torch.randn(196, 3, dtype=F64))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(8, 196, generator=g, dtype=F64) * 2, -1)
    cpu = weighted_em(grid, w, 3, n_iter=20, init="regions", tol=1e-12)
    gpu = weighted_em(grid.cuda(), w.cuda(), 3, n_iter=20, init="regions", tol=1e-12)
    assert gpu.means.device.type == "cuda"
    torch.testing.assert_close(gpu.means.cpu(), cpu.means)
    torch.testing.assert_close(gpu.covariances.cpu(), cpu.covariances)
    gk = weighted_em(grid.cuda(), w.cuda(), 3, n_iter=5, init="kmeans++", generator=torch.Generator(device="cuda").manual_seed(0))
    assert torch.isfinite(gk.log_likelihood).all()
    mm = MultimodalContinuousAttention(BASIS, grid, 2).cuda()
    s = torch.randn(4, 196, dtype=F64, device="cuda", requires_grad=True)
    c = mm(s, torch.randn(4, 196, 3, dtype=F64, device="cuda"))
    c.sum().backward()
    assert c.device.type == "cuda" and torch.isfinite(s.grad).all()
