"""The library's hot paths, each as a function and its inputs: what must never synchronise a GPU.

Used by ``test_bad_inputs.py`` (no host read on the CPU, and the read-free branch equal to the
CPU's) and by ``test_device_parity.py`` (no synchronisation under CUDA's sync debug mode).
"""

from __future__ import annotations

import torch

import attnopt
from attnopt import continuous as C
from attnopt import continuous_attention as CA
from attnopt import fenchel as F
from attnopt import geometry as G
from attnopt import kernels as K
from attnopt import mixture as M
from attnopt import transforms as T
from attnopt import value_functions as VF

F64 = torch.float64


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64) * scale


def _spd(seed, n, scale):
    A = _rand(n, 2, 2, seed=seed, scale=0.3)
    return A @ A.transpose(-1, -2) * scale + 0.02 * torch.eye(2, dtype=F64)


def hot_paths(device="cpu") -> dict:
    """Name -> ``(fn, inputs)``: ``fn(*inputs)`` is one tensor; modules, bases and masks live on
    ``device``; the float64 ``inputs`` are on the CPU, for the caller to move."""
    centres = VF.grid_locations(4, 2, dtype=F64, device=device)
    basis = VF.GaussianRBF(centres, torch.full((16,), 0.05, dtype=F64, device=device))
    locs = VF.grid_locations(6, 2, dtype=F64, device=device)
    modules = {f: CA.ContinuousAttention(basis, locs, family=f).double() for f in ("gaussian", "truncated_paraboloid")}
    mca = M.MultimodalContinuousAttention(basis, locs, 2).double()
    mask = torch.ones(5, 7, dtype=torch.bool, device=device).tril(2)
    return {
        "softmax": (lambda s: T.softmax(s, tau=0.5), (_rand(4, 9, seed=60),)),
        "prior_softmax": (lambda s: T.prior_softmax(s, torch.ones_like(s)), (_rand(4, 9, seed=61),)),
        "sparsemax": (lambda s: T.sparsemax(s), (_rand(4, 9, seed=62),)),
        "entmax15": (lambda s: T.entmax15(s), (_rand(4, 9, seed=63),)),
        "entmax": (lambda s: T.entmax(s, 1.7), (_rand(4, 9, seed=64),)),
        "sinkhorn_unrolled": (lambda s: T.sinkhorn_attention(s, 0.5, 12, tol=None), (_rand(2, 5, 6, seed=65),)),
        "sinkhorn_implicit": (lambda s: T.sinkhorn_attention(s, 0.5, 12, tol=None, grad="implicit"), (_rand(2, 5, 6, seed=66),)),
        "sdpa": (lambda q, k, v: attnopt.scaled_dot_product_attention(q, k, v, mask=mask)[0],
                 (_rand(2, 5, 4, seed=67), _rand(2, 7, 4, seed=68), _rand(2, 7, 3, seed=69))),
        "continuous_softmax": (lambda m, S: C.continuous_softmax(m, S, basis), (0.5 + 0.1 * _rand(5, 2, seed=70), _spd(71, 5, 0.2))),
        "continuous_sparsemax": (lambda m, S: C.continuous_sparsemax(m, S, basis), (0.5 + 0.1 * _rand(5, 2, seed=72), _spd(73, 5, 0.2))),
        "continuous_attention_gaussian": (lambda s, v: modules["gaussian"](s, v), (_rand(3, 36, seed=74), _rand(3, 36, 4, seed=75))),
        "continuous_attention_paraboloid": (lambda s, v: modules["truncated_paraboloid"](s, v),
                                            (_rand(3, 36, seed=76), _rand(3, 36, 4, seed=77))),
        "weighted_em": (lambda w: M.weighted_em(locs, w, 3, n_iter=10, init="regions").means, (torch.softmax(_rand(4, 36, seed=78), -1),)),
        "multimodal_attention": (lambda s, v: mca(s, v), (_rand(3, 36, seed=79), _rand(3, 36, 2, seed=80))),
        "softmatch_kernel": (lambda q, x: K.softmatch_kernel(q, K.EmpiricalMeasure(x)), (_rand(4, 3, seed=81), _rand(6, 3, seed=82))),
        "generalized_attention": (lambda z, t: F.generalized_attention(z, t, alpha=0.7)[0], (_rand(3, 4, seed=83), _rand(6, 4, seed=84))),
        "advantage_gradient": (lambda p, r: G.advantage_gradient(torch.softmax(p, -1), r, 0.8), (_rand(5, 7, seed=85), _rand(5, 7, seed=86))),
    }


def forward_backward(fn, inputs, device="cpu"):
    """``fn`` forward and backward (the gradient of the sum of squares) on copies of ``inputs``."""
    xs = [x.detach().to(device).clone().requires_grad_(True) for x in inputs]
    out = fn(*xs)
    grads = torch.autograd.grad((out * out).sum(), xs, allow_unused=True)
    return out.detach(), [g for g in grads if g is not None]
