"""Tests for attnopt.vqa_data (the synthetic VQA task) and attnopt.vqa (the frozen grid features,
the heads, maps and training).

Answers and masks are checked against an independent reading of the scene (the object table and
the question *text*, parsed here), densities against moments computed here from the softmax, not
against the module's own bookkeeping.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import fields

import pytest
import torch

from attnopt import vqa, vqa_data
from attnopt.course import _vqa_scenes
from attnopt.mixture import select_components
from attnopt.value_functions import grid_locations

RGB = torch.tensor(
    [(0.90, 0.10, 0.10), (0.10, 0.75, 0.20), (0.15, 0.30, 0.95), (0.95, 0.90, 0.10), (0.60, 0.20, 0.80), (0.10, 0.85, 0.90)]
)
BACKGROUND = torch.tensor([0.15, 0.15, 0.15])

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(one_thread):
    return vqa_data.make_batch(120, torch.Generator().manual_seed(11))


@pytest.fixture(scope="module")
def features(data):
    torch.manual_seed(0)
    return vqa.encode(vqa.GridEncoder(), data)


@pytest.fixture(scope="module")
def oracle_features(data):
    """What a perfect encoder would give: the share of each cell on each colour and shape."""
    colour, shape = _vqa_scenes.cell_targets(data, torch.arange(data.n_scenes), data.grid)
    probs = torch.cat([colour, shape], 1).flatten(2).transpose(1, 2)
    return torch.cat([probs, grid_locations(data.grid).expand(data.n_scenes, -1, -1)], -1)


def test_determinism_by_seed():
    a = vqa_data.SyntheticVQA(20, seed=5, questions_per_scene=3)
    b = vqa_data.SyntheticVQA(20, seed=5, questions_per_scene=3)
    c = vqa_data.SyntheticVQA(20, seed=6, questions_per_scene=3)
    for f in fields(a.data):
        assert torch.equal(getattr(a.data, f.name), getattr(b.data, f.name)), f.name
    assert not torch.equal(a.data.images, c.data.images)
    assert len(a) == 60 and a.data.n_scenes == 20
    item = a[4]
    assert torch.equal(item["image"], a.data.images[1]) and torch.equal(item["question"], a.data.questions[4])


def test_scenes_are_valid(data):
    n_obj = data.present.sum(-1)
    assert (n_obj >= 4).all() and (n_obj <= 6).all()
    for s in range(data.n_scenes):
        colours = [o["colour"] for o in data.scene_description(s)]
        assert len(set(colours)) == len(colours)  # distinct colours: a colour names one object
    # objects do not overlap (bounding circles apart) and each one shows its exact colour
    c, p = data.centres, data.present
    d = torch.linalg.vector_norm(c[:, :, None] - c[:, None, :], dim=-1)
    pair = p[:, :, None] & p[:, None, :] & ~torch.eye(p.shape[1], dtype=torch.bool)
    assert (d[pair] > 2 * 0.085 * 1.25).all()
    for s in range(20):
        img = data.images[s].permute(1, 2, 0).reshape(-1, 3)
        for o in data.scene_description(s):
            assert ((img - RGB[vqa_data.COLOURS.index(o["colour"])]).abs().amax(-1) < 1e-6).sum() > 20


def _recompute(objs, text):
    """(answer, relevant colours) of a question text about a scene, from the object list."""
    w = text.split()
    by_colour = {o["colour"]: o for o in objs}
    if text.startswith("what shape is the"):
        return by_colour[w[4]]["shape"], {w[4]}
    if text.startswith("is the") and w[-2] == "left":
        x = by_colour[w[2]]["x"]
        assert abs(x - 0.5) > 0.05  # unambiguous
        return ("yes" if x < 0.5 else "no"), {w[2]}
    if " same shape as " in text:
        a, b = by_colour[w[2]], by_colour[w[9]]
        assert a is not b
        return ("yes" if a["shape"] == b["shape"] else "no"), {w[2], w[9]}
    if text.startswith("how many"):
        of_shape = [o for o in objs if o["shape"] + "s" == w[2]]
        return str(len(of_shape)), {o["colour"] for o in of_shape}
    raise AssertionError(f"unknown question {text!r}")


def test_answers_and_types_consistent_with_the_scene(data):
    seen = set()
    for i in range(len(data)):
        text = data.question_text(i)
        s = int(data.scene[i])
        objs = data.scene_description(s)
        answer, colours = _recompute(objs, text)
        assert answer == data.answer_text(i), (i, text)
        expect = "yes/no" if answer in ("yes", "no") else ("number" if answer.isdigit() else "other")
        assert vqa_data.ANSWER_TYPES[int(data.answer_types[i])] == expect
        relevant = {objs[j]["colour"] for j, o in enumerate(objs) if bool(data.relevant[i, o["slot"]])}
        assert relevant == colours
        seen.add(vqa_data.FAMILIES[int(data.families[i])][0])
    assert seen == {f for f, _, _ in vqa_data.FAMILIES}


def test_a_question_only_model_stays_near_chance(data):
    """The best answer given the question text alone (fitted on the same data: an upper bound)."""
    bigger = vqa_data.make_batch(600, torch.Generator().manual_seed(3), questions_per_scene=5)
    counts = defaultdict(Counter)
    for q, a in zip(vqa_data.decode(bigger.questions), bigger.answers.tolist()):
        counts[q][a] += 1
    best = {q: c.most_common(1)[0][1] for q, c in counts.items()}
    by_type = defaultdict(lambda: [0, 0])
    for q, t in zip(vqa_data.decode(bigger.questions), bigger.answer_types.tolist()):
        by_type[t][0] += best[q] / sum(counts[q].values())
        by_type[t][1] += 1
    prior = {vqa_data.ANSWER_TYPES[t]: s / n for t, (s, n) in by_type.items()}
    assert prior["yes/no"] < 0.6 and prior["other"] < 0.5 and prior["number"] < 0.6, prior


def test_masks_cover_the_named_objects(data):
    img = data.images.permute(0, 2, 3, 1)  # (S, H, W, 3)
    bg = (img - BACKGROUND).abs().amax(-1) < 1e-6
    masks = data.masks
    for i in range(len(data)):
        s = int(data.scene[i])
        _, colours = _recompute(data.scene_description(s), data.question_text(i))
        expect = torch.zeros_like(masks[i])
        for c in colours:
            expect |= (img[s] - RGB[vqa_data.COLOURS.index(c)]).abs().amax(-1) < 1e-6
        assert torch.equal(masks[i], expect) and not (masks[i] & bg[s]).any()
    # grid masks: a cell is marked iff one of its pixels is
    cell = masks.shape[-1] // data.grid
    blocks = masks.reshape(len(data), data.grid, cell, data.grid, cell).any(-1).any(-2)
    assert torch.equal(blocks, data.grid_masks)
    two = data.families == [f for f, *_ in vqa_data.FAMILIES].index("same_shape")
    assert (data.relevant[two].sum(-1) == 2).all()


def test_decode_and_answer_text():
    words = "is the red object the same shape as the blue object ?".split()
    q = torch.tensor([vqa_data.VOCAB.index(w) for w in words] + [0])
    assert vqa_data.decode(q) == " ".join(words)
    assert vqa_data.decode(q[None].repeat(2, 1)) == [" ".join(words)] * 2
    assert vqa_data.answer_text(torch.tensor(1)) == "yes" and vqa_data.answer_text([2, 8]) == ["1", "circle"]


def test_grid_encoder_learns_the_cells_and_encode_is_its_eval_forward():
    torch.manual_seed(0)
    scenes = vqa_data.make_batch(48, torch.Generator().manual_seed(1), questions_per_scene=1)
    encoder = vqa.GridEncoder(channels=8)
    history = vqa.pretrain_encoder(encoder, scenes, epochs=3, batch_size=8, lr=1e-2)
    assert history["loss"][-1] < 0.7 * history["loss"][0]
    f = vqa.encode(encoder, scenes, batch_size=20)
    assert f.shape == (48, 196, len(vqa.FEATURES)) and not f.requires_grad
    with torch.no_grad():
        assert torch.allclose(f[:5], encoder.eval()(scenes.images[:5]), atol=1e-6)
    # probabilities per cell, then the coordinates of the cell (row, column)
    assert torch.allclose(f[..., :7].sum(-1), torch.ones(48, 196), atol=1e-5)
    assert torch.allclose(f[..., 7:11].sum(-1), torch.ones(48, 196), atol=1e-5)
    assert torch.allclose(f[0, :, -2:], grid_locations(14))


def _weights_and_moments(model, features, questions):
    """The softmax of the model's cell scores and its mean and covariance, computed here."""
    with torch.no_grad():
        e = model.embed(questions).sum(-2)
        w = torch.softmax(torch.einsum("bld,bd->bl", features, model.query(e)), -1).double()
    t = grid_locations(14).double()
    mu = w @ t
    z = t[None] - mu[:, None]
    return w, mu, torch.einsum("bl,bli,blj->bij", w, z, z)


