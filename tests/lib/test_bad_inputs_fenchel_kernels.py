"""Bad and edge inputs of attnopt.fenchel, attnopt.kernels, attnopt.regularity and attnopt.geometry.

Written from the contract (the docstrings and CONTRIBUTING): a bad argument raises TypeError (types,
dtypes) or ValueError (values, shapes, devices) whose message names the user's argument; an edge
input gives its documented result (empty in, empty out; no template, key or head: a clear error);
finite input gives a finite output in the input's dtype, also for magnitudes near the dtype's range
where the answer is representable; the forward maps make no host read when reads are not allowed.
"""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnopt import fenchel as F
from attnopt import geometry as G
from attnopt import kernels as K
from attnopt import regularity as R
from host_reads import host_reads

F64 = torch.float64
INF = float("inf")
NAN = float("nan")
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)

pytestmark = pytest.mark.usefixtures("one_thread")


def rand(*shape, seed=0, dtype=F64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def simplex(*shape, seed=0, dtype=F64):
    return torch.softmax(rand(*shape, seed=seed, dtype=dtype), -1)


T = rand(5, 3, seed=1)
Z = rand(3, seed=2)
U = simplex(5, seed=3)
M = torch.cdist(T, T)
Q, KEYS, V = rand(4, 3, seed=4), rand(6, 3, seed=5), rand(6, 2, seed=6)
P = simplex(3, 4, seed=7)
REWARD = rand(3, 4, seed=8)
PTS = rand(6, 2, seed=9)


# ------------------------------------------------------------------------------------------------
# Bad arguments: the error type, and a message that names the argument
# ------------------------------------------------------------------------------------------------

BAD = [
    # (call, error type, word the message must contain)
    # --- fenchel
    (lambda: F.generalized_attention(Z, T, alpha=0.0), ValueError, "alpha"),
    (lambda: F.generalized_attention(Z, T, alpha=True), TypeError, "alpha"),
    (lambda: F.generalized_attention(Z, T, alpha="1"), TypeError, "alpha"),
    (lambda: F.generalized_attention(Z, T, alpha=NAN), ValueError, "alpha"),
    (lambda: F.generalized_attention(Z.long(), T), TypeError, "z"),
    (lambda: F.generalized_attention(Z.float(), T), TypeError, "z"),
    (lambda: F.generalized_attention(Z, T.to(torch.int32)), TypeError, "templates"),
    (lambda: F.generalized_attention(Z, T, U.float()), TypeError, "u"),
    (lambda: F.generalized_attention(Z, T, U.to("meta")), ValueError, "u"),
    (lambda: F.generalized_attention(Z[:2], T), ValueError, "z"),
    (lambda: F.generalized_attention(Z, T * INF), ValueError, "templates"),
    (lambda: F.generalized_attention(Z * NAN, T), ValueError, "z"),
    (lambda: F.generalized_attention(Z, T, -U), ValueError, "u"),
    (lambda: F.generalized_attention(Z, T, 2 * U), ValueError, "u"),
    (lambda: F.generalized_attention(Z, T, U[:4]), ValueError, "u"),
    (lambda: F.generalized_attention(rand(3, 3), rand(2, 5, 3)), ValueError, "templates"),
    (lambda: F.generalized_attention(Z, torch.zeros(0, 3, dtype=F64)), ValueError, "templates"),
    # scores beyond float64: named, with the way out
    (lambda: F.generalized_attention(torch.full((3,), 1e200, dtype=F64), torch.full((5, 3), 1e200, dtype=F64)),
     ValueError, "templates"),
    (lambda: F.dual_objective(torch.full((3,), 1e200, dtype=F64), Z, torch.full((5, 3), 1e200, dtype=F64)),
     ValueError, "lam"),
    (lambda: F.solve_dual(Z, T, tol=0.0), ValueError, "tol"),
    (lambda: F.solve_dual(Z, T, max_iter=0), ValueError, "max_iter"),
    (lambda: F.solve_dual(Z, T, max_iter=5.0), TypeError, "max_iter"),
    (lambda: F.solve_dual(Z, T, method="newton"), ValueError, "method"),
    (lambda: F.solve_dual(Z, T, method=None), TypeError, "method"),
    (lambda: F.solve_dual(torch.full((3,), 1e200, dtype=F64), torch.full((5, 3), 1e200, dtype=F64)), ValueError, "b"),
    (lambda: F.gaussian_estimate(Z, Z + 1, 0.5, cov=-torch.eye(3, dtype=F64)), ValueError, "cov"),
    (lambda: F.gaussian_dual_maximizer(Z, Z + 1, 0.5, cov=-torch.eye(3, dtype=F64)), ValueError, "cov"),
    (lambda: F.gaussian_estimate(Z, Z + 1, 0.5, cov=torch.triu(torch.ones(3, 3, dtype=F64))), ValueError, "cov"),
    (lambda: F.gaussian_estimate(Z, Z + 1, 0.5, cov=torch.eye(2, dtype=F64)), ValueError, "cov"),
    (lambda: F.gaussian_estimate(Z, Z.float(), 0.5), TypeError, "b"),
    (lambda: F.gaussian_estimate(Z, Z, -0.5), ValueError, "alpha"),
    (lambda: F.t5_preference(torch.zeros(2, 3), torch.ones(2, 3)), TypeError, "mask"),
    (lambda: F.t5_preference(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool)), ValueError, "mask"),
    (lambda: F.t5_preference(torch.zeros(2, 3), torch.tensor([True, False, True]).to("meta")), ValueError, "mask"),
    (lambda: F.t5_preference(torch.full((2, 3), -INF)), ValueError, "masked"),
    (lambda: F.t5_preference(torch.zeros(2, 0)), ValueError, "position_bias"),
    (lambda: F.t5_preference(torch.tensor([0.0, INF])), ValueError, "position_bias"),
    (lambda: F.relative_deviation(Z, Z.float()), TypeError, "approx"),
    (lambda: F.relative_deviation(Z, rand(4)), ValueError, "approx"),
    (lambda: F.true_preference(U, M, 0.0), ValueError, "gamma"),
    (lambda: F.true_preference(U, M - INF, 1.0), ValueError, "cost"),
    (lambda: F.true_preference(U, M * NAN, 1.0), ValueError, "cost"),
    (lambda: F.true_preference(U, torch.full((5, 5), INF, dtype=F64), 1.0), ValueError, "cost"),
    (lambda: F.true_preference(U, M.float(), 1.0), TypeError, "cost"),
    (lambda: F.true_preference(torch.zeros(0, dtype=F64), M[:0, :0], 1.0), ValueError, "u"),
    (lambda: F.ot_attention(Z, T, U), ValueError, "cost"),
    (lambda: F.ot_attention(Z, T, U, M[:3, :3]), ValueError, "cost"),
    (lambda: F.ot_attention(Z, T, U, M, 1.0, -1.0), ValueError, "gamma"),
    (lambda: F.ot_attention(Z, T, U.expand(3, 5), M.expand(2, 5, 5)), ValueError, "cost"),  # batches 3 and 2
    (lambda: F.solve_ot_dual(Z, T, U, M, method="gram"), ValueError, "KL dual"),
    # --- kernels
    (lambda: K.EmpiricalMeasure(PTS, torch.ones(6, dtype=torch.long)), TypeError, "weights"),
    (lambda: K.EmpiricalMeasure(PTS, torch.full((6,), 1 / 6, dtype=F64).to("meta")), ValueError, "weights"),
    (lambda: K.EmpiricalMeasure(torch.zeros(3, 0, dtype=F64)), ValueError, "points"),
    (lambda: K.EmpiricalMeasure(PTS).integrate(torch.ones(6, 2)), TypeError, "values"),
    (lambda: K.EmpiricalMeasure(PTS).integrate(torch.full((6, 2), NAN, dtype=F64)), ValueError, "values"),
    (lambda: K.boltzmann_gibbs(K.EmpiricalMeasure(PTS), torch.tensor([1.0, INF, 1, 1, 1, 1], dtype=F64)),
     ValueError, "potential"),
    (lambda: K.boltzmann_gibbs(K.EmpiricalMeasure(PTS), torch.ones(6)), TypeError, "potential"),
    (lambda: K.boltzmann_gibbs(K.EmpiricalMeasure(PTS), torch.zeros(6, dtype=F64)), ValueError, "nu(g) = 0"),
    (lambda: K.boltzmann_gibbs(K.EmpiricalMeasure(PTS), log_potential=torch.full((6,), NAN, dtype=F64)),
     ValueError, "log_potential"),
    (lambda: K.boltzmann_gibbs(K.EmpiricalMeasure(rand(2, 6, 2)), torch.ones(3, 6, dtype=F64)), ValueError, "potential"),
    (lambda: K.softmatch_kernel(Q, torch.zeros(0, 3, dtype=F64)), ValueError, "mu"),
    (lambda: K.softmatch_kernel(Q.float(), KEYS), TypeError, "queries"),
    (lambda: K.softmatch_kernel(Q, KEYS, scale=True), TypeError, "scale"),
    (lambda: K.softmatch_kernel(Q, KEYS, scale=-1.0), ValueError, "scale"),
    (lambda: K.softmatch_kernel(Q, KEYS, similarity=3), TypeError, "similarity"),
    (lambda: K.softmatch_kernel(Q, KEYS, similarity=lambda q, k: torch.full((4, 6), NAN, dtype=F64)),
     ValueError, "similarity"),
    (lambda: K.softmatch_kernel(Q, KEYS, similarity=lambda q, k: torch.full((4, 6), -INF, dtype=F64)),
     ValueError, "similarity"),
    (lambda: K.softmatch_kernel(Q, KEYS, similarity=lambda q, k: torch.zeros(4, 5, dtype=F64)), ValueError, "similarity"),
    # a layer of the flow checks a callable's rows through the engine (kernels._softmatch.attend)
    (lambda: K.self_attention_flow(KEYS, 2, similarity=lambda q, k: torch.full((6, 6), -INF, dtype=F64)),
     ValueError, "similarity"),
    (lambda: K.softmatch_kernel(torch.full((2, 3), 1e20), torch.full((4, 3), 1e20)), ValueError, "queries"),
    (lambda: K.attention_kernel(Q, torch.zeros(0, 3, dtype=F64), V[:0]), ValueError, "keys"),
    (lambda: K.attention_kernel(Q, KEYS, V.float()), TypeError, "values"),
    (lambda: K.attention_kernel(Q, KEYS, V * NAN), ValueError, "values"),
    (lambda: K.attention_kernel(Q, KEYS, V[:5]), ValueError, "values"),
    (lambda: K.attention_kernel(Q, KEYS, key_weights=-simplex(6)), ValueError, "key_weights"),
    (lambda: K.gaussian_potential_attention(Q, KEYS, scale=0.0), ValueError, "scale"),
    (lambda: K.lookup_kernel(K.EmpiricalMeasure(KEYS), V[:4]), ValueError, "table"),
    (lambda: K.multihead_attention_kernel(Q, KEYS, KEYS, *(rand(0, 3, 2),) * 3, rand(0, 2, 5)), ValueError, "w_q"),
    (lambda: K.multihead_attention_kernel(Q, KEYS, KEYS, rand(2, 3, 4).float(), rand(2, 3, 4), rand(2, 3, 2),
                                          rand(2, 2, 5)), TypeError, "w_q"),
    (lambda: K.self_attention_flow(KEYS, 2.0), TypeError, "depth"),
    (lambda: K.self_attention_flow(KEYS, -1), ValueError, "depth"),
    (lambda: K.self_attention_flow(KEYS, 2, residual="yes"), TypeError, "residual"),
    (lambda: K.self_attention_flow(KEYS, 2, w_q=torch.eye(3)), TypeError, "w_q"),
    (lambda: K.self_attention_flow(KEYS, 2, normalize="batch"), ValueError, "normalize"),
    (lambda: K.maximum_entropy_tilt(K.EmpiricalMeasure(PTS), PTS, torch.zeros(2)), TypeError, "target"),
    (lambda: K.maximum_entropy_tilt(K.EmpiricalMeasure(PTS), PTS, torch.zeros(2, dtype=F64), max_iter=2.5),
     TypeError, "max_iter"),
    (lambda: K.maximum_entropy_tilt(K.EmpiricalMeasure(PTS), PTS, torch.zeros(2, dtype=F64), tol=-1.0), ValueError, "tol"),
    (lambda: R.wasserstein1(PTS, PTS.float()), TypeError, "nu"),
    (lambda: R.wasserstein1(PTS, PTS, method=1), TypeError, "method"),
    (lambda: R.wasserstein1(PTS, PTS, return_plan=1), TypeError, "return_plan"),
    (lambda: R.wasserstein1(rand(2, 6, 2), rand(3, 6, 2)), ValueError, "nu"),
    (lambda: R.contraction_bound(lip_first=1.0, lip_second=1.0, epsilon=0.5, diameter=1.0, dim=2.0, sup=1.0),
     TypeError, "dim"),
    (lambda: R.contraction_bound(lip_first=NAN, lip_second=1.0, epsilon=0.5, diameter=1.0, dim=2, sup=1.0),
     ValueError, "lip_first"),
    (lambda: R.contraction_bound(lip_first=1.0, lip_second=1.0, epsilon=0.5, diameter=1.0, dim=2, sup=1.0,
                                 as_printed="no"), TypeError, "as_printed"),
    (lambda: R.contraction_bound(lip_first=1e300, lip_second=1.0, epsilon=1e-300, diameter=1e10, dim=2, sup=1.0),
     ValueError, "contraction_bound"),
    (lambda: R.dot_product_potential_constants(radius=100.0, dim=4), ValueError, "radius"),
    (lambda: R.gaussian_potential_constants(radius=100.0, dim=4), ValueError, "radius"),
    (lambda: R.gaussian_potential_bound(dim=2, n=True), TypeError, "n"),
    (lambda: R.lipschitz_bound(lip_first=1.0, epsilon=0.0, diameter=1.0, dim=2), ValueError, "epsilon"),
    (lambda: R.lipschitz_ratio(3, Q, Q), TypeError, "fn"),
    (lambda: R.lipschitz_ratio(lambda q: q * NAN, Q, Q + 1), ValueError, "fn(q1)"),
    (lambda: R.contraction_ratio(PTS, PTS.float()), TypeError, "y"),
    # --- geometry
    (lambda: G.advantage_gradient(P, REWARD.float()), TypeError, "reward"),
    (lambda: G.advantage_gradient(P, REWARD[:, :3]), ValueError, "reward"),
    (lambda: G.advantage_gradient(P, REWARD, tau=True), TypeError, "tau"),
    (lambda: G.advantage_gradient(P, REWARD, dim=1.0), TypeError, "dim"),
    (lambda: G.advantage_gradient(P, REWARD * INF), ValueError, "reward"),
    (lambda: G.advantage_gradient(P.float(), REWARD.float(), tau=1e-50), ValueError, "tau"),
    (lambda: G.natural_gradient(P * NAN, REWARD), ValueError, "p"),
    (lambda: G.fisher_information(torch.ones(3, 4, dtype=torch.long)), TypeError, "p"),
    (lambda: G.fisher_information(2 * P), ValueError, "p"),
    (lambda: G.log_sum_exp_potential(torch.tensor([0.0, INF])), ValueError, "scores"),
    (lambda: G.log_sum_exp_potential(REWARD, tau=0.0), ValueError, "tau"),
    (lambda: G.reinforce_estimate(P, REWARD, n_samples=2.0), TypeError, "n_samples"),
    (lambda: G.reinforce_estimate(P, REWARD, baseline="yes"), TypeError, "baseline"),
    (lambda: G.reinforce_estimate(P, REWARD, generator=0), TypeError, "generator"),
    (lambda: G.reinforce_estimate(torch.zeros(3, 0, dtype=F64), torch.zeros(3, 0, dtype=F64)), ValueError, "p"),
]


