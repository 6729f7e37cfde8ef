"""Argument checks of :mod:`attnopt.continuous.value_functions` (all through :mod:`attnopt._validation`).

The basis is checked to be a :class:`~attnopt.continuous.value_functions.GaussianRBF` by the API module
before :func:`locations_arg` runs (this module does not import it)."""

from __future__ import annotations

import torch

from .._validation import as_float_tensor, check_finite, check_float_dtype, check_int, check_number


def number_list(value, name: str, kind) -> list:
    """A number or a sequence of numbers as a list (``TypeError`` naming ``name`` otherwise)."""
    if isinstance(value, torch.Tensor):
        value = value.tolist() if value.ndim else [value.item()]
    if isinstance(value, kind) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a number or a sequence of numbers; got {type(value).__name__}")
    return list(value)


def bounds_args(low, high) -> tuple[float, float]:
    """``(low, high)`` as floats with ``low < high``."""
    low, high = check_number(low, "low"), check_number(high, "high")
    if not high > low:
        raise ValueError(f"high must be > low; got low={low}, high={high}")
    return low, high


def grid_args(n_per_axis, dim, low, high, dtype, *, min_per_axis: int = 1):
    """``(n_per_axis, dim, low, high, dtype)`` of a regular grid of ``[low, high]^dim``, checked:
    ``n_per_axis >= min_per_axis`` and ``dim >= 1`` ints, ``low < high``, ``dtype`` floating
    (``None``: torch's default)."""
    n_per_axis = check_int(n_per_axis, "n_per_axis", minimum=min_per_axis)
    dim = check_int(dim, "dim")
    low, high = bounds_args(low, high)
    return n_per_axis, dim, low, high, check_float_dtype(dtype)


def locations_arg(locations, basis, name="locations") -> torch.Tensor:
    """``(L, D)`` finite float locations, ``L >= 1``, in the dimension of ``basis``."""
    locations = as_float_tensor(locations, name, min_ndim=2)
    if locations.ndim != 2:
        raise ValueError(f"{name} must have shape (L, D); got {tuple(locations.shape)}")
    check_finite(locations, name)
    if locations.shape[-1] != basis.dim:
        raise ValueError(f"{name} has points of dimension {locations.shape[-1]} but the basis has D={basis.dim}")
    if locations.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one point")
    return locations
