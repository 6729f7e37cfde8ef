"""Argument checks of :mod:`attnopt.course.widgets`: the views and figures of the ``draw_*`` functions, the
tensors of the explorers (numbers through :mod:`attnopt._validation`)."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from .._validation import as_float_tensor


def check_view(view, kind: type, fig, field: str, ndim: int, what: str, *, plane: bool = False) -> None:
    """Check that ``view`` is one ``kind`` of :mod:`attnopt.course.explore`, unbatched, and ``fig`` a figure.

    Unbatched: the view's tensor ``field`` has ``ndim`` dimensions (the last of size 2 when ``plane``);
    ``what`` says so in the error message.
    """
    if not isinstance(view, kind):
        raise TypeError(f"view must be the {kind.__name__} of attnopt.explore; got {type(view).__name__}")
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure; got {type(fig).__name__}")
    shape = getattr(view, field).shape
    if len(shape) != ndim or (plane and shape[-1] != 2):
        raise ValueError(f"view must hold {what}; got {tuple(shape)}")


def tensor_arg(x, name: str, shape: str, *, ndim: int = 2, min_rows: int = 0,
               columns: int | None = None) -> torch.Tensor:
    """``x`` as a float tensor of ``ndim`` dimensions with at least ``min_rows`` rows (and ``columns``
    columns when given); ``shape`` says so in the error message."""
    t = as_float_tensor(x, name, min_ndim=ndim)
    if t.ndim != ndim or t.shape[0] < min_rows or (columns is not None and t.shape[-1] != columns):
        raise ValueError(f"{name} must have shape {shape}; got {tuple(t.shape)}")
    return t
