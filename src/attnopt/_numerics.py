"""Small numerical helpers shared by several modules of :mod:`attnopt`."""

from __future__ import annotations

import functools

import torch


def log_or_neg_inf(x: torch.Tensor) -> torch.Tensor:
    """``log x`` with ``log 0 = -inf`` and no NaN gradient at the zeros (a zero weight masks its entry).

    The logarithm is taken of 1 where ``x`` is 0, and ``-inf`` is put there by ``where``: so no
    ``0 * inf`` reaches the gradient.
    """
    positive = x > 0
    safe = torch.where(positive, x, torch.ones_like(x))
    return torch.where(positive, torch.log(safe), torch.full_like(x, float("-inf")))


def symmetric_part(x: torch.Tensor) -> torch.Tensor:
    """``(x + x^T) / 2`` over the last two dimensions."""
    return 0.5 * (x + x.transpose(-1, -2))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute in: float32 for half precisions (erf/erfc/cholesky are missing or too coarse there)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class ConvergenceWarning(RuntimeWarning):
    """An iterative solver stopped at its iteration limit before reaching its stated tolerance.

    The message names the error reached; the result is returned all the same.
    """


class _SecondDerivativeRefused(torch.autograd.Function):
    """Passes a backward pass's gradients through; differentiating them raises ``RuntimeError``."""

    @staticmethod
    def forward(ctx, message, n_grads, *tensors):
        ctx.message = message
        return tuple(t.clone() for t in tensors[:n_grads])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(ctx.message)


def differentiable_once(backward):
    """Decorate the ``backward`` of an autograd Function whose gradient is not differentiable.

    Like :func:`torch.autograd.function.once_differentiable`, the backward runs without a graph;
    unlike it, when a graph is asked for (``create_graph=True``) the gradients are linked to the
    incoming gradients and to the tensors the forward listed in ``ctx.graph_inputs``, through a node
    whose backward raises ``RuntimeError``.  ``once_differentiable`` links them to nothing, so
    ``torch.autograd.grad(..., allow_unused=True)`` silently gives ``None``, that is zero, for the
    second derivative; here it raises.
    """

    @functools.wraps(backward)
    def wrapper(ctx, *grad_outputs):
        with torch.no_grad():
            grads = backward(ctx, *grad_outputs)
        if not torch.is_grad_enabled():
            return grads
        anchors = [t for t in (*grad_outputs, *getattr(ctx, "graph_inputs", ()))
                   if isinstance(t, torch.Tensor) and t.requires_grad]
        single = not isinstance(grads, tuple)
        grads = (grads,) if single else grads
        where = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
        if not anchors or not where:
            return grads[0] if single else grads
        message = (f"{type(ctx).__name__.removesuffix('Backward')} is differentiable once: its backward "
                   "pass has no second derivative (double backward, create_graph=True)")
        linked = _SecondDerivativeRefused.apply(message, len(where), *(grads[i] for i in where), *anchors)
        out = list(grads)
        for i, g in zip(where, linked):
            out[i] = g
        return out[0] if single else tuple(out)

    return wrapper
