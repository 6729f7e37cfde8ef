"""Tests for attnopt.kernels: the Markov-kernel model of attention, exact W1, and the paper's bounds.

Every check compares against an independent computation: PyTorch's SDPA / MultiheadAttention,
explicit formulas, SciPy (linear_sum_assignment, linprog, SLSQP, wasserstein_distance), POT's
network simplex, finite differences, or measured ratios that the bounds must dominate.
"""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment, minimize
from scipy.stats import wasserstein_distance

import attnopt
from attnopt.kernels import (
    EmpiricalMeasure,
    attention_kernel,
    boltzmann_gibbs,
    contraction_bound,
    contraction_ratio,
    dot_product_potential_constants,
    gaussian_potential_attention,
    gaussian_potential_bound,
    gaussian_potential_constants,
    lipschitz_bound,
    lipschitz_ratio,
    lookup_kernel,
    maximum_entropy_tilt,
    moment_projection,
    multihead_attention_kernel,
    neighbourhood_bound,
    self_attention_flow,
    softmatch_kernel,
    wasserstein1,
)

F64 = torch.float64
HSET = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _simplex(shape, gen, zeros=False):
    w = torch.rand(*shape, generator=gen, dtype=F64) + 0.05
    if zeros:
        w[..., 0] = 0.0
    return w / w.sum(-1, keepdim=True)


def _ot_l1(a, x, b, y):
    """W1 with l1 ground cost from POT's network simplex (reference)."""
    cost = ot.dist(x.numpy(), y.numpy(), metric="cityblock")
    return ot.emd2(a.numpy(), b.numpy(), cost, numItermax=10**7)


# ------------------------------------------------------------------------------------------
# Prop. 9 / Appendix A: the kernel composition is matrix attention
# ------------------------------------------------------------------------------------------


def test_attention_kernel_reproduces_matrix_attention_f64():
    g = _gen(0)
    q = torch.randn(2, 3, 5, 8, generator=g, dtype=F64)
    k = torch.randn(2, 3, 7, 8, generator=g, dtype=F64)
    v = torch.randn(2, 3, 7, 4, generator=g, dtype=F64)
    out, kernel = attention_kernel(q, k, v)
    ref, ref_w = attnopt.scaled_dot_product_attention(q, k, v)
    torch_ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 5, 4) and kernel.shape == (2, 3, 5, 7)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, torch_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(kernel, ref_w, atol=1e-12, rtol=0)
    # A non-uniform key measure is an additive log-weight bias, and a zero weight is a mask.
    w = _simplex((2, 3, 7), g, zeros=True)
    out_w, _ = attention_kernel(q, k, v, key_weights=w)
    ref_w_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=torch.log(w).unsqueeze(-2))
    torch.testing.assert_close(out_w, ref_w_out, atol=1e-12, rtol=0)


