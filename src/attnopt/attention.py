r"""Scaled dot-product attention written from its definition.

For queries :math:`q_i`, keys :math:`k_j` and values :math:`v_j`,

.. math::

    s_{ij} = \frac{\langle q_i, k_j\rangle}{\sqrt{d}} + b_{ij}, \qquad
    p_{ij} = \frac{\exp s_{ij}}{\sum_{l} \exp s_{il}}, \qquad
    \operatorname{Att}(q_i) = \sum_j p_{ij}\, v_j ,

where a key that the mask forbids gets :math:`s_{ij} = -\infty`, hence weight zero.  This is the
object every chapter of the course rederives from an optimization problem; here it is only the
reference implementation, checked against :func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch

from ._validation import as_float_tensor, check_positive, check_shape_match

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

    Args:
        query: ``(..., n_queries, d)``.
        key: ``(..., n_keys, d)``; leading dimensions broadcast against ``query``'s.
        mask: optional boolean tensor broadcastable to ``(..., n_queries, n_keys)``;
            ``True`` marks a key a query may attend to (the convention of PyTorch's SDPA).
        bias: optional floating tensor broadcastable to the scores, added before the softmax
            (T5's relative-position bias, ALiBi, ...).
        scale: multiplies the inner products; defaults to :math:`1/\sqrt{d}`.

    Returns:
        The ``(..., n_queries, n_keys)`` score tensor.
    """
    query = as_float_tensor(query, "query", min_ndim=2)
    key = as_float_tensor(key, "key", min_ndim=2)
    check_shape_match(query, "query", key, "key", [(-1, -1)])
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    else:
        scale = check_positive(scale, "scale")
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if bias is not None:
        bias = as_float_tensor(bias, "bias")
        scores = scores + bias
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("mask must be a boolean tensor (True = may attend); for an additive float mask use bias")
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def attention_weights(scores: torch.Tensor) -> torch.Tensor:
    r"""Row-wise softmax :math:`p_{ij} = e^{s_{ij}} / \sum_l e^{s_{il}}` over the last dimension.

    A row whose scores are all ``-inf`` (a query that may attend to nothing) gets all-zero
    weights instead of NaN, so its output is the zero vector.
    """
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

    Example:
        >>> q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 3)
        >>> out, p = scaled_dot_product_attention(q, k, v)
        >>> out.shape, p.shape
        (torch.Size([2, 5, 3]), torch.Size([2, 5, 7]))
    """
    value = as_float_tensor(value, "value", min_ndim=2)
    check_shape_match(key, "key", value, "value", [(-2, -2)])
    weights = attention_weights(attention_scores(query, key, mask=mask, bias=bias, scale=scale))
    return torch.matmul(weights, value), weights