@pytest.mark.parametrize("call,error,word", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_argument_raises_a_clear_error(call, error, word):
    with pytest.raises(error, match=re.escape(word)):
        call()


# ------------------------------------------------------------------------------------------------
# Edge inputs: the documented result
# ------------------------------------------------------------------------------------------------


def test_no_query_or_no_batch_gives_empty_results():
    h, w = F.generalized_attention(torch.zeros(2, 0, 3, dtype=F64), T.expand(2, 5, 3))
    assert h.shape == (2, 0, 3) and w.shape == (2, 0, 5)
    assert F.solve_dual(torch.zeros(1, 0, 3, dtype=F64), T.unsqueeze(0)).shape == (1, 0, 3)
    assert F.exact_estimate(torch.zeros(0, 3, dtype=F64), T.expand(0, 5, 3)).shape == (0, 3)
    assert F.solve_ot_dual(torch.zeros(1, 0, 3, dtype=F64), T.unsqueeze(0), U, M).shape == (1, 0, 3)
    assert F.gaussian_estimate(torch.zeros(0, 3, dtype=F64), torch.zeros(0, 3, dtype=F64), 0.5).shape == (0, 3)
    assert F.t5_preference(torch.zeros(0, 4)).shape == (0, 4)
    assert K.softmatch_kernel(torch.zeros(0, 3, dtype=F64), KEYS).shape == (0, 6)
    out, ker = K.attention_kernel(torch.zeros(0, 3, dtype=F64), KEYS, V)
    assert out.shape == (0, 2) and ker.shape == (0, 6)
    assert R.wasserstein1(torch.zeros(0, 4, 2, dtype=F64), torch.zeros(0, 5, 2, dtype=F64)).shape == (0,)
    value, plan = R.wasserstein1(torch.zeros(0, 4, 2, dtype=F64), torch.zeros(0, 5, 2, dtype=F64), return_plan=True)
    assert value.shape == (0,) and plan.shape == (0, 4, 5)
    flow = K.self_attention_flow(torch.zeros(2, 0, 3, dtype=F64), 3)  # no particle: nothing moves
    assert flow.shape == (4, 2, 0, 3)
    assert G.advantage_gradient(torch.zeros(3, 0, dtype=F64), torch.zeros(3, 0, dtype=F64)).shape == (3, 0)
    assert G.fisher_information(torch.zeros(0, 4, dtype=F64)).shape == (0, 4, 4)
    assert G.reinforce_estimate(torch.zeros(0, 4, dtype=F64), torch.ones(4, dtype=F64), n_samples=3,
                                reduce=False).shape == (3, 0, 4)


def test_potential_of_an_empty_or_fully_masked_row_is_minus_inf_with_zero_gradient():
    s = torch.tensor([[0.5, -INF, 2.0], [-INF, -INF, -INF]], dtype=F64, requires_grad=True)
    phi = G.log_sum_exp_potential(s, tau=0.3)
    assert phi[1] == -INF and math.isclose(phi[0].item(), 0.3 * math.log(math.exp(0.5 / 0.3) + math.exp(2.0 / 0.3)))
    (grad,) = torch.autograd.grad(torch.where(torch.isfinite(phi), phi, 0).sum(), s)
    assert torch.isfinite(grad).all() and (grad[1] == 0).all() and grad[0, 1] == 0
    torch.testing.assert_close(grad[0], torch.softmax(s[0].detach() / 0.3, -1))
    empty = G.log_sum_exp_potential(torch.zeros(3, 0, dtype=F64))
    assert empty.shape == (3,) and (empty == -INF).all()


def test_meta_tensors_give_shapes_without_values():
    meta = dict(device="meta", dtype=F64)
    h, w = F.generalized_attention(torch.empty(2, 4, 3, **meta), torch.empty(2, 5, 3, **meta))
    assert h.shape == (2, 4, 3) and w.shape == (2, 4, 5) and h.device.type == "meta"
    assert F.solve_dual(torch.empty(3, **meta), torch.empty(5, 3, **meta)).shape == (3,)
    assert F.ot_attention(torch.empty(3, **meta), torch.empty(5, 3, **meta), None, torch.empty(5, 5, **meta))[1].shape == (5,)
    assert F.t5_preference(torch.empty(2, 3, **meta)).shape == (2, 3)
    nu = K.EmpiricalMeasure(torch.empty(6, 2, **meta))
    assert K.boltzmann_gibbs(nu, torch.empty(6, **meta)).weights.shape == (6,)
    tilt, lam = K.maximum_entropy_tilt(nu, torch.empty(6, 2, **meta), torch.empty(2, **meta))
    assert tilt.weights.shape == (6,) and lam.shape == (2,)
    assert R.wasserstein1(torch.empty(3, 4, 2, **meta), torch.empty(3, 5, 2, **meta)).shape == (3,)
    assert G.log_sum_exp_potential(torch.empty(3, 4, **meta)).shape == (3,)


def test_zero_covariance_gives_the_prior_mean_and_psd_covariance_is_accepted():
    mu, b = rand(2, 3, seed=20), rand(2, 3, seed=21)
    torch.testing.assert_close(F.gaussian_estimate(mu, b, 0.7, cov=torch.zeros(3, 3, dtype=F64)), mu)
    x = rand(3, 1, seed=22)
    cov = x @ x.T  # rank one: positive semi-definite, singular
    lam = F.gaussian_dual_maximizer(mu, b, 0.7, cov=cov)
    torch.testing.assert_close(lam, 0.7 * torch.linalg.solve(torch.eye(3, dtype=F64) + 0.7 * cov, (b - mu).T).T)


def test_contraction_ratio_of_equal_measures_is_nan_as_documented():
    assert torch.isnan(R.contraction_ratio(PTS, PTS))


# ------------------------------------------------------------------------------------------------
# No host read in the forward maps (checks in "async" mode, as on a GPU)
# ------------------------------------------------------------------------------------------------

_Tb, _zb = rand(2, 5, 3, seed=30), rand(2, 4, 3, seed=31)
_ub = simplex(2, 1, 5, seed=32)
_ub = _ub * (torch.arange(5) > 0)  # a masked template
_ub = _ub / _ub.sum(-1, keepdim=True)
_Mb = torch.cdist(_Tb, _Tb)
_w = simplex(2, 6, seed=33)
FORWARD = {
    "generalized_attention": lambda: F.generalized_attention(_zb, _Tb, _ub, 0.7),
    "generalized_attention_large_alpha": lambda: F.generalized_attention(_zb, _Tb, None, 3.0),
    "ot_attention": lambda: F.ot_attention(_zb, _Tb, _ub, _Mb, 0.5, 0.3),
    "dual_objective": lambda: F.dual_objective(_zb, _zb, _Tb, _ub, 0.7),
    "gaussian_estimate": lambda: F.gaussian_estimate(_zb, _zb + 1, 0.5, cov=torch.eye(3, dtype=F64)),
    "t5_preference": lambda: F.t5_preference(rand(4, 5), torch.ones(4, 5, dtype=torch.bool).tril()),
    "true_preference": lambda: F.true_preference(_ub, _Mb.unsqueeze(1), 0.5),
    "relative_deviation": lambda: F.relative_deviation(_zb, _zb + 1),
    "softmatch_kernel": lambda: K.softmatch_kernel(_zb, _Tb),
    "softmatch_kernel_weighted_gaussian": lambda: K.softmatch_kernel(
        _zb, K.EmpiricalMeasure(rand(2, 6, 3), _w), similarity="gaussian"),
    "attention_kernel": lambda: K.attention_kernel(_zb, rand(2, 6, 3), rand(2, 6, 2), key_weights=_w),
    "gaussian_potential_attention": lambda: K.gaussian_potential_attention(_zb, rand(2, 6, 3), rand(2, 6, 2)),
    "multihead_attention_kernel": lambda: K.multihead_attention_kernel(
        _zb, rand(2, 6, 3), rand(2, 6, 3), rand(2, 3, 4), rand(2, 3, 4), rand(2, 3, 2), rand(2, 2, 5)),
    "boltzmann_gibbs": lambda: K.boltzmann_gibbs(K.EmpiricalMeasure(rand(2, 6, 3), _w), torch.rand(2, 6, dtype=F64)),
    "boltzmann_gibbs_log": lambda: K.boltzmann_gibbs(K.EmpiricalMeasure(rand(6, 3)), log_potential=rand(2, 6)),
    "lookup_and_moment": lambda: K.moment_projection(K.lookup_kernel(K.EmpiricalMeasure(rand(6, 3)), rand(6, 2))),
    "self_attention_flow": lambda: K.self_attention_flow(rand(2, 6, 3), 2, residual=True),
    "advantage_gradient": lambda: G.advantage_gradient(P, REWARD, 0.5),
    "natural_gradient": lambda: G.natural_gradient(P, REWARD, 0.5),
    "fisher_information": lambda: G.fisher_information(P),
    "log_sum_exp_potential": lambda: G.log_sum_exp_potential(REWARD, 0.5),
}


@pytest.mark.parametrize("name", list(FORWARD))
def test_forward_maps_make_no_host_read(name):
    assert host_reads(FORWARD[name]) == []


# ------------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------------


@st.composite
def huge_attention_problem(draw):
    """z ~ 10^a, templates ~ 10^(308-a), alpha ~ 10^-308 (still a normal float64): products z_k t_k
    overflow, yet the scores alpha <z, t_i> are of order one."""
    a = draw(st.integers(100, 200))
    seed = draw(st.integers(0, 2**16))
    z = rand(2, 3, seed=seed) * 10.0**a
    t = rand(4, 3, seed=seed + 1) * 10.0 ** (308 - a)
    return z, t, 1e-308 * draw(st.floats(2.5, 10.0))


@SETTINGS
@given(huge_attention_problem())
def test_generalized_attention_is_finite_and_exact_where_only_intermediates_overflow(problem):
    z, t, alpha = problem
    assume(not torch.isfinite(z @ t.T).all())  # the naive product overflows
    h, w = F.generalized_attention(z, t, alpha=alpha)
    # reference: each term (alpha z_k) t_k in Python floats, summed exactly
    scores = np.array([[math.fsum(alpha * zk * tk for zk, tk in zip(zi.tolist(), ti.tolist())) for ti in t] for zi in z])
    ref = np.exp(scores - scores.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    assert torch.isfinite(h).all() and w.dtype == F64
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-10, atol=1e-14)


@SETTINGS
@given(st.integers(0, 2**16), st.integers(-320, -1), st.floats(0.0, 1e3), st.sampled_from([torch.float32, F64]))
def test_ot_maps_are_finite_for_small_gamma_and_shift_invariant_in_the_cost(seed, exponent, shift, dtype):
    """gamma from 0.1 down to 1e-320 (below float32's range): (s_i - M_ij) / gamma overflows unless shifted first."""
    gamma = 10.0**exponent
    t, z = rand(5, 3, seed=seed, dtype=dtype), rand(3, seed=seed + 1, dtype=dtype)
    u = simplex(5, seed=seed + 2, dtype=dtype)
    cost = torch.cdist(t, t)
    h, w = F.ot_attention(z, t, u, cost, 0.5, gamma)
    assert torch.isfinite(h).all() and torch.isfinite(w).all() and w.dtype == dtype
    torch.testing.assert_close(w.sum(), torch.ones((), dtype=dtype))
    ut = F.true_preference(u, cost, gamma)
    assert torch.isfinite(ut).all() and ut.dtype == dtype
    if dtype == F64 and gamma >= 1e-6:  # adding a constant to every cost changes no plan (columns are normalised)
        _, w2 = F.ot_attention(z, t, u, cost + shift, 0.5, gamma)
        torch.testing.assert_close(w2, w, atol=1e-6, rtol=0)
        torch.testing.assert_close(F.true_preference(u, cost + shift, gamma), ut, atol=1e-6, rtol=0)


@SETTINGS
@given(st.integers(0, 2**16), st.sampled_from([(torch.float32, 1e5), (F64, 1e12)]), st.integers(-320, 0))
def test_log_sum_exp_potential_is_shift_equivariant_and_finite_for_small_tau(seed, dtype_shift, exponent):
    """tau from 1 down to 1e-320 (below float32's range), scores shifted by up to 1e5 (float32) or 1e12."""
    dtype, largest = dtype_shift
    tau = 10.0**exponent
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-32, 32, (3, 6), generator=g).to(dtype) / 4  # quarters: s + c is exact
    c = float(torch.randint(0, int(largest), (), generator=g))
    phi, phi_c = G.log_sum_exp_potential(s, tau), G.log_sum_exp_potential(s + c, tau)
    assert torch.isfinite(phi_c).all() and phi_c.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(phi_c - c, phi, atol=8 * eps * (c + 10), rtol=0)
    # the limit tau -> 0 of tau log sum e^{s/tau} is the row maximum: within tau log n of it
    top = s.amax(-1)
    assert ((phi - top) >= -8 * eps * 10).all() and ((phi - top) <= tau * math.log(6) + 8 * eps * 10).all()


