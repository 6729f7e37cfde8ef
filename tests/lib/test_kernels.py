"""Tests for attnopt.kernels: the Markov-kernel model of attention of Vuckovic et al. (2020).

Every check compares against an independent computation: PyTorch's SDPA / MultiheadAttention,
explicit formulas, SciPy's SLSQP, or finite differences.  The distances and bounds of chapter 2 are
tested in ``test_regularity.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import attnopt
from attnopt.kernels import (
    EmpiricalMeasure,
    attention_kernel,
    boltzmann_gibbs,
    gaussian_potential_attention,
    lookup_kernel,
    maximum_entropy_tilt,
    moment_projection,
    multihead_attention_kernel,
    self_attention_flow,
    softmatch_kernel,
)

from random_measures import generator, simplex

F64 = torch.float64


_gen = generator
_simplex = simplex


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
    with pytest.raises(ValueError, match="exactly one"):
        boltzmann_gibbs(EmpiricalMeasure(pts), torch.ones(4), log_potential=torch.zeros(4))
    with pytest.raises(ValueError, match="non-negative"):
        boltzmann_gibbs(EmpiricalMeasure(pts), -torch.ones(4))
    with pytest.raises(ValueError, match="do not match"):
        attention_kernel(torch.randn(2, 3), torch.randn(4, 3), torch.randn(5, 3))
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
