"""Argument checks of :mod:`attnopt.mixture`: the data, the initializations and the generator of the EM fits.

Every check is one of :mod:`attnopt._validation`; these functions only say which applies to which
argument of the mixture functions, so that each public function starts with a few lines.
"""

from __future__ import annotations

import math

import torch

from ._mixture_em import symmetric
from ._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_choice,
    check_finite,
    check_nonnegative,
    check_same_device,
    check_same_dtype,
    check_shape_match,
    check_spd,
    require,
)

#: The named initializations of :func:`~attnopt.mixture.weighted_em`.
INITS = ("kmeans++", "random", "regions")


def generator_arg(generator, points) -> None:
    """Check that ``generator`` is ``None`` or a ``torch.Generator`` on the device type of ``points``."""
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")
        if generator.device.type != points.device.type:
            raise ValueError(f"generator is on {generator.device} but points are on {points.device}; pass a generator on {points.device}")


def data_args(points, weights, *, positive_sum=True):
    """The checked ``(..., N, D)`` points and ``(..., N)`` weights, broadcast to one batch, and that batch shape."""
    points = as_float_tensor(points, "points", min_ndim=2)
    weights = as_float_tensor(weights, "weights", min_ndim=1, like=points)
    check_same_dtype(weights, "weights", points, "points")
    check_same_device(weights, "weights", points, "points")
    if points.shape[-2] < 1 or points.shape[-1] < 1:
        raise ValueError(f"points must have shape (..., N, D) with N, D >= 1 (at least one point); got {tuple(points.shape)}")
    check_shape_match(weights, "weights", points, "points", [(-1, -2)])
    batch = broadcast_shapes(**{"points (leading dims)": points.shape[:-2], "weights (leading dims)": weights.shape[:-1]})
    if points.numel():
        # finite, and small enough for a covariance (a squared spread) to be representable
        bound = math.sqrt(torch.finfo(points.dtype).max) / 4
        require(points.abs().amax() <= bound,
                f"points must be finite, with entries of magnitude at most {bound:.3g} (their covariances must be "
                f"representable in {points.dtype}); found NaN, an infinity or a larger entry: rescale the points")
    check_finite(weights, "weights")
    check_nonnegative(weights, "weights")
    if positive_sum and weights.numel():
        require((weights.sum(-1) > 0).all(), "weights must have a positive sum over the N points of every example")
    n, d = points.shape[-2:]
    return points.expand(*batch, n, d), weights.expand(*batch, n), batch


def init_arg(init, k, points, generator):
    """The checked ``init`` of :func:`~attnopt.mixture.weighted_em`: a name, or ``(means, covariances, mixing)`` (``None``
    where not given) broadcast to the batch, in the dtype and on the device of ``points``."""
    batch, d = points.shape[:-2], points.shape[-1]
    if isinstance(init, str):
        check_choice(init, "init", INITS)
        if init != "regions":
            generator_arg(generator, points)
        return init
    if isinstance(init, dict):
        unknown = set(init) - {"means", "covariances", "mixing"}
        if unknown or "means" not in init:
            raise ValueError(f"init dict must have key 'means' and optionally 'covariances', 'mixing'; got keys {sorted(init)}")
        given = {"init['means']": init["means"], "init['covariances']": init.get("covariances"), "init['mixing']": init.get("mixing")}
    elif isinstance(init, torch.Tensor):
        given = {"init": init, "init['covariances']": None, "init['mixing']": None}
    else:
        raise TypeError(f"init must be one of {INITS}, a tensor of means or a dict; got {type(init).__name__}")
    out = []
    for (name, value), trailing, what in zip(given.items(), ((k, d), (k, d, d), (k,)), ("means", "covariances", "mixing weights")):
        if value is None:
            out.append(None)
            continue
        value = as_float_tensor(value, name, min_ndim=len(trailing), like=points)
        check_same_dtype(value, name, points, "points")
        check_same_device(value, name, points, "points")
        lead = value.shape[: value.ndim - len(trailing)]
        if tuple(value.shape[-len(trailing):]) != trailing or broadcast_shapes(batch=batch, init=lead) != batch:
            shape = ", ".join(map(str, trailing))
            raise ValueError(f"{name} (the initial {what}) must have shape (..., {shape}) with leading dimensions that "
                             f"broadcast to the batch {tuple(batch)}; got {tuple(value.shape)}")
        if what == "covariances":
            check_spd(value, name)
            value = symmetric(value)
        else:
            check_finite(value, name)
        if what == "mixing weights":
            require((value > 0).all(), f"{name} (the initial mixing weights) must be positive")
            value = value / value.sum(-1, keepdim=True)
        out.append(value.expand(*batch, *trailing))
    return tuple(out)