@SETTINGS
@given(st.integers(0, 2**16), st.sampled_from([torch.float32, F64]), st.floats(0.35, 0.8))
def test_policy_gradients_are_finite_for_rewards_near_the_largest_float(seed, dtype, tau):
    """Rewards of both signs up to 0.6 x the largest float: u_j - E_p[u] exceeds the range, while
    p_j (u_j - E_p[u]) / tau (<= 0.3 max / tau) and tau (u_j - E_p[u]) (<= 1.2 max tau) do not."""
    big = 0.6 * torch.finfo(dtype).max
    p = simplex(3, 5, seed=seed, dtype=dtype)
    r = rand(3, 5, seed=seed + 1, dtype=dtype).clamp(-1, 1)
    r[:, 0], r[:, 1] = 1.0, -1.0
    r = r * big
    for fn in (G.advantage_gradient, G.natural_gradient):
        out = fn(p, r, tau)
        assert torch.isfinite(out).all() and out.dtype == dtype
        p64 = p.double() / p.double().sum(-1, keepdim=True)
        ref = fn(p64, r.double() / big, tau) * big  # the same quantity, computed at unit scale
        eps = torch.finfo(dtype).eps  # the inputs' own rounding: p to eps, the mean of r to eps * big
        torch.testing.assert_close(out.double(), ref, rtol=64 * eps, atol=64 * eps * big * max(tau, 1 / tau))
    # adding a constant to the reward changes neither gradient (the baseline absorbs it)
    shifted = rand(3, 5, seed=seed + 2, dtype=F64)
    torch.testing.assert_close(G.advantage_gradient(p64, shifted + 1e7, tau), G.advantage_gradient(p64, shifted, tau),
                               atol=1e-8, rtol=0)


