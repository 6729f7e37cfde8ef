"""Small numerical helpers shared by several modules of :mod:`attnopt`."""

from __future__ import annotations

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
