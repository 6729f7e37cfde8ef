"""Argument checks of :mod:`attnopt.kernels`: which check of :mod:`attnopt._validation` applies to which argument."""

from __future__ import annotations

import torch

from .._numerics import log_or_neg_inf
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_finite,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability_vector,
    check_same_device,
    check_same_dtype,
    check_shape_match,
)


def measure_args(points, weights, points_name: str, weights_name: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The checked atoms and masses of an :class:`attnopt.kernels.EmpiricalMeasure`, and whether the masses are uniform."""
    points = as_float_tensor(points, points_name, min_ndim=2)
    if points.shape[-2] == 0:
        raise ValueError(
            f"{points_name} must hold at least one atom (shape (..., N, d) with N >= 1): a probability "
            f"measure needs one; got {tuple(points.shape)}"
        )
    if points.shape[-1] == 0:
        raise ValueError(f"{points_name} must have dimension d >= 1 (shape (..., N, d)); got {tuple(points.shape)}")
    uniform = weights is None
    if uniform:
        n = points.shape[-2]
        weights = torch.full(points.shape[:-1], 1.0 / n, dtype=points.dtype, device=points.device)
    else:
        weights = as_float_tensor(weights, weights_name, min_ndim=1, like=points)
        check_same_device(weights, weights_name, points, points_name)
        weights = weights.to(points.dtype)
        check_shape_match(points, points_name, weights, weights_name, [(-2, -1)])
        broadcast_shapes(**{f"the batch dimensions of {points_name}": points.shape[:-2],
                            f"the batch dimensions of {weights_name}": weights.shape[:-1]})
        check_finite(weights, weights_name)
        check_probability_vector(weights, weights_name)
    check_finite(points, points_name)
    return points, weights, uniform


def table_arg(values, mu, name: str, mu_name: str) -> torch.Tensor:
    """Validate values ``(..., N, l)`` attached to the atoms of ``mu`` (a lookup table, a function's values)."""
    values = as_float_tensor(values, name, min_ndim=2, like=mu.points)
    check_same_dtype(values, name, mu.points, mu_name)
    check_same_device(values, name, mu.points, mu_name)
    check_shape_match(values, name, mu.points, mu_name, [(-2, -2)])
    broadcast_shapes(**{f"the batch dimensions of {name}": values.shape[:-2],
                        f"the batch dimensions of {mu_name}": mu.batch_shape})
    check_finite(values, name)
    return values


def queries_arg(queries, mu, q_name: str, k_name: str, same_dim: bool) -> torch.Tensor:
    """Queries ``(..., M, d)`` for the keys of ``mu`` (of their dimension ``d`` when ``same_dim``)."""
    queries = as_float_tensor(queries, q_name, min_ndim=2, like=mu.points)
    check_same_dtype(queries, q_name, mu.points, k_name)
    check_same_device(queries, q_name, mu.points, k_name)
    if same_dim:
        check_shape_match(queries, q_name, mu.points, k_name, [(-1, -1)])
    broadcast_shapes(**{f"the batch dimensions of {q_name}": queries.shape[:-2],
                        f"the batch dimensions of {k_name}": mu.batch_shape})
    check_finite(queries, q_name)
    return queries


def log_potential_arg(nu, potential, log_potential) -> torch.Tensor:
    r""":math:`\log g` at the atoms of ``nu``, from whichever potential of
    :func:`attnopt.kernels.boltzmann_gibbs` is given."""
    if (potential is None) == (log_potential is None):
        raise ValueError("give exactly one of potential and log_potential")
    name = "potential" if potential is not None else "log_potential"
    given = potential if potential is not None else log_potential
    values = given(nu.points) if callable(given) else given
    values = as_float_tensor(values, name, min_ndim=1, like=nu.points)
    check_same_dtype(values, name, nu.points, "nu's points")
    check_same_device(values, name, nu.points, "nu's points")
    check_shape_match(values, name, nu.weights, "nu.weights", [(-1, -1)])
    broadcast_shapes(**{f"the batch dimensions of {name}": values.shape[:-1], "the batch dimensions of nu": nu.batch_shape})
    if log_potential is not None:
        check_finite(values, name, allow_neg_inf=True)
        return values
    check_finite(values, name)
    check_nonnegative(values, name, what=" (g: E -> [0, inf))")
    return log_or_neg_inf(values)


def tilt_args(nu, statistics, target, max_iter, tol):
    """The checked ``statistics``, ``target``, batch shape, ``max_iter`` and ``tol`` of
    :func:`attnopt.kernels.maximum_entropy_tilt`."""
    k = as_float_tensor(statistics, "statistics", min_ndim=2, like=nu.points)
    f = as_float_tensor(target, "target", min_ndim=1, like=nu.points)
    for name, x in (("statistics", k), ("target", f)):
        check_same_dtype(x, name, nu.points, "nu's points")
        check_same_device(x, name, nu.points, "nu's points")
    check_shape_match(k, "statistics", nu.weights, "nu.weights", [(-2, -1)])
    check_shape_match(k, "statistics", f, "target", [(-1, -1)])
    batch = broadcast_shapes(**{"the batch dimensions of statistics": k.shape[:-2],
                                "the batch dimensions of target": f.shape[:-1], "the batch dimensions of nu": nu.batch_shape})
    max_iter = check_int(max_iter, "max_iter", 0)
    tol = (1e-10 if k.dtype == torch.float64 else 1e-5) if tol is None else check_positive(tol, "tol")
    check_finite(k, "statistics")
    check_finite(f, "target")
    return k, f, batch, max_iter, tol


def multihead_args(queries, keys, values, w_q, w_k, w_v, w_o):
    """The checked tensors of :func:`attnopt.kernels.multihead_attention_kernel`, as a dict by argument name."""
    queries = as_float_tensor(queries, "queries", min_ndim=2)
    tensors = {"queries": queries}
    for name, x, ndim in (("keys", keys, 2), ("values", values, 2), ("w_q", w_q, 3), ("w_k", w_k, 3), ("w_v", w_v, 3),
                          ("w_o", w_o, 3)):
        x = as_float_tensor(x, name, min_ndim=ndim, like=queries)
        check_same_dtype(x, name, queries, "queries")
        check_same_device(x, name, queries, "queries")
        if ndim == 3 and x.ndim != 3:
            raise ValueError(f"{name} must have shape (H, d_in, d_out); got {tuple(x.shape)}")
        tensors[name] = x
    keys, values = tensors["keys"], tensors["values"]
    if tensors["w_q"].shape[0] == 0:
        raise ValueError("w_q must hold at least one head (shape (H, d, d_h) with H >= 1): the mixture over heads needs one")
    for name in ("w_k", "w_v", "w_o"):
        check_shape_match(tensors["w_q"], "w_q", tensors[name], name, [(0, 0)])
    check_shape_match(tensors["w_q"], "w_q", tensors["w_k"], "w_k", [(2, 2)])
    check_shape_match(queries, "queries", tensors["w_q"], "w_q", [(-1, 1)])
    check_shape_match(keys, "keys", tensors["w_k"], "w_k", [(-1, 1)])
    check_shape_match(values, "values", tensors["w_v"], "w_v", [(-1, 1)])
    check_shape_match(values, "values", keys, "keys", [(-2, -2)])
    check_shape_match(tensors["w_v"], "w_v", tensors["w_o"], "w_o", [(2, 1)])
    for name, x in tensors.items():
        check_finite(x, name)
    return tensors


def layer_matrices(w, name: str, x: torch.Tensor, depth: int, square: bool) -> torch.Tensor | None:
    """A projection of :func:`attnopt.kernels.self_attention_flow`, shared ``(d, d')`` or per layer ``(depth, d, d')``."""
    if w is None:
        return None
    d = x.shape[-1]
    w = as_float_tensor(w, name, like=x)
    check_same_dtype(w, name, x, "x")
    check_same_device(w, name, x, "x")
    check_finite(w, name)
    if w.ndim == 2:
        w = w.unsqueeze(0).expand(max(depth, 1), *w.shape)
    elif w.ndim != 3 or w.shape[0] != depth:
        raise ValueError(f"{name} must have shape (d, d') or (depth={depth}, d, d'); got {tuple(w.shape)}")
    if w.shape[1] != d or (square and w.shape[2] != d):
        want = f"(.., {d}, {d})" if square else f"(.., {d}, d')"
        raise ValueError(f"{name} must map R^{d} to R^{d if square else 'd'}' (shape {want}); got {tuple(w.shape)}")
    return w