@pytest.mark.parametrize("head", ["discrete", "continuous_softmax", "continuous_sparsemax"])
def test_heads_forward_backward_and_maps(head, data, features):
    torch.manual_seed(0)
    model = vqa.VQAModel(head, hidden=16, embedding_dim=8)
    b = data.index(slice(0, 8))
    f = features[b.scene]
    out = model(f, b.questions)
    assert out.logits.shape == (8, len(vqa_data.ANSWERS))
    torch.nn.functional.cross_entropy(out.logits, b.answers).backward()
    g = model.query.weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    for res in (14, 28):
        A = vqa.attention_map(out, res).detach()
        assert A.shape == (8, res, res) and (A >= 0).all()
        assert torch.allclose(A.sum((-2, -1)), torch.ones(8), atol=1e-4)
    w, mu, V = _weights_and_moments(model, f, b.questions)
    att = out.attention.detach()
    assert torch.allclose(att.weights.flatten(1).double(), w, atol=1e-6)
    if head == "discrete":
        assert att.density is None and torch.allclose(vqa.attention_map(att).flatten(1).double(), w, atol=1e-6)
        return
    density = att.density
    assert density.means.shape == (8, 1, 2) and torch.equal(density.mixing, torch.ones(8, 1))
    assert torch.allclose(density.means[:, 0].double(), mu, atol=1e-5)  # moment matching, Alg. 2
    assert torch.allclose(density.covariances[:, 0].double(), V, atol=1e-5)
    A = vqa.attention_map(att, 28).double()
    u = (torch.arange(28, dtype=torch.float64) + 0.5) / 28
    t1 = (u * 14 - 0.5) / 13
    tt = torch.stack(torch.meshgrid(t1, t1, indexing="ij"), -1)  # (28, 28, 2)
    V = V + 1e-6 * torch.eye(2, dtype=torch.float64)
    z = tt[None] - mu[:, None, None]
    quad = torch.einsum("bhwi,bij,bhwj->bhw", z, torch.linalg.inv(V), z)
    if head == "continuous_softmax":
        d = torch.exp(-0.5 * quad)
        assert torch.allclose(A, d / d.sum((-2, -1), keepdim=True), atol=1e-5)
    else:  # truncated paraboloid with covariance V: support quad < (D + 4) = 6 in Mahalanobis units of V
        assert (A[quad > 6.0 * 1.001] == 0).all() and (A[quad < 6.0 * 0.999] > 0).all()


