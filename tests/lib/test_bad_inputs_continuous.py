"""Bad and edge inputs of attnopt.continuous, attnopt.value_functions and attnopt.continuous_attention,
written from the contract.

A bad argument raises TypeError (types, dtypes) or ValueError (values, shapes) whose message names the
user's argument; an edge input gives its documented result (empty batch in, empty out; a singular
covariance is the limit density; a one-hot or peaked score vector is a point mass); finite input gives
a finite output in range (0 <= r_j <= max psi_j) in the input's dtype, with finite gradients, for scales
of Sigma from the point-mass limit to far larger than the basis; batching is looping.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnopt.continuous import (
    continuous_density,
    continuous_softmax,
    continuous_sparsemax,
    moment_match,
    truncated_paraboloid_threshold,
)
from attnopt.continuous_attention import ContinuousAttention, ContinuousDensity
from attnopt.value_functions import (
    GaussianRBF,
    grid_locations,
    padding_locations,
    ridge_operator,
    ridge_value_function,
)

F64 = torch.float64
NAN, INF = float("nan"), float("inf")
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)

pytestmark = pytest.mark.usefixtures("one_thread")

BASIS = GaussianRBF.grid(3, 0.3, dim=2, dtype=F64)
BASIS1 = GaussianRBF(torch.tensor([[0.1], [0.5], [0.9]], dtype=F64), 0.2)
MU = torch.tensor([0.4, 0.6], dtype=F64)
SIG = torch.tensor([[0.02, 0.005], [0.005, 0.01]], dtype=F64)
LOC = grid_locations(4, dtype=F64)
W = torch.softmax(torch.randn(16, generator=torch.Generator().manual_seed(0), dtype=F64), -1)
ATT = ContinuousAttention(BASIS, LOC, family="truncated_paraboloid")
ATT_G = ContinuousAttention(BASIS, LOC)
VALUES = torch.randn(16, 3, generator=torch.Generator().manual_seed(1), dtype=F64)


def density(mixing=None, means=None, covariances=None, family="gaussian"):
    """A valid two-component density with one field replaced."""
    mixing = torch.tensor([0.3, 0.7], dtype=F64) if mixing is None else mixing
    means = torch.stack([MU, 1 - MU]) if means is None else means
    covariances = torch.stack([SIG, SIG]) if covariances is None else covariances
    return ContinuousDensity(mixing, means, covariances, family)


def with_nan(x, index=0):
    x = x.clone()
    x.view(-1)[index] = NAN
    return x


def one_hot_scores(index, fill=-INF):
    s = torch.full((16,), fill, dtype=F64)
    s[index] = 0.0
    return s


# ------------------------------------------------------------------------------------------------
# Bad arguments: the error type, and a message that names the argument
# ------------------------------------------------------------------------------------------------

BAD = [
    # (call, error type, word the message must contain)
    # --- continuous_softmax / continuous_sparsemax
    (lambda: continuous_sparsemax(with_nan(MU), SIG, BASIS), ValueError, "mu"),
    (lambda: continuous_softmax(MU, with_nan(SIG), BASIS), ValueError, "Sigma"),
    (lambda: continuous_sparsemax(MU, SIG + torch.tensor([[0.0, INF], [INF, 0.0]], dtype=F64), BASIS), ValueError, "Sigma"),
    (lambda: continuous_sparsemax(MU, torch.tensor([[0.02, 0.01], [0.0, 0.02]], dtype=F64), BASIS), ValueError, "Sigma"),
    (lambda: continuous_sparsemax(MU, torch.diag(torch.tensor([0.02, 0.0], dtype=F64)), BASIS), ValueError, "Sigma"),
    (lambda: continuous_sparsemax(MU, torch.zeros(2, 2, dtype=F64), BASIS), ValueError, "Sigma"),
    (lambda: continuous_sparsemax(MU, -SIG, BASIS), ValueError, "Sigma"),
    (lambda: continuous_softmax(MU, torch.diag(torch.tensor([0.02, -0.01], dtype=F64)), BASIS), ValueError, "Sigma"),
    (lambda: continuous_softmax(torch.tensor([0, 1]), SIG, BASIS), TypeError, "mu"),
    (lambda: continuous_softmax(MU.float(), SIG, BASIS), TypeError, "Sigma"),
    (lambda: continuous_sparsemax(MU, SIG, "basis"), TypeError, "basis"),
    (lambda: continuous_softmax(MU, torch.eye(3, dtype=F64), BASIS), ValueError, "Sigma"),
    (lambda: continuous_softmax(MU.expand(3, 2), SIG.expand(2, 2, 2), BASIS), ValueError, "Sigma"),
    (lambda: continuous_sparsemax(torch.zeros(3, dtype=F64), torch.eye(3, dtype=F64), GaussianRBF.grid(2, 0.2, dim=3)),
     ValueError, "D"),
    (lambda: continuous_sparsemax(MU, SIG, BASIS, n_quadrature=0), ValueError, "n_quadrature"),
    (lambda: continuous_sparsemax(MU, SIG, BASIS, n_quadrature=2.5), TypeError, "n_quadrature"),
    (lambda: continuous_sparsemax(MU, SIG, BASIS, tol=NAN), ValueError, "tol"),
    (lambda: continuous_sparsemax(MU, SIG, BASIS, tol="1e-6"), TypeError, "tol"),
    (lambda: continuous_sparsemax(MU, SIG, BASIS, max_quadrature=4), ValueError, "max_quadrature"),
    (lambda: continuous_sparsemax(MU, SIG, BASIS, max_quadrature=True), TypeError, "max_quadrature"),
    # --- truncated_paraboloid_threshold (returned a silent value for a non-PD Sigma)
    (lambda: truncated_paraboloid_threshold(torch.diag(torch.tensor([1.0, -1.0], dtype=F64))), ValueError, "Sigma"),
    (lambda: truncated_paraboloid_threshold(torch.zeros(2, 2, dtype=F64)), ValueError, "Sigma"),
    (lambda: truncated_paraboloid_threshold(torch.ones(2, 3, dtype=F64)), ValueError, "Sigma"),
    (lambda: truncated_paraboloid_threshold(with_nan(SIG)), ValueError, "Sigma"),
    # --- moment_match
    (lambda: moment_match(W - 0.1, LOC), ValueError, "weights"),
    (lambda: moment_match(with_nan(W), LOC), ValueError, "weights"),
    (lambda: moment_match(torch.zeros(16, dtype=F64), LOC), ValueError, "weights"),
    (lambda: moment_match(torch.zeros(0, dtype=F64), torch.zeros(0, 2, dtype=F64)), ValueError, "L"),
    (lambda: moment_match(W, LOC, family=2), TypeError, "family"),
    (lambda: moment_match(W, LOC, family="laplace"), ValueError, "family"),
    (lambda: moment_match(torch.ones(16, dtype=torch.int64), LOC), TypeError, "weights"),
    (lambda: moment_match(W, LOC.float()), TypeError, "locations"),
    (lambda: moment_match(W, with_nan(LOC)), ValueError, "locations"),
    (lambda: moment_match(W[:15], LOC), ValueError, "locations"),
    # --- continuous_density
    (lambda: continuous_density(MU, MU, -SIG), ValueError, "Sigma"),
    (lambda: continuous_density(MU, MU, SIG, family="cauchy"), ValueError, "family"),
    (lambda: continuous_density(MU.float(), MU, SIG), TypeError, "mu"),
    (lambda: continuous_density(with_nan(MU), MU, SIG), ValueError, "t"),
    (lambda: continuous_density(MU, MU, torch.eye(3, dtype=F64)), ValueError, "Sigma"),
    # --- ridge_value_function
    (lambda: ridge_value_function(VALUES, LOC, "basis"), TypeError, "basis"),
    (lambda: ridge_value_function(VALUES, LOC, BASIS, penalty=NAN), ValueError, "penalty"),
    (lambda: ridge_value_function(VALUES, LOC, BASIS, penalty=True), TypeError, "penalty"),
    (lambda: ridge_value_function(with_nan(VALUES), LOC, BASIS), ValueError, "features"),
    (lambda: ridge_value_function(VALUES[:0], LOC[:0], BASIS), ValueError, "locations"),
    (lambda: ridge_value_function(VALUES[:2], LOC[:2], BASIS, penalty=0.0), ValueError, "penalty"),
    # --- GaussianRBF and the grids
    (lambda: GaussianRBF(LOC, 0.0), ValueError, "sigma"),
    (lambda: GaussianRBF(LOC, NAN), ValueError, "sigma"),
    (lambda: GaussianRBF(LOC, 0.1, covariance=torch.eye(2, dtype=F64)), ValueError, "covariance"),
    (lambda: GaussianRBF(LOC, covariance=torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=F64)), ValueError, "covariance"),
    (lambda: GaussianRBF(with_nan(LOC), 0.1), ValueError, "centers"),
    (lambda: GaussianRBF(torch.zeros(0, 2), 0.1), ValueError, "centers"),
    (lambda: GaussianRBF(torch.tensor([[1, 2]]), 0.1), TypeError, "centers"),
    (lambda: GaussianRBF.grid(3, "0.1"), TypeError, "sigmas"),
    (lambda: GaussianRBF.grid(3, []), ValueError, "sigmas"),
    (lambda: GaussianRBF.grid(3.0, 0.1), TypeError, "n_per_axis"),
    (lambda: GaussianRBF.grid(3, 0.1, dim=0), ValueError, "dim"),
    (lambda: GaussianRBF.grid(3, 0.1, low=1.0, high=0.0), ValueError, "high"),
    (lambda: GaussianRBF.grid(3, 0.1, dtype=torch.int64), TypeError, "dtype"),
    (lambda: grid_locations(0), ValueError, "n_per_axis"),
    (lambda: grid_locations(2.5), TypeError, "n_per_axis"),
    (lambda: grid_locations(3, low=NAN), ValueError, "low"),
    (lambda: grid_locations(3, dtype=torch.int32), TypeError, "dtype"),
    (lambda: padding_locations(1), ValueError, "n_per_axis"),
    (lambda: padding_locations(4, dim=True), TypeError, "dim"),
    # --- ContinuousAttention
    (lambda: ATT(with_nan(one_hot_scores(3, 0.0)), VALUES), ValueError, "scores"),  # said "weights contains NaN"
    (lambda: ATT(one_hot_scores(3, 0.0) + torch.eye(16, dtype=F64)[2] * INF, VALUES), ValueError, "scores"),
    (lambda: ATT(torch.full((16,), -INF, dtype=F64), VALUES), ValueError, "scores"),
    (lambda: ATT_G(torch.zeros(16, dtype=F64), with_nan(VALUES)), ValueError, "values"),
    (lambda: ATT(torch.zeros(15, dtype=F64), VALUES), ValueError, "scores"),
    (lambda: ATT(torch.zeros(16, dtype=torch.int64), VALUES), TypeError, "scores"),
    (lambda: ContinuousAttention(BASIS, LOC, family="sparse"), ValueError, "family"),
    (lambda: ContinuousAttention(BASIS, LOC, penalty=-1.0), ValueError, "penalty"),
    (lambda: ContinuousAttention(BASIS, LOC, tol=0.0), ValueError, "tol"),
    (lambda: ContinuousAttention("basis", LOC), TypeError, "basis"),
    (lambda: ContinuousAttention(BASIS, LOC, uniform_mix=1.5), ValueError, "uniform_mix"),
    (lambda: ATT.density(torch.zeros(15, dtype=F64)), ValueError, "scores"),
    # --- ridge_operator
    (lambda: ridge_operator(LOC, "basis"), TypeError, "basis"),
    (lambda: ridge_operator(LOC.long(), BASIS), TypeError, "locations"),
    (lambda: ridge_operator(with_nan(LOC), BASIS), ValueError, "locations"),
    (lambda: ridge_operator(LOC[:, :1], BASIS), ValueError, "locations"),
    (lambda: ridge_operator(LOC, BASIS, -0.1), ValueError, "penalty"),
    (lambda: ridge_operator(LOC, BASIS, "small"), TypeError, "penalty"),
    (lambda: ridge_operator(LOC, BASIS, padding=torch.zeros(3, 3, dtype=F64)), ValueError, "padding"),
    # --- ContinuousDensity
    (lambda: density(mixing=torch.tensor([0.3, -0.7], dtype=F64)).expected_basis(BASIS), ValueError, "mixing"),
    (lambda: density(mixing=torch.tensor([0.3, NAN], dtype=F64)).expected_basis(BASIS), ValueError, "mixing"),
    (lambda: density(mixing=torch.ones(3, dtype=F64)).expected_basis(BASIS), ValueError, "mixing"),
    (lambda: density(mixing=torch.ones(2)).expected_basis(BASIS), TypeError, "mixing"),
    (lambda: density(covariances=-torch.stack([SIG, SIG])).expected_basis(BASIS), ValueError, "covariances"),
    (lambda: density(covariances=torch.ones(2, 3, 3, dtype=F64)).expected_basis(BASIS), ValueError, "covariances"),
    (lambda: density(family="laplace").expected_basis(BASIS), ValueError, "family"),
    (lambda: density().expected_basis("basis"), TypeError, "basis"),
    (lambda: density().pdf(torch.zeros(4, 3, dtype=F64)), ValueError, "points"),
    (lambda: density().pdf(torch.zeros(4, 2)), TypeError, "points"),
    (lambda: density().pdf(torch.zeros(2, dtype=F64)), ValueError, "points"),
]


@pytest.mark.parametrize("k", range(len(BAD)))
def test_bad_argument_raises_a_clear_error(k):
    call, error, word = BAD[k]
    with pytest.raises(error, match=word):
        call()


# ------------------------------------------------------------------------------------------------
# Edge inputs: the documented result
# ------------------------------------------------------------------------------------------------


def test_empty_batches_give_empty_results():
    for fn in (continuous_softmax, continuous_sparsemax):
        r = fn(torch.zeros(0, 2, dtype=F64), torch.zeros(0, 2, 2, dtype=F64) + SIG, BASIS)
        assert r.shape == (0, 9) and r.dtype == F64
    mu, Sigma = moment_match(torch.zeros(0, 16, dtype=F64), LOC)
    assert mu.shape == (0, 2) and Sigma.shape == (0, 2, 2)
    for att in (ATT, ATT_G):
        assert att(torch.zeros(0, 16, dtype=F64), torch.zeros(0, 16, 3, dtype=F64)).shape == (0, 3)


def test_density_edges_empty_batch_zero_weight_and_one_hot_scores():
    d = density(torch.zeros(0, 2, dtype=F64), torch.zeros(0, 2, 2, dtype=F64), torch.zeros(0, 2, 2, 2, dtype=F64))
    assert d.expected_basis(BASIS).shape == (0, 9) and d.pdf(LOC).shape == (0, 16)
    # a component with mixing weight 0 contributes nothing, whatever its (placeholder) parameters
    one = density(torch.tensor([1.0, 0.0], dtype=F64), covariances=torch.stack([SIG, torch.zeros(2, 2, dtype=F64)]))
    alone = ContinuousDensity(torch.ones(1, dtype=F64), MU[None], SIG[None])
    assert torch.allclose(one.expected_basis(BASIS), alone.expected_basis(BASIS))
    assert torch.allclose(one.pdf(LOC), alone.pdf(LOC)) and int(one.n_components) == 1
    # one-hot scores: a point mass, E[psi] = psi(mu), for both families
    for att in (ATT, ATT_G):
        point = att.density(one_hot_scores(5))
        assert torch.allclose(point.expected_basis(BASIS), BASIS(LOC[5]), atol=1e-12)
    # ridge operator: empty locations are refused (documented); padding adds no row
    with pytest.raises(ValueError, match="locations"):
        ridge_operator(LOC[:0], BASIS, 0.1)
    assert ridge_operator(LOC, BASIS, 0.1, padding=padding_locations(4, dtype=F64)).shape == (16, 9)


def test_singular_covariances_are_the_limit_densities():
    """softmax: Sigma = 0 is the point mass; moment_match on one location: variance 0 and paraboloid scale 0
    (lambda = -inf: continuous_sparsemax refuses it, ContinuousAttention gives the point mass)."""
    torch.testing.assert_close(continuous_softmax(MU, torch.zeros(2, 2, dtype=F64), BASIS), BASIS(MU), rtol=1e-14, atol=0)
    mu, var = moment_match(torch.eye(16, dtype=F64)[5], LOC)
    assert torch.equal(var, torch.zeros(2, 2, dtype=F64)) and torch.equal(mu, LOC[5])
    _, scale = moment_match(torch.eye(16, dtype=F64)[5], LOC, "truncated_paraboloid")
    assert torch.equal(scale, torch.zeros(2, 2, dtype=F64))
    B = ridge_value_function(VALUES, LOC, BASIS)
    for att in (ATT, ATT_G):
        torch.testing.assert_close(att(one_hot_scores(5), VALUES), B @ BASIS(LOC[5]), rtol=1e-12, atol=1e-12)


def test_one_location_and_a_single_point_basis():
    one = GaussianRBF(torch.tensor([[0.5, 0.5]], dtype=F64), 0.2)
    att = ContinuousAttention(one, LOC[:1], family="truncated_paraboloid")
    assert att(torch.zeros(1, dtype=F64), VALUES[:1]).shape == (3,)
    assert grid_locations(1).shape == (1, 2)
    # two points per axis: half a side is half a step, which rounds to no margin (documented)
    assert padding_locations(2, dtype=F64).shape == (0, 2)


def test_masked_scores_are_allowed():
    s = torch.zeros(16, dtype=F64)
    s[[0, 7, 9]] = -INF
    for att in (ATT, ATT_G):
        c = att(s, VALUES)
        assert torch.isfinite(c).all()


# ------------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------------


def random_spd(seed, log_scale, log_ratio, dtype):
    g = torch.Generator().manual_seed(seed)
    angle = torch.rand((), generator=g, dtype=F64) * math.pi
    R = torch.stack([torch.stack([angle.cos(), -angle.sin()]), torch.stack([angle.sin(), angle.cos()])])
    S = 10.0**log_scale * R @ torch.diag(torch.tensor([1.0, 10.0**log_ratio], dtype=F64)) @ R.T
    return 0.5 * (S + S.T).to(dtype)


@SETTINGS
@given(seed=st.integers(0, 2**20), log_scale=st.floats(-30, 4), log_ratio=st.floats(-6, 0),
       far=st.booleans(), double=st.booleans())
def test_sparsemax_finite_in_range_and_dtype_for_any_scale(seed, log_scale, log_ratio, far, double):
    dtype = F64 if double else torch.float32
    if dtype == torch.float32:
        log_scale, log_ratio = max(log_scale, -18.0), max(log_ratio, -3.0)  # SPD after rounding to float32
    Sigma = random_spd(seed, log_scale, log_ratio, dtype)
    mu = torch.tensor([3.0, -2.0] if far else [0.45, 0.6], dtype=dtype)
    basis = GaussianRBF(BASIS.centers.to(dtype), covariance=BASIS.covariance.to(dtype))
    m, S = mu.clone().requires_grad_(), Sigma.clone().requires_grad_()
    r = continuous_sparsemax(m, S, basis)
    assert r.dtype == dtype and torch.isfinite(r).all()
    peak = basis(basis.centers).diagonal()
    eps = torch.finfo(dtype).eps
    assert (r >= -eps * peak).all() and (r <= peak * (1 + 1e3 * eps)).all()
    r.sum().backward()
    assert torch.isfinite(m.grad).all() and torch.isfinite(S.grad).all()
    s = continuous_softmax(mu, Sigma, basis)
    assert s.dtype == dtype and torch.isfinite(s).all() and (s <= peak * (1 + 1e3 * eps)).all()


@SETTINGS
@given(seed=st.integers(0, 2**20), log_scales=st.lists(st.floats(-25, 2), min_size=2, max_size=4))
def test_sparsemax_batching_is_looping(seed, log_scales):
    Sigma = torch.stack([random_spd(seed + k, ls, -1.0, F64) for k, ls in enumerate(log_scales)])
    mu = 0.2 + 0.6 * torch.rand(len(log_scales), 2, generator=torch.Generator().manual_seed(seed), dtype=F64)
    batched = continuous_sparsemax(mu, Sigma, BASIS)
    looped = torch.stack([continuous_sparsemax(mu[k], Sigma[k], BASIS) for k in range(len(log_scales))])
    scale = looped.abs().amax(-1, keepdim=True)
    assert ((batched - looped).abs() <= 1e-9 * scale).all()
    one_d = continuous_sparsemax(mu[:, :1], Sigma[:, :1, :1], BASIS1)
    torch.testing.assert_close(one_d, torch.stack([continuous_sparsemax(mu[k, :1], Sigma[k, :1, :1], BASIS1)
                                                   for k in range(len(log_scales))]), rtol=1e-12, atol=0)


@SETTINGS
@given(seed=st.integers(0, 2**20), log_temperature=st.floats(-4, 4), family=st.sampled_from(["gaussian", "truncated_paraboloid"]),
       double=st.booleans())
def test_continuous_attention_finite_for_any_score_scale(seed, log_temperature, family, double):
    """From near-uniform to one-hot (scores scaled by up to 1e4): finite context, finite gradients."""
    dtype = F64 if double else torch.float32
    basis = GaussianRBF(BASIS.centers.to(dtype), covariance=BASIS.covariance.to(dtype))
    att = ContinuousAttention(basis, LOC.to(dtype), family=family)
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(2, 16, generator=g, dtype=F64) * 10.0**log_temperature).to(dtype).requires_grad_()
    v = torch.randn(2, 16, 3, generator=g, dtype=F64).to(dtype).requires_grad_()
    c = att(s, v)
    assert c.dtype == dtype and torch.isfinite(c).all()
    assert c.abs().max() <= 10 * v.abs().max()  # an average of values through a fitted value function
    c.square().sum().backward()
    assert torch.isfinite(s.grad).all() and torch.isfinite(v.grad).all()