@SETTINGS
@given(st.integers(0, 2**16), st.sampled_from([(torch.float32, 1e2, 1e-3), (F64, 1e7, 1e-6)]))
def test_gaussian_potential_attention_is_translation_invariant(seed, case):
    dtype, offset, tol = case
    q, k, v = rand(2, 4, 3, seed=seed, dtype=dtype), rand(2, 6, 3, seed=seed + 1, dtype=dtype), rand(2, 6, 2, seed=seed + 2, dtype=dtype)
    shift = offset * rand(3, seed=seed + 3, dtype=dtype)
    out, ker = K.gaussian_potential_attention(q, k, v)
    out_s, ker_s = K.gaussian_potential_attention(q + shift, k + shift, v)
    assert torch.isfinite(out_s).all() and out_s.dtype == dtype
    torch.testing.assert_close(ker_s, ker, atol=tol, rtol=0)


@SETTINGS
@given(st.integers(0, 2**16), st.integers(19, 37))
def test_softmatch_kernel_is_finite_where_only_the_unscaled_product_overflows(seed, exponent):
    """float32 queries and keys ~ 10^e, e >= 19: <q, k> overflows, and the scale 10^-2e that brings the
    scores to order one is below float32's range, yet the kernel is representable."""
    q = rand(3, 16, seed=seed, dtype=torch.float32).clamp(-1, 1) * 10.0**exponent
    k = rand(5, 16, seed=seed + 1, dtype=torch.float32).clamp(-1, 1) * 10.0**exponent
    scale = 10.0 ** (-2 * exponent)  # scores of order one
    ker = K.softmatch_kernel(q, k, scale=scale)
    ref = torch.softmax((q.double() * scale) @ k.double().T, -1)
    assert ker.dtype == torch.float32 and torch.isfinite(ker).all()
    torch.testing.assert_close(ker.double(), ref, atol=1e-5, rtol=0)