def test_attention_kernel_float32_and_self_attention_default():
    g = _gen(1)
    x = torch.randn(4, 6, 3, generator=g)
    out, _ = attention_kernel(x, x)  # values default to the keys: self-attention, l = id
    ref = torch.nn.functional.scaled_dot_product_attention(x, x, x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


def test_components_match_explicit_formulas():
    g = _gen(2)
    pts = torch.randn(3, 6, 2, generator=g, dtype=F64)
    w = _simplex((3, 6), g)
    nu = EmpiricalMeasure(pts, w)
    pot = torch.rand(3, 6, generator=g, dtype=F64) + 0.1
    # Def. 3: w_i g_i / sum_j w_j g_j, in three equivalent input forms.
    expected = w * pot / (w * pot).sum(-1, keepdim=True)
    torch.testing.assert_close(boltzmann_gibbs(nu, pot).weights, expected, atol=1e-14, rtol=0)
    torch.testing.assert_close(boltzmann_gibbs(nu, log_potential=pot.log()).weights, expected, atol=1e-14, rtol=0)
    fn = lambda p: p.pow(2).sum(-1) + 1.0  # noqa: E731
    gp = pts.pow(2).sum(-1) + 1.0
    torch.testing.assert_close(boltzmann_gibbs(nu, fn).weights, w * gp / (w * gp).sum(-1, keepdim=True), atol=1e-14, rtol=0)
    # Def. 4 and the left action m(Q) Psi_G(m(K)) of Sec. 3.1, written as a double sum.
    q = torch.randn(3, 4, 2, generator=g, dtype=F64)
    kernel = softmatch_kernel(q, nu, similarity="dot", scale=0.7)
    gmat = torch.exp(0.7 * torch.einsum("bmd,bnd->bmn", q, pts))
    direct = gmat * w.unsqueeze(1) / (gmat * w.unsqueeze(1)).sum(-1, keepdim=True)
    torch.testing.assert_close(kernel, direct, atol=1e-14, rtol=0)
    torch.testing.assert_close(kernel.sum(-1), torch.ones(3, 4, dtype=F64), atol=1e-14, rtol=0)
    left = (torch.full((3, 1, 4), 0.25, dtype=F64) @ kernel).squeeze(-2)  # u @ P with u = m(Q)
    manual = sum(direct[:, t] for t in range(4)) / 4
    torch.testing.assert_close(left, manual, atol=1e-14, rtol=0)
    # Def. 5 with a lookup function, and Defs. 6-7 with a feature map F(x) = [x, x^2].
    pushed = lookup_kernel(nu, lambda p: 2.0 * p + 1.0)
    torch.testing.assert_close(pushed.points, 2.0 * pts + 1.0)
    torch.testing.assert_close(moment_projection(pushed), (w.unsqueeze(-1) * (2 * pts + 1)).sum(-2), atol=1e-14, rtol=0)
    feats = moment_projection(nu, lambda p: torch.cat([p, p**2], -1))
    torch.testing.assert_close(feats, (w.unsqueeze(-1) * torch.cat([pts, pts**2], -1)).sum(-2), atol=1e-14, rtol=0)
    assert EmpiricalMeasure.dirac(torch.zeros(3, 2)).points.shape == (3, 1, 2)


def test_gaussian_potential_attention_matches_direct_distances():
    g = _gen(3)
    q = torch.randn(2, 5, 3, generator=g, dtype=F64)
    k = torch.randn(2, 9, 3, generator=g, dtype=F64) * 2
    v = torch.randn(2, 9, 4, generator=g, dtype=F64)
    out, kernel = gaussian_potential_attention(q, k, v, scale=0.8)
    d2 = ((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1)
    p = torch.exp(-0.8 * d2)
    p = p / p.sum(-1, keepdim=True)
    torch.testing.assert_close(kernel, p, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, p @ v, atol=1e-12, rtol=0)


def test_multihead_mixture_kernel_matches_torch_mha():
    g = _gen(4)
    e, h, m, n = 12, 3, 5, 7
    torch.manual_seed(4)
    mha = torch.nn.MultiheadAttention(e, h, bias=False, batch_first=True, dtype=F64)
    q = torch.randn(2, m, e, generator=g, dtype=F64)
    kv = torch.randn(2, n, e, generator=g, dtype=F64)
    ref, _ = mha(q, kv, kv, need_weights=False)
    wq_full, wk_full, wv_full = mha.in_proj_weight.detach().chunk(3, dim=0)
    dh = e // h
    split = lambda w: w.T.reshape(e, h, dh).permute(1, 0, 2)  # noqa: E731  (H, e, dh), x -> x W
    w_o = mha.out_proj.weight.detach().T.reshape(h, dh, e)
    out = multihead_attention_kernel(q, kv, kv, split(wq_full), split(wk_full), split(wv_full), w_o)
    torch.testing.assert_close(out, ref.detach(), atol=1e-12, rtol=0)


def test_gradcheck_attention_kernel():
    g = _gen(5)
    q = torch.randn(2, 3, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(4, 3, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(4, 2, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: attention_kernel(a, b, c)[0], (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: gaussian_potential_attention(a, b, c)[0], (q, k, v))


# ------------------------------------------------------------------------------------------
# Self-attention flow (Sec. 3.1 particles, Sec. 6.2)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("residual,normalize", [(False, None), (True, "layer"), (True, "sphere")])
def test_self_attention_flow_matches_layer_loop(shared, residual, normalize):
    g = _gen(6)
    depth, d = 3, 4
    x0 = torch.randn(2, 5, d, generator=g, dtype=F64)
    shape = (d, 3) if shared else (depth, d, 3)
    wq = torch.randn(*shape, generator=g, dtype=F64) * 0.5
    wk = torch.randn(*shape, generator=g, dtype=F64) * 0.5
    wv = torch.randn(*((d, d) if shared else (depth, d, d)), generator=g, dtype=F64) * 0.5
    traj = self_attention_flow(x0, depth, w_q=wq, w_k=wk, w_v=wv, residual=residual, step_size=0.7, normalize=normalize)
    assert traj.shape == (depth + 1, 2, 5, d)
    x = x0
    torch.testing.assert_close(traj[0], x0)
    for layer in range(depth):
        pick = (lambda w: w) if shared else (lambda w: w[layer])
        att, _ = attnopt.scaled_dot_product_attention(x @ pick(wq), x @ pick(wk), x @ pick(wv))
        x = x + 0.7 * att if residual else 0.7 * att
        if normalize == "layer":
            x = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
        elif normalize == "sphere":
            x = x / x.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(traj[layer + 1], x, atol=1e-12, rtol=0)


def test_self_attention_flow_weights_and_gaussian():
    g = _gen(7)
    x0 = torch.randn(6, 2, generator=g, dtype=F64)
    w = _simplex((6,), g)
    traj = self_attention_flow(x0, 2, weights=w, similarity="gaussian")
    x = x0
    for _ in range(2):
        p = torch.exp(-torch.cdist(x, x) ** 2) * w
        x = (p / p.sum(-1, keepdim=True)) @ x
    torch.testing.assert_close(traj[-1], x, atol=1e-12, rtol=0)
    # Gaussian-potential self-attention averages, so the particle cloud's l1 diameter shrinks.
    diam = lambda z: torch.cdist(z, z, p=1).max()  # noqa: E731
    assert diam(traj[2]) <= diam(traj[1]) <= diam(traj[0])


# ------------------------------------------------------------------------------------------
# Exact W1 with l1 ground cost
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["auto", "emd", "linprog", "ssp"])
def test_wasserstein1_uniform_equal_size_is_an_assignment(method):
    g = _gen(8)
    x = torch.randn(3, 9, 3, generator=g, dtype=F64)
    y = torch.randn(3, 9, 3, generator=g, dtype=F64) + 0.5
    got = wasserstein1(x, y, method=method)
    for b in range(3):
        cost = torch.cdist(x[b], y[b], p=1).numpy()
        r, c = linear_sum_assignment(cost)
        assert abs(got[b].item() - cost[r, c].mean()) < 1e-10


@pytest.mark.parametrize("method,reference", [("emd", "linprog"), ("linprog", "pot"), ("ssp", "pot")])
def test_wasserstein1_general_weights_against_other_solver(method, reference):
    g = _gen(9)
    x = torch.randn(4, 7, 2, generator=g, dtype=F64)
    y = torch.randn(4, 11, 2, generator=g, dtype=F64) * 1.5
    a = _simplex((4, 7), g, zeros=True)
    b = _simplex((4, 11), g)
    got, plan = wasserstein1(EmpiricalMeasure(x, a), EmpiricalMeasure(y, b), method=method, return_plan=True)
    if reference == "pot":
        ref = torch.tensor([_ot_l1(a[i], x[i], b[i], y[i]) for i in range(4)], dtype=F64)
    else:
        ref = wasserstein1(EmpiricalMeasure(x, a), EmpiricalMeasure(y, b), method="linprog")
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(plan.sum(-1), a, atol=1e-12, rtol=0)
    torch.testing.assert_close(plan.sum(-2), b, atol=1e-12, rtol=0)
    assert (plan >= 0).all()


def test_wasserstein1_one_dimensional_closed_form():
    g = _gen(10)
    x = torch.randn(5, 8, 1, generator=g, dtype=F64)
    y = torch.randn(5, 13, 1, generator=g, dtype=F64)
    a, b = _simplex((5, 8), g), _simplex((5, 13), g)
    got = wasserstein1(EmpiricalMeasure(x, a), EmpiricalMeasure(y, b))
    for i in range(5):
        ref = wasserstein_distance(x[i, :, 0].numpy(), y[i, :, 0].numpy(), a[i].numpy(), b[i].numpy())
        assert abs(got[i].item() - ref) < 1e-12
        assert abs(got[i].item() - _ot_l1(a[i], x[i], b[i], y[i])) < 1e-10
    # Gradients of the closed form, in points and weights.
    xs = x[0].clone().requires_grad_()
    aw = a[0].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda p, w: wasserstein1(EmpiricalMeasure(p, w / w.sum()), EmpiricalMeasure(y[0], b[0])), (xs, aw))


def test_wasserstein1_lp_gradients_match_finite_differences():
    g = _gen(11)
    x = torch.randn(6, 3, generator=g, dtype=F64)
    y = torch.randn(5, 3, generator=g, dtype=F64)
    a, b = _simplex((6,), g), _simplex((5,), g)
    xr = x.clone().requires_grad_()
    ar = a.clone().requires_grad_()
    val = wasserstein1(EmpiricalMeasure(xr, ar), EmpiricalMeasure(y, b), method="emd")
    gx, ga = torch.autograd.grad(val, (xr, ar))
    h = 1e-6
    direction_x = torch.randn(6, 3, generator=g, dtype=F64)
    direction_a = torch.randn(6, generator=g, dtype=F64)
    direction_a -= direction_a.mean()  # stay on the simplex
    ref = lambda xx, aa: _ot_l1(aa, xx, b, y)  # noqa: E731
    fd_x = (ref(x + h * direction_x, a) - ref(x - h * direction_x, a)) / (2 * h)
    fd_a = (ref(x, a + h * direction_a) - ref(x, a - h * direction_a)) / (2 * h)
    assert abs((gx * direction_x).sum().item() - fd_x) < 1e-6
    assert abs((ga * direction_a).sum().item() - fd_a) < 1e-6


def test_wasserstein1_metric_sanity_and_broadcast():
    g = _gen(12)
    x = torch.randn(4, 3, generator=g, dtype=F64)
    assert wasserstein1(x, x).item() < 1e-14
    # W1(delta_p, delta_q) = |p - q|_1, and a batch of nus against one mu broadcasts.
    p, qs = torch.randn(1, 3, generator=g, dtype=F64), torch.randn(5, 1, 3, generator=g, dtype=F64)
    torch.testing.assert_close(wasserstein1(p, qs), (qs[:, 0] - p).abs().sum(-1), atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------
# Thm. 14: maximum entropy
# ------------------------------------------------------------------------------------------


def test_maximum_entropy_is_boltzmann_gibbs():
    g = _gen(13)
    n, l = 7, 2
    nu = EmpiricalMeasure(torch.randn(n, 2, generator=g, dtype=F64), _simplex((n,), g))
    stats = torch.randn(n, l, generator=g, dtype=F64)
    lam_true = torch.randn(l, generator=g, dtype=F64)
    psi = boltzmann_gibbs(nu, log_potential=stats @ lam_true)  # G = exp<lambda, k>
    target = (psi.weights.unsqueeze(-1) * stats).sum(0)
    w_nu = nu.weights.numpy()

    def neg_entropy(mvec):  # KL(m || nu), to be minimised
        mvec = np.clip(mvec, 1e-300, None)
        return float(np.sum(mvec * np.log(mvec / w_nu)))

    cons = [
        {"type": "eq", "fun": lambda mvec: mvec.sum() - 1.0},
        {"type": "eq", "fun": lambda mvec: stats.numpy().T @ mvec - target.numpy()},
    ]
    res = minimize(neg_entropy, w_nu, method="SLSQP", bounds=[(0.0, 1.0)] * n, constraints=cons, options={"ftol": 1e-14, "maxiter": 500})
    assert res.success
    np.testing.assert_allclose(res.x, psi.weights.numpy(), atol=2e-5)
    mu_star, lam = maximum_entropy_tilt(nu, stats, target)
    torch.testing.assert_close(mu_star.weights, psi.weights, atol=1e-9, rtol=0)
    torch.testing.assert_close(lam, lam_true, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="did not reach"):
        maximum_entropy_tilt(nu, stats, stats.max(0).values + 1.0)  # outside the convex hull


def test_maximum_entropy_tilt_reaches_rounding_level_on_many_atoms():
    # 64 atoms, 32 queries whose targets are attention outputs (inside the hull): the dual's decrease
    # near the solution falls below the rounding of its value, where an exact Armijo test used to
    # reject every Newton step (residual stuck near 1e-9). The tilt must reach 1e-13 and equal the
    # attention weights, whose exponential tilt it is (lambda = q / sqrt(d)).
    g = _gen(17)
    n, d, nq = 64, 2, 32
    y = torch.randn(n, d, generator=g, dtype=F64)
    nu = EmpiricalMeasure(y, _simplex((n,), g))
    queries = 1.5 * torch.randn(nq, d, generator=g, dtype=F64)
    weights = softmatch_kernel(queries, nu)
    mu_star, lam = maximum_entropy_tilt(nu, y.expand(nq, n, d), weights @ y, tol=1e-13)
    torch.testing.assert_close(mu_star.weights, weights, atol=1e-13, rtol=0)
    torch.testing.assert_close(lam, queries / math.sqrt(d), atol=1e-9, rtol=0)


# ------------------------------------------------------------------------------------------
# Bounds never below measured ratios (Thm. 23, Cor. 24, Prop. 25, Thm. 29)
# ------------------------------------------------------------------------------------------


def _box(gen, shape, r):
    return (2 * torch.rand(*shape, generator=gen, dtype=F64) - 1) * r


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 7), m=st.integers(2, 7), d=st.integers(1, 3),
       r=st.floats(0.2, 1.5), c=st.floats(0.1, 1.0), gaussian=st.booleans())
def test_contraction_bound_dominates_measured_ratio(seed, n, m, d, r, c, gaussian):
    g = _gen(seed)
    x, y = _box(g, (n, d), r), _box(g, (m, d), r)
    if gaussian:
        consts = gaussian_potential_constants(radius=r, dim=d)
        sim, scale = "gaussian", 1.0
    else:
        consts = dot_product_potential_constants(radius=r, dim=d)
        sim, scale = "dot", None
    ratio = contraction_ratio(x, y, values=lambda p: c * p, similarity=sim, scale=scale)
    bound = contraction_bound(**consts, dim=d, lookup_lip=c)
    assert ratio.item() <= bound
    # The sharper tau(Pi) = 1 valid for the l1 ground cost is also never violated.
    assert ratio.item() <= contraction_bound(**consts, dim=d, lookup_lip=c, projection_constant=1.0)


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 8), d=st.integers(1, 4), r=st.floats(0.2, 1.5))
def test_lipschitz_bound_dominates_query_ratios(seed, n, d, r):
    g = _gen(seed)
    keys, vals = _box(g, (n, d), r), _box(g, (n, d), r)
    lookup_lip = (torch.cdist(vals, vals, p=1) / torch.cdist(keys, keys, p=1).fill_diagonal_(float("inf"))).max().item()
    q1, q2 = _box(g, (256, d), r), _box(g, (256, d), r)
    q2 = torch.where(torch.rand(256, 1, generator=g, dtype=F64) < 0.5, q1 + 1e-3 * (q2 - q1), q2)  # near pairs too
    ratios = lipschitz_ratio(lambda q: attention_kernel(q, keys, vals)[0], q1, q2)
    consts = dot_product_potential_constants(radius=r, dim=d)
    bound = lipschitz_bound(lip_first=consts["lip_first"], epsilon=consts["epsilon"], diameter=consts["diameter"], dim=d, lookup_lip=lookup_lip)
    assert ratios.max().item() <= bound


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(3, 8), d=st.integers(1, 3), r=st.floats(0.2, 1.5))
def test_neighbourhood_bound_dominates(seed, n, d, r):
    g = _gen(seed)
    pts = _box(g, (n, d), r)
    xt = pts[:1]
    keep1 = torch.rand(n, generator=g) < 0.6
    keep2 = torch.rand(n, generator=g) < 0.6
    keep1[0] = keep2[0] = True  # both neighbourhoods contain t
    if torch.equal(keep1, keep2):
        keep2[-1] = ~keep2[-1]
    x1, x2 = pts[keep1], pts[keep2]
    diff = (attention_kernel(xt, x1)[0] - attention_kernel(xt, x2)[0]).abs().sum().item()
    w1 = wasserstein1(x1, x2).item()
    consts = dot_product_potential_constants(radius=r, dim=d)
    bound = neighbourhood_bound(lip_second=consts["lip_second"], epsilon=consts["epsilon"], sup=consts["sup"], diameter=consts["diameter"], dim=d)
    assert diff <= bound * w1 + 1e-12


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 8), m=st.integers(2, 8), d=st.integers(1, 3), spread=st.floats(0.1, 4.0))
def test_gaussian_potential_bound_dominates_on_unbounded_space(seed, n, m, d, spread):
    g = _gen(seed)
    x = torch.randn(n, d, generator=g, dtype=F64) * spread
    y = x[: min(n, m)] + 0.3 * torch.randn(min(n, m), d, generator=g, dtype=F64) if m <= n else torch.randn(m, d, generator=g, dtype=F64) * spread
    ratio = contraction_ratio(x, y, similarity="gaussian", scale=1.0).item()
    assert ratio <= gaussian_potential_bound(dim=d, n=n, m=y.shape[0])


