r"""Scaled dot-product attention written from its definition.

For queries :math:`q_i`, keys :math:`k_j` and values :math:`v_j`,

.. math::

    s_{ij} = \frac{\langle q_i, k_j\rangle}{\sqrt{d}} + b_{ij}, \qquad
    p_{ij} = \frac{\exp s_{ij}}{\sum_{l} \exp s_{il}}, \qquad
    \operatorname{Att}(q_i) = \sum_j p_{ij}\, v_j ,

where a key that the mask forbids gets :math:`s_{ij} = -\infty`, hence weight zero.  This is the
object every chapter of the course rederives from an optimization problem; here it is only the
reference implementation, checked against :func:`torch.nn.functional.scaled_dot_product_attention`.

References:
    Vaswani et al. (2017), *Attention Is All You Need*, eq. (1).  Bahdanau, Cho and Bengio (2015),
    *Neural Machine Translation by Jointly Learning to Align and Translate*, eqs. (5)–(6).
"""

from __future__ import annotations

import math

import torch

from ._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool_mask,
    check_finite,
    check_no_overflow,
    check_positive,
    check_same_device,
    check_same_dtype,
    check_shape_match,
)

__all__ = ["attention_scores", "attention_weights", "scaled_dot_product_attention"]


def attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Scores :math:`s_{ij} = \mathrm{scale}\,\langle q_i, k_j\rangle + b_{ij}`, ``-inf`` where masked.

    The scale is applied as :math:`\sqrt{\mathrm{scale}}` to both factors before the product (as
    PyTorch's reference SDPA does), so no intermediate overflows when the scores themselves fit the
    dtype.  When they do not (e.g. entries of 1e20 in float32), the scores are not representable
    and a ``ValueError`` says so, rather than a NaN further down.

    Args:
        query: ``(..., n_queries, d)``.
        key: ``(..., n_keys, d)``; leading dimensions broadcast against ``query``'s.
        mask: optional boolean tensor broadcastable to ``(..., n_queries, n_keys)``;
            ``True`` marks a key a query may attend to (the convention of PyTorch's SDPA).
        bias: optional floating tensor broadcastable to the scores, added before the softmax
            (T5's relative-position bias, ALiBi, ...); ``-inf`` entries forbid a key.
        scale: multiplies the inner products; defaults to :math:`1/\sqrt{d}`.

    Returns:
        The ``(..., n_queries, n_keys)`` score tensor, in the dtype of ``query``.

    Raises:
        TypeError: non-floating inputs, ``query``/``key``/``bias`` of different dtypes, a mask
            that is not boolean.
        ValueError: shapes that do not match or broadcast, tensors on different devices, NaN or
            infinite ``query``/``key``, NaN or ``+inf`` ``bias``, ``scale <= 0``, scores that
            overflow the dtype.

    Examples:
        >>> q = torch.tensor([[1.0, 0.0]])
        >>> k = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
        >>> attention_scores(q, k, scale=1.0)
        tensor([[2., 0.]])
        >>> attention_scores(q, k, scale=1.0, mask=torch.tensor([[False, True]]))
        tensor([[-inf, 0.]])

    References:
        Vaswani et al. (2017), *Attention Is All You Need*, eq. (1) (the scaled inner products).
    """
    query = as_float_tensor(query, "query", min_ndim=2)
    key = as_float_tensor(key, "key", min_ndim=2)
    check_same_dtype(key, "key", query, "query")
    check_same_device(key, "key", query, "query")
    check_shape_match(query, "query", key, "key", [(-1, -1)])
    batch = broadcast_shapes(query=query.shape[:-2], key=key.shape[:-2])
    shape = tuple(batch) + (query.shape[-2], key.shape[-2])
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    else:
        scale = check_positive(scale, "scale")
    if bias is not None:
        bias = as_float_tensor(bias, "bias")
        check_same_dtype(bias, "bias", query, "query")
        check_same_device(bias, "bias", query, "query")
        if broadcast_shapes(bias=bias.shape, scores=shape) != torch.Size(shape):
            raise ValueError(f"bias of shape {tuple(bias.shape)} would enlarge the scores of shape {shape}")
        check_finite(bias, "bias", allow_neg_inf=True)
    if mask is not None:
        check_bool_mask(mask, "mask", shape, device=query.device, meaning="True = may attend; for an additive mask use bias")
    check_finite(query, "query")
    check_finite(key, "key")
    root = math.sqrt(scale)
    scores = torch.matmul(query * root, (key * root).transpose(-2, -1))
    check_no_overflow(scores, "the scaled inner products scale * <query, key>", "query or key")
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def attention_weights(scores: torch.Tensor) -> torch.Tensor:
    r"""Row-wise softmax :math:`p_{ij} = e^{s_{ij}} / \sum_l e^{s_{il}}` over the last dimension.

    A row whose scores are all ``-inf`` (a query that may attend to nothing) gets all-zero
    weights instead of NaN, so its output is the zero vector.

    Args:
        scores: ``(..., n_keys)``; ``-inf`` forbids a key.

    Returns:
        Weights shaped and typed like ``scores`` (empty for empty scores).

    Raises:
        TypeError: ``scores`` not floating.
        ValueError: NaN or ``+inf`` scores.

    Examples:
        >>> inf = float("inf")
        >>> attention_weights(torch.tensor([[0.0, 0.0], [-inf, -inf]]))
        tensor([[0.5000, 0.5000],
                [0.0000, 0.0000]])

    References:
        Vaswani et al. (2017), *Attention Is All You Need*, eq. (1) (the softmax of the scores).
    """
    scores = as_float_tensor(scores, "scores", min_ndim=1)
    check_finite(scores, "scores", allow_neg_inf=True)
    if scores.numel() == 0:
        return scores * 0
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    # Neutralise dead rows *before* the softmax: a softmax of all -inf is NaN, and NaN would leak
    # into the backward pass even where the forward replaced it.
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
    return weights.masked_fill(dead, 0.0)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Attention :math:`\operatorname{Att}(q_i)=\sum_j p_{ij} v_j` and its weights :math:`p`.

    Args:
        query: ``(..., n_queries, d)``.
        key: ``(..., n_keys, d)``.
        value: ``(..., n_keys, d_v)``.
        mask, bias, scale: as in :func:`attention_scores`.

    Returns:
        ``(output, weights)`` of shapes ``(..., n_queries, d_v)`` and ``(..., n_queries, n_keys)``.
        With no keys, the output is zero (every query is a dead row).

    Raises:
        TypeError: as :func:`attention_scores`, and a ``value`` of another dtype than ``key``.
        ValueError: as :func:`attention_scores`, and a ``value`` on another device than ``key``,
            with another number of keys, or with NaN or infinite entries.

    Examples:
        >>> q, k = torch.randn(2, 5, 8), torch.randn(2, 7, 8)
        >>> v = torch.randn(2, 7, 3)
        >>> out, p = scaled_dot_product_attention(q, k, v)
        >>> out.shape, p.shape
        (torch.Size([2, 5, 3]), torch.Size([2, 5, 7]))
        >>> reference = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        >>> torch.allclose(out, reference, atol=1e-6)
        True

    References:
        Vaswani et al. (2017), *Attention Is All You Need*, eq. (1).
    """
    value = as_float_tensor(value, "value", min_ndim=2)
    key = as_float_tensor(key, "key", min_ndim=2)
    check_same_dtype(value, "value", key, "key")
    check_same_device(value, "value", key, "key")
    check_shape_match(key, "key", value, "value", [(-2, -2)])
    check_finite(value, "value")
    weights = attention_weights(attention_scores(query, key, mask=mask, bias=bias, scale=scale))
    return torch.matmul(weights, value), weights
