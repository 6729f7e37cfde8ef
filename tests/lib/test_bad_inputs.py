"""Bad and edge inputs across the whole library: what holds for every module at once.

The cases themselves live one file per area, because each area needs its own fixtures:
``test_bad_inputs_transforms_attention.py``, ``test_bad_inputs_fenchel_kernels.py`` (with
geometry), ``test_bad_inputs_continuous.py`` and ``test_bad_inputs_mixture_vqa_book.py`` (with
pretrained and plotting).  Each asserts, written from the contract, the error type and that the
message names the argument, or the documented result of an edge input, and the properties
(finite in, finite out; batching equals looping; shift invariance; dtype preserved; finite
gradients through masked rows).  This file checks that together they cover every public
function, and that every hot path of the library

* makes no host read off the CPU (the CPU stand-in for "never synchronises a GPU"; the CUDA tests
  of ``test_device_parity.py`` run the same list under ``torch.cuda.set_sync_debug_mode("error")``);
* gives the same answer on its read-free branch (the one every GPU takes) as on the CPU's.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import torch

import attnopt
from attnopt import continuous as C
from attnopt import fenchel as F
from attnopt import geometry as G
from attnopt import kernels as K
from attnopt import mixture as M
from attnopt import pretrained
from attnopt import transforms as T
from host_reads import host_reads

F64 = torch.float64
HERE = Path(__file__).parent

# Public names that take no argument a user could get wrong, or only hold results.
NOTHING_TO_VALIDATE = {
    "book.in_colab": "takes no argument",
    "plotting.use_book_style": "takes no argument",
    "mixture.WeightedEMResult": "a result container (NamedTuple) built by weighted_em",
    "mixture.MixtureSelection": "a result container (NamedTuple) built by select_components",
    "vqa.AttentionOutput": "a result container built by the model's heads",
    "vqa.VQABatch": "a result container built by make_batch / SyntheticVQA",
    "vqa.VQAOutput": "a result container built by VQAModel",
    "pretrained.AttentionInputs": "a result container built by attention_inputs",
}


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64) * scale


def test_every_public_function_has_bad_input_cases():
    source = "".join(p.read_text() for p in sorted(HERE.glob("test_bad_inputs*.py")))
    missing = []
    for info in pkgutil.iter_modules(attnopt.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"attnopt.{info.name}")
        for name in getattr(module, "__all__", []):
            qualified = f"{info.name}.{name}"
            if callable(getattr(module, name)) and qualified not in NOTHING_TO_VALIDATE:
                if not re.search(rf"\b{name}\(", source):
                    missing.append(qualified)
    assert not missing, f"public functions without a bad-input case: {missing}"


# ------------------------------------------------------------------------------------------------
# Cases for the functions no area file calls
# ------------------------------------------------------------------------------------------------

TEMPLATES = rand(5, 3, seed=1)
Z = rand(3, seed=2)
COST = torch.cdist(TEMPLATES, TEMPLATES)

BAD = [
    (lambda: F.ot_dual_objective(torch.full((3,), float("nan"), dtype=F64), Z, TEMPLATES, cost=COST), ValueError, "lam"),
    (lambda: F.ot_dual_objective(torch.zeros(4, dtype=F64), Z, TEMPLATES, cost=COST), ValueError, "lam"),
    (lambda: F.ot_dual_objective(Z, Z, TEMPLATES, cost=COST, gamma=0.0), ValueError, "gamma"),
    (lambda: F.ot_dual_objective(Z, Z.float(), TEMPLATES, cost=COST), TypeError, "b"),
    (lambda: F.ot_exact_estimate(Z, TEMPLATES, cost=COST, alpha=-1.0), ValueError, "alpha"),
    (lambda: F.ot_exact_estimate(Z, TEMPLATES, cost=COST[:4, :4]), ValueError, "cost"),
    (lambda: F.ot_exact_estimate(Z, TEMPLATES), ValueError, "cost"),
    (lambda: F.ot_exact_estimate(Z, TEMPLATES, cost=COST, max_iter=0), ValueError, "max_iter"),
    (lambda: K.neighbourhood_bound(lip_second=1.0, epsilon=-0.1, diameter=1.0, dim=2), ValueError, "epsilon"),
    (lambda: K.neighbourhood_bound(lip_second=1.0, epsilon=0.1, diameter=float("nan"), dim=2), ValueError, "diameter"),
    (lambda: K.neighbourhood_bound(lip_second=1.0, epsilon=0.1, diameter=1.0, dim=2.0), TypeError, "dim"),
    (lambda: K.neighbourhood_bound(lip_second=1.0, epsilon=0.1, diameter=1.0, dim=2, as_printed="no"), TypeError, "as_printed"),
    (lambda: pretrained.load_minilm("nonsense"), ValueError, "device"),
    (lambda: pretrained.load_minilm(3), TypeError, "device"),
]


@pytest.mark.parametrize("call, error, word", BAD, ids=[f"{i}-{w}" for i, (_, _, w) in enumerate(BAD)])
def test_bad_argument_is_named(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_ot_maps_on_an_empty_batch():
    z = torch.zeros(0, 3, dtype=F64)
    h, weights = F.ot_exact_estimate(z, TEMPLATES, cost=COST)
    assert h.shape == (0, 3) and weights.shape == (0, 5)
    assert F.ot_dual_objective(z, z, TEMPLATES, cost=COST).shape == (0,)


# ------------------------------------------------------------------------------------------------
# Every hot path: no host read, and the read-free branch agrees with the CPU's
# ------------------------------------------------------------------------------------------------


def _basis():
    return C.GaussianRBF(C.grid_locations(4, 2, dtype=F64), torch.full((16,), 0.05, dtype=F64))


def _spd(seed, n, scale):
    A = rand(n, 2, 2, seed=seed, scale=0.3)
    return A @ A.transpose(-1, -2) * scale + 0.02 * torch.eye(2, dtype=F64)


def hot_paths():
    """Name -> (function, inputs): the same list as ``test_device_parity.HOT_PATHS``."""
    basis, locs = _basis(), C.grid_locations(6, 2, dtype=F64)
    modules = {f: C.ContinuousAttention(basis, locs, family=f).double() for f in ("gaussian", "truncated_paraboloid")}
    mca = M.MultimodalContinuousAttention(basis, locs, 2).double()
    mask = torch.ones(5, 7, dtype=torch.bool).tril(2)
    return {
        "softmax": (lambda s: T.softmax(s, tau=0.5), (rand(4, 9, seed=60),)),
        "prior_softmax": (lambda s: T.prior_softmax(s, torch.ones_like(s)), (rand(4, 9, seed=61),)),
        "sparsemax": (lambda s: T.sparsemax(s), (rand(4, 9, seed=62),)),
        "entmax15": (lambda s: T.entmax15(s), (rand(4, 9, seed=63),)),
        "entmax": (lambda s: T.entmax(s, 1.7), (rand(4, 9, seed=64),)),
        "sinkhorn_unrolled": (lambda s: T.sinkhorn_attention(s, 0.5, 12), (rand(2, 5, 6, seed=65),)),
        "sinkhorn_implicit": (lambda s: T.sinkhorn_attention(s, 0.5, 12, grad="implicit"), (rand(2, 5, 6, seed=66),)),
        "sdpa": (lambda q, k, v: attnopt.scaled_dot_product_attention(q, k, v, mask=mask)[0],
                 (rand(2, 5, 4, seed=67), rand(2, 7, 4, seed=68), rand(2, 7, 3, seed=69))),
        "continuous_softmax": (lambda m, S: C.continuous_softmax(m, S, basis), (0.5 + 0.1 * rand(5, 2, seed=70), _spd(71, 5, 0.2))),
        "continuous_sparsemax": (lambda m, S: C.continuous_sparsemax(m, S, basis), (0.5 + 0.1 * rand(5, 2, seed=72), _spd(73, 5, 0.2))),
        "continuous_attention_gaussian": (lambda s, v: modules["gaussian"](s, v), (rand(3, 36, seed=74), rand(3, 36, 4, seed=75))),
        "continuous_attention_paraboloid": (lambda s, v: modules["truncated_paraboloid"](s, v),
                                            (rand(3, 36, seed=76), rand(3, 36, 4, seed=77))),
        "weighted_em": (lambda w: M.weighted_em(locs, w, 3, n_iter=10, init="regions").means, (torch.softmax(rand(4, 36, seed=78), -1),)),
        "multimodal_attention": (lambda s, v: mca(s, v), (rand(3, 36, seed=79), rand(3, 36, 2, seed=80))),
        "softmatch_kernel": (lambda q, x: K.softmatch_kernel(q, K.EmpiricalMeasure(x)), (rand(4, 3, seed=81), rand(6, 3, seed=82))),
        "generalized_attention": (lambda z, t: F.generalized_attention(z, t, alpha=0.7)[0], (rand(3, 4, seed=83), rand(6, 4, seed=84))),
        "advantage_gradient": (lambda p, r: G.advantage_gradient(torch.softmax(p, -1), r, 0.8), (rand(5, 7, seed=85), rand(5, 7, seed=86))),
    }


HOT = sorted(hot_paths())


def _forward_backward(fn, inputs):
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*xs)
    grads = torch.autograd.grad((out * out).sum(), xs, allow_unused=True)
    return out.detach(), [g for g in grads if g is not None]


def test_the_list_matches_the_cuda_test():
    source = (HERE / "test_device_parity.py").read_text()
    listed = re.search(r"HOT_PATHS = \[(.*?)\]", source, re.S).group(1)
    assert sorted(re.findall(r'"(\w+)"', listed)) == HOT


@pytest.mark.parametrize("name", HOT)
def test_hot_path_makes_no_host_read(name):
    fn, inputs = hot_paths()[name]
    assert host_reads(_forward_backward, fn, inputs) == []


@pytest.mark.parametrize("name", HOT)
def test_read_free_branch_agrees_with_the_cpu_branch(name):
    # "async" is what every GPU runs: Sinkhorn-free sort thresholds, the read-free quadrature of
    # continuous sparsemax, EM without early exits.  On valid input it must give the CPU's answer.
    fn, inputs = hot_paths()[name]
    out_cpu, grads_cpu = _forward_backward(fn, inputs)
    with attnopt.checks("async"):
        out_free, grads_free = _forward_backward(fn, inputs)
    torch.testing.assert_close(out_free, out_cpu, atol=1e-9, rtol=1e-7)
    for a, b in zip(grads_free, grads_cpu):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-6)
