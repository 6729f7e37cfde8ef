"""Bad and edge inputs of attnopt.mixture, attnopt.vqa, attnopt.book, attnopt.pretrained and
attnopt.plotting, written from their contracts: each bad input raises the documented error type
with a message that names the user's argument; each edge input gives the documented result.
Hypothesis properties of weighted EM: finite in -> finite out (degenerate point sets included),
batching = looping with a fixed initialization, dtype preserved.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnopt import book, plotting, pretrained, vqa, vqa_data
from attnopt.mixture import (
    MultimodalContinuousAttention,
    region_labels,
    select_components,
    weighted_em,
    weighted_log_likelihood,
)
from attnopt.value_functions import GaussianRBF, grid_locations

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")

GRID = grid_locations(5, dtype=F64)  # (25, 2)
W = torch.full((25,), 1 / 25, dtype=F64)
BASIS = GaussianRBF.grid(3, 0.3, dtype=F64)


def _module(**kw):
    return MultimodalContinuousAttention(BASIS, GRID, 2, n_iter=3, **kw)


def _standard_mixture(k=1, d=2):
    return torch.zeros(k, d, dtype=F64), torch.eye(d, dtype=F64).expand(k, d, d), torch.full((k,), 1 / k, dtype=F64)


# --------------------------------------------------------------------------------------------
# mixture: bad inputs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: weighted_em(GRID, W, 2, cov_floor=-1.0), ValueError, "cov_floor"),
        (lambda: weighted_em(GRID, W, 2, tol=-1e-3), ValueError, "tol"),
        (lambda: weighted_em(GRID, W, 2, tol="small"), TypeError, "tol"),
        (lambda: weighted_em(GRID, torch.zeros(25, dtype=F64), 2), ValueError, "weights"),
        (lambda: weighted_em(GRID, W.clone().index_fill_(0, torch.tensor([3]), math.inf), 2), ValueError, "weights"),
        (lambda: weighted_em(GRID.clone().index_fill_(0, torch.tensor([3]), math.nan), W, 2), ValueError, "points"),
        (lambda: weighted_em(1e200 * GRID, W, 2), ValueError, "points"),  # covariances beyond float64
        (lambda: weighted_em(GRID, W.float(), 2), TypeError, "weights"),
        (lambda: weighted_em(GRID, W.to("meta"), 2), ValueError, "weights"),
        (lambda: weighted_em(GRID[:0], W[:0], 1), ValueError, "points"),
        (lambda: weighted_em(GRID, W, 26), ValueError, "n_components"),
        (lambda: weighted_em(GRID, W, 2, n_iter=0), ValueError, "n_iter"),
        (lambda: weighted_em(GRID, W, 2, init="nope"), ValueError, "init"),
        (lambda: weighted_em(GRID, W, 2, init=3), TypeError, "init"),
        (lambda: weighted_em(GRID, W, 2, init={"means": GRID[:2].float()}), TypeError, r"init\['means'\]"),
        (lambda: weighted_em(GRID, W, 2, init={"means": GRID[:2], "mixing": torch.tensor([1.0, 0.0], dtype=F64)}),
         ValueError, r"init\['mixing'\]"),
        (lambda: weighted_em(GRID, W, 2, generator="seed"), TypeError, "generator"),
        (lambda: weighted_log_likelihood(GRID, W, *_standard_mixture()[:1], -torch.eye(2, dtype=F64)[None],
                                         _standard_mixture()[2]), ValueError, "covariances"),
        (lambda: weighted_log_likelihood(GRID, W, *_standard_mixture()[:2], torch.tensor([0.5], dtype=F64)),
         ValueError, "mixing"),
        (lambda: weighted_log_likelihood(GRID, W, _standard_mixture()[0].float(), *_standard_mixture()[1:]),
         TypeError, "means"),
        (lambda: weighted_log_likelihood(GRID, W, _standard_mixture(d=3)[0], *_standard_mixture()[1:]),
         ValueError, "means"),
        (lambda: select_components(GRID, W, penalty=-0.1), ValueError, "penalty"),
        (lambda: select_components(GRID, W, init="regions"), ValueError, "init"),
        (lambda: select_components(GRID, W, max_components=30), ValueError, "max_components"),
        (lambda: region_labels(GRID, 0), ValueError, "n_components"),
        (lambda: region_labels(torch.full((3, 2), math.nan), 2), ValueError, "points"),
        (lambda: region_labels(torch.zeros(3, 0), 2), ValueError, "points"),
        (lambda: region_labels(torch.zeros(3, 2, dtype=torch.long), 2), TypeError, "points"),
        (lambda: MultimodalContinuousAttention(BASIS, GRID, "many"), ValueError, "n_components"),
        (lambda: MultimodalContinuousAttention(BASIS, GRID, 2, init="centre"), ValueError, "init"),
        (lambda: MultimodalContinuousAttention(BASIS, GRID, 2, cov_floor=-1e-6), ValueError, "cov_floor"),
        (lambda: MultimodalContinuousAttention(BASIS, GRID, 2, differentiate_em="yes"), TypeError, "differentiate_em"),
        (lambda: MultimodalContinuousAttention(BASIS, GRID.clone().fill_(math.nan), 2), ValueError, "locations"),
        (lambda: MultimodalContinuousAttention(BASIS, GRID, 2, padding=torch.zeros(4, 3, dtype=F64)), ValueError,
         "padding"),
        (lambda: _module()(torch.full((25,), math.nan, dtype=F64), torch.ones(25, 3, dtype=F64)), ValueError, "scores"),
        (lambda: _module()(torch.full((25,), math.inf, dtype=F64), torch.ones(25, 3, dtype=F64)), ValueError, "scores"),
        (lambda: _module()(torch.zeros(25, dtype=F64), torch.ones(25, 3)), TypeError, "values"),
        (lambda: _module()(torch.zeros(25, dtype=F64, device="meta"), torch.ones(25, 3, dtype=F64, device="meta")),
         ValueError, "scores"),
        (lambda: _module()(torch.zeros(2, 25, dtype=F64), torch.ones(3, 25, 3, dtype=F64)), ValueError, "values"),
    ],
)
def test_mixture_bad_input(call, error, name):
    with pytest.raises(error, match=name):
        call()


# --------------------------------------------------------------------------------------------
# mixture: edge inputs and their documented results
# --------------------------------------------------------------------------------------------


def test_weighted_em_cov_floor_zero_on_collinear_and_duplicate_points_is_finite():
    line = torch.linspace(0, 1, 10, dtype=F64)
    for pts in (torch.stack([line, line], -1), torch.ones(10, 2, dtype=F64)):
        for init in ("kmeans++", "random", "regions"):
            fit = weighted_em(pts, torch.ones(10, dtype=F64), 2, n_iter=10, init=init, tol=None, cov_floor=0.0)
            assert all(torch.isfinite(t).all() for t in fit[:5])
            assert (torch.linalg.eigvalsh(fit.covariances) > 0).all()


def test_weighted_em_empty_batch_gives_empty_parameters():
    fit = weighted_em(GRID, torch.ones(0, 25, dtype=F64), 3, n_iter=2, tol=None)
    assert fit.means.shape == (0, 3, 2) and fit.covariances.shape == (0, 3, 2, 2)
    assert fit.mixing.shape == (0, 3) and fit.log_likelihood.shape == (0,) and fit.history.shape == (2, 0)


def test_weighted_log_likelihood_of_zero_weights_is_zero():
    ll = weighted_log_likelihood(GRID, torch.zeros(25, dtype=F64), *_standard_mixture())
    assert ll.item() == 0.0


def test_region_labels_edges():
    assert region_labels(torch.zeros(0, 2), 3).shape == (0, 3)
    same = region_labels(torch.ones(4, 2), 2)  # a box of zero width: every point in the first region
    assert torch.equal(same, torch.tensor([[1.0, 0.0]]).expand(4, 2))


def test_module_edges_empty_batch_and_masked_rows():
    mm = _module()
    assert mm(torch.zeros(0, 25, dtype=F64), torch.ones(0, 25, 3, dtype=F64)).shape == (0, 3)
    scores = torch.zeros(2, 25, dtype=F64)
    scores[0] = -math.inf
    context = mm(scores, torch.ones(2, 25, 3, dtype=F64))
    assert torch.equal(context[0], torch.zeros(3, dtype=F64)) and torch.isfinite(context).all()


# --------------------------------------------------------------------------------------------
# mixture: properties of weighted EM
# --------------------------------------------------------------------------------------------


@st.composite
def point_sets(draw):
    """Points in general position, on a line, coincident, or with duplicates; weights with zeros."""
    n = draw(st.integers(1, 8))
    d = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kind = draw(st.sampled_from(["general", "line", "coincident", "duplicates"]))
    magnitude = 10.0 ** draw(st.integers(-6, 6))
    x = torch.randn(n, d, generator=g, dtype=F64)
    if kind == "line":
        x = torch.randn(n, 1, generator=g, dtype=F64) * torch.randn(1, d, generator=g, dtype=F64) + x[:1]
    elif kind == "coincident":
        x = x[:1].expand(n, d)
    elif kind == "duplicates":
        x = x[torch.randint(0, max(1, n // 2), (n,), generator=g)]
    w = torch.rand(n, generator=g, dtype=F64) * (torch.rand(n, generator=g) < 0.7)
    w[0] = w[0] + 0.5
    return magnitude * x, w


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(point_sets(), st.integers(1, 3), st.sampled_from(["kmeans++", "random", "regions"]),
       st.sampled_from([0.0, 1e-6]), st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
def test_em_finite_in_finite_out_and_dtype_preserved(data, k, init, cov_floor, dtype):
    x, w = data
    k = min(k, x.shape[0])
    fit = weighted_em(x.to(dtype), w.to(dtype), k, n_iter=6, init=init, tol=None, cov_floor=cov_floor,
                      generator=torch.Generator().manual_seed(0))
    for t in fit[:5]:
        assert t.dtype == dtype and torch.isfinite(t).all()
    assert (torch.linalg.eigvalsh(fit.covariances.double()) > 0).all()
    torch.testing.assert_close(fit.mixing.double().sum(-1), torch.ones((), dtype=F64), atol=1e-2, rtol=0)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(2, 4))
def test_em_batching_equals_looping_with_a_fixed_init(seed, k, batch):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(batch, 25, generator=g, dtype=F64) ** 3
    init = {"means": torch.rand(batch, k, 2, generator=g, dtype=F64),
            "covariances": 0.05 * torch.eye(2, dtype=F64) + 0.01 * torch.rand(batch, k, 1, 1, generator=g, dtype=F64),
            "mixing": torch.rand(batch, k, generator=g, dtype=F64) + 0.1}
    together = weighted_em(GRID, w, k, n_iter=8, init=init, tol=None, cov_floor=0.0)
    for i in range(batch):
        alone = weighted_em(GRID, w[i], k, n_iter=8, init={key: v[i] for key, v in init.items()}, tol=None, cov_floor=0.0)
        for a, b in zip(together[:4], alone[:4]):
            torch.testing.assert_close(a[i], b, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(together.history[:, i], alone.history, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------------------------
# vqa
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_batch():
    return vqa_data.make_batch(4, torch.Generator().manual_seed(0), questions_per_scene=2)


@pytest.fixture(scope="module")
def tiny_features(tiny_batch):
    torch.manual_seed(0)
    return vqa.encode(vqa.GridEncoder(channels=4), tiny_batch)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return vqa.VQAModel("continuous_softmax", hidden=16, embedding_dim=8)


@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: vqa_data.decode(torch.tensor([1, 2, 999])), ValueError, "tokens"),
        (lambda: vqa_data.decode(torch.tensor([1, -1])), ValueError, "tokens"),
        (lambda: vqa_data.decode(torch.tensor([1.0, 2.0])), TypeError, "tokens"),
        (lambda: vqa_data.decode(torch.zeros(2, 2, 2, dtype=torch.long)), ValueError, "tokens"),
        (lambda: vqa_data.answer_text(len(vqa_data.ANSWERS)), ValueError, "answers"),
        (lambda: vqa_data.answer_text(torch.tensor([0.5])), TypeError, "answers"),
        (lambda: vqa.attention_precision(torch.full((2, 3, 3), math.nan), torch.ones(2, 3, 3, dtype=torch.bool)),
         ValueError, "attention_map"),
        (lambda: vqa.attention_precision(torch.full((3, 3), math.inf), torch.ones(3, 3, dtype=torch.bool)),
         ValueError, "attention_map"),
        (lambda: vqa.attention_precision(-torch.ones(3, 3), torch.ones(3, 3, dtype=torch.bool)),
         ValueError, "attention_map"),
        (lambda: vqa.attention_precision(torch.ones(3, 3), torch.full((3, 3), math.nan)), ValueError, "gt_mask"),
        (lambda: vqa.attention_precision(torch.ones(2, 3, 3), torch.ones(3, 3, 3)), ValueError, "gt_mask"),
        (lambda: vqa.attention_precision(torch.ones(3, 3), "mask"), TypeError, "gt_mask"),
        (lambda: vqa_data.make_batch(2.5), TypeError, "n_scenes"),
        (lambda: vqa_data.make_batch(0), ValueError, "n_scenes"),
        (lambda: vqa_data.make_batch(4, canvas=50), ValueError, "canvas"),
        (lambda: vqa_data.make_batch(4, min_objects=5, max_objects=3), ValueError, "min_objects"),
        (lambda: vqa_data.make_batch(4, max_objects=7), ValueError, "max_objects"),
        (lambda: vqa_data.make_batch(4, noise=-0.1), ValueError, "noise"),
        (lambda: vqa_data.make_batch(4, generator=0), TypeError, "generator"),
        (lambda: vqa_data.SyntheticVQA(0), ValueError, "n_scenes"),
        (lambda: vqa_data.SyntheticVQA(4, seed=2**70), ValueError, "seed"),
        (lambda: vqa_data.SyntheticVQA(4, device="nonsense"), ValueError, "device"),
        (lambda: vqa.VQAModel(3), TypeError, "head"),
        (lambda: vqa.VQAModel("nope"), ValueError, "head"),
        (lambda: vqa.VQAModel("discrete", grid=1), ValueError, "grid"),
        (lambda: vqa.VQAModel("discrete", hidden=2.5), TypeError, "hidden"),
        (lambda: vqa.VQAModel("discrete", uniform_mix=1.5), ValueError, "uniform_mix"),
        (lambda: vqa.VQAModel("discrete", basis_sigma=0.0), ValueError, "basis_sigma"),
        (lambda: vqa.VQAModel("discrete", penalty=-1.0), ValueError, "penalty"),
        (lambda: vqa.VQAModel("mixture", mixture_kwargs={"n_iterations": 3}), TypeError, "mixture_kwargs"),
        (lambda: vqa.VQAModel("mixture", mixture_kwargs=[("n_iter", 3)]), TypeError, "mixture_kwargs"),
        (lambda: vqa.GridEncoder(grid=1), ValueError, "grid"),
        (lambda: vqa.GridEncoder(channels=0), ValueError, "channels"),
        (lambda: vqa.GridEncoder(channels=2.5), TypeError, "channels"),
        (lambda: vqa.GridEncoder()(torch.rand(2, 4, 56, 56)), ValueError, "images"),
        (lambda: vqa.GridEncoder()(torch.zeros(2, 3, 56, 56, dtype=torch.long)), TypeError, "images"),
        (lambda: vqa.GridEncoder()(torch.full((1, 3, 56, 56), math.nan)), ValueError, "images"),
        (lambda: vqa.swap_head("model", "mixture"), TypeError, "model"),
        (lambda: vqa.swap_head(vqa.VQAModel(), "nope"), ValueError, "head"),
        (lambda: vqa.swap_head(vqa.VQAModel(), "mixture", grid=7), TypeError, "grid"),
    ],
)
def test_vqa_bad_input(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_vqa_model_forward_bad_input(tiny_model, tiny_batch, tiny_features):
    f, q = tiny_features[tiny_batch.scene], tiny_batch.questions
    with pytest.raises(TypeError, match="questions"):
        tiny_model(f, q.float())
    with pytest.raises(ValueError, match="questions"):
        tiny_model(f, q + len(vqa_data.VOCAB))
    with pytest.raises(ValueError, match="questions"):
        tiny_model(f, q[:3])
    with pytest.raises(ValueError, match="features"):
        tiny_model(f[..., :5], q)
    with pytest.raises(ValueError, match="features"):
        tiny_model(f.clone().fill_(math.nan), q)
    with pytest.raises(TypeError, match="features"):
        tiny_model(f.long(), q)


def test_vqa_encoder_train_evaluate_sweep_and_maps_bad_input(tiny_model, tiny_batch, tiny_features):
    b, f = tiny_batch, tiny_features
    encoder = vqa.GridEncoder(channels=4)
    with pytest.raises(TypeError, match="encoder"):
        vqa.pretrain_encoder("encoder", b)
    with pytest.raises(ValueError, match="epochs"):
        vqa.pretrain_encoder(encoder, b, epochs=0)
    with pytest.raises(ValueError, match="lr"):
        vqa.pretrain_encoder(encoder, b, lr=-1.0)
    with pytest.raises(ValueError, match="object_weight"):
        vqa.pretrain_encoder(encoder, b, object_weight=-1.0)
    with pytest.raises(TypeError, match="progress"):
        vqa.pretrain_encoder(encoder, b, progress="no")
    with pytest.raises(ValueError, match="multiple"):
        vqa.pretrain_encoder(vqa.GridEncoder(grid=13), b)
    with pytest.raises(TypeError, match="encoder"):
        vqa.encode(tiny_model, b)
    with pytest.raises(TypeError, match="data"):
        vqa.encode(encoder, [1, 2])
    with pytest.raises(ValueError, match="batch_size"):
        vqa.encode(encoder, b, batch_size=0)
    with pytest.raises(TypeError, match="model"):
        vqa.train("model", b, f)
    with pytest.raises(ValueError, match="epochs"):
        vqa.train(tiny_model, b, f, epochs=0)
    with pytest.raises(ValueError, match="lr"):
        vqa.train(tiny_model, b, f, lr=0.0)
    with pytest.raises(ValueError, match="attention_supervision"):
        vqa.train(tiny_model, b, f, attention_supervision=-1.0)
    with pytest.raises(TypeError, match="progress"):
        vqa.train(tiny_model, b, f, progress="no")
    with pytest.raises(TypeError, match="on_epoch"):
        vqa.train(tiny_model, b, f, on_epoch="evaluate")
    with pytest.raises(ValueError, match="data"):
        vqa.train(tiny_model, b.index(slice(0, 0)), f)
    with pytest.raises(ValueError, match="features"):
        vqa.train(tiny_model, b, f[:2])
    with pytest.raises(TypeError, match="data"):
        vqa.train(tiny_model, [1], f)
    other = vqa.VQAModel("continuous_softmax")
    with pytest.raises(TypeError, match="models"):
        vqa.train_seeds(tiny_model, b, f, seeds=[0])
    with pytest.raises(ValueError, match="at least one"):
        vqa.train_seeds([], b, f, seeds=[])
    with pytest.raises(TypeError, match=r"models\[1\]"):
        vqa.train_seeds([tiny_model, "model"], b, f, seeds=[0, 1])
    with pytest.raises(ValueError, match="distinct"):
        vqa.train_seeds([tiny_model, tiny_model], b, f, seeds=[0, 1])
    with pytest.raises(ValueError, match="another head"):
        vqa.train_seeds([tiny_model, other], b, f, seeds=[0, 1])
    with pytest.raises(ValueError, match="one seed per model"):
        vqa.train_seeds([tiny_model], b, f, seeds=[0, 1])
    with pytest.raises(TypeError, match="seeds"):
        vqa.train_seeds([tiny_model], b, f, seeds=0)
    with pytest.raises(ValueError, match="epochs"):
        vqa.train_seeds([tiny_model], b, f, seeds=[0], epochs=0)
    with pytest.raises(TypeError, match="on_epoch"):
        vqa.train_seeds([tiny_model], b, f, seeds=[0], on_epoch="evaluate")
    with pytest.raises(ValueError, match="features"):
        vqa.train_seeds([tiny_model], b, f[:2], seeds=[0])
    with pytest.raises(ValueError, match="batch_size"):
        vqa.evaluate(tiny_model, b, f, batch_size=0)
    with pytest.raises(ValueError, match="features"):
        vqa.evaluate(tiny_model, b, f[..., :3])
    with pytest.raises(ValueError, match="penalties"):
        vqa.selection_sweep(tiny_model, b, f, [-1.0])
    with pytest.raises(ValueError, match="penalties"):
        vqa.selection_sweep(tiny_model, b, f, [])
    with pytest.raises(TypeError, match="penalties"):
        vqa.selection_sweep(tiny_model, b, f, 0.1)
    with pytest.raises(ValueError, match="penalties must be distinct"):
        vqa.selection_sweep(tiny_model, b, f, [0.1, 1.0, 0.1])
    with pytest.raises(ValueError, match="n_init"):
        vqa.selection_sweep(tiny_model, b, f, [0.1], n_init=0)
    with pytest.raises(ValueError, match="continuous head"):
        vqa.selection_sweep(vqa.VQAModel("discrete"), b, f, [0.1])
    with torch.no_grad():
        out = tiny_model(f[b.scene], b.questions)
    with pytest.raises(ValueError, match="resolution"):
        vqa.attention_map(out, 0)
    with pytest.raises(TypeError, match="resolution"):
        vqa.attention_map(out, 2.5)
    with pytest.raises(TypeError, match="output"):
        vqa.attention_map(out.logits)


def test_vqa_edges():
    assert vqa_data.decode(torch.tensor([], dtype=torch.long)) == ""
    assert vqa_data.decode(torch.zeros(0, 10, dtype=torch.long)) == []
    assert vqa_data.answer_text([]) == []
    assert vqa.attention_precision(torch.ones(0, 3, 3), torch.ones(0, 3, 3, dtype=torch.bool)).shape == (0,)
    assert vqa.attention_precision(torch.zeros(3, 3), torch.ones(3, 3, dtype=torch.bool)).item() == 0.0  # no mass
    # a one-cell softmax (covariance 0) still draws: a map that sums to one
    model = vqa.VQAModel("continuous_sparsemax", hidden=8, embedding_dim=4).eval()
    with torch.no_grad():
        model.query.weight.zero_()
        model.query.bias.copy_(torch.tensor([0.0] * 11 + [400.0, 400.0]))  # scores peak at the last cell
        out = model(torch.cat([torch.zeros(1, 196, 11), grid_locations(14)[None]], -1), torch.tensor([[1, 2]]))
    assert torch.allclose(vqa.attention_map(out).sum(), torch.tensor(1.0))


# --------------------------------------------------------------------------------------------
# book helpers, pretrained, plotting
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: book.pick_device("nonsense"), ValueError, r"device.*'cpu'"),  # lists what is accepted
        (lambda: book.pick_device(0), TypeError, "device"),
        (lambda: book.seed_everything(2**70), ValueError, r"seed.*2\*\*64"),  # names the accepted range
        (lambda: book.seed_everything(-(2**63) - 1), ValueError, "seed"),
        (lambda: book.seed_everything(1.0), TypeError, "seed"),
        (lambda: book.check_scale("huge"), ValueError, "scale"),
        (lambda: book.check_scale(1), TypeError, "scale"),
        (lambda: book.record("a/b", x=1), ValueError, "name"),
        (lambda: book.record(3, x=1), TypeError, "name"),
        (lambda: pretrained.load_pretrained(3), TypeError, "name"),
        (lambda: pretrained.load_pretrained("gpt-2", online=True), ValueError, "name"),
        (lambda: pretrained.load_pretrained("bert-base-uncased", online="yes"), TypeError, "online"),
        (lambda: pretrained.load_pretrained("bert-base-uncased", online=True, device="nonsense"), ValueError, "device"),
        (lambda: pretrained.attention_inputs("model", lambda *a, **k: None, "x"), TypeError, "model"),
        (lambda: pretrained.attention_inputs(torch.nn.Linear(1, 1), 3, "x"), TypeError, "tokenizer"),
        (lambda: pretrained.attention_inputs(torch.nn.Linear(1, 1), lambda *a, **k: None, "x", max_length=0),
         ValueError, "max_length"),
        (lambda: plotting.attention_heatmap(torch.full((2, 2), math.nan)), ValueError, "weights"),
        (lambda: plotting.small_multiples(0), ValueError, "n"),
    ],
)
def test_helpers_bad_input(call, error, name):
    with pytest.raises(error, match=name):
        call()


@pytest.mark.parametrize("accelerator", ["cuda", "mps"])
def test_pick_device_refuses_an_accelerator_this_machine_lacks(accelerator):
    available = torch.cuda.is_available() if accelerator == "cuda" else torch.backends.mps.is_available()
    if available:
        assert book.pick_device(accelerator).type == accelerator
    else:
        with pytest.raises(ValueError, match="device"):
            book.pick_device(accelerator)


def test_seed_everything_accepts_the_whole_range():
    for seed in (-(2**63), -1, 0, 2**64 - 1):
        a = torch.rand(3, generator=book.seed_everything(seed))
        assert torch.equal(a, torch.rand(3, generator=book.seed_everything(seed)))


def test_record_refuses_what_json_cannot_hold_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(book.RESULTS_ENV, str(tmp_path))
    with pytest.raises(TypeError, match="model"):
        book.record("demo", value=1.0, model=torch.nn.Linear(1, 1))
    assert not (tmp_path / "demo.json").exists()
    path = book.record("demo", nan=torch.tensor(math.nan), inf=float("inf"), xs=torch.arange(3))
    assert json.loads(path.read_text()) == {"nan": "nan", "inf": "inf", "xs": [0, 1, 2]}