def test_printed_theorem_23_fails_for_a_nearly_constant_potential():
    # Counterexample to Thm. 23 / Prop. 25 as printed: on a tiny box G = exp(<x, y>/sqrt(d)) is
    # almost constant, so attention is almost the mean, and translating the tokens translates the
    # output by the same amount (ratio ~ 1), while the printed constant is O(r^2).
    r, d = 0.05, 1
    x = torch.tensor([[-r], [-r / 2]], dtype=F64)
    y = x + r / 2
    ratio = contraction_ratio(x, y).item()
    consts = dot_product_potential_constants(radius=r, dim=d)
    printed = contraction_bound(**consts, dim=d, as_printed=True)
    assert ratio > 0.9 > 10 * printed
    assert ratio <= contraction_bound(**consts, dim=d)
    xt = x[:1]
    diff = (attention_kernel(xt, x)[0] - attention_kernel(xt, torch.cat([xt, y[1:]]))[0]).abs().sum().item()
    w1 = wasserstein1(x, torch.cat([xt, y[1:]])).item()
    nb = dict(lip_second=consts["lip_second"], epsilon=consts["epsilon"], diameter=consts["diameter"], dim=d)
    assert diff > neighbourhood_bound(**nb, as_printed=True) * w1
    assert diff <= neighbourhood_bound(**nb, sup=consts["sup"]) * w1


