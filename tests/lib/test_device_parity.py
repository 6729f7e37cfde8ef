"""Every public computation of attnopt on an accelerator against the same computation on the CPU.

The reference is the library's CPU path in float64, which the rest of tests/lib checks against
closed forms, SciPy, POT and finite differences; here each function runs again on the device (in
float64, and in float32 where the device path differs) and its outputs *and gradients* must agree.

The device is CUDA; the whole module skips without it.  ``ATTNOPT_PARITY_DEVICE=cpu`` runs it
CPU-against-CPU, which checks the test code itself on a machine without a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

import attnopt
from attnopt import continuous as C
from attnopt import continuous_attention as CA
from attnopt import fenchel as F
from attnopt import geometry as G
from attnopt import kernels as K
from attnopt import mixture as M
from attnopt import regularity as R
from attnopt import transforms as T
from attnopt import value_functions as VF
from attnopt import vqa, vqa_data
from attnopt.transforms._sinkhorn import sinkhorn_plan
from hot_paths import forward_backward, hot_paths

DEVICE = os.environ.get("ATTNOPT_PARITY_DEVICE", "cuda")
F64 = torch.float64

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs CUDA"),
]


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64) * scale


def on_both(fn, *inputs, grad=True, atol=1e-9):
    """Run ``fn`` on CPU and on the device with the same float64 inputs; compare every output and
    the gradient of a fixed random projection of the outputs with respect to every input."""
    results = []
    for device in ("cpu", DEVICE):
        xs = [x.detach().to(device).requires_grad_(grad and x.is_floating_point()) for x in inputs]
        out = fn(*xs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        outs = [o for o in outs if isinstance(o, torch.Tensor)]
        for o in outs:
            assert o.device.type == torch.device(device).type, "output left the inputs' device"
        grads = []
        if grad:
            loss = sum((o * rand(*o.shape, seed=99).to(device)).sum() for o in outs if o.is_floating_point() and o.requires_grad)
            leaves = [x for x in xs if x.requires_grad]
            grads = torch.autograd.grad(loss, leaves, allow_unused=True) if torch.is_tensor(loss) else []
        results.append(([o.detach().cpu() for o in outs], [None if g is None else g.cpu() for g in grads]))
    (out_cpu, grad_cpu), (out_dev, grad_dev) = results
    for a, b in zip(out_cpu, out_dev):
        torch.testing.assert_close(b, a, atol=atol, rtol=1e-7)
    for a, b in zip(grad_cpu, grad_dev):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(b, a, atol=atol, rtol=1e-7)


# ---------------------------------------------------------------- reference SDPA (attnopt.attention)


def test_attention_parity():
    q, k, v = rand(2, 3, 5, 4, seed=1), rand(2, 3, 7, 4, seed=2), rand(2, 3, 7, 6, seed=3)
    mask = torch.ones(5, 7, dtype=torch.bool).tril(2)
    bias = rand(3, 5, 7, seed=4)
    on_both(lambda q, k, v, b: attnopt.scaled_dot_product_attention(q, k, v, mask=mask.to(q.device), bias=b), q, k, v, bias)


# ---------------------------------------------------------------- chapter 1: Fenchel dual


def test_fenchel_parity():
    T_, z = rand(2, 6, 5, seed=5, scale=0.5), rand(2, 4, 5, seed=6)
    u = torch.softmax(rand(2, 4, 6, seed=7), -1)
    u[..., 0] = 0
    u = u / u.sum(-1, keepdim=True)
    on_both(lambda z, T_, u: F.generalized_attention(z, T_, u, 0.7), z, T_, u)
    on_both(lambda b, T_, u: F.solve_dual(b, T_, u, 1.3), z + 0.1, T_, u)  # implicit gradient
    on_both(lambda b, T_, u: F.exact_estimate(b, T_, u, 1.3), z + 0.1, T_, u)
    on_both(lambda mu, b: F.gaussian_estimate(mu, b, 0.5), rand(3, 5, seed=8), rand(3, 5, seed=9))
    cost = torch.cdist(T_[0], T_[0]) ** 2
    on_both(lambda z, T_, u, c: F.ot_attention(z, T_, u, c, 0.5, 1.0), z[0], T_[0], u[0], cost)
    bias = rand(4, 6, seed=10)
    on_both(lambda b: F.t5_preference(b, torch.ones(4, 6, dtype=torch.bool, device=b.device).triu()), bias)


# ---------------------------------------------------------------- chapter 2: Markov kernels


def test_kernels_parity():
    q, k, v = rand(3, 5, 4, seed=11), rand(3, 7, 4, seed=12), rand(3, 7, 2, seed=13)
    w = torch.softmax(rand(3, 7, seed=14), -1)
    on_both(lambda q, k, v, w: K.attention_kernel(q, k, v, key_weights=w), q, k, v, w)
    on_both(lambda q, k, v: K.gaussian_potential_attention(q, k, v, scale=0.8), q, k, v)
    on_both(lambda x: K.self_attention_flow(x, 3, residual=True, step_size=0.5), rand(2, 6, 3, seed=15))
    on_both(lambda x, y: R.wasserstein1(x, y), rand(8, 1, seed=16), rand(8, 1, seed=17), grad=False, atol=1e-12)
    on_both(lambda x, y: R.lipschitz_ratio(lambda z: K.attention_kernel(z, k.to(z.device), v.to(z.device))[0], x, y),
            rand(10, 4, seed=18), rand(10, 4, seed=19), grad=False)
    nu = K.EmpiricalMeasure(rand(9, 2, seed=20), torch.full((9,), 1 / 9, dtype=F64))

    def tilt(points, weights):
        measure = K.EmpiricalMeasure(points, weights)
        tilted, lam = K.maximum_entropy_tilt(measure, points, torch.tensor([0.1, -0.2], dtype=F64, device=points.device))
        return tilted.weights, lam

    on_both(tilt, nu.points, nu.weights, grad=False)


# ---------------------------------------------------------------- chapter 3: transforms, geometry


@pytest.mark.parametrize("method", ["sort", "newton"])
def test_sparse_transforms_parity(method):
    x = rand(40, 33, seed=21, scale=2.0)
    x[0, :5] = float("-inf")
    x[1] = float("-inf")
    on_both(lambda s: T.sparsemax(s, method=method), x)
    on_both(lambda s: T.entmax15(s, dim=0, method=method), x[2:])
    on_both(lambda s: T.sparsemax(s, method=method), rand(3000, 64, seed=22) * torch.logspace(-2, 1, 3000, dtype=F64)[:, None])


def test_other_transforms_parity():
    x = rand(6, 9, seed=23)
    on_both(lambda s: T.softmax(s, tau=0.7), x)
    on_both(lambda s: T.entmax(s, 1.3, n_iter=40), x)
    on_both(lambda s: T.entmax(s, 2.5, n_iter=40), x)
    on_both(lambda s, p: T.prior_softmax(s, p), x, torch.softmax(rand(6, 9, seed=24), -1))
    on_both(lambda c: T.one_sided_eot(c, 0.5, "tsallis", alpha=1.5), -x)
    for mode in ("unrolled", "implicit"):
        on_both(lambda s: T.sinkhorn_attention(s, 1.0, 30, tol=None, grad=mode), rand(3, 8, 6, seed=25), atol=1e-8)
        # the tolerance mode tests every 10 iterations on every device: the same iterations run
        on_both(lambda s: T.sinkhorn_attention(s, 0.2, tol=1e-9, grad=mode, return_info=True)[:2], rand(3, 8, 6, seed=26), atol=1e-8)


def test_low_precision_on_device():
    for dtype in (torch.float16, torch.bfloat16):
        x = rand(4, 50, seed=26).to(DEVICE, dtype)
        for f in (T.softmax, T.sparsemax, T.entmax15, lambda s: T.entmax(s, 1.7)):
            p = f(x)
            assert p.dtype == dtype and p.device.type == torch.device(DEVICE).type
            assert torch.isfinite(p).all() and torch.allclose(p.float().sum(-1), torch.ones(4, device=DEVICE), atol=2e-2)


@pytest.mark.skipif(DEVICE != "cuda", reason="synchronisation is a CUDA notion")
def test_sinkhorn_iterations_never_synchronise():
    # The claim of the docstring: no host synchronisation inside the Sinkhorn loop.
    M = rand(4, 16, 16, seed=27).cuda()
    a = torch.full((4, 16), 1 / 16, dtype=F64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sinkhorn_plan(M, a, a.clone(), 25, 5)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(DEVICE != "cuda", reason="synchronisation is a CUDA notion")
@pytest.mark.parametrize("name", sorted(hot_paths("cpu")))
def test_hot_paths_never_synchronise(name):
    # The forward and backward of every hot path (tests/lib/hot_paths.py) run under CUDA's sync
    # debug mode "error": any host read (an input check, a data-dependent loop, nonzero, .item())
    # raises.  The first call is a warm-up (library handles, caches) outside the mode.
    fn, inputs = hot_paths(DEVICE)[name]
    forward_backward(fn, inputs, DEVICE)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward_backward(fn, inputs, DEVICE)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_geometry_parity():
    p = torch.softmax(rand(5, 7, seed=28), -1)
    r = rand(5, 7, seed=29)
    on_both(lambda p, r: G.advantage_gradient(p, r, 0.8), p, r)
    on_both(lambda p, r: G.natural_gradient(p, r, 0.8), p, r)
    on_both(lambda p: G.fisher_information(p), p)
    on_both(lambda s: G.log_sum_exp_potential(s, 0.8), rand(5, 7, seed=30))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    est = G.reinforce_estimate(p.to(DEVICE), r.to(DEVICE), 0.8, n_samples=20000, generator=gen)
    exact = G.advantage_gradient(p, r, 0.8)
    assert est.device.type == torch.device(DEVICE).type
    assert (est.cpu() - exact).abs().max() < 0.05  # a Monte Carlo estimate: sampling on the device works


# ---------------------------------------------------------------- chapter 4: continuous, mixtures, VQA


def basis_2d():
    centres = VF.grid_locations(4, 2, dtype=F64)
    return VF.GaussianRBF(centres, torch.full((16,), 0.05, dtype=F64))


def on_device(basis, device):
    return VF.GaussianRBF(basis.centers.to(device), covariance=basis.covariance.to(device))


def spd(seed, n, scale):
    A = rand(n, 2, 2, seed=seed, scale=0.3)
    return A @ A.transpose(-1, -2) * scale + 0.02 * torch.eye(2, dtype=F64)


def test_continuous_parity():
    basis = basis_2d()
    mu, S = 0.2 + 0.6 * torch.rand(5, 2, dtype=F64, generator=torch.Generator().manual_seed(31)), spd(32, 5, 0.2)
    on_both(lambda m, s: C.continuous_softmax(m, s, on_device(basis, m.device)), mu, S)
    on_both(lambda m, s: C.continuous_sparsemax(m, s, on_device(basis, m.device), n_quadrature=128), mu, S)
    b1 = VF.GaussianRBF(torch.linspace(0, 1, 6, dtype=F64)[:, None], torch.full((6,), 0.1, dtype=F64))
    mu1, S1 = torch.tensor([[0.3], [0.6]], dtype=F64), torch.tensor([[[0.02]], [[0.1]]], dtype=F64)
    on_both(lambda m, s: C.continuous_sparsemax(m, s, on_device(b1, m.device)), mu1, S1)
    locs = VF.grid_locations(6, 2, dtype=F64)
    w = torch.softmax(rand(3, 36, seed=33), -1)
    for family in ("gaussian", "truncated_paraboloid"):
        on_both(lambda w, l: C.moment_match(w, l, family), w, locs)
    on_both(lambda f, l: VF.ridge_value_function(f, l, on_device(basis, f.device), 0.1), rand(3, 36, 4, seed=34), locs)


def test_continuous_attention_module_parity():
    basis, locs = basis_2d(), VF.grid_locations(6, 2, dtype=F64)
    for family in ("gaussian", "truncated_paraboloid"):
        module = CA.ContinuousAttention(basis, locs, family=family).double()
        s, v = rand(3, 36, seed=35), rand(3, 36, 4, seed=36)
        on_both(lambda s, v: module.to(s.device)(s, v), s, v)


def test_mixture_parity():
    locs = VF.grid_locations(8, 2, dtype=F64)
    w = torch.softmax(rand(4, 64, seed=37, scale=3.0), -1)
    cpu = M.weighted_em(locs, w, 3, n_iter=30, init="regions", tol=1e-12)
    dev = M.weighted_em(locs.to(DEVICE), w.to(DEVICE), 3, n_iter=30, init="regions", tol=1e-12)
    for name in ("means", "covariances", "mixing", "log_likelihood"):
        torch.testing.assert_close(getattr(dev, name).cpu(), getattr(cpu, name), atol=1e-8, rtol=1e-7)
    # Component selection draws random initializations, which differ between devices' generators:
    # two well-separated blobs, each wider than the grid's spacing, make the choice (K = 2)
    # independent of them (K = 2 for the seeds 0-5 on the CPU; narrower blobs let a component
    # collapse onto one row of the grid).
    blobs = torch.exp(-((locs - 0.2) ** 2).sum(-1) / 0.05) + torch.exp(-((locs - 0.8) ** 2).sum(-1) / 0.05)
    blobs = (blobs / blobs.sum()).expand(2, -1)
    for device in ("cpu", DEVICE):
        gen = torch.Generator(device=device).manual_seed(0)
        sel = M.select_components(locs.to(device), blobs.to(device), 3, penalty=0.1, n_init=2, generator=gen)
        assert sel.n_components.tolist() == [2, 2], device
    module = M.MultimodalContinuousAttention(basis_2d(), locs, 2).double()
    on_both(lambda s, v: module.to(s.device)(s, v), rand(3, 64, seed=38), rand(3, 64, 2, seed=39), atol=1e-7)


def test_vqa_encoder_on_device():
    data = vqa_data.make_batch(4, torch.Generator().manual_seed(3), questions_per_scene=1)
    torch.manual_seed(0)
    encoder = vqa.GridEncoder(channels=4).double().eval()
    images = data.images.to(F64)
    on_both(lambda x: encoder.to(x.device)(x), images, atol=1e-9)


@pytest.mark.parametrize("head", ["discrete", "continuous_softmax", "continuous_sparsemax", "mixture"])
def test_vqa_model_on_device(head):
    data = vqa_data.make_batch(4, torch.Generator().manual_seed(3), questions_per_scene=2)
    torch.manual_seed(0)
    features = torch.rand(data.n_scenes, 196, len(vqa.FEATURES), dtype=F64)[data.scene]
    model = vqa.VQAModel(head, hidden=16).double().eval()
    model_dev = vqa.VQAModel(head, hidden=16).double().eval()
    model_dev.load_state_dict(model.state_dict())
    model_dev.to(DEVICE)
    out_cpu = model(features, data.questions)
    out_dev = model_dev(features.to(DEVICE), data.questions.to(DEVICE))
    torch.testing.assert_close(out_dev.logits.cpu(), out_cpu.logits, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(vqa.attention_map(out_dev, 28).cpu(), vqa.attention_map(out_cpu, 28), atol=1e-7, rtol=1e-6)
    loss = torch.nn.functional.cross_entropy(out_dev.logits, data.answers.to(DEVICE))
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model_dev.parameters() if p.grad is not None)


def test_vqa_training_on_device():
    data = vqa_data.SyntheticVQA(16, seed=4, questions_per_scene=4, device=DEVICE)
    torch.manual_seed(0)
    encoder = vqa.GridEncoder(channels=4).to(DEVICE)
    vqa.pretrain_encoder(encoder, data, epochs=1, batch_size=8, seed=0)
    features = vqa.encode(encoder, data)
    assert features.device.type == torch.device(DEVICE).type
    model = vqa.VQAModel("continuous_sparsemax", hidden=16).to(DEVICE)
    hist = vqa.train(model, data, features, epochs=1, batch_size=32, seed=0)
    assert len(hist["loss"]) == 1 and all(torch.isfinite(torch.tensor(hist["loss"])))
    res = vqa.evaluate(model, data, features)
    assert 0 <= res["overall"] <= 1 and 0 <= res["attention_precision"] <= 1
    sweep = vqa.selection_sweep(model, data, features, [0.0, 1.0], max_components=2, n_init=1, n_iter=3)
    assert all(abs(sum(r["k_star_shares"]) - 1) < 1e-6 for r in sweep.values())
