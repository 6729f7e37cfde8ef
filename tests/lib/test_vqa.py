"""Tests for attnopt.vqa: the synthetic VQA task, the heads, attention maps and training.

Answers and masks are checked against an independent reading of the scene (the object table and
the question *text*, parsed here), not against the generator's own bookkeeping.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import fields

import pytest
import torch

from attnopt import vqa
from attnopt.continuous import continuous_density

RGB = torch.tensor(
    [(0.90, 0.10, 0.10), (0.10, 0.75, 0.20), (0.15, 0.30, 0.95), (0.95, 0.90, 0.10), (0.60, 0.20, 0.80), (0.10, 0.85, 0.90)]
)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(one_thread):
    return vqa.make_batch(300, torch.Generator().manual_seed(11))


def _objects(b, i):
    return b.scene_description(i)


def test_determinism_by_seed():
    a = vqa.SyntheticVQA(40, seed=5)
    b = vqa.SyntheticVQA(40, seed=5)
    c = vqa.SyntheticVQA(40, seed=6)
    for f in fields(a.data):
        assert torch.equal(getattr(a.data, f.name), getattr(b.data, f.name)), f.name
    assert not torch.equal(a.data.images, c.data.images)
    assert len(a) == 40 and set(a[0]) == {f.name for f in fields(a.data)}
    assert len(a.batch(torch.arange(5))) == 5


def test_scene_is_valid(data):
    n_obj = data.present.sum(-1)
    assert (n_obj >= 2).all() and (n_obj <= 6).all()
    # objects do not overlap: the bounding circles (1.25 r) are apart
    c, r, p = data.centres, data.radii, data.present
    d = torch.linalg.vector_norm(c[:, :, None] - c[:, None, :], dim=-1)
    pair = p[:, :, None] & p[:, None, :] & ~torch.eye(p.shape[1], dtype=torch.bool)
    assert (d[pair] > 1.25 * (r[:, :, None] + r[:, None, :])[pair]).all()
    # every present object is visible: the canvas holds each scene colour
    for i in range(20):
        img = data.images[i].permute(1, 2, 0).reshape(-1, 3)
        for o in _objects(data, i):
            col = RGB[vqa.COLOURS.index(o["colour"])]
            assert (img - col).abs().amax(-1).lt(1e-6).any()


def _recompute_answer(objs, text):
    """Answer of a question text about a scene, computed from the object list."""
    w = text.split()
    if text.startswith("what colour is the"):
        (o,) = [o for o in objs if o["shape"] == w[4]]  # the referent is unique
        return o["colour"]
    if text.startswith("what shape is the"):
        (o,) = [o for o in objs if o["colour"] == w[4]]
        return o["shape"]
    if text.startswith("how many") and w[3] == "objects":
        return str(sum(o["colour"] == w[2] for o in objs))
    if text.startswith("how many"):
        return str(sum(o["shape"] + "s" == w[2] for o in objs))
    if text.startswith("is there a"):
        return "yes" if any(o["colour"] == w[3] and o["shape"] == w[4] for o in objs) else "no"
    if " left of " in text:
        (a,) = [o for o in objs if (o["colour"], o["shape"]) == (w[2], w[3])]
        (b,) = [o for o in objs if (o["colour"], o["shape"]) == (w[7], w[8])]
        assert abs(a["x"] - b["x"]) > 0.05  # unambiguous
        return "yes" if a["x"] < b["x"] else "no"
    raise AssertionError(f"unknown question {text!r}")


def test_answers_consistent_with_scene(data):
    seen = set()
    for i in range(len(data)):
        text = data.question_text(i)
        ans = _recompute_answer(_objects(data, i), text)
        assert ans == data.answer_text(i), (i, text)
        t = vqa.ANSWER_TYPES[int(data.answer_types[i])]
        expect = "yes/no" if ans in ("yes", "no") else ("number" if ans.isdigit() else "other")
        assert t == expect
        seen.add(vqa.FAMILIES[int(data.families[i])][0])
    assert seen == {f for f, _ in vqa.FAMILIES}
    yn = data.answers[data.answer_types == 0]
    assert 0.35 < (yn == vqa.ANSWERS.index("yes")).float().mean() < 0.65
    # token ids decode to the text and lengths match
    assert (data.questions != 0).sum(-1).tolist() == data.question_lengths.tolist()


def test_masks_cover_the_right_objects(data):
    img = data.images.permute(0, 2, 3, 1)  # (n, H, W, 3)
    bg = (img - torch.tensor([0.15, 0.15, 0.15])).abs().amax(-1) < 1e-6
    for i in range(len(data)):
        text, m = data.question_text(i), data.masks[i]
        w = text.split()
        assert m.any() and not (m & bg[i]).any()  # non-empty, only object pixels
        colour = None
        if text.startswith("how many") and w[3] == "objects":
            colour = w[2]
        elif text.startswith("what shape is the"):
            colour = w[4]
        elif text.startswith("what colour is the"):
            colour = data.answer_text(i)
        if colour is not None:
            of_colour = (img[i] - RGB[vqa.COLOURS.index(colour)]).abs().amax(-1) < 1e-6
            if text.startswith("what colour"):
                assert of_colour[m].all()
            else:  # all objects of that colour are relevant, and only they
                assert torch.equal(m, of_colour)
        if " left of " in text:  # both named objects' colours appear under the mask
            for c in (w[2], w[7]):
                assert ((img[i][m] - RGB[vqa.COLOURS.index(c)]).abs().amax(-1) < 1e-6).any()
    # grid masks: a cell is marked iff one of its pixels is
    cell = data.masks.shape[-1] // 14
    blocks = data.masks.reshape(len(data), 14, cell, 14, cell).any(-1).any(-2)
    assert torch.equal(blocks, data.grid_masks)


def test_decode_and_vocab():
    q = torch.tensor([vqa.VOCAB.index(w) for w in "is there a red circle ?".split()] + [0, 0])
    assert vqa.decode(q) == "is there a red circle ?"
    assert vqa.decode(q[None].repeat(2, 1)) == ["is there a red circle ?"] * 2
    assert vqa.answer_text(torch.tensor(1)) == "yes"


def _ellipse_support_check(att, res):
    """Independent check: the truncated paraboloid map is zero exactly outside its ellipse."""
    G = att.grid
    u = (torch.arange(res, dtype=torch.float64) + 0.5) / res
    t1 = (u * G - 0.5) / (G - 1)
    tt = torch.stack(torch.meshgrid(t1, t1, indexing="ij"), -1)  # (res, res, 2)
    mu, S = att.mu[:, 0].double(), att.Sigma[:, 0].double()
    z = tt[None] - mu[:, None, None]
    quad = 0.5 * torch.einsum("bhwi,bij,bhwj->bhw", z, torch.linalg.inv(S), z)
    a = (math.pi * torch.linalg.det(S).sqrt()) ** -0.5  # -lambda: pi a^2 |S|^(1/2) = 1 in 2D
    return quad, a[:, None, None]


@pytest.mark.parametrize("head", ["discrete", "continuous_softmax", "continuous_sparsemax"])
def test_head_forward_backward_and_maps(head, data):
    torch.manual_seed(0)
    model = vqa.VQAModel(head, channels=8, feature_dim=16, hidden=32)
    b = data.index(slice(0, 16))
    out = model.forward_batch(b)
    assert out.logits.shape == (16, len(vqa.ANSWERS))
    torch.nn.functional.cross_entropy(out.logits, b.answers).backward()
    g = model.cnn[0].weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    for res in (14, 28, 56):
        A = vqa.attention_map(out, res).detach()
        assert A.shape == (16, res, res) and (A >= 0).all()
        assert torch.allclose(A.sum((-2, -1)), torch.ones(16), atol=1e-4)
    att = out.attention.detach()
    if head == "discrete":
        assert torch.allclose(vqa.attention_map(att), att.scores_softmax)
    else:
        assert att.mu.shape == (16, 1, 2) and att.Sigma.shape == (16, 1, 2, 2)
        A = vqa.attention_map(att, 56)
        if head == "continuous_sparsemax":
            quad, a = _ellipse_support_check(att, 56)
            assert (A[quad > a * 1.001] == 0).all()
            assert (A[quad < a * 0.999] > 0).all()
        else:  # proportional to the Gaussian density at the cell centres
            u = (torch.arange(56) + 0.5) / 56
            t1 = (u * 14 - 0.5) / 13
            tt = torch.stack(torch.meshgrid(t1, t1, indexing="ij"), -1)
            mvn = torch.distributions.MultivariateNormal(att.mu[:, 0, None, None], att.Sigma[:, 0, None, None])
            d = mvn.log_prob(tt[None]).exp()
            assert torch.allclose(A, d / d.sum((-2, -1), keepdim=True), atol=1e-6)


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
    with pytest.raises(ValueError):
        vqa.attention_precision(-inside, mask)


def test_mixture_adapter_with_a_stand_in(monkeypatch):
    """The multimodal adapter and padded mixtures in attention_map, with a stand-in mixture module."""

    class FakeMCA(torch.nn.Module):
        def __init__(self, basis, locations, n_components=2, *, max_components=5, **kw):
            super().__init__()
            self.select = n_components == "auto"
            self.register_buffer("locations", locations)

        def forward(self, scores, values, *, return_mixture=False):
            p = torch.softmax(scores, -1)
            B = p.shape[0]
            mu = torch.tensor([[0.3, 0.3], [0.7, 0.6]]).expand(B, 2, 2) + 0 * p[:, :1, None]
            Sigma = 0.01 * torch.eye(2).expand(B, 2, 2, 2)
            w = torch.tensor([0.25, 0.75]).expand(B, 2).clone()
            if self.select:
                w[0] = torch.tensor([1.0, 0.0])  # example 0 keeps one component
            ctx = torch.einsum("bl,bld->bd", p, values)
            return (ctx, (w, mu, Sigma)) if return_mixture else ctx

    fake = types.ModuleType("attnopt.mixture")
    fake.MultimodalContinuousAttention = FakeMCA
    monkeypatch.setitem(sys.modules, "attnopt.mixture", fake)
    assert vqa.mixture_available()
    b = vqa.make_batch(4, torch.Generator().manual_seed(0))
    model = vqa.VQAModel("mixture_selected", channels=8, feature_dim=16, hidden=32, n_components=2)
    out = model.forward_batch(b)
    out.logits.sum().backward()
    assert out.attention.n_components.tolist() == [1, 2, 2, 2]
    A = vqa.attention_map(out, 28).detach()
    assert torch.allclose(A.sum((-2, -1)), torch.ones(4), atol=1e-4)
    # independent: a weighted sum of two Gaussian densities
    u = (torch.arange(28) + 0.5) / 28
    t1 = (u * 14 - 0.5) / 13
    tt = torch.stack(torch.meshgrid(t1, t1, indexing="ij"), -1)
    d = sum(
        wk * continuous_density(tt, torch.tensor(m), 0.01 * torch.eye(2))
        for wk, m in ((0.25, [0.3, 0.3]), (0.75, [0.7, 0.6]))
    )
    assert torch.allclose(A[1], d / d.sum(), atol=1e-6)


@pytest.mark.parametrize("head", ["mixture", "mixture_selected"])
def test_mixture_heads(head):
    b = vqa.make_batch(4, torch.Generator().manual_seed(0), canvas=28)
    kw = {"n_iter": 3, "n_init": 1} if head == "mixture_selected" else {"n_iter": 3}
    model = vqa.VQAModel(head, channels=8, feature_dim=16, hidden=32, n_components=3, mixture_kwargs=kw)
    out = model.forward_batch(b)
    out.logits.sum().backward()
    assert model.att_w.weight.grad is not None and torch.isfinite(model.att_w.weight.grad).all()
    att = out.attention
    assert att.mu.shape == (4, 3, 2) and att.Sigma.shape == (4, 3, 2, 2) and att.mix.shape == (4, 3)
    assert torch.allclose(att.mix.sum(-1), torch.ones(4, dtype=att.mix.dtype), atol=1e-5)
    A = vqa.attention_map(out, 28).detach()
    assert (A >= 0).all() and torch.allclose(A.sum((-2, -1)), torch.ones(4), atol=1e-4)


def test_tiny_training_reduces_loss():
    torch.manual_seed(0)
    ds = vqa.SyntheticVQA(160, seed=2, canvas=28)
    model = vqa.VQAModel("discrete", channels=8, feature_dim=16, hidden=64)

    def full_loss():
        with torch.no_grad():
            out = model.forward_batch(ds.data)
            return torch.nn.functional.cross_entropy(out.logits, ds.data.answers).item()

    before = full_loss()
    hist = vqa.train(model, ds, epochs=2, batch_size=32, lr=3e-3, seed=0, progress=False)
    after = full_loss()
    print(f"loss before {before:.3f} after {after:.3f}")
    assert after < before - 0.3
    assert len(hist["loss"]) == 2 and len(hist["step_loss"]) == 10
    res = vqa.evaluate(model, ds)
    assert set(res) >= {"overall", "yes/no", "number", "other", "attention_precision"}
    assert 0 <= res["attention_precision"] <= 1


def test_invalid_arguments():
    with pytest.raises(ValueError):
        vqa.VQAModel("nope")
    with pytest.raises(ValueError):
        vqa.make_batch(4, canvas=50)
    with pytest.raises(ValueError):
        vqa.make_batch(0)
    tiny = vqa.make_batch(4, canvas=28)
    with pytest.raises(ValueError):
        vqa.train(vqa.VQAModel(channels=4, feature_dim=8, hidden=16), tiny, epochs=1, attention_supervision=-1.0)
    with pytest.raises(TypeError):
        vqa.train(vqa.VQAModel(channels=4, feature_dim=8, hidden=16), [1, 2], epochs=1)