def test_gaussian_potential_bound_on_a_sensitive_configuration():
    # A regular simplex with squared edge ln(N-1): each query splits its mass evenly between
    # itself and the rest, where the softmatch weights are most sensitive to a dilation.
    n = 6
    base = torch.eye(n, dtype=F64) - 1.0 / n
    base = base / torch.cdist(base[:1], base[1:2]).item() * math.sqrt(math.log(n - 1))
    ratio = contraction_ratio(base, base * 1.01, similarity="gaussian").item()
    assert ratio > 1.0  # a genuine expansion: dilating the cloud moves attention outputs more
    assert ratio <= gaussian_potential_bound(dim=n, n=n)


@pytest.mark.parametrize("n", [10, 10**6])
def test_prop28_constant_is_exceeded_for_many_tokens(n):
    # mu = (1/N) delta_0 + (1-1/N) delta_t in 1-D, nu moves the heavy atom to t + h, and the query
    # sits at 0; with t^2 = ln(N-1) the softmatch splits its mass evenly.  In closed form
    # W1(Psi(mu), Psi(nu)) = |s' - s| t + s' h with s = c / (1 + c), c = (N-1) exp(-t^2), which
    # grows like (ln N)/2 times W1(mu, nu), faster than the sqrt(ln N) bracket of Prop. 28.
    t, h = math.sqrt(math.log(n - 1)), 1e-4
    w = torch.tensor([1 / n, 1 - 1 / n], dtype=F64)
    mu = EmpiricalMeasure(torch.tensor([[0.0], [t]], dtype=F64), w)
    nu = EmpiricalMeasure(torch.tensor([[0.0], [t + h]], dtype=F64), w)
    gauss = lambda p: torch.exp(-p[..., 0] ** 2)  # noqa: E731  G(0, y)
    got = wasserstein1(boltzmann_gibbs(mu, gauss), boltzmann_gibbs(nu, gauss)).item()
    mass = lambda z: (n - 1) * math.exp(-(z**2)) / (1 + (n - 1) * math.exp(-(z**2)))  # noqa: E731
    assert got == pytest.approx(abs(mass(t + h) - mass(t)) * t + mass(t + h) * h, rel=1e-9)
    ratio = got / wasserstein1(mu, nu).item()
    bracket = math.sqrt(math.log(n) + 1 / (2 * math.e)) * math.sqrt(2 / math.e) + 1 + 1 + 2  # d = 1
    assert (ratio > bracket) == (n == 10**6)


