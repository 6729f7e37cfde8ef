"""Argument checks of :mod:`attnopt.fenchel`: its arguments parsed into the layouts the solvers use.

Every check is one of :mod:`attnopt._validation`; these functions only say which applies to which
argument of the Fenchel-dual functions, so that each public function starts with a few lines.
"""

from __future__ import annotations

import torch

from ._solvers import OTFamily
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool_mask,
    check_finite,
    check_int,
    check_positive,
    check_probability_vector,
    check_psd,
    check_same_device,
    check_same_dtype,
    check_shape_match,
    require,
)


def templates_arg(templates) -> torch.Tensor:
    """The checked templates ``(..., n, d)``, ``n >= 1``."""
    t = as_float_tensor(templates, "templates", min_ndim=2)
    if t.shape[-2] == 0:
        raise ValueError(
            "templates must hold at least one template (shape (..., n, d) with n >= 1): with no templates "
            "there is no preference u in the simplex, and problem (4) has no solution"
        )
    check_finite(t, "templates")
    return t


def solver_args(alpha, tol, max_iter) -> tuple[float, float, int]:
    """The checked ``alpha``, ``tol`` and ``max_iter`` of the dual solvers."""
    return check_positive(alpha, "alpha"), check_positive(tol, "tol"), check_int(max_iter, "max_iter", 1)


def true_preference_args(u, cost, gamma) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The checked arguments of :func:`attnopt.fenchel.true_preference`: ``u (..., N)``, ``cost (..., N, N)``, ``gamma``."""
    u = as_float_tensor(u, "u", min_ndim=1)
    if u.shape[-1] == 0:
        raise ValueError("u must hold at least one entry (shape (..., N) with N >= 1): no preference exists over no template")
    m = cost_arg(cost, u.shape[-1], u, "u")
    gamma = check_positive(gamma, "gamma")
    broadcast_shapes(**{"u's batch dimensions": u.shape[:-1], "cost's batch dimensions": m.shape[:-2]})
    check_finite(u, "u")
    check_probability_vector(u, "u")
    return u, m, gamma


def _like_templates(x, name: str, templates: torch.Tensor) -> torch.Tensor:
    """``x`` as a floating tensor ``(..., d)`` in the dtype, on the device and of the ``d`` of ``templates``."""
    x = as_float_tensor(x, name, min_ndim=1, like=templates)
    check_same_dtype(x, name, templates, "templates")
    check_same_device(x, name, templates, "templates")
    check_shape_match(x, name, templates, "templates", [(-1, -1)])
    return x


def vector_arg(x, name: str, templates: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Validate ``x`` (``(..., d)`` or ``(..., n_q, d)``) and return it with a query axis."""
    x = _like_templates(x, name, templates)
    single = x.ndim != templates.ndim
    xq = x.unsqueeze(-2) if single else x
    broadcast_shapes(**{f"{name}'s batch dimensions": xq.shape[:-2], "templates' batch dimensions": templates.shape[:-2]})
    check_finite(x, name)
    return xq, single


def b_arg(b, T, single, lq, lam_name):
    """``b`` in the layout of ``lq`` (the checked ``lam``)."""
    b = _like_templates(b, "b", T)
    bq = b.unsqueeze(-2) if single else b
    broadcast_shapes(**{lam_name: lq.shape, "b": bq.shape})
    check_finite(b, "b")
    return bq


def preference_arg(u, templates: torch.Tensor, single: bool, name: str = "u") -> torch.Tensor | None:
    """Validate a preference and return it in the query layout ``(..., n_q or 1, n)``."""
    if u is None:
        return None
    u = as_float_tensor(u, name, min_ndim=1, like=templates)
    check_same_dtype(u, name, templates, "templates")
    check_same_device(u, name, templates, "templates")
    n = templates.shape[-2]
    if u.shape[-1] != n:
        raise ValueError(f"{name} must have one entry per template: {name}.shape[-1]={u.shape[-1]} but n={n}")
    check_finite(u, name)
    check_probability_vector(u, name)
    return u.unsqueeze(-2) if single else u


