r"""The value function of continuous attention: Gaussian basis functions fitted by ridge regression.

Continuous attention (chapters 3--4 of Farinhas, 2021) averages a *value function* instead of
:math:`L` value vectors.  The features :math:`h_l\in\mathbb R^d` are known only at locations
:math:`t_1,\dots,t_L\in\mathbb R^D` (for an image, the cells of a feature map scaled to
:math:`[0,1]^2`); the value function is written in a basis :math:`\psi:\mathbb R^D\to\mathbb R^N`
of Gaussian radial basis functions (RBFs),

.. math::

    V_B(t) = B\psi(t),\qquad \psi_j(t)=\mathcal N(t;\mu_j,\Sigma_j),\quad j\in[N],

and its coefficients :math:`B\in\mathbb R^{d\times N}` are fitted to the features by multivariate
ridge regression (Alg. 1 and eq. (3.17) of Farinhas, 2021).  With
:math:`F=[\psi(t_1),\dots,\psi(t_L)]\in\mathbb R^{N\times L}` and
:math:`H=[h_1,\dots,h_L]\in\mathbb R^{d\times L}`,

.. math::

    B^\star = \arg\min_B \|BF-H\|_F^2+\eta\|B\|_F^2 = HG,

    G = F^\top\big(FF^\top+\eta I_N\big)^{-1}\in\mathbb R^{L\times N}.

:math:`G` depends only on the locations, the basis and the ridge penalty :math:`\eta` (written
:math:`\lambda` by Farinhas (2021); in the book :math:`\lambda` is the threshold of a truncated
paraboloid), so a model computes it once, offline (Fig. 6.3), and each example costs one product
:math:`B=HG`.  The context of an attention density :math:`p` is then
:math:`c=\mathbb E_p[V_B(t)]=B\,r` with :math:`r=\mathbb E_p[\psi(t)]` (eq. (3.16)), which
:mod:`attnopt.continuous` computes for Gaussian and truncated-paraboloid densities.

This module provides

* :class:`GaussianRBF` -- the basis :math:`\psi`, normalized Gaussian densities with any
  covariances, and :meth:`GaussianRBF.grid` for centres on regular grids (Table 6.1);
* :func:`grid_locations` -- the locations :math:`t_l` of a regular grid (the :math:`14\times14`
  feature map of §6.2.2), and :func:`padding_locations` -- the points around it where the
  value function is fitted to zero (footnote 2 of §6.2.2);
* :func:`ridge_operator` -- the matrix :math:`G`, and :func:`ridge_value_function` -- the
  coefficients :math:`B` in one call.

Conventions.  Locations have shape ``(L, D)``, features ``(..., L, d)`` (token-major, as
``value`` in attention) and coefficients ``(..., d, N)``.  The basis is a constant: no gradient
flows to its centres or covariances; gradients flow to the features.

References:
    Farinhas (2021), *Visual Attention with Sparse and Continuous Transformations*, Alg. 1,
    eqs. (3.16)--(3.17), §6.2.2 (footnote 2), Fig. 6.3 and Table 6.1.  Martins et al. (2020),
    *Sparse and Continuous Attention Mechanisms*.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch
from torch import nn

from .._numerics import compute_dtype, symmetric_part
from .._validation import (
    as_float_tensor,
    check_finite,
    check_float_dtype,
    check_int,
    check_positive,
    check_shape_match,
    check_spd,
    require,
)
from ._value_functions_checks import bounds_args, grid_args, locations_arg, number_list

__all__ = [
    "GaussianRBF",
    "grid_locations",
    "padding_locations",
    "ridge_operator",
    "ridge_value_function",
]


# --------------------------------------------------------------------------------------------
# the basis: Gaussian radial basis functions
# --------------------------------------------------------------------------------------------


class GaussianRBF(nn.Module):
    r"""Gaussian radial basis functions :math:`\psi_j(t) = \mathcal N(t;\mu_j,\Sigma_j)`, :math:`j\in[N]`.

    Each basis function is a normalized Gaussian *density* (as in chapter 4 of
    Farinhas (2021)), not an unnormalized bump: :math:`\int\psi_j = 1`.

    Args:
        centers: ``(N, D)`` centers :math:`\mu_j` (a ``(N,)`` tensor is read as ``D = 1``).
        sigma: standard deviations: a number (shared, isotropic), ``(N,)`` (isotropic per basis
            function) or ``(N, D)`` (axis-aligned per basis function); the covariance is
            :math:`\Sigma_j=\operatorname{diag}(\sigma_j^2)`.  Farinhas's (2021) VQA basis,
            :math:`\Sigma_j = 0.001\,I`, is ``sigma=0.001 ** 0.5``.
        covariance: instead of ``sigma``, full covariances ``(D, D)`` (shared) or ``(N, D, D)``.

    Raises:
        ValueError: if both or neither of ``sigma``/``covariance`` are given, a standard deviation
            is not positive, a covariance is not symmetric positive definite, a value is not finite,
            ``centers`` is empty (``N = 0``), or shapes disagree.
        TypeError: for non-numeric or integer-dtype tensors.

    Example:
        >>> basis = GaussianRBF.grid(10, 0.001 ** 0.5, dim=2)
        >>> basis.n_basis, basis.dim
        (100, 2)
        >>> basis(torch.rand(5, 2)).shape
        torch.Size([5, 100])
    """

    def __init__(self, centers, sigma=None, *, covariance=None):
        super().__init__()
        centers = as_float_tensor(centers, "centers", min_ndim=1)
        if centers.ndim == 1:
            centers = centers.unsqueeze(-1)
        if centers.ndim != 2 or centers.shape[0] < 1 or centers.shape[1] < 1:
            raise ValueError(f"centers must have shape (N, D) with N, D >= 1; got {tuple(centers.shape)}")
        check_finite(centers, "centers")
        n, d = centers.shape
        if (sigma is None) == (covariance is None):
            raise ValueError("give exactly one of sigma (standard deviations) and covariance")
        if sigma is not None:
            sigma = as_float_tensor(sigma, "sigma", like=centers).to(device=centers.device, dtype=centers.dtype)
            check_finite(sigma, "sigma")
            if sigma.numel():
                require((sigma > 0).all(), "sigma (standard deviations) must be > 0")
            if sigma.ndim == 0:
                sigma = sigma.expand(n, d)
            elif sigma.ndim == 1:
                if sigma.shape[0] != n:
                    raise ValueError(f"sigma of shape (N,) must have N={n} entries; got {sigma.shape[0]}")
                sigma = sigma.unsqueeze(-1).expand(n, d)
            elif sigma.shape != (n, d):
                raise ValueError(f"sigma must be a number, (N,) or (N, D)=({n}, {d}); got {tuple(sigma.shape)}")
            cov = torch.diag_embed(sigma**2)
        else:
            cov = as_float_tensor(covariance, "covariance", min_ndim=2, like=centers)
            cov = cov.to(device=centers.device, dtype=centers.dtype)
            if cov.ndim == 2:
                cov = cov.expand(n, d, d)
            if cov.shape != (n, d, d):
                raise ValueError(f"covariance must have shape (D, D) or (N, D, D)=({n}, {d}, {d}); got {tuple(cov.shape)}")
            check_spd(cov, "covariance")
            cov = symmetric_part(cov)
        self.register_buffer("centers", centers.clone())
        self.register_buffer("covariance", cov.contiguous().clone())

    @classmethod
    def grid(
        cls,
        n_per_axis: int | Sequence[int],
        sigmas: float | Sequence[float],
        dim: int = 2,
        *,
        low: float = 0.0,
        high: float = 1.0,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> "GaussianRBF":
        r"""Isotropic RBFs centred on regular grids of :math:`[\mathrm{low},\mathrm{high}]^D`.

        One level per entry of ``sigmas``: level :math:`k` puts ``n_per_axis[k]**dim`` centers on
        a ``linspace(low, high, n_per_axis[k])`` grid (``'ij'`` order), all with standard
        deviation ``sigmas[k]``.  ``GaussianRBF.grid(10, 0.001 ** 0.5)`` is the :math:`N=100`
        basis of Table 6.1 of Farinhas (2021).

        Args:
            n_per_axis: centers per axis, one int for every level or one per level.
            sigmas: a standard deviation or a sequence of them (one level each).
            dim: the dimension :math:`D` of the domain.
            low, high: the grid's bounds on each axis.
            dtype, device: of the buffers (defaults: torch's default dtype, CPU).

        Returns:
            A :class:`GaussianRBF` with ``N = sum_k n_per_axis[k] ** dim`` functions.

        Raises:
            ValueError: on non-positive sizes or standard deviations, mismatched lengths, or
                ``high <= low``.
            TypeError: for non-integer sizes, non-numeric standard deviations or bounds, or a
                non-floating ``dtype``.
        """
        dim = check_int(dim, "dim")
        sig = number_list(sigmas, "sigmas", numbers.Real)
        if len(sig) == 0:
            raise ValueError("sigmas must hold at least one standard deviation")
        sig = [check_positive(s, "sigmas") for s in sig]
        if isinstance(n_per_axis, numbers.Integral):
            ns = [n_per_axis] * len(sig)
        else:
            ns = number_list(n_per_axis, "n_per_axis", numbers.Integral)
        if len(ns) != len(sig):
            raise ValueError(f"n_per_axis has {len(ns)} entries but sigmas has {len(sig)}")
        ns = [check_int(n, "n_per_axis") for n in ns]
        low, high = bounds_args(low, high)
        dtype = check_float_dtype(dtype)
        centers, stds = [], []
        for n, s in zip(ns, sig):  # levels: a handful, not a hot path
            c = grid_locations(n, dim, low=low, high=high, dtype=dtype, device=device)
            centers.append(c)
            stds.append(torch.full((c.shape[0],), s, dtype=dtype, device=device))
        return cls(torch.cat(centers), torch.cat(stds))

    @property
    def n_basis(self) -> int:
        """The number :math:`N` of basis functions."""
        return self.centers.shape[0]

    @property
    def dim(self) -> int:
        """The dimension :math:`D` of the domain."""
        return self.centers.shape[1]

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        r"""Evaluate :math:`\psi(t)=[\mathcal N(t;\mu_j,\Sigma_j)]_{j=1}^N`.

        Args:
            t: ``(..., D)`` points.

        Returns:
            ``(..., N)`` values.

        Raises:
            ValueError: if ``t.shape[-1] != D``.
        """
        t = as_float_tensor(t, "t", min_ndim=1)
        check_shape_match(t, "t", self.centers, "basis.centers", [(-1, -1)])
        centers = self.centers.to(device=t.device, dtype=t.dtype)
        L = torch.linalg.cholesky(self.covariance.to(device=t.device, dtype=t.dtype))  # (N, D, D)
        diff = t.unsqueeze(-2) - centers  # (..., N, D)
        z = torch.linalg.solve_triangular(L, diff.unsqueeze(-1), upper=False).squeeze(-1)
        half_logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        return torch.exp(-0.5 * (z * z).sum(-1) - half_logdet - 0.5 * self.dim * math.log(2 * math.pi))

    def extra_repr(self) -> str:
        return f"n_basis={self.n_basis}, dim={self.dim}"


def _check_basis(basis) -> None:
    if not isinstance(basis, GaussianRBF):
        raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")


# --------------------------------------------------------------------------------------------
# locations: the grid of a feature map and its padding (§6.2.2)
# --------------------------------------------------------------------------------------------


def _cartesian_power(axis: torch.Tensor, dim: int) -> torch.Tensor:
    """The ``len(axis) ** dim`` points of ``axis`` to the power ``dim``, ``(len(axis) ** dim, dim)``,
    in ``'ij'`` (row-major) order."""
    mesh = torch.meshgrid(*([axis] * dim), indexing="ij")
    return torch.stack([m.reshape(-1) for m in mesh], dim=-1)


def grid_locations(
    n_per_axis: int,
    dim: int = 2,
    *,
    low: float = 0.0,
    high: float = 1.0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""The ``n_per_axis ** dim`` points of a regular grid of :math:`[\mathrm{low},\mathrm{high}]^D`.

    The locations :math:`t_l` of §6.2.2 of Farinhas (2021) (a :math:`14\times14` feature map normalized to
    the unit square) are ``grid_locations(14)``; the flattening order is ``'ij'`` (row-major), as
    for ``features.flatten(-3, -2)`` of a ``(..., H, W, C)`` map.

    Args:
        n_per_axis: points per axis.
        dim: the dimension :math:`D` of the domain.
        low, high: the grid's bounds on each axis.
        dtype, device: of the result (defaults: torch's default dtype, CPU).

    Returns:
        ``(n_per_axis ** dim, dim)`` tensor (a single point, ``low``, for ``n_per_axis=1``).

    Raises:
        ValueError: if ``n_per_axis`` or ``dim`` is below 1, or ``high <= low``.
        TypeError: if they are not ints, the bounds are not real numbers, or ``dtype`` is not a
            floating dtype.

    Example:
        >>> grid_locations(3, dim=1).flatten().tolist()
        [0.0, 0.5, 1.0]
    """
    n_per_axis, dim, low, high, dtype = grid_args(n_per_axis, dim, low, high, dtype)
    return _cartesian_power(torch.linspace(low, high, n_per_axis, dtype=dtype, device=device), dim)


def padding_locations(
    n_per_axis: int,
    dim: int = 2,
    *,
    low: float = 0.0,
    high: float = 1.0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""Extra grid points around :func:`grid_locations` for the padded ridge regression of §6.2.2.

    The grid with the same step is extended to a cube of twice the side (half a side of margin on
    every face, the unit square inside a square of side 2); the points outside the original cube are
    returned.  Passing them as ``padding`` to :func:`ridge_value_function` fits the value function
    to zero there, so that :math:`V_B` decays to zero beyond the image.

    Args:
        n_per_axis: points per axis of the grid being padded (at least 2: the step is
            ``(high - low) / (n_per_axis - 1)``).
        dim: the dimension :math:`D` of the domain.
        low, high: the bounds on each axis of the grid being padded.
        dtype, device: of the result (defaults: torch's default dtype, CPU).

    Returns:
        ``(P, dim)`` tensor of padding locations; the margin is half a side rounded to whole
        steps, so ``n_per_axis = 2`` (half a side is half a step) gives none (``P = 0``).

    Raises:
        ValueError: if ``n_per_axis < 2`` (no grid step), ``dim < 1`` or ``high <= low``.
        TypeError: if they are not ints, the bounds are not real numbers, or ``dtype`` is not a
            floating dtype.

    Example:
        >>> padding_locations(3, dim=1).flatten().tolist()
        [-0.5, 1.5]
    """
    n_per_axis, dim, low, high, dtype = grid_args(n_per_axis, dim, low, high, dtype, min_per_axis=2)
    step = (high - low) / (n_per_axis - 1)
    m = int(round(0.5 * (high - low) / step))
    idx = _cartesian_power(torch.arange(-m, n_per_axis + m, device=device), dim)  # grid indices
    outside = ((idx < 0) | (idx > n_per_axis - 1)).any(-1)
    return low + idx[outside].to(dtype) * step


# --------------------------------------------------------------------------------------------
# value function: ridge regression (Alg. 1, eq. (3.17))
# --------------------------------------------------------------------------------------------


def _ridge_operator(locations, basis, penalty, padding=None):
    """``G = F^T (F F^T + penalty I)^{-1}`` restricted to the rows of ``locations``: ``(L, N)`` (unchecked)."""
    F = basis(locations)  # (L, N): row l is psi(t_l), i.e. F^T in the notation of eq. (3.17)
    n_loc = F.shape[0]
    if padding is not None:
        F = torch.cat([F, basis(padding)], dim=0)
    if penalty == 0 and F.shape[0] < F.shape[1]:
        raise ValueError(
            f"the ridge normal equations are singular: {F.shape[0]} locations for {F.shape[1]} basis "
            "functions; use penalty > 0"
        )
    gram = F.transpose(-1, -2) @ F
    gram = gram + penalty * torch.eye(gram.shape[-1], dtype=F.dtype, device=F.device)
    G, info = torch.linalg.solve_ex(gram, F.transpose(-1, -2))
    require((info == 0).all() & torch.isfinite(G).all(),
            "the ridge normal equations are singular; use penalty > 0 (or more locations)")
    G = G.transpose(-1, -2)  # gram is symmetric
    return G[:n_loc]


def ridge_operator(
    locations: torch.Tensor,
    basis: GaussianRBF,
    penalty: float = 0.01,
    *,
    padding: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""The matrix :math:`G=F^\top(FF^\top+\eta I_N)^{-1}` that turns features into value coefficients.

    Ridge regression of the features :math:`H\in\mathbb R^{d\times L}` on the basis values
    :math:`F=[\psi(t_1),\dots,\psi(t_L)]\in\mathbb R^{N\times L}` (eq. (3.17) and Fig. 6.3 of
    Farinhas, 2021) gives :math:`B^\star=HG`.  :math:`G` depends only on the locations, the basis and
    the penalty, so a model computes it once ("offline", Fig. 6.3) and applies it to every batch of
    features: ``B = torch.einsum("...ld,ln->...dn", features, G)``.  With ``padding`` (footnote 2
    of §6.2.2) the regression also sees the padding locations, with target zero, and only the rows
    of the real locations are returned.

    Args:
        locations: ``(L, D)`` locations :math:`t_l`.
        basis: the :class:`GaussianRBF` :math:`\psi` (``N`` functions on :math:`\mathbb R^D`).
        penalty: the ridge penalty :math:`\eta\ge0` (0.01 in Farinhas, 2021, Table 6.1).
        padding: optional ``(P, D)`` extra locations where :math:`V_B` is fitted to zero
            (see :func:`padding_locations`).

    Returns:
        ``(L, N)`` tensor :math:`G`, in the dtype and on the device of ``locations``.

    Raises:
        TypeError: ``basis`` not a :class:`GaussianRBF`, ``locations`` or ``padding`` not floating
            point, ``penalty`` not a real number.
        ValueError: ``locations``/``padding`` not ``(L, D)`` with the basis's ``D``, empty or not
            finite, ``penalty < 0``, or singular normal equations (``penalty = 0`` with fewer
            locations than basis functions).

    Example:
        >>> basis, loc = GaussianRBF.grid(3, 0.3), grid_locations(5)
        >>> G = ridge_operator(loc, basis)
        >>> G.shape
        torch.Size([25, 9])
        >>> features = torch.randn(25, 4)
        >>> B = features.T @ G  # the coefficients of ridge_value_function
        >>> B_direct = ridge_value_function(features, loc, basis)
        >>> bool(torch.allclose(B, B_direct, atol=1e-5))
        True

    References:
        Farinhas (2021), eq. (3.17), Fig. 6.3 and footnote 2 of §6.2.2.
    """
    _check_basis(basis)
    locations = locations_arg(locations, basis)
    penalty = check_positive(penalty, "penalty", allow_zero=True)
    if padding is not None:
        padding = locations_arg(padding, basis, "padding").to(locations)
    cdt = compute_dtype(locations.dtype)
    G = _ridge_operator(locations.to(cdt), _BasisAs(basis, locations),
                        penalty, None if padding is None else padding.to(cdt))
    return G.to(locations.dtype)


def ridge_value_function(
    features: torch.Tensor,
    locations: torch.Tensor,
    basis: GaussianRBF,
    penalty: float = 0.01,
    *,
    padding: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Coefficients :math:`B` of the value function :math:`V_B(t) = B\psi(t)` by ridge regression.

    With the :math:`L` feature vectors as rows of :math:`H^\top\in\mathbb R^{L\times d}` and
    :math:`F^\top = [\psi(t_1),\dots,\psi(t_L)]^\top\in\mathbb R^{L\times N}`, eq. (3.17) / Alg. 1 of
    Farinhas (2021) is

    .. math::

        \begin{aligned}
        B^\star &= \arg\min_B \|BF - H\|_F^2 + \eta\|B\|_F^2\\
        &= H F^\top (FF^\top + \eta I_N)^{-1} \in \mathbb R^{d\times N}.
        \end{aligned}

    With ``padding`` (footnote 2 of §6.2.2), the regression also sees the padding locations with
    target zero: their basis values enter :math:`FF^\top` but, their features being zero, only the
    rows of :math:`G=F^\top(FF^\top+\eta I)^{-1}` of the real locations multiply :math:`H`.

    Args:
        features: ``(..., L, d)`` features :math:`h_l` (token-major, as ``value`` in attention).
        locations: ``(L, D)`` locations :math:`t_l`.
        basis: the :class:`GaussianRBF` :math:`\psi` (``N`` functions on :math:`\mathbb R^D`).
        penalty: the ridge penalty :math:`\eta\ge0` (Farinhas (2021) uses 0.01).
        padding: optional ``(P, D)`` extra locations where :math:`V_B` is fitted to zero
            (see :func:`padding_locations`).

    Returns:
        ``(..., d, N)`` tensor :math:`B`; the context for :math:`r=\mathbb E_p[\psi(t)]` is
        ``B @ r.unsqueeze(-1)``.

    Raises:
        ValueError: if shapes disagree, ``features`` or ``locations`` is not finite, ``locations`` is
            empty, ``penalty < 0`` or the normal equations are singular (``penalty = 0`` with fewer
            locations than basis functions).
        TypeError: if ``basis`` is not a :class:`GaussianRBF`, a tensor is not floating point, or
            ``penalty`` is not a real number.

    Example:
        >>> basis, loc = GaussianRBF.grid(3, 0.3), grid_locations(5)
        >>> ridge_value_function(torch.ones(25, 2), loc, basis).shape
        torch.Size([2, 9])

    References:
        Farinhas (2021), Alg. 1, eq. (3.17) and footnote 2 of §6.2.2.
    """
    _check_basis(basis)
    features = as_float_tensor(features, "features", min_ndim=2)
    check_finite(features, "features")
    locations = locations_arg(locations, basis).to(device=features.device, dtype=features.dtype)
    check_shape_match(features, "features", locations, "locations", [(-2, 0)])
    penalty = check_positive(penalty, "penalty", allow_zero=True)
    if padding is not None:
        padding = locations_arg(padding, basis, "padding").to(device=features.device, dtype=features.dtype)
    cdt = compute_dtype(features.dtype)
    G = _ridge_operator(
        locations.to(cdt), _BasisAs(basis, features), penalty, None if padding is None else padding.to(cdt)
    )
    return torch.einsum("...ld,ln->...dn", features, G.to(features.dtype))


class _BasisAs:
    """Evaluate ``basis`` in the compute dtype/device of ``like`` without moving the module."""

    def __init__(self, basis: GaussianRBF, like: torch.Tensor):
        self.basis, self.like = basis, like

    def __call__(self, t):
        return self.basis(t.to(device=self.like.device, dtype=compute_dtype(self.like.dtype)))