def test_bound_formulas():
    # The formulas as printed in the paper, evaluated here independently.
    common = dict(lip_first=0.5, lip_second=0.25, epsilon=0.1, diameter=3.0, dim=2, lookup_lip=2.0)
    assert contraction_bound(**common, as_printed=True) == pytest.approx(2 * 2 * 0.75 * 3 / 0.1 * 2)
    assert contraction_bound(**common, sup=1.5) == pytest.approx(2 * 2 * (2 * 0.5 * 3 + 1.5 + 2 * 0.25 * 3) / 0.1)
    assert lipschitz_bound(lip_first=0.5, epsilon=0.1, diameter=3.0, dim=4, lookup_lip=2.0) == pytest.approx(8 * 2 * 2 * 0.5 * 3 / 0.1)
    assert neighbourhood_bound(lip_second=0.5, epsilon=0.1, diameter=3.0, dim=4, as_printed=True) == pytest.approx(4 * 2 * 0.5 * 3 / 0.1)
    assert neighbourhood_bound(lip_second=0.5, epsilon=0.1, diameter=3.0, dim=4, sup=2.0) == pytest.approx(4 * (2.0 + 2 * 0.5 * 3) / 0.1)
    expected = 2 * 3 * 1.0 * (math.sqrt(3) * math.sqrt(math.log(5) + 1 / (2 * math.e)) * math.sqrt(2 / math.e) + 1 + math.sqrt(3) + 2)
    assert gaussian_potential_bound(dim=3, n=5, m=9) == pytest.approx(expected)
    # ||G||_Lip of the Gaussian potential in the l1 metric: max over t of 2 t exp(-t^2).
    t = np.linspace(0, 5, 200001)
    assert gaussian_potential_constants(radius=1.0, dim=1)["lip_first"] == pytest.approx((2 * t * np.exp(-(t**2))).max(), rel=1e-8)


