"""attnopt.geometry against autograd (gradients, Hessians), pseudo-inverses and Monte Carlo."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnopt import geometry as G


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 9), seed=st.integers(0, 10_000), tau=st.sampled_from([0.3, 1.0, 4.0]))
def test_advantage_gradient_is_autograd_gradient_of_expected_reward(n, seed, tau):
    s = rand(3, n, seed=seed, scale=2.0).requires_grad_()
    u = rand(3, n, seed=seed + 1)
    p = torch.softmax(s / tau, dim=-1)
    (grad,) = torch.autograd.grad((p * u).sum(), s)
    assert torch.allclose(G.advantage_gradient(p.detach(), u, tau), grad, atol=1e-13)


def test_advantage_gradient_other_dim_and_broadcast_reward():
    s = rand(5, 2, seed=1).requires_grad_()
    u = rand(5, 1, seed=2)  # the same reward for both columns
    p = torch.softmax(s, dim=0)
    (grad,) = torch.autograd.grad((p * u).sum(), s)
    assert torch.allclose(G.advantage_gradient(p.detach(), u, dim=0), grad, atol=1e-13)


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_lse_potential_gradient_and_hessian(tau):
    s = rand(6, seed=3, scale=2.0).requires_grad_()
    phi = G.log_sum_exp_potential(s, tau)
    (grad,) = torch.autograd.grad(phi, s)
    p = torch.softmax(s.detach() / tau, -1)
    assert torch.allclose(grad, p, atol=1e-14)
    hess = torch.autograd.functional.hessian(lambda z: G.log_sum_exp_potential(z, tau), s.detach())
    assert torch.allclose(hess, G.fisher_information(p) / tau, atol=1e-13)


def test_lse_potential_is_the_value_of_the_forward_problem():
    s, tau = rand(4, 7, seed=4), 0.8
    p = torch.softmax(s / tau, -1)
    value = (p * s).sum(-1) - tau * (p * p.log()).sum(-1)  # max_p <s,p> + tau H(p), attained at p
    assert torch.allclose(G.log_sum_exp_potential(s, tau), value, atol=1e-12)
    assert torch.allclose(G.log_sum_exp_potential(s.t(), tau, dim=0), value, atol=1e-12)


def test_fisher_is_batched_covariance_of_the_score_function():
    p = torch.softmax(rand(2, 3, 5, seed=5), -1)
    F = G.fisher_information(p)
    assert F.shape == (2, 3, 5, 5)
    eye = torch.eye(5, dtype=p.dtype)
    diffs = eye - p.unsqueeze(-2)  # row j is e_j - p
    expected = torch.einsum("...j,...jk,...jl->...kl", p, diffs, diffs)
    assert torch.allclose(F, expected, atol=1e-14)
    assert torch.allclose(F.sum(-1), torch.zeros(2, 3, 5, dtype=p.dtype), atol=1e-15)  # 1 in the kernel
    assert torch.allclose(G.fisher_information(p.transpose(-1, -2), dim=-2), F, atol=0)


def test_fisher_equals_softmax_jacobian_times_tau():
    s, tau = rand(5, seed=6), 0.7
    jac = torch.autograd.functional.jacobian(lambda z: torch.softmax(z / tau, -1), s)
    assert torch.allclose(jac * tau, G.fisher_information(torch.softmax(s / tau, -1)), atol=1e-14)


def test_natural_gradient_is_fisher_pseudo_inverse_applied_to_gradient():
    s, tau = rand(3, 6, seed=7), 1.7
    u = rand(3, 6, seed=8)
    p = torch.softmax(s / tau, -1)
    metric = G.fisher_information(p) / tau**2
    euclid = G.advantage_gradient(p, u, tau)
    nat = torch.linalg.pinv(metric, hermitian=True) @ euclid.unsqueeze(-1)
    ours = G.natural_gradient(p, u, tau)
    # Equal up to a multiple of the all-ones vector (which does not move p).
    diff = ours - nat.squeeze(-1)
    assert torch.allclose(diff - diff.mean(-1, keepdim=True), torch.zeros_like(diff), atol=1e-10)
    assert torch.allclose((metric @ ours.unsqueeze(-1)).squeeze(-1), euclid, atol=1e-12)


@pytest.mark.parametrize("baseline", [True, False])
def test_reinforce_is_unbiased_and_baseline_reduces_variance(baseline):
    p = torch.softmax(rand(2, 5, seed=9), -1)
    u = rand(2, 5, seed=10) + 3.0  # an offset that the baseline removes
    gen = torch.Generator().manual_seed(0)
    samples = G.reinforce_estimate(p, u, 0.5, n_samples=40_000, baseline=baseline, generator=gen, reduce=False)
    assert samples.shape == (40_000, 2, 5)
    exact = G.advantage_gradient(p, u, 0.5)
    se = samples.std(0) / 40_000**0.5
    assert ((samples.mean(0) - exact).abs() <= 5 * se + 1e-12).all()
    if baseline:
        gen = torch.Generator().manual_seed(1)
        plain = G.reinforce_estimate(p, u, 0.5, n_samples=40_000, baseline=False, generator=gen, reduce=False)
        assert (samples.var(0).sum() < plain.var(0).sum())


def test_reinforce_reduce_shape():
    p = torch.softmax(rand(3, 4, seed=11), -1)
    est = G.reinforce_estimate(p, rand(4, seed=12), n_samples=8, generator=torch.Generator().manual_seed(0))
    assert est.shape == (3, 4) and torch.allclose(est.sum(-1), torch.zeros(3, dtype=p.dtype), atol=1e-12)


def test_low_precision_potential():
    s = rand(4, 8, seed=13).to(torch.bfloat16)
    s[0, :3] = float("-inf")
    out = G.log_sum_exp_potential(s, 0.5)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    assert G.log_sum_exp_potential(torch.full((3,), float("-inf")), 1.0) == float("-inf")


@pytest.mark.parametrize("dtype,tau", [(torch.float64, 1e-310), (torch.float32, 1e-60), (torch.float32, 1e-3)])
def test_lse_potential_at_small_tau_is_the_maximum(dtype, tau):
    """tau log sum e^{s/tau} -> max s (within tau log n): s / tau would overflow, and tau itself may
    round to 0 in the dtype, without the shift by the maximum before the division."""
    s = (rand(3, 6, seed=20, scale=10.0) + 1e3).to(dtype)
    phi = G.log_sum_exp_potential(s, tau)
    top = s.amax(-1)
    assert phi.dtype == dtype
    assert ((phi - top) >= 0).all() and ((phi - top) <= tau * 1.8 + 4 * torch.finfo(dtype).eps * top.abs()).all()


def test_policy_gradients_for_rewards_near_the_largest_float():
    """u_j - E_p[u] overflows for rewards of both signs near the largest float; the gradients are
    linear in u, so they equal big times those of u / big."""
    big = 0.6 * torch.finfo(torch.float64).max
    p = torch.softmax(rand(2, 5, seed=21), -1)
    u = torch.tensor([1.0, -1.0, 0.3, -0.2, 0.9], dtype=torch.float64)
    for fn, tau in ((G.advantage_gradient, 0.4), (G.natural_gradient, 0.7)):
        torch.testing.assert_close(fn(p, u * big, tau) / big, fn(p, u, tau), rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="tau"):
        G.natural_gradient(p, u * big, 4.0)  # 4 (u_j - E_p[u]) is beyond the largest float


def test_bad_input_errors():
    p = torch.softmax(rand(3, 4), -1)
    with pytest.raises(ValueError, match="tau"):
        G.advantage_gradient(p, torch.zeros(4, dtype=p.dtype), tau=0.0)
    with pytest.raises(ValueError, match="tau"):
        G.log_sum_exp_potential(rand(4), tau=-1.0)
    with pytest.raises(ValueError, match="p"):
        G.fisher_information(torch.ones(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="p"):
        G.advantage_gradient(-p, torch.zeros(4, dtype=p.dtype))
    with pytest.raises(ValueError, match="dim"):
        G.fisher_information(p, dim=2)
    with pytest.raises(ValueError, match="reward"):
        G.advantage_gradient(p, torch.zeros(5, dtype=p.dtype))
    with pytest.raises(ValueError, match="n_samples"):
        G.reinforce_estimate(p, torch.zeros(4, dtype=p.dtype), n_samples=0)
    with pytest.raises(TypeError, match="scores"):
        G.log_sum_exp_potential(torch.ones(3, dtype=torch.int64))
