"""Input validation shared by every module.

Each helper raises :class:`TypeError` (wrong kind of object or dtype) or :class:`ValueError`
(right kind, wrong value or shape) with a message that names the argument and says what was
expected, so that a reader who passes the wrong thing learns what to pass instead.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = [
    "as_float_tensor",
    "check_dim",
    "check_finite",
    "check_int",
    "check_positive",
    "check_probability_vector",
    "check_shape_match",
]


def as_float_tensor(x, name: str, *, min_ndim: int = 0, like: torch.Tensor | None = None) -> torch.Tensor:
    """Return ``x`` as a floating-point tensor, or raise a clear error.

    Tensors keep their device and dtype (integer tensors are refused rather than silently cast,
    since an integer score matrix is almost always a bug).  Python numbers and nested lists are
    converted, to the device and dtype of ``like`` when given.
    """
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, (int, float)) or (isinstance(x, (list, tuple)) and len(x) > 0):
        kwargs = {} if like is None else {"dtype": like.dtype, "device": like.device}
        try:
            t = torch.as_tensor(x, **kwargs)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a tensor or a nested list of numbers; got {type(x).__name__}") from err
        if not t.is_floating_point():
            t = t.to(torch.get_default_dtype() if like is None else like.dtype)
    else:
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype (float16/bfloat16/float32/float64); got {t.dtype}")
    if t.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s); got shape {tuple(t.shape)}")
    return t


def check_finite(x: torch.Tensor, name: str, *, allow_neg_inf: bool = False) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN (or ±inf; ``-inf`` allowed when asked)."""
    # fast path, one pass and one host read.  NaN and ±inf propagate through a sum (inf - inf = NaN),
    # so a finite sum proves every entry finite; the maximum is NaN or +inf exactly when a NaN or +inf
    # is present.  A failed fast check (or an overflowing sum) gets the exact checks and their message.
    if x.is_floating_point() and x.numel():
        if bool(x.amax() < torch.inf) if allow_neg_inf else bool(torch.isfinite(x.sum())):
            return
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")
    bad = torch.isposinf(x) if allow_neg_inf else torch.isinf(x)
    if bad.any():
        what = "+inf" if allow_neg_inf else "infinite values"
        raise ValueError(f"{name} contains {what}")


def check_positive(value, name: str, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a float after checking it is a finite number > 0 (or >= 0)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{name} must be a scalar; got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not ok or not math.isfinite(value):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}; got {value}")
    return value


def check_dim(dim: int, ndim: int, name: str = "dim") -> int:
    """Return ``dim`` normalised to ``[0, ndim)``, or raise ``ValueError`` when out of range."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int; got {type(dim).__name__}")
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a tensor with {ndim} dimension(s)")
    return dim % ndim


def check_int(value, name: str, minimum: int = 1) -> int:
    """Return ``value`` after checking it is an int (not a bool) and ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return value


def check_shape_match(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str, dims: Sequence[tuple[int, int]]) -> None:
    """Check ``a.shape[i] == b.shape[j]`` for each ``(i, j)`` in ``dims``."""
    for i, j in dims:
        if a.shape[i] != b.shape[j]:
            raise ValueError(
                f"{a_name} and {b_name} do not match: {a_name}.shape[{i}]={a.shape[i]} "
                f"but {b_name}.shape[{j}]={b.shape[j]} (shapes {tuple(a.shape)} and {tuple(b.shape)})"
            )


def check_probability_vector(p: torch.Tensor, name: str, *, dim: int = -1, atol: float | None = None) -> None:
    """Check that ``p`` is non-negative and sums to one along ``dim``."""
    if (p < 0).any():
        raise ValueError(f"{name} must be non-negative; found entries < 0")
    if atol is None:
        atol = 1e-3 if p.dtype in (torch.float16, torch.bfloat16) else (1e-5 if p.dtype == torch.float32 else 1e-10)
    total = p.sum(dim=dim)
    if not torch.allclose(total, torch.ones_like(total), atol=atol, rtol=0.0):
        worst = (total - 1).abs().max().item()
        raise ValueError(f"{name} must sum to 1 along dim {dim}; off by up to {worst:.3g}")
