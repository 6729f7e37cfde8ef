"""Argument checks of :mod:`attnopt.continuous.mixture`: the data, the mixtures, the settings, the initializations
and the generator of the EM fits, and the options and locations of the attention module.

Every check is one of :mod:`attnopt._validation`; these functions only say which applies to which
argument of the mixture functions, so that each public function starts with a few lines.
"""

from __future__ import annotations

import math

import torch

from ._mixture_em import symmetric, work_dtype
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_choice,
    check_finite,
    check_int,
    check_nonnegative,
    check_number,
    check_probability_vector,
    check_same_device,
    check_same_dtype,
    check_shape_match,
    check_spd,
    require,
)

#: The named initializations of :func:`~attnopt.continuous.mixture.weighted_em`.
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
    """The checked ``init`` of :func:`~attnopt.continuous.mixture.weighted_em`: a name, or ``(means, covariances, mixing)`` (``None``
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


def points_arg(points) -> torch.Tensor:
    """The checked ``(..., N, D)`` finite points of :func:`~attnopt.continuous.mixture.region_labels` (``D >= 1``)."""
    points = as_float_tensor(points, "points", min_ndim=2)
    if points.shape[-1] < 1:
        raise ValueError(f"points must have shape (..., N, D) with D >= 1; got {tuple(points.shape)}")
    check_finite(points, "points")
    return points


def mixture_args(points, weights, means, covariances, mixing):
    """The checked ``(points, weights, means, covariances, mixing)`` of
    :func:`~attnopt.continuous.mixture.weighted_log_likelihood`: one dtype, one device, shapes that agree and
    leading dimensions that broadcast, SPD covariances and probability vectors of mixing weights."""
    points, weights, batch = data_args(points, weights, positive_sum=False)
    n, d = points.shape[-2:]
    means = as_float_tensor(means, "means", min_ndim=2, like=points)
    covariances = as_float_tensor(covariances, "covariances", min_ndim=3, like=points)
    mixing = as_float_tensor(mixing, "mixing", min_ndim=1, like=points)
    for tensor, name in ((means, "means"), (covariances, "covariances"), (mixing, "mixing")):
        check_same_dtype(tensor, name, points, "points")
        check_same_device(tensor, name, points, "points")
    k = means.shape[-2]
    if means.shape[-1] != d:
        raise ValueError(f"means must have shape (..., K, D) with D={d} as points; got {tuple(means.shape)}")
    if covariances.shape[-3:] != (k, d, d):
        raise ValueError(f"covariances must have shape (..., K, D, D) = (..., {k}, {d}, {d}) as means; "
                         f"got {tuple(covariances.shape)}")
    if mixing.shape[-1] != k:
        raise ValueError(f"mixing must have shape (..., K) with K={k} as means; got {tuple(mixing.shape)}")
    broadcast_shapes(**{"points/weights (leading dims)": batch, "means (leading dims)": means.shape[:-2],
                        "covariances (leading dims)": covariances.shape[:-3],
                        "mixing (leading dims)": mixing.shape[:-1]})
    check_finite(means, "means")
    check_spd(covariances, "covariances")
    check_probability_vector(mixing, "mixing")
    return points, weights, means, covariances, mixing


def em_args(points, weights, n_components, n_iter, init, tol, cov_floor, generator):
    """The checked ``(points, weights, K, n_iter, init, tol, cov_floor)`` of
    :func:`~attnopt.continuous.mixture.weighted_em`: ``K <= N``, ``init`` as :func:`init_arg` gives it, and a
    ``cov_floor`` within the range of the dtype EM computes in."""
    k = check_int(n_components, "n_components")
    n_iter = check_int(n_iter, "n_iter")
    cov_floor = check_number(cov_floor, "cov_floor", low=0.0)
    if tol is not None:
        tol = check_number(tol, "tol", low=0.0, hint=" (or None for a fixed number of iterations)")
    points, weights, _ = data_args(points, weights)
    if k > points.shape[-2]:
        raise ValueError(f"n_components={k} exceeds the number of points N={points.shape[-2]}")
    init = init_arg(init, k, points, generator)
    work = work_dtype(points.dtype)
    if cov_floor > torch.finfo(work).max:
        raise ValueError(f"cov_floor={cov_floor:g} is beyond the range of {work}")
    return points, weights, k, n_iter, init, tol, cov_floor


def selection_args(points, weights, max_components, min_components, penalty, n_init, n_iter, init, generator):
    """The checked ``(points, weights, batch, K_min, K_max, penalty, n_init, n_iter)`` of
    :func:`~attnopt.continuous.mixture.select_components` (the weights as given, not yet normalized)."""
    k_max = check_int(max_components, "max_components")
    k_min = check_int(min_components, "min_components")
    if k_min > k_max:
        raise ValueError(f"min_components={k_min} must be <= max_components={k_max}")
    n_init = check_int(n_init, "n_init")
    n_iter = check_int(n_iter, "n_iter")
    penalty = check_number(penalty, "penalty", low=0.0)
    check_choice(init, "init", ("kmeans++", "random"))
    points, weights, batch = data_args(points, weights)
    if k_max > points.shape[-2]:
        raise ValueError(f"max_components={k_max} exceeds the number of points N={points.shape[-2]}")
    generator_arg(generator, points)
    return points, weights, batch, k_min, k_max, penalty, n_init, n_iter


def components_args(n_components, max_components) -> tuple[int | str, int]:
    """The checked ``(n_components, max_components)`` of
    :class:`~attnopt.continuous.mixture.MultimodalContinuousAttention`: an int ``K >= 1`` (then ``K_max = K``),
    or ``"auto"`` with an int ``K_max >= 1``."""
    if isinstance(n_components, str):
        if n_components != "auto":
            raise ValueError(f"n_components must be an int >= 1 or 'auto'; got {n_components!r}")
        return "auto", check_int(max_components, "max_components")
    k = check_int(n_components, "n_components")
    return k, k


def location_set_arg(x, name: str, rows: str, dim: int) -> torch.Tensor:
    """The checked ``(rows, dim)`` finite locations ``name`` (``"locations"`` or ``"padding"``) of
    :class:`~attnopt.continuous.mixture.MultimodalContinuousAttention`; ``rows`` names their number."""
    x = as_float_tensor(x, name, min_ndim=2)
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"{name} must have shape ({rows}, D={dim}); got {tuple(x.shape)}")
    check_finite(x, name)
    return x


def scores_arg(scores, locations) -> torch.Tensor:
    """The checked ``(..., L)`` scores of a forward pass, finite or ``-inf``, on the device of the
    module's ``(L, D)`` locations."""
    scores = as_float_tensor(scores, "scores", min_ndim=1)
    check_same_device(scores, "scores", locations, "the module (its locations)")
    check_shape_match(scores, "scores", locations, "locations", [(-1, 0)])
    check_finite(scores, "scores", allow_neg_inf=True)
    return scores


def values_arg(values, scores, locations) -> torch.Tensor:
    """The checked ``(..., L, d)`` finite values of a forward pass, in the dtype and on the device of
    ``scores`` (``(..., L)``, checked), with leading dimensions that broadcast with theirs."""
    values = as_float_tensor(values, "values", min_ndim=2)
    check_same_dtype(values, "values", scores, "scores")
    check_same_device(values, "values", scores, "scores")
    check_shape_match(values, "values", locations, "locations", [(-2, 0)])
    broadcast_shapes(**{"scores (leading dims)": scores.shape[:-1],
                        "values (leading dims)": values.shape[:-2]})
    check_finite(values, "values")
    return values
