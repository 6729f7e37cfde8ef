"""Bad and edge inputs across the whole library: what holds for every module at once.

The cases themselves live one file per area, because each area needs its own fixtures:
``test_bad_inputs_transforms_attention.py``, ``test_bad_inputs_fenchel_kernels.py`` (with
geometry), ``test_bad_inputs_continuous.py`` (with value_functions and continuous_attention) and
``test_bad_inputs_mixture_vqa_book.py`` (with pretrained and plotting).  Each asserts, written
from the contract, the error type and that the message names the argument, or the documented
result of an edge input, and the properties (finite in, finite out; batching equals looping;
shift invariance; dtype preserved; finite gradients through masked rows).  This file checks that together they cover every public
function, and that every hot path of the library

* makes no host read off the CPU (the CPU stand-in for "never synchronises a GPU"; the CUDA tests
  of ``test_device_parity.py`` run the same list under ``torch.cuda.set_sync_debug_mode("error")``);
* gives the same answer on its read-free branch (the one every GPU takes) as on the CPU's.

The list of hot paths is ``hot_paths.py``, shared with the CUDA tests.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import torch

import attnopt
from attnopt import book
from attnopt import fenchel as F
from attnopt import kernels as K
from attnopt import regularity as R
from attnopt import pretrained
from host_reads import host_reads
from hot_paths import forward_backward, hot_paths

F64 = torch.float64
HERE = Path(__file__).parent

# Public names that take no argument a user could get wrong, or only hold results.
NOTHING_TO_VALIDATE = {
    "book.in_colab": "takes no argument",
    "plotting.use_book_style": "takes no argument",
    "transforms.SinkhornResult": "a result container (NamedTuple) built by sinkhorn_attention",
    "mixture.WeightedEMResult": "a result container (NamedTuple) built by weighted_em",
    "mixture.MixtureSelection": "a result container (NamedTuple) built by select_components",
    "vqa.AttentionOutput": "a result container built by the model's heads",
    "vqa_data.VQABatch": "a result container built by make_batch / SyntheticVQA",
    "vqa.VQAOutput": "a result container built by VQAModel",
    "pretrained.AttentionInputs": "a result container built by attention_inputs",
    "explore.PreferenceView": "a result container (NamedTuple) built by preference_view",
    "explore.FlowView": "a result container (NamedTuple) built by particle_flow",
    "explore.RegularizerView": "a result container (NamedTuple) built by regularized_weights",
    "explore.ImageValues": "a result container (NamedTuple) built by image_value_function",
    "explore.DensityView": "a result container (NamedTuple) built by density_view",
    "explore.FourViews": "a result container (NamedTuple) built by four_views",
    "page_explorer.PageExplorer": "a result container built by page_explorer",
}


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    plt.close(fig)
    return fig


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
    (lambda: R.neighbourhood_bound(lip_second=1.0, epsilon=-0.1, diameter=1.0, dim=2), ValueError, "epsilon"),
    (lambda: R.neighbourhood_bound(lip_second=1.0, epsilon=0.1, diameter=float("nan"), dim=2), ValueError, "diameter"),
    (lambda: R.neighbourhood_bound(lip_second=1.0, epsilon=0.1, diameter=1.0, dim=2.0), TypeError, "dim"),
    (lambda: R.neighbourhood_bound(lip_second=1.0, epsilon=0.1, diameter=1.0, dim=2, as_printed="no"), TypeError, "as_printed"),
    (lambda: pretrained.load_minilm("nonsense"), ValueError, "device"),
    (lambda: pretrained.load_minilm(3), TypeError, "device"),
    (lambda: book.markdown_table([[1, 2]]), ValueError, "columns"),
    (lambda: book.markdown_table([[1, 2]], columns=["a"]), ValueError, "columns"),
    (lambda: book.markdown_table([3], columns=["a"]), TypeError, "rows"),
    (lambda: book.markdown_table([{"a": 1}], digits=2.5), TypeError, "digits"),
    (lambda: book.save_figure("not a figure", "x"), TypeError, "fig"),
    (lambda: book.save_figure(_figure(), "../escape"), ValueError, "name"),
    (lambda: book.save_figure(_figure(), ""), ValueError, "name"),
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


HOT = sorted(hot_paths())


@pytest.mark.parametrize("name", HOT)
def test_hot_path_makes_no_host_read(name):
    fn, inputs = hot_paths()[name]
    assert host_reads(forward_backward, fn, inputs) == []


@pytest.mark.parametrize("name", HOT)
def test_read_free_branch_agrees_with_the_cpu_branch(name):
    # "async" is what every GPU runs: Sinkhorn-free sort thresholds, the read-free quadrature of
    # continuous sparsemax, EM without early exits.  On valid input it must give the CPU's answer.
    fn, inputs = hot_paths()[name]
    out_cpu, grads_cpu = forward_backward(fn, inputs)
    with attnopt.checks("async"):
        out_free, grads_free = forward_backward(fn, inputs)
    torch.testing.assert_close(out_free, out_cpu, atol=1e-9, rtol=1e-7)
    for a, b in zip(grads_free, grads_cpu):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-6)


def test_edge_tables_and_figures(tmp_path, monkeypatch):
    assert book.markdown_table([]).data.splitlines()[0] == "|  |"  # no rows, no columns: an empty header
    assert "| 1 | 2 |" in book.markdown_table([[1, 2]], columns=["a", "b"]).data
    monkeypatch.delenv(book.FIGURES_ENV, raising=False)
    assert book.save_figure(_figure(), "ch0-demo") is None  # outside the book's build nothing is written
    monkeypatch.setenv(book.FIGURES_ENV, str(tmp_path))
    path = book.save_figure(_figure(), "ch0-demo")
    assert path == tmp_path / "ch0-demo.png" and path.is_file()


def test_device_messages_fit_cuda():
    """A failed check in mode "async" is a CUDA device assertion, whose message must be under 255
    bytes: the long overflow message of softmatch_kernel used to raise at the call on a GPU."""
    from attnopt._validation import DEVICE_MESSAGE_BYTES, device_message, require

    long = "argument 'scores' " + "é" * 300
    cut = device_message(long)
    assert len(cut.encode()) <= DEVICE_MESSAGE_BYTES and cut.startswith("argument 'scores' ")
    assert device_message("short") == "short"
    with attnopt.checks("async"):
        require(torch.tensor(True), long)  # through the CUDA-like _assert_async of conftest
        q = torch.randn(3, 4, dtype=torch.float64)
        attnopt.kernels.softmatch_kernel(q, attnopt.kernels.EmpiricalMeasure(torch.randn(5, 4, dtype=torch.float64)))