@SETTINGS
@given(st.integers(0, 2**16), st.integers(1, 3), st.sampled_from([torch.float32, F64]))
def test_batching_equals_looping(seed, batch, dtype):
    t, z = rand(batch, 5, 3, seed=seed, dtype=dtype), rand(batch, 2, 3, seed=seed + 1, dtype=dtype)
    u = simplex(batch, 1, 5, seed=seed + 2, dtype=dtype)
    cost = torch.cdist(t, t)
    k, v = rand(batch, 6, 3, seed=seed + 3, dtype=dtype), rand(batch, 6, 2, seed=seed + 4, dtype=dtype)
    p, r = simplex(batch, 4, seed=seed + 5, dtype=dtype), rand(batch, 4, seed=seed + 6, dtype=dtype)
    batched = [
        F.generalized_attention(z, t, u, 0.6)[1],
        F.ot_attention(z, t, u, cost, 0.6, 0.2)[1],
        K.attention_kernel(z, k, v, similarity="gaussian")[0],
        G.advantage_gradient(p, r, 0.7),
        G.log_sum_exp_potential(r, 0.2),
    ]
    for i in range(batch):
        looped = [
            F.generalized_attention(z[i], t[i], u[i], 0.6)[1],
            F.ot_attention(z[i], t[i], u[i], cost[i], 0.6, 0.2)[1],
            K.attention_kernel(z[i], k[i], v[i], similarity="gaussian")[0],
            G.advantage_gradient(p[i], r[i], 0.7),
            G.log_sum_exp_potential(r[i], 0.2),
        ]
        for b, l in zip(batched, looped):
            assert b.dtype == dtype
            torch.testing.assert_close(b[i], l)