def test_lipschitz_ratio_of_linear_map_is_its_gain():
    g = _gen(14)
    q1, q2 = torch.randn(100, 3, generator=g, dtype=F64), torch.randn(100, 3, generator=g, dtype=F64)
    torch.testing.assert_close(lipschitz_ratio(lambda q: 3.0 * q, q1, q2), torch.full((100,), 3.0, dtype=F64))
    assert lipschitz_ratio(lambda q: q, q1, q1).eq(0).all()


# ------------------------------------------------------------------------------------------
# Numerics at the edges of the dtype's range
# ------------------------------------------------------------------------------------------


def test_gaussian_similarity_is_exact_far_from_the_origin():
    """|q - k|^2 is recovered in coordinates centred at the keys: at an offset of 1e7 in float64 the
    kernel matches the direct distances (the expanded 2<q, k> - |k|^2 alone would lose ~1e-2 per logit)."""
    g = _gen(40)
    q, k = torch.randn(4, 3, generator=g, dtype=F64), torch.randn(6, 3, generator=g, dtype=F64)
    ref = torch.softmax(-0.8 * torch.cdist(q, k) ** 2, -1)
    offset = torch.tensor([1e7, -3e7, 2e7], dtype=F64)
    ker = softmatch_kernel(q + offset, k + offset, similarity="gaussian", scale=0.8)
    torch.testing.assert_close(ker, ref, atol=1e-8, rtol=0)


