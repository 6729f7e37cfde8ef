"""Argument checks of :mod:`attnopt.course.explore` (all through :mod:`attnopt._validation`)."""

from __future__ import annotations

import torch

from .._validation import as_float_tensor, check_finite, check_same_device, check_same_dtype, require


def float_arg(x, name: str, min_ndim: int, like: torch.Tensor | None = None,
              like_name: str = "") -> torch.Tensor:
    """``x`` as a finite float tensor of at least ``min_ndim`` dimensions, matching ``like``."""
    t = as_float_tensor(x, name, min_ndim=min_ndim, like=like)
    if like is not None:
        check_same_dtype(t, name, like, like_name)
        check_same_device(t, name, like, like_name)
    check_finite(t, name)
    return t


def grid_arg(grid, name: str, default: tuple[float, float, int], like: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor of finite numbers > 0 (``default``: log-spaced from 10**lo to 10**hi)."""
    if grid is None:
        lo, hi, n = default
        return torch.logspace(lo, hi, n, dtype=like.dtype, device=like.device)
    grid = float_arg(grid, name, 1, like, "the other tensors")
    if grid.ndim != 1 or grid.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor; got shape {tuple(grid.shape)}")
    require((grid > 0).all(), f"{name} must hold numbers > 0")
    return grid
