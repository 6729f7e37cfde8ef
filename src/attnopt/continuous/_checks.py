"""Argument checks of :mod:`attnopt.continuous` (all through :mod:`attnopt._validation`).

The basis is checked to be a :class:`~attnopt.continuous.value_functions.GaussianRBF` by the API module
before these run (this module does not import it); the checks of the grids and of the locations
of a ridge regression are in :mod:`attnopt.continuous._value_functions_checks`."""

from __future__ import annotations

from ._expectations import flatten
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_finite,
    check_int,
    check_number,
    check_psd,
    check_same_device,
    check_same_dtype,
    check_spd,
)


def quadrature_args(n_quadrature, tol, max_quadrature):
    """``(n_quadrature, tol, max_quadrature)`` of the angular rule of 2D sparsemax, checked."""
    if n_quadrature is not None:
        n_quadrature = check_int(n_quadrature, "n_quadrature")
        if tol is not None:
            raise ValueError("tol applies to the adaptive rule only; pass n_quadrature=None to use it")
    if tol is not None:
        tol = check_number(tol, "tol", low=0.0, high=1.0, low_open=True, high_open=True)
    max_quadrature = check_int(max_quadrature, "max_quadrature", minimum=8)
    return n_quadrature, tol, max_quadrature


def mean_scale_checks(mu, Sigma, basis, name_fn, *, definite, names=("mu", "Sigma")):
    """Validate ``(mu, Sigma)`` against a checked ``basis``: ``Sigma`` SPD (``definite``) or PSD.
    ``names`` are the user's names of the two arguments (for the error messages).  Returns
    ``(mu, Sigma, batch)``, the tensors as given and their broadcast batch shape."""
    n_mu, n_S = names
    mu = as_float_tensor(mu, n_mu, min_ndim=1)
    Sigma = as_float_tensor(Sigma, n_S, min_ndim=2)
    check_same_dtype(Sigma, n_S, mu, n_mu)
    check_same_device(Sigma, n_S, mu, n_mu)
    d = mu.shape[-1]
    if Sigma.shape[-2:] != (d, d):
        raise ValueError(
            f"{n_S} must have shape (..., {d}, {d}) to match {n_mu} of shape {tuple(mu.shape)}; got {tuple(Sigma.shape)}"
        )
    if basis.dim != d:
        raise ValueError(f"{name_fn}: {n_mu} has dimension D={d} but the basis lives in D={basis.dim}")
    batch = broadcast_shapes(**{n_mu: mu.shape[:-1], n_S: Sigma.shape[:-2]})
    check_finite(mu, n_mu)
    (check_spd if definite else check_psd)(Sigma, n_S)
    return mu, Sigma, batch


def mean_scale_args(mu, Sigma, basis, name_fn, *, definite, names=("mu", "Sigma")):
    """:func:`mean_scale_checks`, then the batch flattened: ``(mu_f (B, D), Sigma_f (B, D, D),
    centers, cov, batch, dtype)``, the tensors in the compute dtype on the device of ``mu``."""
    mu, Sigma, batch = mean_scale_checks(mu, Sigma, basis, name_fn, definite=definite, names=names)
    return (*flatten(mu, Sigma, basis, batch), batch, mu.dtype)