def test_dot_similarity_is_scaled_before_the_product():
    """float32 queries and keys ~ 1e30 with s = 1e-60 (0 in float32): sqrt(s) scales both factors."""
    g = _gen(41)
    q, k = torch.randn(3, 8, generator=g, dtype=F64), torch.randn(5, 8, generator=g, dtype=F64)
    ker = softmatch_kernel((q * 1e30).float(), (k * 1e30).float(), scale=0.5e-60)
    assert ker.dtype == torch.float32
    torch.testing.assert_close(ker.double(), torch.softmax(0.5 * q @ k.T, -1), atol=1e-5, rtol=0)


def test_zero_weights_mask_keys_with_finite_gradients():
    """A key of weight zero (and a zero potential) is masked: the result and its gradient equal those
    of the measure without that key, and the gradient with respect to the zero weight is finite."""
    g = _gen(42)
    q, k, v = (torch.randn(*shape, generator=g, dtype=F64) for shape in ((3, 2), (5, 2), (5, 2)))
    w = torch.tensor([0.2, 0.0, 0.3, 0.5, 0.0], dtype=F64, requires_grad=True)
    keep = torch.tensor([0, 2, 3])
    out, ker = attention_kernel(q, k, v, key_weights=w)
    ref, _ = attention_kernel(q, k[keep], v[keep], key_weights=w.detach()[keep])
    torch.testing.assert_close(out, ref)
    assert (ker[:, [1, 4]] == 0).all()
    (grad,) = torch.autograd.grad(out.sum(), w)
    assert torch.isfinite(grad).all()
    pot = torch.tensor([1.0, 0.0, 2.0, 0.5, 0.0], dtype=F64, requires_grad=True)
    tilted = boltzmann_gibbs(EmpiricalMeasure(k), pot)
    torch.testing.assert_close(tilted.weights.detach(), pot.detach() / pot.detach().sum())
    (grad,) = torch.autograd.grad((tilted.weights * torch.arange(5)).sum(), pot)
    assert torch.isfinite(grad).all()