@pytest.mark.parametrize("head", ["mixture", "mixture_selected"])
def test_mixture_heads(head, data, features):
    b = data.index(slice(0, 6))
    kw = {"n_iter": 3, "n_init": 1} if head == "mixture_selected" else {"n_iter": 3}
    model = vqa.VQAModel(head, hidden=16, embedding_dim=8, n_components=3, mixture_kwargs=kw)
    out = model(features[b.scene], b.questions)
    out.logits.sum().backward()
    assert model.query.weight.grad is not None and torch.isfinite(model.query.weight.grad).all()
    density = out.attention.density
    assert density.means.shape == (6, 3, 2) and density.covariances.shape == (6, 3, 2, 2)
    assert torch.allclose(density.mixing.sum(-1), torch.ones(6), atol=1e-5)
    k = out.attention.n_components
    assert ((k >= 1) & (k <= 3)).all()
    if head == "mixture":
        assert (k == 3).all()
    A = vqa.attention_map(out, 28).detach()
    assert (A >= 0).all() and torch.allclose(A.sum((-2, -1)), torch.ones(6), atol=1e-4)


def test_swap_head_keeps_every_other_weight(data, features):
    torch.manual_seed(0)
    model = vqa.VQAModel("continuous_softmax", hidden=16, embedding_dim=8).eval()
    b = data.index(slice(0, 5))
    same = vqa.swap_head(model, "continuous_softmax")
    assert torch.equal(same(features[b.scene], b.questions).logits, model(features[b.scene], b.questions).logits)
    other = vqa.swap_head(model, "mixture", n_components=2)
    assert other.head_name == "mixture" and not other.training
    for name, p in other.named_parameters():
        assert torch.equal(p, dict(model.named_parameters())[name])
    with pytest.raises(TypeError, match="hidden"):
        vqa.swap_head(model, "mixture", hidden=8)


