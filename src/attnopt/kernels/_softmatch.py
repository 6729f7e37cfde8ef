r"""The engine of the softmatch kernel of :mod:`attnopt.kernels`: similarities, their softmax, sums over atoms.

A measure here is anything with ``points (..., N, d)``, ``weights (..., N)``, ``batch_shape`` and
``_uniform`` (an :class:`attnopt.kernels.EmpiricalMeasure`).  The similarities :math:`a(q,k)` are
formed without intermediate overflow: a shrinking scale multiplies both factors by its square root
before the product (as PyTorch's reference SDPA does), and the Gaussian one is computed in
coordinates centred at the keys' mean, so that translating queries and keys together changes
nothing.

References:
    Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Defs. 3–4
    (the Boltzmann-Gibbs transformation and the softmatch kernel), Thm. 29 (the Gaussian potential).
"""

from __future__ import annotations

import math
from typing import Callable, Union

import torch

from ._checks import queries_arg
from .._numerics import log_or_neg_inf
from .._validation import (
    as_float_tensor,
    check_finite,
    check_no_overflow,
    check_positive,
    check_same_device,
    check_same_dtype,
    require,
)

#: A similarity: ``"dot"``, ``"gaussian"`` or a callable ``(queries, keys) -> (..., M, N)``.
Similarity = Union[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``sum_i w[..., i] * values[..., i, :]`` without materialising a broadcast copy of ``values``.

    When ``values`` has a singleton dimension just before the atoms (one support shared by the
    rows of a kernel), the sum is a plain matrix product.
    """
    if values.ndim >= 3 and values.shape[-3] == 1 and weights.ndim >= 2:
        return torch.matmul(weights, values.squeeze(-3))
    return torch.matmul(weights.unsqueeze(-2), values).squeeze(-2)


def similarity_logits(queries: torch.Tensor, keys: torch.Tensor, similarity: Similarity, scale, q_name: str,
                      k_name: str) -> torch.Tensor:
    """Log-potential matrix a(q_i, k_j), shape (..., M, N), finite (or -inf from a callable)."""
    if callable(similarity):
        name = "similarity(queries, keys)"
        out = as_float_tensor(similarity(queries, keys), name, min_ndim=2)
        check_same_dtype(out, name, queries, q_name)
        check_same_device(out, name, queries, q_name)
        if out.shape[-2:] != (queries.shape[-2], keys.shape[-2]):
            raise ValueError(f"{name} must have shape (..., {queries.shape[-2]}, {keys.shape[-2]}); got {tuple(out.shape)}")
        check_finite(out, name, allow_neg_inf=True)
        return out
    if not isinstance(similarity, str):
        raise TypeError(f"similarity must be 'dot', 'gaussian' or a callable; got {type(similarity).__name__}")
    if similarity == "dot":
        s = 1.0 / math.sqrt(queries.shape[-1]) if scale is None else check_positive(scale, "scale")
        # no intermediate overflow: a shrinking s scales both factors by sqrt(s) before the product (as
        # PyTorch's reference SDPA does; s itself may be below the smallest float32), a growing one the product
        root = math.sqrt(s)
        logits = (queries * root) @ (keys * root).mT if s < 1.0 else s * (queries @ keys.mT)
        what = f"scale * <{q_name}, {k_name}>"
    elif similarity == "gaussian":
        s = 1.0 if scale is None else check_positive(scale, "scale")
        # -s|q - k|^2 = s(2<q, k> - |k|^2) - s|q|^2; the last term is constant along a row of the kernel and
        # cancels in the normalisation, so it is dropped (exactly).  Both sides are first moved by the keys'
        # mean (which leaves |q - k| unchanged and the kernel exactly the same, so it is detached): far from
        # the origin |q - k|^2 would otherwise be lost to cancellation against |q|^2 and |k|^2.  sqrt(s)
        # scales both factors before the product.
        centre = keys.detach().mean(dim=-2, keepdim=True)
        root = math.sqrt(s)
        qc, kc = (queries - centre) * root, (keys - centre) * root
        logits = 2.0 * (qc @ kc.mT) - kc.pow(2).sum(-1).unsqueeze(-2)
        what = f"scale * |{q_name} - {k_name}|^2"
    else:
        raise ValueError(f"similarity must be 'dot', 'gaussian' or a callable; got {similarity!r}")
    check_no_overflow(logits, f"the similarities {what}", f"{q_name}, {k_name} or scale")
    return logits


def kernel_logits(queries: torch.Tensor, points: torch.Tensor, weights: torch.Tensor | None, similarity: Similarity,
                  scale, q_name: str, k_name: str) -> torch.Tensor:
    r"""The logits :math:`a(q_i,k_j)+\log w_j` of the softmatch kernel (``weights=None``: uniform, no
    shift), on checked queries and key measure."""
    logits = similarity_logits(queries, points, similarity, scale, q_name, k_name)
    return logits if weights is None else logits + log_or_neg_inf(weights).unsqueeze(-2)


def require_live_rows(logits: torch.Tensor) -> None:
    """Every query has some key of positive weight and finite logit (else its kernel row is 0/0)."""
    require(
        (logits > float("-inf")).any(dim=-1).all(),
        "similarity(queries, keys) is -inf on every key of positive weight for some query: "
        "Psi_G(mu) needs mu(G(q, .)) > 0",
    )


def softmatch_weights(queries, mu, similarity: Similarity, scale, q_name: str, k_name: str) -> torch.Tensor:
    """The softmatch matrix :math:`P_{ij}\\propto w_je^{a(q_i,k_j)}`, the arguments named as the caller's user wrote them."""
    queries = queries_arg(queries, mu, q_name, k_name, same_dim=not callable(similarity))
    # uniform weights shift every logit of a row equally: no effect
    logits = kernel_logits(queries, mu.points, None if mu._uniform else mu.weights, similarity, scale, q_name, k_name)
    if callable(similarity) or not mu._uniform:
        # a named similarity is finite and some weight positive: only a callable can leave a row empty
        require_live_rows(logits)
    return torch.softmax(logits, dim=-1)


def attend(queries: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None, values: torch.Tensor,
           similarity: Similarity, scale, q_name: str, k_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Attention on checked tensors: the softmatch kernel :math:`P_{ij}\propto w_je^{a(q_i,k_j)}` of
    ``keys`` (weights ``weights``, ``None``: uniform) and the means :math:`\sum_jP_{ij}v_j` of
    ``values`` ``(..., N, e)``; returns ``(means (..., M, e), kernel (..., M, N))``.

    The logits' overflow guard runs here (scores formed from finite tensors may still overflow),
    and so does the check of a callable similarity's output, which is the user's data; the
    queries, keys, values and weights are not checked again."""
    logits = kernel_logits(queries, keys, weights, similarity, scale, q_name, k_name)
    if callable(similarity):  # a named similarity is finite, and a weight vector has some positive entry
        require_live_rows(logits)
    kernel = torch.softmax(logits, dim=-1)
    return weighted_sum(kernel, values.unsqueeze(-3)), kernel


def flow(x: torch.Tensor, depth: int, wq, wk, wv, weights: torch.Tensor | None, similarity: Similarity, scale,
         residual: bool, step_size: float, normalize: str | None) -> torch.Tensor:
    """The layers ``(depth + 1, ..., N, d)`` of :func:`attnopt.kernels.self_attention_flow` on checked
    arguments (``x`` with at least one particle; ``wq``/``wk``/``wv`` ``None`` or ``(depth, d, d')``).

    The queries, keys and values of each layer come from checked tensors, so only the logits are
    guarded against overflow (in :func:`attend`), and the last layer's particles once at the end."""
    d = x.shape[-1]
    layers = [x]
    for h in range(depth):  # layers are sequential; everything inside a layer is batched
        q = x if wq is None else x @ wq[h]
        k = x if wk is None else x @ wk[h]
        v = x if wv is None else x @ wv[h]
        out, _ = attend(q, k, weights, v, similarity, scale, f"the queries of layer {h + 1}", f"the keys of layer {h + 1}")
        out = step_size * out
        x = x + out if residual else out
        if normalize == "layer":
            x = torch.nn.functional.layer_norm(x, (d,))
        elif normalize == "sphere":
            x = x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        layers.append(x)
    layers = torch.stack(layers)
    if depth:
        check_no_overflow(layers[-1], "the particles after the last layer", "x, w_v or step_size")
    return layers