def test_potential_constants_refuse_an_overflowing_exponent():
    dot_product_potential_constants(radius=10.0, dim=4, scale=1.0)  # s r^2 d = 400: exp(400) is a double
    with pytest.raises(ValueError, match="radius"):
        dot_product_potential_constants(radius=20.0, dim=4, scale=1.0)  # exp(1600) is not
    with pytest.raises(ValueError, match="radius"):
        gaussian_potential_constants(radius=10.0, dim=4, scale=1.0)  # exp(-1600) underflows to 0


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    pts = torch.randn(4, 2)
    with pytest.raises(ValueError, match="non-negative"):
        EmpiricalMeasure(pts, torch.tensor([0.5, 0.7, -0.2, 0.0]))
    with pytest.raises(ValueError, match="sum to 1"):
        EmpiricalMeasure(pts, torch.tensor([0.5, 0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match="at least one atom"):
        EmpiricalMeasure(torch.zeros(0, 2))
    with pytest.raises(ValueError, match="do not match"):
        EmpiricalMeasure(pts, torch.full((3,), 1 / 3))
    with pytest.raises(ValueError, match="broadcast"):
        EmpiricalMeasure(torch.randn(2, 4, 2), torch.full((3, 4), 0.25))
    with pytest.raises(TypeError, match="floating"):
        EmpiricalMeasure(torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        EmpiricalMeasure(torch.tensor([[float("nan"), 0.0]]))
    with pytest.raises(ValueError, match="do not match"):
        wasserstein1(torch.randn(3, 2), torch.randn(3, 3))
    with pytest.raises(ValueError, match="method"):
        wasserstein1(torch.randn(3, 2), torch.randn(3, 2), method="sinkhorn")
    with pytest.raises(ValueError, match="exactly one"):
        boltzmann_gibbs(EmpiricalMeasure(pts), torch.ones(4), log_potential=torch.zeros(4))
    with pytest.raises(ValueError, match="non-negative"):
        boltzmann_gibbs(EmpiricalMeasure(pts), -torch.ones(4))
    with pytest.raises(ValueError, match="do not match"):
        attention_kernel(torch.randn(2, 3), torch.randn(4, 3), torch.randn(5, 3))
    with pytest.raises(ValueError, match="epsilon"):
        contraction_bound(lip_first=1.0, lip_second=1.0, epsilon=0.0, diameter=1.0, dim=2, sup=1.0)
    with pytest.raises(ValueError, match="sup"):
        contraction_bound(lip_first=1.0, lip_second=1.0, epsilon=0.5, diameter=1.0, dim=2)
    with pytest.raises(ValueError, match="dim"):
        gaussian_potential_bound(dim=0, n=3)
    with pytest.raises(ValueError, match="normalize"):
        self_attention_flow(torch.randn(3, 2), 2, normalize="batch")
    with pytest.raises(ValueError, match="depth"):
        self_attention_flow(torch.randn(3, 2), -1)
    with pytest.raises(ValueError, match="similarity"):
        softmatch_kernel(torch.randn(2, 3), torch.randn(4, 3), similarity="cosine")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    g = _gen(15)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=F64) for _ in range(3))
    out_cpu, _ = attention_kernel(q, k, v)
    out_gpu, _ = attention_kernel(q.cuda(), k.cuda(), v.cuda())
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-12, rtol=0)
    x, y = torch.randn(2, 6, 3, generator=g, dtype=F64), torch.randn(2, 5, 3, generator=g, dtype=F64)
    torch.testing.assert_close(wasserstein1(x.cuda(), y.cuda()).cpu(), wasserstein1(x, y), atol=1e-12, rtol=0)
