"""Shared plumbing of the transforms: an empty input's result, the working dtype, and the
normalized dimension moved last and back.  Engines: their inputs arrive checked."""

from __future__ import annotations

import torch


def empty_result(x: torch.Tensor) -> torch.Tensor:
    """The result for an input with no entries (no rows, or rows of no keys): itself, times 0.

    Multiplying keeps the autograd graph, so an empty batch flows through training code."""
    return x * 0


def work_dtype(x: torch.Tensor) -> torch.dtype:
    # Half precision would lose the threshold entirely; float64 stays float64 (gradcheck).
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def to_last(x: torch.Tensor, dim: int) -> torch.Tensor:
    # Move the normalised dimension last once, so every reduction below is over contiguous memory.
    if dim == x.ndim - 1:
        return x.to(work_dtype(x))
    return x.movedim(dim, -1).to(work_dtype(x)).contiguous()


def from_last(p: torch.Tensor, dim: int, like: torch.Tensor) -> torch.Tensor:
    if dim != like.ndim - 1:
        p = p.movedim(-1, dim)
    return p.to(like.dtype)