def test_selection_sweep_against_select_components(data, features):
    torch.manual_seed(0)
    model = vqa.VQAModel("continuous_softmax", hidden=16, embedding_dim=8).eval()
    b = data.index(slice(0, 30))
    penalties = [0.0, 0.05, 1000.0]
    sweep = vqa.selection_sweep(model, b, features, penalties, max_components=3, n_init=2, n_iter=5, seed=1)
    assert list(sweep) == penalties
    for p in penalties:
        assert math.isclose(sum(sweep[p]["k_star_shares"]), 1.0, abs_tol=1e-6) and sweep[p]["n"] == 30
    assert sweep[1000.0]["k_star_shares"] == [1.0, 0.0, 0.0]  # a huge penalty keeps one Gaussian
    mean_k = [sum((k + 1) * s for k, s in enumerate(sweep[p]["k_star_shares"])) for p in penalties]
    assert mean_k[0] >= mean_k[1] >= mean_k[2]
    # the same K* as a direct call of select_components at that penalty, from the same seed
    w, _, _ = _weights_and_moments(model, features[b.scene], b.questions)
    direct = select_components(grid_locations(14), w.float(), 3, 0.05, 2, 5, cov_floor=1 / (12 * 13**2),
                               generator=torch.Generator().manual_seed(1))
    shares = [float((direct.n_components == k).float().mean()) for k in (1, 2, 3)]
    assert shares == pytest.approx(sweep[0.05]["k_star_shares"], abs=0.07)
    with pytest.raises(ValueError, match="continuous head"):
        vqa.selection_sweep(vqa.VQAModel("discrete"), b, features, [0.1])


def test_attention_precision():
    mask = torch.zeros(2, 14, 14, dtype=torch.bool)
    mask[:, 2:5, 3:7] = True
    inside = mask.float() / mask.float().sum((-2, -1), keepdim=True)
    outside = (~mask).float() / (~mask).float().sum((-2, -1), keepdim=True)
    assert torch.allclose(vqa.attention_precision(inside, mask), torch.ones(2))
    assert torch.allclose(vqa.attention_precision(outside, mask), torch.zeros(2))
    assert torch.allclose(vqa.attention_precision(0.5 * inside + 0.5 * outside, mask), torch.full((2,), 0.5))
    # a canvas-resolution mask against a grid map: a cell counts if it overlaps the mask
    fine = torch.zeros(2, 56, 56, dtype=torch.bool)
    fine[:, 9:17, 13:25] = True  # overlaps grid cells rows 2..4, cols 3..6
    assert torch.allclose(vqa.attention_precision(inside, fine), torch.ones(2))


def test_training_reduces_loss_and_evaluate_reports_every_type(data, features):
    torch.manual_seed(0)
    model = vqa.VQAModel("discrete", hidden=32, embedding_dim=16)

    def full_loss():
        with torch.no_grad():
            out = model.eval()(features[data.scene], data.questions)
            return torch.nn.functional.cross_entropy(out.logits, data.answers).item()

    before = full_loss()
    history = vqa.train(model, data, features, epochs=3, batch_size=64, lr=1e-2, seed=0)
    after = full_loss()
    assert after < before - 0.3, (before, after)
    assert len(history["loss"]) == 3 and not model.training
    res = vqa.evaluate(model, data, features)
    families = (f for f, *_ in vqa_data.FAMILIES)
    assert set(res) >= {"overall", *vqa_data.ANSWER_TYPES, *families, "attention_precision", "n"}
    assert res["n"] == len(data) and 0 <= res["attention_precision"] <= 1
    # overall accuracy is the question-weighted mean of the per-type accuracies
    shares = torch.bincount(data.answer_types, minlength=3).double() / len(data)
    weighted = sum(float(s) * res[t] for s, t in zip(shares, vqa_data.ANSWER_TYPES))
    assert res["overall"] == pytest.approx(weighted, abs=1e-6)