@SETTINGS
@given(st.integers(0, 2**16))
def test_gradients_are_finite_through_masked_entries(seed):
    t = rand(5, 3, seed=seed).requires_grad_()
    z = rand(2, 3, seed=seed + 1).requires_grad_()
    u = torch.tensor([0.0, 0.3, 0.0, 0.5, 0.2], dtype=F64, requires_grad=True)  # two masked templates
    cost = torch.cdist(t.detach(), t.detach()).requires_grad_()
    h, w = F.generalized_attention(z, t, u, 0.8)
    h2, _ = F.ot_attention(z, t, u, cost, 0.8, 0.5)
    keys_w = torch.tensor([0.0, 0.25, 0.25, 0.0, 0.5], dtype=F64, requires_grad=True)  # two masked keys
    out, _ = K.attention_kernel(z, t, key_weights=keys_w)
    g = torch.tensor([0.0, 1.0, 2.0, 0.0, 1.0], dtype=F64, requires_grad=True)  # a vanishing potential
    tilted = K.boltzmann_gibbs(K.EmpiricalMeasure(t), g)
    bias = torch.tensor([[0.3, -INF, 1.0, -INF, 0.0]], dtype=F64, requires_grad=True)
    pref = F.t5_preference(bias, torch.tensor([True, True, True, False, True]))
    phi = G.log_sum_exp_potential(torch.cat([bias, torch.full((1, 5), -INF, dtype=F64)]), 0.5)
    loss = (h.sum() + h2.sum() + out.sum() + (tilted.weights * torch.arange(5)).sum() + (pref * torch.arange(5)).sum()
            + phi[0])
    grads = torch.autograd.grad(loss, (t, z, u, cost, keys_w, g, bias))
    for grad in grads:
        assert torch.isfinite(grad).all()
    assert (w[:, [0, 2]] == 0).all()