def cost_arg(cost, n: int, ref: torch.Tensor, ref_name: str) -> torch.Tensor:
    """Validate a cost matrix ``(..., n, n)``, finite or ``+inf``, in the dtype and on the device of ``ref``."""
    if cost is None:
        raise ValueError("cost is required: a (..., N, N) matrix M(t_i, t_j)")
    m = as_float_tensor(cost, "cost", min_ndim=2, like=ref)
    check_same_dtype(m, "cost", ref, ref_name)
    check_same_device(m, "cost", ref, ref_name)
    if m.shape[-1] != n or m.shape[-2] != n:
        raise ValueError(f"cost must be (..., n, n) with n={n} templates; got shape {tuple(m.shape)}")
    # NaN > -inf is False: one reduction refuses NaN and -inf
    require((m > float("-inf")).all(), "cost contains NaN or -inf; costs must be finite or +inf")
    require(
        (m < float("inf")).any(dim=-2).all(),
        "cost has a column that is +inf everywhere; each template must reach some template",
    )
    return m


def ot_family_arg(u, cost, gamma, T: torch.Tensor, xq: torch.Tensor, single: bool, x_name: str) -> OTFamily:
    """The checked preference, cost and gamma of the OT problem (24), as the solver's family."""
    gamma = check_positive(gamma, "gamma")
    uq = preference_arg(u, T, single)
    m = cost_arg(cost, T.shape[-2], T, "templates").unsqueeze(-3)
    shapes = {f"{x_name}'s batch dimensions": xq.shape[:-1], "templates' batch dimensions": T.shape[:-2] + (1,),
              "cost's batch dimensions": m.shape[:-2]}
    if uq is not None:
        shapes["u's batch dimensions"] = uq.shape[:-1]
    broadcast_shapes(**shapes)
    return OTFamily(uq, m, gamma)


def gaussian_args(mu, b, alpha, cov):
    """The checked arguments of the Gaussian closed forms."""
    mu = as_float_tensor(mu, "mu", min_ndim=1)
    b = as_float_tensor(b, "b", min_ndim=1, like=mu)
    check_same_dtype(b, "b", mu, "mu")
    check_same_device(b, "b", mu, "mu")
    check_shape_match(b, "b", mu, "mu", [(-1, -1)])
    broadcast_shapes(mu=mu.shape, b=b.shape)
    alpha = check_positive(alpha, "alpha")
    check_finite(mu, "mu")
    check_finite(b, "b")
    if cov is not None:
        cov = as_float_tensor(cov, "cov", min_ndim=2, like=mu)
        check_same_dtype(cov, "cov", mu, "mu")
        check_same_device(cov, "cov", mu, "mu")
        d = mu.shape[-1]
        if cov.shape[-1] != d or cov.shape[-2] != d:
            raise ValueError(f"cov must be (..., d, d) with d={d}; got shape {tuple(cov.shape)}")
        broadcast_shapes(**{"mu's batch dimensions": mu.shape[:-1], "b's batch dimensions": b.shape[:-1],
                            "cov's batch dimensions": cov.shape[:-2]})
        check_psd(cov, "cov")
    return mu, b, alpha, cov


def masked_bias_arg(position_bias, mask) -> torch.Tensor:
    """The checked bias of :func:`attnopt.fenchel.t5_preference`, ``-inf`` where ``mask`` forbids a word."""
    bias = as_float_tensor(position_bias, "position_bias", min_ndim=1)
    shape = bias.shape
    if mask is not None:
        check_bool_mask(mask, "mask", device=bias.device, meaning="True = may attend")
        shape = broadcast_shapes(position_bias=bias.shape, mask=mask.shape)
    if shape[-1] == 0:
        raise ValueError(f"position_bias must hold at least one word (shape (..., n) with n >= 1); got {tuple(shape)}")
    check_finite(bias, "position_bias", allow_neg_inf=True)
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    require(
        (bias > float("-inf")).any(dim=-1).all(),
        "every word of some row is masked (by mask or a -inf position_bias); a preference needs at least one allowed word",
    )
    return bias


def deviation_args(lam_star, approx) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked arguments of :func:`attnopt.fenchel.relative_deviation`, broadcast to one shape."""
    lam_star = as_float_tensor(lam_star, "lam_star", min_ndim=1)
    approx = as_float_tensor(approx, "approx", min_ndim=1, like=lam_star)
    check_same_dtype(approx, "approx", lam_star, "lam_star")
    check_same_device(approx, "approx", lam_star, "lam_star")
    shape = broadcast_shapes(lam_star=lam_star.shape, approx=approx.shape)
    check_finite(lam_star, "lam_star")
    check_finite(approx, "approx")
    return lam_star.expand(shape), approx.expand(shape)