def test_on_epoch_sees_each_epoch_in_eval_mode_and_leaves_training_unchanged(data, features):
    seen = []

    def watch(epoch, model):
        seen.append((epoch, model.training, torch.is_grad_enabled()))
        return vqa.evaluate(model, data, features)["overall"]

    runs = []
    for callback in (None, watch):
        torch.manual_seed(0)
        model = vqa.VQAModel("discrete", hidden=16, embedding_dim=8)
        runs.append((vqa.train(model, data, features, epochs=3, batch_size=64, seed=0, on_epoch=callback), model))
    (plain, plain_model), (watched, watched_model) = runs
    assert seen == [(1, False, False), (2, False, False), (3, False, False)]
    assert plain["on_epoch"] == [None] * 3
    # what the callback returned is kept, and the last one is the final model's accuracy
    assert watched["on_epoch"][-1] == vqa.evaluate(watched_model, data, features)["overall"]
    # observing (eval mode, no gradient) does not change the training: same losses, same weights
    assert watched["loss"] == plain["loss"]
    for a, b in zip(plain_model.state_dict().values(), watched_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("head, gain", [("discrete", 0.1), ("continuous_softmax", 0.03)])
def test_attention_supervision_pulls_the_head_onto_the_mask(head, gain, data, oracle_features):
    """The auxiliary loss acts on the head's own attention: its share on the relevant cells grows."""
    results = {}
    for beta in (0.0, 2.0):
        torch.manual_seed(0)
        model = vqa.VQAModel(head, hidden=16, embedding_dim=8)
        vqa.train(model, data, oracle_features, epochs=4, batch_size=64, lr=1e-2, seed=0,
                  attention_supervision=beta)
        results[beta] = vqa.evaluate(model, data, oracle_features)["attention_precision"]
    assert results[2.0] > results[0.0] + gain, results


@pytest.mark.parametrize("head", ["discrete", "continuous_softmax", "continuous_sparsemax", "mixture"])
def test_train_seeds_is_train_for_each_seed(head, data, features):
    """Seeds trained side by side (one call of the head per step for all of them) end where
    train(model, seed=s) takes each alone: the same weights, batch-norm statistics and history, up
    to rounding. (Continuous sparsemax gets a fixed quadrature here: its adaptive rule chooses the
    nodes for the whole batch, so stacked rows may get a finer rule than alone.)"""
    seeds = [3, 4, 5]
    options = {"n_quadrature": 48} if head == "continuous_sparsemax" else {}
    alone, together = [], []
    for s in seeds:
        torch.manual_seed(s)
        alone.append(vqa.VQAModel(head, **options))
        torch.manual_seed(s)
        together.append(vqa.VQAModel(head, **options))
    seen = []
    data = data.index(slice(0, 400))
    kwargs = dict(epochs=2, batch_size=64, lr=5e-3, weight_decay=1e-3)
    histories = [vqa.train(m, data, features, seed=s, **kwargs) for m, s in zip(alone, seeds)]
    joint = vqa.train_seeds(together, data, features, seeds=seeds,
                            on_epoch=lambda epoch, model: seen.append((epoch, model.training)) or epoch, **kwargs)
    tol = 1e-5
    for a, b, ha, hb in zip(alone, together, histories, joint):
        assert not b.training
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            if x.is_floating_point():
                torch.testing.assert_close(y, x, atol=tol, rtol=tol, msg=name)
            else:
                assert torch.equal(x, y), name
        assert hb["on_epoch"] == [1, 2]
        for key in ("loss", "accuracy"):
            assert hb[key] == pytest.approx(ha[key], abs=tol), key
    assert seen == [(e, False) for e in (1, 2) for _ in seeds]
    # and the seeds really differ: side by side is not one model three times
    assert not torch.equal(together[0].query.weight, together[1].query.weight)
