r"""Continuous attention over :math:`\mathbb{R}^D` with Gaussian radial basis functions.

Discrete attention averages :math:`L` value vectors with weights :math:`p\in\Delta^L`.  Continuous
attention (chapters 3--4 of Farinhas, 2021) replaces the simplex by densities on
:math:`S=\mathbb{R}^D` and the weighted average by an expectation.  With a value function
:math:`V_B(t) = B\psi(t)` written in a basis :math:`\psi:\mathbb{R}^D\to\mathbb{R}^N` and a density
:math:`p` that maximizes :math:`\mathbb{E}_p[f(t)] - \Omega_\alpha(p)` for a quadratic score

.. math::

    f(t) = -\tfrac12 (t-\mu)^\top \Sigma^{-1} (t-\mu) = \theta^\top \phi(t),

    \phi(t) = [t,\ tt^\top],\qquad \theta = [\Sigma^{-1}\mu,\ -\tfrac12\Sigma^{-1}],

the context vector is :math:`c = \mathbb{E}_p[V_B(t)] = B r` with :math:`r = \mathbb{E}_p[\psi(t)]`
(eq. (3.16) of Farinhas (2021)).  Shannon's negentropy (:math:`\alpha=1`) gives a
Gaussian :math:`p=\mathcal N(\mu,\Sigma)`; the Gini--Simpson index (:math:`\alpha=2`) gives a
*truncated paraboloid* :math:`p(t) = [-\lambda - \tfrac12(t-\mu)^\top\Sigma^{-1}(t-\mu)]_+`, whose
support is an ellipsoid.

This module provides

* :class:`GaussianRBF` -- the basis :math:`\psi_j(t)=\mathcal N(t;\mu_j,\Sigma_j)`;
* :func:`ridge_value_function` -- the coefficients :math:`B` fitted by ridge regression (Alg. 1);
* :func:`moment_match` -- :math:`(\mu,\Sigma)` from discrete weights, including the inversion of
  Theorem 1 for the truncated paraboloid;
* :func:`continuous_softmax` / :func:`continuous_sparsemax` -- :math:`r=\mathbb{E}_p[\psi(t)]` with
  analytic backward passes (the Jacobian w.r.t. :math:`\theta` is the generalized covariance
  :math:`\operatorname{cov}_{p,2-\alpha}(\phi(t),\psi(t))` of eq. (3.20), chained to
  :math:`(\mu,\Sigma)`);
* :class:`ContinuousAttention` -- the whole pipeline of §6.2.2 as an ``nn.Module``.

Conventions.  ``mu`` has shape ``(..., D)`` and ``Sigma`` ``(..., D, D)``.  ``Sigma`` is always the
*scale* parameter of the density, i.e. the matrix in :math:`\theta_2=-\frac12\Sigma^{-1}`; for the
Gaussian it equals the covariance, for the truncated paraboloid the covariance is
:math:`-\lambda\Sigma/(D/2+2)` (Theorem 1).  Gradients w.r.t. ``Sigma`` are symmetric: they are
gradients of the function of the symmetric part of ``Sigma``.  The basis is a constant: no
gradient flows to its centers or covariances.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import NamedTuple, Sequence

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_choice,
    check_finite,
    check_float_dtype,
    check_int,
    check_nonnegative,
    check_number,
    check_positive,
    check_psd,
    check_same_device,
    check_same_dtype,
    check_shape_match,
    check_spd,
    host_reads_allowed,
    require,
)

__all__ = [
    "DEFAULT_MAX_QUADRATURE",
    "DEFAULT_N_QUADRATURE",
    "DEFAULT_TOL",
    "ContinuousAttention",
    "ContinuousDensity",
    "GaussianRBF",
    "continuous_density",
    "continuous_softmax",
    "continuous_sparsemax",
    "grid_locations",
    "moment_match",
    "padding_locations",
    "ridge_operator",
    "ridge_value_function",
    "truncated_paraboloid_threshold",
]

#: Default ``n_quadrature`` of 2D continuous sparsemax.  ``None`` is the adaptive angular rule with
#: tolerance ``tol``; an int gives the fixed periodic trapezoid rule with that many nodes.
DEFAULT_N_QUADRATURE = None
#: Default relative tolerance of the adaptive rule in float64 (32 machine epsilons in float32).
DEFAULT_TOL = 1e-10
#: Default cap on the angular nodes per (batch, basis) pair of the adaptive rule.
DEFAULT_MAX_QUADRATURE = 4096

_FAMILIES = ("gaussian", "truncated_paraboloid")
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_SQRT_HALF = math.sqrt(0.5)


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def _sym(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x + x.transpose(-1, -2))


def _chol_solve(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``(L L^T)^{-1} B`` by two triangular solves (``cholesky_solve`` reads an error flag back to the host)."""
    y = torch.linalg.solve_triangular(L, B, upper=False)
    return torch.linalg.solve_triangular(L.transpose(-1, -2), y, upper=True)


def _chol_inverse(L: torch.Tensor) -> torch.Tensor:
    """``(L L^T)^{-1}`` from the Cholesky factor ``L``, without host reads."""
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
    L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
    return L_inv.transpose(-1, -2) @ L_inv


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # erf/erfc/cholesky are not implemented (or are too coarse) in half precision
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _as_list(value, name: str, kind) -> list:
    """A number or a sequence of numbers as a list (``TypeError`` naming ``name`` otherwise)."""
    if isinstance(value, torch.Tensor):
        value = value.tolist() if value.ndim else [value.item()]
    if isinstance(value, kind) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a number or a sequence of numbers; got {type(value).__name__}")
    return list(value)


def _check_bounds(low, high) -> tuple[float, float]:
    low, high = check_number(low, "low"), check_number(high, "high")
    if not high > low:
        raise ValueError(f"high must be > low; got low={low}, high={high}")
    return low, high


def _gaussian_const(d: int) -> float:
    r""":math:`\kappa_d=\Gamma(d/2+2)/(2\pi)^{d/2}` of eq. (3.15)."""
    return math.exp(math.lgamma(d / 2 + 2) - (d / 2) * math.log(2 * math.pi))


def truncated_paraboloid_threshold(Sigma: torch.Tensor) -> torch.Tensor:
    r"""The threshold :math:`\lambda<0` that normalizes a truncated paraboloid (eq. (3.15)).

    .. math::

        \lambda = -\left(\frac{\Gamma(D/2+2)}{\sqrt{\det(2\pi\Sigma)}}\right)^{\frac{2}{2+D}} .

    Args:
        Sigma: ``(..., D, D)`` symmetric positive-definite scale matrices.

    Returns:
        ``(...)`` tensor of :math:`\lambda` (negative), in the dtype of ``Sigma``.

    Raises:
        ValueError: if ``Sigma`` is not square, not finite, or not symmetric positive definite (a
            singular scale has :math:`\lambda=-\infty`).
        TypeError: if ``Sigma`` is not a floating-point tensor.

    Example:
        >>> lam = truncated_paraboloid_threshold(torch.eye(2))  # -(1/pi)^(1/2)
        >>> round(lam.item(), 4)
        -0.5642
    """
    Sigma = as_float_tensor(Sigma, "Sigma", min_ndim=2)
    check_spd(Sigma, "Sigma")
    d = Sigma.shape[-1]
    L = torch.linalg.cholesky_ex(_sym(Sigma).to(_compute_dtype(Sigma.dtype)))[0]
    half_logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    log_minus_lam = (2.0 / (d + 2)) * (math.log(_gaussian_const(d)) - half_logdet)
    return (-torch.exp(log_minus_lam)).to(Sigma.dtype)


# --------------------------------------------------------------------------------------------
# basis functions and locations
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
            cov = _sym(cov)
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
        sig = _as_list(sigmas, "sigmas", numbers.Real)
        if len(sig) == 0:
            raise ValueError("sigmas must hold at least one standard deviation")
        sig = [check_positive(s, "sigmas") for s in sig]
        if isinstance(n_per_axis, numbers.Integral):
            ns = [n_per_axis] * len(sig)
        else:
            ns = _as_list(n_per_axis, "n_per_axis", numbers.Integral)
        if len(ns) != len(sig):
            raise ValueError(f"n_per_axis has {len(ns)} entries but sigmas has {len(sig)}")
        ns = [check_int(n, "n_per_axis") for n in ns]
        low, high = _check_bounds(low, high)
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
    n_per_axis = check_int(n_per_axis, "n_per_axis")
    dim = check_int(dim, "dim")
    low, high = _check_bounds(low, high)
    axis = torch.linspace(low, high, n_per_axis, dtype=check_float_dtype(dtype), device=device)
    mesh = torch.meshgrid(*([axis] * dim), indexing="ij")
    return torch.stack([m.reshape(-1) for m in mesh], dim=-1)


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

    Returns:
        ``(P, dim)`` tensor of padding locations.

    Raises:
        ValueError: if ``n_per_axis < 2`` (no grid step), ``dim < 1`` or ``high <= low``.
        TypeError: if they are not ints, the bounds are not real numbers, or ``dtype`` is not a
            floating dtype.

    Example:
        >>> padding_locations(3, dim=1).flatten().tolist()
        [-0.5, 1.5]
    """
    n_per_axis = check_int(n_per_axis, "n_per_axis", minimum=2)
    dim = check_int(dim, "dim")
    low, high = _check_bounds(low, high)
    dtype = check_float_dtype(dtype)
    step = (high - low) / (n_per_axis - 1)
    m = int(round(0.5 * (high - low) / step))
    k = torch.arange(-m, n_per_axis + m, device=device)
    mesh = torch.meshgrid(*([k] * dim), indexing="ij")
    idx = torch.stack([g.reshape(-1) for g in mesh], dim=-1)
    outside = ((idx < 0) | (idx > n_per_axis - 1)).any(-1)
    return low + idx[outside].to(dtype) * step


# --------------------------------------------------------------------------------------------
# value function: ridge regression (Alg. 1)
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
    r"""The matrix :math:`G=F^\top(FF^\top+\lambda I_N)^{-1}` that turns features into value coefficients.

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
        penalty: the ridge penalty :math:`\lambda\ge0` (0.01 in Farinhas, 2021, Table 6.1).
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
        >>> bool(torch.allclose(B, ridge_value_function(features, loc, basis), atol=1e-5))
        True

    References:
        Farinhas (2021), eq. (3.17), Fig. 6.3 and footnote 2 of §6.2.2.
    """
    if not isinstance(basis, GaussianRBF):
        raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
    locations = _check_locations(locations, basis)
    penalty = check_positive(penalty, "penalty", allow_zero=True)
    if padding is not None:
        padding = _check_locations(padding, basis, "padding").to(locations)
    cdt = _compute_dtype(locations.dtype)
    G = _ridge_operator(locations.to(cdt), _BasisAs(basis, locations),
                        penalty, None if padding is None else padding.to(cdt))
    return G.to(locations.dtype)


def _check_locations(locations, basis, name="locations"):
    locations = as_float_tensor(locations, name, min_ndim=2)
    if locations.ndim != 2:
        raise ValueError(f"{name} must have shape (L, D); got {tuple(locations.shape)}")
    check_finite(locations, name)
    if locations.shape[-1] != basis.dim:
        raise ValueError(f"{name} has points of dimension {locations.shape[-1]} but the basis has D={basis.dim}")
    if locations.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one point")
    return locations


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

        B^\star = \arg\min_B \|BF - H\|_F^2 + \lambda\|B\|_F^2
                = H F^\top (FF^\top + \lambda I_N)^{-1} \in \mathbb R^{d\times N}.

    With ``padding`` (footnote 2 of §6.2.2), the regression also sees the padding locations with
    target zero: their basis values enter :math:`FF^\top` but, their features being zero, only the
    rows of :math:`G=F^\top(FF^\top+\lambda I)^{-1}` of the real locations multiply :math:`H`.

    Args:
        features: ``(..., L, d)`` features :math:`h_l` (token-major, as ``value`` in attention).
        locations: ``(L, D)`` locations :math:`t_l`.
        basis: the :class:`GaussianRBF` :math:`\psi` (``N`` functions on :math:`\mathbb R^D`).
        penalty: the ridge penalty :math:`\lambda\ge0` (Farinhas (2021) uses 0.01).
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
    """
    if not isinstance(basis, GaussianRBF):
        raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
    features = as_float_tensor(features, "features", min_ndim=2)
    check_finite(features, "features")
    locations = _check_locations(locations, basis).to(device=features.device, dtype=features.dtype)
    check_shape_match(features, "features", locations, "locations", [(-2, 0)])
    penalty = check_positive(penalty, "penalty", allow_zero=True)
    if padding is not None:
        padding = _check_locations(padding, basis, "padding").to(device=features.device, dtype=features.dtype)
    cdt = _compute_dtype(features.dtype)
    G = _ridge_operator(
        locations.to(cdt), _BasisAs(basis, features), penalty, None if padding is None else padding.to(cdt)
    )
    return torch.einsum("...ld,ln->...dn", features, G.to(features.dtype))


class _BasisAs:
    """Evaluate ``basis`` in the compute dtype/device of ``like`` without moving the module."""

    def __init__(self, basis: GaussianRBF, like: torch.Tensor):
        self.basis, self.like = basis, like

    def __call__(self, t):
        return self.basis(t.to(device=self.like.device, dtype=_compute_dtype(self.like.dtype)))


# --------------------------------------------------------------------------------------------
# moment matching (Thm 1)
# --------------------------------------------------------------------------------------------


def moment_match(
    weights: torch.Tensor,
    locations: torch.Tensor,
    family: str = "gaussian",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Parameters :math:`(\mu,\Sigma)` of the density whose mean and variance match discrete weights.

    With :math:`p=w/\sum_l w_l`, the mean and variance are
    :math:`\mu=\sum_l p_l t_l`, :math:`\mathrm{Var}=\sum_l p_l(t_l-\mu)(t_l-\mu)^\top`.  For a Gaussian,
    :math:`\Sigma=\mathrm{Var}`.  For a truncated paraboloid Theorem 1 of Farinhas (2021) gives
    :math:`\mathrm{Var}=-\lambda\Sigma/(D/2+2)` with :math:`\lambda` of eq. (3.15); taking
    determinants and solving (with :math:`\kappa_D=\Gamma(D/2+2)/(2\pi)^{D/2}` and
    :math:`k=\kappa_D^{2/(D+2)}/(D/2+2)`),

    .. math::

        \Sigma = k^{-(1+D/2)}\,|\mathrm{Var}|^{1/2}\,\mathrm{Var},

    which is :math:`\sigma^2=\tfrac23(5\,\mathrm{Var})^{3/2}` for :math:`D=1` (eq. (4.3)) and
    :math:`\Sigma=9\pi|\mathrm{Var}|^{1/2}\mathrm{Var}` for :math:`D=2` (eq. (4.6)).

    Args:
        weights: ``(..., L)`` non-negative weights (normalized here; a softmax output passes
            through unchanged).
        locations: ``(L, D)`` or ``(..., L, D)`` locations, broadcast against ``weights``.
        family: ``"gaussian"`` (continuous softmax) or ``"truncated_paraboloid"`` (sparsemax).

    Returns:
        ``(mu, Sigma)`` of shapes ``(..., D)`` and ``(..., D, D)``, in the dtype of ``weights``;
        ``Sigma`` is the scale parameter, equal to the variance only for the Gaussian.  Weights on a
        single location (or on collinear locations) give a singular variance; the paraboloid's scale
        is then 0 (its threshold :math:`\lambda` is :math:`-\infty`): :class:`ContinuousAttention`
        works from the variance instead and handles these limits.  An empty batch gives empty outputs.

    Raises:
        ValueError: on negative, NaN or infinite weights, a row of weights summing to 0, non-finite
            locations, mismatched or empty ``L``, shapes that do not broadcast, or an unknown family.
        TypeError: for non-float tensors, ``weights`` and ``locations`` of different dtypes, or a
            non-string family.

    Example:
        >>> loc = grid_locations(3, dtype=torch.float64)
        >>> mu, var = moment_match(torch.ones(9, dtype=torch.float64), loc)
        >>> [round(x, 4) for x in mu.tolist()], round(var[0, 0].item(), 4)
        ([0.5, 0.5], 0.1667)
    """
    family = check_choice(family, "family", _FAMILIES)
    weights = as_float_tensor(weights, "weights", min_ndim=1)
    locations = as_float_tensor(locations, "locations", min_ndim=2, like=weights)
    check_same_dtype(locations, "locations", weights, "weights")
    check_same_device(locations, "locations", weights, "weights")
    check_shape_match(weights, "weights", locations, "locations", [(-1, -2)])
    if weights.shape[-1] == 0:
        raise ValueError("weights and locations must hold at least one location (L >= 1); got L = 0")
    broadcast_shapes(weights=weights.shape[:-1], locations=locations.shape[:-2])
    check_finite(weights, "weights")
    check_finite(locations, "locations")
    check_nonnegative(weights, "weights")
    total = weights.sum(-1, keepdim=True)
    if total.numel():
        require((total > 0).all(), "weights must have a positive sum along the last dimension")
    mu, var = _match_moments(weights / total, locations)
    return (mu, var) if family == "gaussian" else (mu, _paraboloid_scale(var))


def _match_moments(p: torch.Tensor, locations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of the discrete distribution ``p`` (``(..., L)``, normalized) on ``locations``."""
    mu = torch.einsum("...l,...ld->...d", p, locations)
    centred = locations - mu.unsqueeze(-2)
    var = torch.einsum("...l,...ld,...le->...de", p, centred, centred)
    return mu, _sym(var)


def _paraboloid_scale(var: torch.Tensor) -> torch.Tensor:
    r"""The scale :math:`\Sigma=k^{-(1+D/2)}|V|^{1/2}V` of the truncated paraboloid with covariance ``var``
    (zero for a singular covariance, where :math:`\lambda=-\infty`)."""
    d = var.shape[-1]
    k = _gaussian_const(d) ** (2.0 / (d + 2)) / (d / 2 + 2)
    if d == 1:
        det = var[..., 0, 0]
    elif d == 2:
        det = var[..., 0, 0] * var[..., 1, 1] - var[..., 0, 1] * var[..., 1, 0]
    else:
        det = torch.linalg.det(var)
    scale = det.clamp_min(0).sqrt() * k ** (-(1 + d / 2))
    return scale[..., None, None] * var


def continuous_density(t: torch.Tensor, mu: torch.Tensor, Sigma: torch.Tensor, family: str = "gaussian") -> torch.Tensor:
    r"""Evaluate :math:`\mathcal N(t;\mu,\Sigma)` (eq. (3.12)) or
    :math:`\mathcal{TP}(t;\mu,\Sigma)=[-\lambda-\frac12(t-\mu)^\top\Sigma^{-1}(t-\mu)]_+` (eq. (3.14)).

    Args:
        t: ``(..., D)`` points; ``mu`` ``(..., D)`` and ``Sigma`` ``(..., D, D)`` broadcast against them.
        family: ``"gaussian"`` or ``"truncated_paraboloid"``.

    Returns:
        ``(...)`` density values (for plotting attention maps), in the dtype of ``t``.

    Raises:
        ValueError: if ``Sigma`` is not symmetric positive definite, an input is not finite, or
            shapes disagree or do not broadcast.
        TypeError: for non-float tensors, inputs of different dtypes, or a non-string family.

    Example:
        >>> mu, Sigma = torch.zeros(2), torch.eye(2)
        >>> p = continuous_density(torch.zeros(2), mu, Sigma)  # 1 / (2 pi)
        >>> round(p.item(), 4)
        0.1592
    """
    family = check_choice(family, "family", _FAMILIES)
    t = as_float_tensor(t, "t", min_ndim=1)
    mu = as_float_tensor(mu, "mu", min_ndim=1)
    Sigma = as_float_tensor(Sigma, "Sigma", min_ndim=2)
    for x, name in ((mu, "mu"), (Sigma, "Sigma")):
        check_same_dtype(x, name, t, "t")
        check_same_device(x, name, t, "t")
    check_shape_match(t, "t", mu, "mu", [(-1, -1)])
    check_shape_match(mu, "mu", Sigma, "Sigma", [(-1, -1)])
    broadcast_shapes(t=t.shape[:-1], mu=mu.shape[:-1], Sigma=Sigma.shape[:-2])
    check_finite(t, "t")
    check_finite(mu, "mu")
    check_spd(Sigma, "Sigma")
    d = mu.shape[-1]
    L = torch.linalg.cholesky_ex(_sym(Sigma))[0]
    diff = (t - mu).unsqueeze(-1)
    L = L.expand(*diff.shape[:-2], d, d) if L.ndim < diff.ndim else L
    z = torch.linalg.solve_triangular(L, diff, upper=False).squeeze(-1)
    quad = 0.5 * (z * z).sum(-1)
    half_logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    if family == "gaussian":
        return torch.exp(-quad - half_logdet - 0.5 * d * math.log(2 * math.pi))
    minus_lam = torch.exp((2.0 / (d + 2)) * (math.log(_gaussian_const(d)) - half_logdet))
    return torch.clamp(minus_lam - quad, min=0.0)


# --------------------------------------------------------------------------------------------
# continuous softmax (alpha = 1), any D: eqs. (4.7)-(4.12), Alg. 3
# --------------------------------------------------------------------------------------------


class _ContinuousSoftmaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mu, Sigma, centers, cov):
        # mu (B, D), Sigma (B, D, D) PSD, centers (N, D), cov (N, D, D) SPD
        d = mu.shape[-1]
        S = Sigma.unsqueeze(-3) + cov  # (B, N, D, D): S_j = Sigma + Sigma_j, SPD
        diff = mu.unsqueeze(-2) - centers  # (B, N, D): mu - mu_j
        if d == 2:  # the 2x2 inverse in closed form: batched LAPACK calls on tiny matrices are slow
            a, b, c = S[..., 0, 0], S[..., 0, 1], S[..., 1, 1]
            det = a * c - b * b
            S_inv = torch.stack([torch.stack([c, -b], -1), torch.stack([-b, a], -1)], -2) / det[..., None, None]
            half_logdet = 0.5 * torch.log(det)
        else:
            Ls = torch.linalg.cholesky_ex(S)[0]
            S_inv = _chol_inverse(Ls)
            half_logdet = torch.log(torch.diagonal(Ls, dim1=-2, dim2=-1)).sum(-1)
        w = (S_inv @ diff.unsqueeze(-1)).squeeze(-1)  # S^{-1}(mu - mu_j)
        quad = (diff * w).sum(-1)
        r = torch.exp(-0.5 * quad - half_logdet - 0.5 * d * math.log(2 * math.pi))  # eq. (4.10)
        ctx.save_for_backward(S_inv, w, r)
        return r

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_r):
        S_inv, w, r = ctx.saved_tensors
        # r_j = N(mu; mu_j, S_j), S_j = Sigma + Sigma_j: dr_j/dmu = -r_j w_j and
        # dr_j/dSigma = dr_j/dS_j = r_j (w_j w_j^T - S_j^{-1}) / 2, w_j = S_j^{-1}(mu - mu_j); no Sigma^{-1},
        # so Sigma may be singular (eqs. (4.11)-(4.12) chained to (mu, Sigma) give the same)
        gs = grad_r * r
        grad_mu = -torch.einsum("bn,bnd->bd", gs, w)
        outer = w.unsqueeze(-1) * w.unsqueeze(-2)
        grad_Sigma = 0.5 * torch.einsum("bn,bnde->bde", gs, outer - S_inv)
        return grad_mu, _sym(grad_Sigma), None, None


def _prepare(mu, Sigma, basis, name_fn, *, definite, names=("mu", "Sigma")):
    """Validate ``(mu, Sigma, basis)`` and flatten the batch: ``Sigma`` SPD (``definite``) or PSD.
    ``names`` are the user's names of the two arguments (for the error messages)."""
    n_mu, n_S = names
    if not isinstance(basis, GaussianRBF):
        raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
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
    cdt = _compute_dtype(mu.dtype)
    mu_f = mu.expand(*batch, d).reshape(-1, d).to(cdt)
    Sigma_f = _sym(Sigma.expand(*batch, d, d).reshape(-1, d, d).to(cdt))
    centers = basis.centers.to(device=mu.device, dtype=cdt)
    cov = basis.covariance.to(device=mu.device, dtype=cdt)
    return mu_f, Sigma_f, centers, cov, batch, mu.dtype


def _softmax_flat(mu_f, Sigma_f, centers, cov):
    if mu_f.shape[0] == 0:
        return mu_f.new_zeros((0, centers.shape[0]))
    return _ContinuousSoftmaxFn.apply(mu_f, Sigma_f, centers, cov)


def continuous_softmax(mu: torch.Tensor, Sigma: torch.Tensor, basis: GaussianRBF) -> torch.Tensor:
    r"""Continuous softmax attention :math:`r_j=\mathbb E_{\mathcal N(\mu,\Sigma)}[\psi_j(t)]`, any :math:`D`.

    The product of two Gaussian densities is a scaled Gaussian (eqs. (4.8)--(4.9) of
    Farinhas (2021)), so eq. (4.7) has the closed form (eq. (4.10))

    .. math::

        r_j = \int_{\mathbb R^D}\mathcal N(t;\mu,\Sigma)\,\mathcal N(t;\mu_j,\Sigma_j)\,dt
            = \mathcal N(\mu;\mu_j,\Sigma+\Sigma_j).

    Since :math:`\Sigma+\Sigma_j` is positive definite whenever :math:`\Sigma` is positive
    *semi*-definite, so is the closed form: a singular :math:`\Sigma` (a Gaussian on a line) is accepted,
    and :math:`\Sigma=0` (the point mass :math:`\delta_\mu`) gives :math:`r_j=\psi_j(\mu)`.

    The backward pass (Alg. 3) is the Jacobian w.r.t. the canonical parameters
    :math:`\theta=[\Sigma^{-1}\mu,-\frac12\Sigma^{-1}]`, a covariance (eq. (3.20) with
    :math:`\beta=1`, rows eqs. (4.11)--(4.12)), chained to :math:`(\mu,\Sigma)`; the chain simplifies to
    derivatives of the closed form in :math:`S_j=\Sigma+\Sigma_j`,
    :math:`\partial r_j/\partial\mu=-r_jS_j^{-1}(\mu-\mu_j)` and
    :math:`\partial r_j/\partial\Sigma=\frac12r_j\big(S_j^{-1}(\mu-\mu_j)(\mu-\mu_j)^\top S_j^{-1}-S_j^{-1}\big)`,
    which is how it is computed: no :math:`\Sigma^{-1}` is needed.

    Args:
        mu: ``(..., D)`` means.
        Sigma: ``(..., D, D)`` covariances, symmetric positive semi-definite (up to a relative
            round-off of :math:`\sqrt{\epsilon}`); leading dims broadcast with ``mu``'s.
        basis: :class:`GaussianRBF` with ``N`` functions on :math:`\mathbb R^D`.

    Returns:
        ``(..., N)`` tensor :math:`r` in the dtype of ``mu``; an empty batch gives an empty result.

    Raises:
        ValueError: if ``mu`` or ``Sigma`` is not finite, ``Sigma`` is not symmetric positive
            semi-definite, or shapes disagree.
        TypeError: if ``basis`` is not a :class:`GaussianRBF`, a tensor is not floating point or
            ``mu`` and ``Sigma`` differ in dtype.

    Example:
        >>> basis = GaussianRBF.grid(3, 0.3, dim=2, dtype=torch.float64)
        >>> mu = torch.tensor([0.2, 0.7], dtype=torch.float64)
        >>> point_mass = torch.zeros(2, 2, dtype=torch.float64)
        >>> r = continuous_softmax(mu, point_mass, basis)
        >>> bool(torch.allclose(r, basis(mu)))
        True

    References:
        Farinhas (2021), eqs. (4.7)-(4.12); Martins et al. (2020).
    """
    mu_f, Sigma_f, centers, cov, batch, dtype = _prepare(mu, Sigma, basis, "continuous_softmax", definite=False)
    r = _softmax_flat(mu_f, Sigma_f, centers, cov)
    return r.reshape(*batch, basis.n_basis).to(dtype)


# --------------------------------------------------------------------------------------------
# continuous sparsemax (alpha = 2), D in {1, 2}: Appendix A.2, Alg. 4
# --------------------------------------------------------------------------------------------
#
# Write the support E = {t : p(t) > 0} as t = mu + M u, |u| <= 1, with M M^T = S := -2 lambda Sigma
# = (D + 4) V, V the covariance of p (Thm. 1).  M is the lower-triangular factor of S: for an SPD
# scale Sigma it is sqrt(-2 lambda) chol(Sigma); for a singular covariance (a density on a segment, or
# the point mass V = 0) it is still defined, and M = 0 at the point mass.  Then p(t) dt = w(u) du with
# w = (1 - |u|^2) / Z1 on the unit ball (eq. (3.14)), and
#     r_j = E_w[psi_j(mu + M u)],  psi_j(mu + M u) = psi_j(mu) exp(-u^T A_j u / 2 + b_j^T u),
#     A_j = M^T Sigma_j^{-1} M,  b_j = M^T Sigma_j^{-1} (mu_j - mu),
# with no inverse of M: A_j, b_j -> 0 as M -> 0 and r_j -> psi_j(mu).  Each pair (b, j) takes one of
# two routes, chosen by the smallest eigenvalue a_2 of A_j (psi_j narrower than the ellipse in every
# direction, or not):
#
# * Lemma 1 (a_2 >= _STIFF): N(t; mu_j, Sigma_j) dt = N(u; mu~_j, Sigma~_j) du with Sigma~_j = A_j^{-1},
#   mu~_j = A_j^{-1} b_j (Lemma 1 of App. A.2), and everything follows from the moments over the disk
#       U0_j = int N(u),   U1_j = int u N(u),   U2_j = int u u^T N(u):
#       r_j = -lambda (U0_j - tr U2_j)                                              (A.15)
#   In 2D they are integrals in polar coordinates u = rho a(phi): the radial integral is in closed form
#   (eqs. A.18-A.22, A.31, A.34, A.40), the angular one uses the periodic trapezoid rule, which
#   converges geometrically for smooth periodic integrands.  The closed forms lose accuracy as A_j gets
#   small (the Gaussian N(u; mu~, Sigma~) becomes flat and far), which is why the route is kept for
#   a_2 >= 1.  Backward, by differentiating under the integral (p = 0 on the boundary of E; the
#   covariance (A.24)-(A.25) of eq. (3.20), written in S instead of theta):
#       dr_j/dmu = 2 (-lambda) M^{-T} U1_j,   dr_j/dS = (-lambda) M^{-T} (U2_j - (U0_j - tr U2_j) I / 2) M^{-1}.
# * slices (a_2 < _STIFF, and Lemma-1 pairs in the tails, where the radial closed forms cancel): Cartesian
#   slices of the disk in a frame (v_i, v_o): the outer direction v_o is the stiff eigenvector of A_j
#   (or b_j when both are soft), integrated by the periodic trapezoid rule in theta, v_o = sin theta, on
#   a window of angles; the inner one by Gauss-Legendre on each chord, or on the window of the chord
#   where a stiff inner factor is not negligible.  The exponent is written around an anchor point (the
#   centre along stiff axes) at which log psi_j is evaluated directly, so that no large terms cancel.
#   The moments E_w[{1, u} f_j] and E_w2[{1, u, uu^T} f_j], f_j = psi_j(mu + M u), w2 = (1 - |u|^2)^2 / Z2,
#   give the backward pass without M^{-1}:
#       dr_j/dmu = E_w[grad psi_j] = Sigma_j^{-1} ((mu_j - mu) E_w f_j - M E_w[u f_j]),
#       dr_j/dS  = Z2 / (8 Z1) E_w2[Hess psi_j]
#   (integrating (1 - |u|^2) u = -grad (1 - |u|^2)^2 / 4 by parts: w2 vanishes on the sphere); for the
#   stiff pairs, whose Hessian terms would cancel, the Lemma-1 formulas from the unweighted means.
# The gradient w.r.t. S is chained to Sigma (S = -2 lambda(Sigma) Sigma) or to V (S = (D + 4) V) by
# autograd outside the Function.

#: Smallest eigenvalue of A_j = M^T Sigma_j^{-1} M from which a pair takes the route of Lemma 1.
_STIFF = 1.0
#: Distance |mu~_j| beyond which a Lemma-1 pair counts as in the tails (see _lemma1_masks).
_FAR = 3.0
#: Z_l = int_{|u| <= 1} (1 - |u|^2)^l du, l = 1, 2, for D = 1, 2.
_BALL_Z = {1: (4.0 / 3.0, 16.0 / 15.0), 2: (0.5 * math.pi, math.pi / 3.0)}
#: Refinement rounds of the read-free rule (no host reads): every remaining pair gets m 2^k nodes.
_READ_FREE_ROUNDS = 2
#: Refinement rounds of the read-free rule for the slice route (m 2^k angles), and the depth of its chord
#: windows (a chord rule that resolves an exponent varying by this much).
_READ_FREE_SLICE_ROUNDS = 1
_READ_FREE_DEPTH = 24.0
#: Axis ratio a1 / a2 of A_j above which the read-free rule integrates a Lemma-1 pair by slices.
_READ_FREE_ANISOTROPY = 8.0


def _delta_phi(x_lo: torch.Tensor, x_hi: torch.Tensor) -> torch.Tensor:
    r""":math:`\Phi(\sqrt2 x_{hi})-\Phi(\sqrt2 x_{lo})` for :math:`x_{lo}\le x_{hi}`, without cancellation in the tails."""
    # erfc(x) = 2 - erfc(-x): write erfc(x) = 2 [x < 0] + sign(x) erfc(|x|)
    e_lo = torch.special.erfc(x_lo.abs()).copysign(x_lo)
    e_hi = torch.special.erfc(x_hi.abs()).copysign(x_hi)
    straddle = ((x_lo < 0) & (x_hi >= 0)).to(x_lo.dtype)
    return 0.5 * (e_lo - e_hi) + straddle


def _ball_moments_1d(mu_t: torch.Tensor, var_t: torch.Tensor):
    """Moments of N(u; mu_t, var_t) over [-1, 1]; mu_t (B, N), var_t (B, N)."""
    s = var_t.sqrt()
    lo = (-1.0 - mu_t) / s
    hi = (1.0 - mu_t) / s
    I0 = _delta_phi(lo * _SQRT_HALF, hi * _SQRT_HALF)
    phi_lo = torch.exp(-0.5 * lo * lo) / _SQRT_2PI
    phi_hi = torch.exp(-0.5 * hi * hi) / _SQRT_2PI
    U0 = I0
    U1 = mu_t * I0 + s * (phi_lo - phi_hi)
    U2 = (mu_t * mu_t + var_t) * I0 + s * ((mu_t - 1.0) * phi_lo - (mu_t + 1.0) * phi_hi)
    return U0, U1.unsqueeze(-1), U2[..., None, None]


def _psd_factor(S: torch.Tensor) -> torch.Tensor:
    r"""Lower-triangular :math:`M` with :math:`MM^\top=S` for PSD ``(B, D, D)`` matrices, :math:`D\in\{1,2\}`,
    in closed form and defined for singular :math:`S` (:math:`M=0` for :math:`S=0`); a negative
    pivot left by round-off counts as zero."""
    s00 = S[:, 0, 0].clamp_min(0.0)
    l00 = s00.sqrt()
    if S.shape[-1] == 1:
        return l00[:, None, None]
    l10 = torch.where(s00 > 0, S[:, 1, 0] / torch.where(s00 > 0, l00, 1.0), 0.0)
    l11 = (S[:, 1, 1] - l10 * l10).clamp_min(0.0).sqrt()
    zero = torch.zeros_like(l00)
    return torch.stack([torch.stack([l00, zero], -1), torch.stack([l10, l11], -1)], -2)


def _pairs(mu, M, centers, cov):
    r"""Per-pair quantities, ``(B, N)`` tensors (``(N,)`` for those of the basis alone), in closed form.

    With :math:`d_j=\mu_j-\mu`: ``logpsi0`` (:math:`\log\psi_j(\mu)`), ``q``
    (:math:`d_j^\top\Sigma_j^{-1}d_j`), the entries of :math:`A_j=M^\top\Sigma_j^{-1}M` (``A00``, ``A01``,
    ``A11``) and ``detA``, of :math:`b_j=M^\top\Sigma_j^{-1}d_j` (``b0``, ``b1``), of :math:`d_j`
    (``d0``, ``d1``), of :math:`\Sigma_j^{-1}` (``i00``, ``i01``, ``i11``), ``lognorm``
    (:math:`\log\max\psi_j`) and, for the Lemma-1 route,
    of :math:`\tilde\mu_j=M^{-1}d_j` (``mt0``, ``mt1``; inf or NaN where :math:`M` is singular, and then
    unused).  For :math:`D=1` only the ``*0``/``*00`` keys.  ``M`` is lower triangular.
    """
    if mu.shape[-1] == 1:
        m = M[:, 0, 0, None]  # (B, 1)
        v = cov[:, 0, 0]  # (N,)
        i00 = 1.0 / v
        d0 = centers[:, 0] - mu[:, :1]
        w0 = i00 * d0
        q = d0 * w0
        A00 = m * m * i00
        lognorm = -0.5 * torch.log(v) - 0.5 * math.log(2.0 * math.pi)
        return {"logpsi0": lognorm - 0.5 * q, "lognorm": lognorm, "q": q,
                "A00": A00, "detA": A00, "b0": m * w0, "d0": d0, "i00": i00, "mt0": d0 / m}
    m00, m10, m11 = M[:, 0, 0, None], M[:, 1, 0, None], M[:, 1, 1, None]  # (B, 1)
    v00, v01, v11 = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1]  # (N,)
    det_j = v00 * v11 - v01 * v01
    i00, i01, i11 = v11 / det_j, -v01 / det_j, v00 / det_j  # Sigma_j^{-1}
    d0 = centers[:, 0] - mu[:, :1]  # (B, N): mu_j - mu
    d1 = centers[:, 1] - mu[:, 1:]
    w0 = i00 * d0 + i01 * d1  # Sigma_j^{-1} (mu_j - mu)
    w1 = i01 * d0 + i11 * d1
    q = d0 * w0 + d1 * w1
    k10 = i01 * m00 + i11 * m10  # (Sigma_j^{-1} M)_{10}
    mt0 = d0 / m00  # mu~ = M^{-1}(mu_j - mu), M lower triangular
    lognorm = -0.5 * torch.log(det_j) - math.log(2.0 * math.pi)
    return {
        "logpsi0": lognorm - 0.5 * q, "lognorm": lognorm, "q": q,
        "A00": m00 * (i00 * m00 + i01 * m10) + m10 * k10, "A01": m11 * k10, "A11": m11 * m11 * i11,
        "detA": (m00 * m11) ** 2 / det_j, "b0": m00 * w0 + m10 * w1, "b1": m11 * w1,
        "d0": d0, "d1": d1, "i00": i00, "i01": i01, "i11": i11,
        "mt0": mt0, "mt1": (d1 - m10 * mt0) / m11,
    }


def _gather(pairs, idx, B, N):
    """The entries of ``pairs`` as flat ``(p,)`` tensors at the flat pair indices ``idx`` (``None``: all)."""
    out = {}
    for k, v in pairs.items():
        flat = v.expand(B, N).reshape(-1)
        out[k] = flat if idx is None else flat[idx]
    return out


def _eig2(A00, A01, A11, detA):
    """Eigenvalues ``a1 >= a2 >= 0`` and the angle of the eigenvector of ``a1`` of symmetric 2x2 PSD matrices;
    ``a2 = det / a1`` from the exact determinant, without the cancellation of ``mean - radius``."""
    mean = 0.5 * (A00 + A11)
    rad = torch.hypot(0.5 * (A00 - A11), A01)
    a1 = mean + rad
    a2 = torch.where(a1 > 0, detA / torch.where(a1 > 0, a1, 1.0), 0.0).clamp_min(0.0)
    angle = 0.5 * torch.atan2(2.0 * A01, A00 - A11)
    return a1, a2, angle


def _eig_small(pairs, a1):
    """The smaller eigenvalue of A_j (2D), from the exact determinant."""
    return torch.where(a1 > 0, pairs["detA"] / torch.where(a1 > 0, a1, 1.0), 0.0)


def _lemma1_pair_2d(pairs, route, all_route):
    r"""The dict of the Lemma-1 route (``P00, P01, P11`` of :math:`P=\tilde\Sigma^{-1}=A_j`, ``detP``,
    :math:`P\tilde\mu=b_j` as ``Pm0, Pm1``, :math:`\tilde\mu` as ``mt0, mt1`` and ``q``), with the
    standard Gaussian in place of the pairs that do not take the route (unless ``all_route``; their
    results are discarded), so that no inf or NaN enters the shared computations."""
    names = {"P00": "A00", "P01": "A01", "P11": "A11", "detP": "detA", "Pm0": "b0", "Pm1": "b1",
             "mt0": "mt0", "mt1": "mt1", "q": "q"}
    if all_route:
        return {k: pairs[v] for k, v in names.items()}
    benign = {"P00": 1.0, "P11": 1.0, "detP": 1.0}
    return {k: torch.where(route, pairs[v], benign.get(k, 0.0)) for k, v in names.items()}


_SQRT_PI = math.sqrt(math.pi)
_LOG_SQRT_PI = 0.5 * math.log(math.pi)


def _ray_params(pair):
    r"""The per-pair constants of :func:`_ray_terms` as ``(8, p)`` rows, ``p`` the number of pairs:
    :math:`(P_{00}+P_{11})/4`, :math:`(P_{00}-P_{11})/4`, :math:`P_{01}`, :math:`P\tilde\mu/2`,
    :math:`\tilde\mu\sqrt{\det P}/2` and :math:`e^{-q/2}/\sqrt\pi`."""
    P00, P01, P11 = pair["P00"], pair["P01"], pair["P11"]
    half_sd = 0.5 * pair["detP"].sqrt()
    rows = [0.25 * (P00 + P11), 0.25 * (P00 - P11), P01, 0.5 * pair["Pm0"], 0.5 * pair["Pm1"],
            pair["mt0"] * half_sd, pair["mt1"] * half_sd, torch.exp(-0.5 * pair["q"]) / _SQRT_PI]
    return torch.stack([x.reshape(-1) for x in rows])


def _ray_terms(prm, phi):
    r"""Angular integrands of the six unit-disk moments at the directions :math:`a=(\cos\varphi,\sin\varphi)`.

    ``prm`` is ``(8, p)`` (:func:`_ray_params`), ``phi`` is ``(p, m)`` or ``(1, m)``.  Along the ray
    :math:`u=\rho a`, Lemma 1 of Appendix A.2 gives a 1D Gaussian in :math:`\rho` with
    :math:`1/\sigma^2=a^\top Pa`, :math:`r_0=\sigma^2a^\top P\tilde\mu` and scale
    :math:`\tilde s\propto e^{-\mathrm{perp}^2/2}`, :math:`\mathrm{perp}^2=\det P\,(a\times\tilde\mu)^2/a^\top Pa`
    (eq. (A.17)); the radial integrals :math:`T_k=\tilde s\int_0^1\rho^k\mathcal N(\rho;r_0,\sigma^2)d\rho`,
    :math:`k=1,2,3`, are in closed form.  Returns a ``(6, p, m)`` tensor
    :math:`[T_1,\ T_2\cos,\ T_2\sin,\ T_3,\ T_3\cos2\varphi,\ T_3\cos\varphi\sin\varphi]` up to the factor
    :math:`\sqrt{\pi}/2` and the weight :math:`\sqrt{\det P}/(2\pi)` of an angle.

    Every intermediate lives in one preallocated workspace and is updated in place: with fresh
    tensors per operation, the page faults of the allocator cost more than the arithmetic on CPU.
    """
    dtype, device = phi.dtype, phi.device
    # Arguments of exp/erfc are clamped where the result would underflow: the clamped values
    # (~1e-35 in float32, ~1e-300 in float64) are negligible, and the underflowing inputs would take
    # the slow path of the vectorized exp/erfc (about 25x slower on CPU).
    log_tiny = -math.log(torch.finfo(dtype).tiny)
    exp_floor, erfc_ceil = -(log_tiny - 8.0), math.sqrt(log_tiny) - 0.5
    al, be, ga, b0, b1, c0, c1, llh = prm.unsqueeze(-1)  # (p, 1) each
    trig = torch.empty((4,) + tuple(phi.shape), dtype=dtype, device=device)
    ws = torch.empty((14, prm.shape[1], phi.shape[-1]), dtype=dtype, device=device)
    co, si, c2, cs = trig
    z, rz, p, y, r0, w, hh, sx = ws[:8]
    out = ws[8:]
    torch.cos(phi, out=co)
    torch.sin(phi, out=si)
    torch.mul(co, si, out=cs)
    torch.mul(co, co, out=c2).addcmul_(si, si, value=-1.0)  # cos 2 phi
    torch.addcmul(al, be, c2, out=z).addcmul_(ga, cs).sqrt_()  # z = sqrt(a^T P a / 2) = 1 / (sigma sqrt 2)
    torch.reciprocal(z, out=rz)  # sigma sqrt 2
    torch.mul(co, b0, out=p).addcmul_(b1, si).mul_(rz)  # r0 z = -x_lo,  x_lo = -r0 / (sigma sqrt 2)
    torch.mul(si, c0, out=y).addcmul_(c1, co, value=-1.0).mul_(rz)
    y.mul_(y)  # perp^2 / 2: det(P) (a x mu~)^2 / (2 a^T P a), without the cancellation of q - (a^T P mu~)^2 / a^T P a
    torch.mul(p, rz, out=r0)
    torch.mul(rz, rz, out=w)  # 2 sigma^2
    torch.sub(z, p, out=hh)  # x_hi = (1 - r0) / (sigma sqrt 2)
    hh.mul_(hh).add_(y).neg_().sub_(_LOG_SQRT_PI).clamp_(min=exp_floor).exp_()  # s~ phi(hi) / sqrt(pi), up to C
    e_perp = y.neg_().clamp_(min=exp_floor).exp_()
    # 2 [Phi(hi) - Phi(lo)] = |erfc(|x_lo|) - erfc(|x_lo| + sign(x_lo) z)|: both arguments have the sign
    # that keeps erfc away from 2 in the tails, so the difference does not cancel
    torch.copysign(z, p, out=sx)
    a = p.abs_()
    torch.sub(a, sx, out=sx)
    g = a.clamp_(max=erfc_ceil).erfc_().sub_(sx.clamp_(max=erfc_ceil).erfc_()).abs_()
    t1 = g.mul_(e_perp).mul_(rz)  # T_0 / (sqrt(pi) / 2)
    h2 = hh.mul_(w)
    # T_k = r0 T_{k-1} + sigma^2 ((k-1) T_{k-2} + s~ phi(lo) [k=1] - s~ phi(hi)), s~ phi(lo) = e^{-q/2}
    # (the closed forms (A.22), (A.31), (A.34), (A.40) of Farinhas (2021), regrouped), all over sqrt(pi)/2
    T1 = torch.mul(r0, t1, out=out[0]).addcmul_(llh, w).sub_(h2)
    T2 = torch.mul(r0, T1, out=z).addcmul_(w, t1, value=0.5).sub_(h2)
    T3 = torch.mul(r0, T2, out=out[3]).addcmul_(w, T1).sub_(h2)
    torch.mul(T2, trig[:2], out=out[1:3])
    torch.mul(T3, trig[2:], out=out[4:])
    return out


def _sum_last(x):
    """``x.sum(-1)`` as a matrix-vector product: about twice as fast for the short rows used here."""
    return torch.matmul(x, x.new_ones(x.shape[-1]))


def _moments_from_entries(E):
    """``(U0, U1 (..., 2), U2 (..., 2, 2))`` from ``E = [U0, U1x, U1y, tr U2, (U2)xx - (U2)yy, (U2)xy]``,
    the form in which :func:`_ray_terms` (up to a factor) produces them."""
    U0, U1x, U1y, T3, T3c2, T3cs = E
    Uxx, Uyy = 0.5 * (T3 + T3c2), 0.5 * (T3 - T3c2)
    U1 = torch.stack([U1x, U1y], -1)
    U2 = torch.stack([torch.stack([Uxx, T3cs], -1), torch.stack([T3cs, Uyy], -1)], -2)
    return U0, U1, U2


def _ball_moments_2d_entries(pair, n):
    r"""Moments over the unit disk of :math:`\mathcal N(u;\tilde\mu,\tilde\Sigma)` by the periodic trapezoid
    rule with ``n`` angular nodes :math:`\varphi_k = 2\pi k/n`, :math:`k=0,\dots,n-1`, for every pair, as
    ``(6, B, N)`` entries (see :func:`_moments_from_entries`)."""
    q = pair["q"]
    phi = torch.arange(n, dtype=q.dtype, device=q.device) * (2.0 * math.pi / n)  # no duplicated endpoint
    s = _sum_last(_ray_terms(_ray_params(pair), phi[None])).view(6, *q.shape)
    # the weight of a node, sqrt(det P) / (2 pi) * 2 pi / n, times the factor sqrt(pi) / 2 of _ray_terms
    return s * (pair["detP"].sqrt() * (0.5 * _SQRT_PI / n))


def _nodes_for_tol(tol: float) -> int:
    """Nodes per (batch, basis) pair in the first round of the adaptive rule (even, grows like log(1/tol))."""
    return 2 * math.ceil(2.0 + 0.65 * math.log(1.0 / tol))



def _lemma1_masks(pair, tol, route, lb_floor):
    r"""Closed forms, negligible pairs and the lower bound :math:`s_b` of the Lemma-1 route (2D).

    Returns ``(U, closed, quad, lb_b, lb_route, tail)``: ``U`` the ``(6, B*N)`` entries (closed forms
    filled in, zeros elsewhere), the ``(B, N)`` masks of the closed forms and of the pairs left to the
    angular rule, ``lb_b`` the lower bound of :math:`s_b=\max_jU_{0,bj}` that sets the tolerance (at least
    ``lb_floor``, a bound from elsewhere in these units, and at least :math:`\sqrt{\text{tiny}}`),
    ``lb_route`` the bound from this route's pairs alone, and the mask of the quadrature pairs in the
    tails that are better integrated by slices.
    """
    P00, P01, P11, detP = pair["P00"], pair["P01"], pair["P11"], pair["detP"]
    mt0, mt1 = pair["mt0"], pair["mt1"]
    dtype = P00.dtype
    tiny = torch.finfo(dtype).tiny
    rad = torch.hypot(mt0, mt1)  # |mu~|
    pmax = 0.5 * (P00 + P11) + torch.hypot(0.5 * (P00 - P11), P01)  # eigenvalues of P = Sigma~^{-1}
    pmin = detP / pmax
    smax = pmin.rsqrt()  # the largest standard deviation of N(mu~, Sigma~)
    peak = detP.sqrt() / (2.0 * math.pi)  # its largest density
    # 1. Gaussian well inside the disk: the disk contains the whitened ball of radius d_in around mu~;
    # outside that ball |u|^k <= (1 + smax |z|)^2, k <= 2, and |z| has the density r e^{-r^2/2} (2D), so
    # every moment entry outside the disk is at most e0 + 2 smax T1 + smax^2 T2, T_k = int_d^inf r^(k+1) e^(-r^2/2)
    inside = rad < 1
    d_in = ((1.0 - rad) * pmin.sqrt()).clamp_min(0.0)
    e_in = torch.exp(-0.5 * d_in * d_in)
    T1 = d_in * e_in + math.sqrt(0.5 * math.pi) * torch.erfc(d_in * _SQRT_HALF)
    bound_in = e_in + 2.0 * smax * T1 + smax * smax * (d_in * d_in + 2.0) * e_in
    # 2. Gaussian far outside: the disk is d_out whitened units away from mu~ and |u| <= 1 on it
    d_out = ((rad - 1.0) * pmin.sqrt()).clamp_min(0.0)
    bound_out = torch.exp(-0.5 * d_out * d_out) * (math.pi * peak).clamp_max(1.0)
    # lower bounds of U0: the whitened ball around mu~ (if inside), and the balls B((1 - rho) mu~/|mu~|, rho)
    # of the disk times the smallest density on them; s_b is at least their maximum over j
    # (rho = 1, 1/2, and the rho that maximizes the bound for a Gaussian outside the disk)
    lb = torch.where(inside, -torch.expm1(-0.5 * d_in * d_in), 0.0)
    gap = (rad - 1.0).clamp_min(0.0)
    rho_opt = (8.0 / pmax / (gap + (gap * gap + 8.0 / pmax).sqrt())).clamp_max(1.0)  # 2 rho^2 + gap rho = 1 / pmax
    for rho in (1.0, 0.5, rho_opt):
        dist = (rad - (1.0 - rho)).abs() + rho
        lb = torch.maximum(lb, (math.pi * rho * rho) * peak * torch.exp(-0.5 * pmax * dist * dist))
    # below sqrt(tiny), s_b is round-off of underflowing terms (an ellipse that no basis function reaches)
    lb_route = torch.where(route, lb, 0.0).amax(-1)
    lb_b = torch.maximum(lb_route, lb_floor).clamp_min(math.sqrt(tiny))
    tol_abs = tol * lb_b[:, None]  # (B, 1)
    closed = route & inside & (bound_in <= tol_abs)
    quad = route & ~closed & (bound_out > tol_abs)
    # In the tails (mu~ far from the disk, or the disk in its tail) the radial closed forms cancel: their
    # round-off, up to about 256 eps relative to the pair's own mass, would exceed tol * s_b for a pair
    # that may carry more than tol / (256 eps) of s_b (float32, or an ellipse that every psi_j is far from)
    # (the mass of a convex set d_out whitened units from the centre is at most that of a half-plane)
    far = (rad > _FAR) | (d_out > 2.0)
    mass_out = torch.minimum(bound_out, 0.5 * torch.erfc(d_out * _SQRT_HALF))
    tail = quad & far & (mass_out > (tol / (256.0 * torch.finfo(dtype).eps)) * lb_b[:, None])
    # Results are kept as [U0, U1x, U1y, tr U2, (U2)xx - (U2)yy, (U2)xy] (see _moments_from_entries), first
    # the closed forms U0 = 1, U1 = mu~, U2 = Sigma~ + mu~ mu~^T, Sigma~ = P^{-1}
    xx, yy = P11 / detP + mt0 * mt0, P00 / detP + mt1 * mt1
    exact = torch.stack([torch.ones_like(rad), mt0, mt1, xx + yy, xx - yy, -P01 / detP + mt0 * mt1])
    U = torch.where(closed, exact, 0.0).view(6, -1)
    return U, closed, quad, lb_b, lb_route, tail


def _angular_windows(sub, tol, lb, m):
    r"""Start angle, node spacing, ray constants and node weight of the windowed periodic trapezoid rule
    for the Lemma-1 pairs in ``sub`` (a dict of 1D tensors), each with its lower bound ``lb`` of :math:`s_b`."""
    qq, P00, P01, P11, detP, m0, m1 = (sub[k] for k in ("q", "P00", "P01", "P11", "detP", "mt0", "mt1"))
    dtype = qq.dtype
    # Angular window.  The P-distance from mu~ to the ray {rho a, 0 <= rho <= 1} is at least perp(a),
    # perp^2 = det(P) (a x mu~)^2 / a^T P a, and at least sqrt(q) if a^T P mu~ < 0; the ray integrand
    # is at most rho * peak * exp(-dist^2 / 2), so all directions with dist >= d, d^2 = 2 log(4 pi peak /
    # tol_abs), add at most tol_abs / 4 to any moment entry, and are skipped.  perp(a) < d <=> a^T Q a < 0
    # with Q = det(P) n n^T - d^2 P, n = (-mu~_2, mu~_1), det Q = d^2 det(P) (d^2 - q): if q > d^2 the window
    # is the cone of half-width w = atan(sqrt(-l_- / l_+)) around the eigenvector of l_- facing mu~.
    peak = detP.sqrt() / (2.0 * math.pi)
    d2 = 2.0 * torch.log(4.0 * math.pi * peak / (tol * lb))
    windowed = qq > d2
    Q00 = detP * m1 * m1 - d2 * P00
    Q01 = -detP * m0 * m1 - d2 * P01
    Q11 = detP * m0 * m0 - d2 * P11
    qmean, qrad = 0.5 * (Q00 + Q11), torch.hypot(0.5 * (Q00 - Q11), Q01)
    tiny = torch.finfo(dtype).tiny
    w = torch.atan(((qrad - qmean) / (qmean + qrad).clamp_min(tiny)).clamp_min(0.0).sqrt())
    theta = 0.5 * torch.atan2(2.0 * Q01, Q00 - Q11) + 0.5 * math.pi  # eigenvector of l_-
    facing = theta.cos() * sub["Pm0"] + theta.sin() * sub["Pm1"] >= 0
    theta = torch.where(facing, theta, theta + math.pi)
    # m nodes of T_n, n = 2 floor((m - 1) pi / (2 w)) >= m, centred on theta cover the window (T_n is
    # shift invariant); without a window, T_m on the whole circle.
    n_win = 2.0 * torch.floor((m - 1) * math.pi / (2.0 * w).clamp_min(tiny)).clamp_max(2.0**40)
    h = 2.0 * math.pi / torch.where(windowed, n_win.clamp_min(m), float(m))
    start = torch.where(windowed, theta - 0.5 * (m - 1) * h, 0.0)
    wt = detP.sqrt() / (4.0 * _SQRT_PI)  # times the spacing: the weight of a node, sqrt(det P) / (2 pi) * sqrt(pi) / 2
    return start, h, _ray_params(sub), wt


_PAIR_KEYS = ("q", "P00", "P01", "P11", "detP", "mt0", "mt1", "Pm0", "Pm1")


def _lemma1_adaptive(pair, idx, tol, lb_b, closed, U, info, max_nodes):
    """The windowed, adaptive periodic trapezoid rule for the pairs ``idx``; writes ``U[:, idx]``."""
    B, N = pair["q"].shape
    dtype, device = U.dtype, U.device
    m = min(_nodes_for_tol(tol), 2 * (max_nodes // 2))
    sub = dict(zip(_PAIR_KEYS, torch.stack([pair[k].reshape(-1) for k in _PAIR_KEYS])[:, idx].unbind(0)))
    bidx = idx // N
    start, h, prm, wt = _angular_windows(sub, tol, lb_b[bidx], m)
    # round 0: even-numbered nodes first, so that T_{n/2} is a sum over the first half
    j = torch.cat([torch.arange(0, m, 2), torch.arange(1, m, 2)]).to(dtype=dtype, device=device)
    halves = _sum_last(_ray_terms(prm, start[:, None] + j * h[:, None]).view(6, -1, 2, m // 2))
    tot = halves.sum(-1)
    I_cur = tot * (wt * h)
    est = (I_cur - halves[..., 0] * (wt * 2.0 * h)).abs().amax(0)  # |T_n - T_{n/2}|
    conv = torch.zeros_like(est, dtype=torch.bool)
    s_closed = torch.maximum(closed.any(-1).to(dtype), lb_b)  # U0 = 1 on closed-form pairs
    nodes, rounds, m_r = idx.numel() * m, 0, m
    while True:
        for _ in range(2):  # s_b from closed forms and converged pairs, at least its lower bound; it grows
            s_b = s_closed.scatter_reduce(0, bidx, torch.where(conv, I_cur[0], 0.0), "amax")
            # a pair is also accepted relative to its own mass (which is at most s_b)
            conv = est <= tol * torch.maximum(s_b[bidx], I_cur[0])
        act = (~conv).nonzero().squeeze(-1)
        if act.numel() == 0 or 2 * m_r > max_nodes:
            break
        # refine: T_{2n} adds the midpoints of the m_r evaluated nodes (and one past the last)
        rounds += 1
        h_a = h[act] / 2 ** (rounds - 1)
        phi = start[act, None] + (torch.arange(m_r, dtype=dtype, device=device) + 0.5) * h_a[:, None]
        tot_a = tot[:, act] + _sum_last(_ray_terms(prm[:, act], phi))
        I_new = tot_a * (wt[act] * h_a * 0.5)
        est[act] = (I_new - I_cur[:, act]).abs().amax(0)
        tot[:, act], I_cur[:, act] = tot_a, I_new
        nodes += act.numel() * m_r
        m_r *= 2
    U.index_copy_(1, idx, I_cur)
    info["lemma1"].update(rounds=rounds, nodes=nodes, unconverged=act.numel(),
                          max_error_estimate=float((est / s_b[bidx]).max()))


def _lemma1_read_free(pair, quad, tol, lb_b, U, max_nodes):
    """The read-free variant: the same windows, ``m 2^k`` nodes (``k = _READ_FREE_ROUNDS``, at most
    ``max_nodes``) for every pair, kept where ``quad``; no host read, no error estimate."""
    B, N = pair["q"].shape
    dtype, device = U.dtype, U.device
    m = min(_nodes_for_tol(tol), 2 * (max_nodes // 2))
    n = m * 2**_READ_FREE_ROUNDS
    while n > max_nodes:
        n //= 2
    sub = {k: pair[k].reshape(-1) for k in _PAIR_KEYS}
    start, h, prm, wt = _angular_windows(sub, tol, lb_b.repeat_interleave(N), m)
    h = h * (m / n)  # the spacing of T_{n'} with n' = n_win n / m nodes on the circle
    start = start + 0.5 * (m - 1) * h * (n / m) - 0.5 * (n - 1) * h  # still centred on the window
    phi = start[:, None] + torch.arange(n, dtype=dtype, device=device) * h[:, None]
    I_all = _sum_last(_ray_terms(prm, phi)) * (wt * h)
    return torch.where(quad.view(-1), I_all, U)


# Gauss-Legendre rules for the chords of the slice route.  _GL_ERROR[i][k] is the largest relative error
# (measured against scipy.integrate.quad) of the _GL_NODES[k]-point rule for int_{-1}^{1} (1 - x^2)^l x^k
# exp(-a x^2 / 2 + c x) dx, l <= 2, k <= 2, a in {0, 1, V, 2 V}, c = V - a / 2 (V = _GL_VARIATION[i]:
# tilted, Gaussian, or both), relative to int exp(-a x^2 / 2 + c x) dx.
_GL_VARIATION = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 40.0, 56.0)
_GL_NODES = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64)
_GL_ERROR = (
    (2e-07, 3e-10, 2e-13, 4e-16, 2e-15, 6e-16, 9e-16, 3e-15, 3e-15, 1e-15),
    (5e-06, 3e-08, 9e-11, 6e-16, 2e-15, 9e-16, 1e-15, 4e-15, 5e-15, 1e-15),
    (1e-04, 2e-06, 3e-08, 2e-12, 6e-15, 3e-15, 2e-15, 1e-14, 1e-14, 4e-15),
    (3e-03, 1e-04, 5e-06, 4e-09, 9e-13, 7e-15, 5e-15, 2e-14, 3e-14, 9e-15),
    (1e-02, 1e-03, 1e-04, 2e-07, 2e-10, 1e-13, 8e-15, 4e-14, 4e-14, 1e-14),
    (4e-02, 6e-03, 7e-04, 4e-06, 9e-09, 1e-11, 9e-15, 5e-14, 6e-14, 2e-14),
    (1e-01, 3e-02, 6e-03, 1e-04, 1e-06, 5e-09, 2e-14, 7e-14, 9e-14, 2e-14),
    (2e-01, 8e-02, 2e-02, 1e-03, 2e-05, 2e-07, 7e-12, 1e-13, 1e-13, 3e-14),
    (3e-01, 1e-01, 5e-02, 4e-03, 1e-04, 3e-06, 4e-10, 1e-13, 1e-13, 3e-14),
    (5e-01, 3e-01, 1e-01, 2e-02, 2e-03, 1e-04, 9e-08, 2e-11, 2e-13, 4e-14),
)
#: The largest exponent variation along a chord assumed by the read-free and fixed rules.
_GL_READ_FREE_VARIATION = 16.0


def _gl_count(variation: float, tol: float) -> int:
    """Nodes of the chord rule for an exponent that varies by at most ``variation`` (within tol / 100)."""
    row = next((i for i, v in enumerate(_GL_VARIATION) if v >= variation), len(_GL_VARIATION) - 1)
    return next((n for n, e in zip(_GL_NODES, _GL_ERROR[row]) if e <= 0.01 * tol), _GL_NODES[-1])


def _legendre_gauss(n: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights of the ``n``-point Gauss-Legendre rule on [-1, 1]: Newton's method on P_n in
    float64, on ``device`` (no host transfer), from the asymptotic guesses cos(pi (k - 1/4) / (n + 1/2))."""
    k = torch.arange(1, n + 1, dtype=torch.float64, device=device)
    x = torch.cos(math.pi * (k - 0.25) / (n + 0.5))

    def legendre(x):  # P_n(x) and P_n'(x)
        p = torch.special.legendre_polynomial_p(x, n)
        return p, n * (x * p - torch.special.legendre_polynomial_p(x, n - 1)) / (x * x - 1.0)

    for _ in range(6):  # quadratic convergence from guesses within O(1/n^2)
        p, dp = legendre(x)
        x = x - p / dp
    _, dp = legendre(x)
    w = 2.0 / ((1.0 - x * x) * dp * dp)
    return x.to(dtype), w.to(dtype)


def _chord_matrix(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``(n, 8)`` columns w (1-x^2), w (1-x^2) x, w (1-x^2)^2, w (1-x^2)^2 x, w (1-x^2)^2 x^2, w, w x, w x^2."""
    om = (1.0 - x) * (1.0 + x)
    return torch.stack([w * om, w * om * x, w * om * om, w * om * om * x, w * om * om * x * x, w, w * x, w * x * x], -1)


def _max_quadratic(a, c, lo, hi):
    """``max_{lo <= x <= hi} (-a x^2 / 2 + c x)`` for ``a >= 0`` (``lo <= hi``), and its argument."""
    x = torch.where(a > 0, torch.minimum(torch.maximum(c / torch.where(a > 0, a, 1.0), lo), hi),
                    torch.where(c > 0, hi, lo))
    return x * (c - 0.5 * a * x), x


def _anchor(a, b, stiff):
    """The anchor coordinate ``b / a`` along a stiff direction (0 along a soft one) and the slope there:
    exactly 0 along a stiff direction, where ``b - a (b / a)`` would only be round-off."""
    centre = torch.where(stiff, b / torch.where(stiff, a, 1.0), 0.0)
    return centre, torch.where(stiff, 0.0, b)


def _slice_setup_2d(pp, a1, angle, Mp):
    r"""Frame and constants of the slice route (2D), for flat per-pair entries ``pp`` and factors ``Mp``.

    The outer axis :math:`e_o` is the stiff eigenvector of :math:`A_j` if :math:`a_1\ge1`, else the
    direction of :math:`b_j`; the inner one is :math:`e_i=(-e_{o,2}, e_{o,1})`; :math:`u=v_ie_i+v_oe_o`.
    The exponent is written around an anchor :math:`u_a=r_ie_i+r_oe_o` (the centre :math:`b/a` along
    each stiff axis, 0 along a soft one) as

    .. math::

        \log\psi_j(\mu+Mu_a)-\tfrac12(a_i\delta_i^2+2c_i\delta_i\delta_o+a_o\delta_o^2)+g_i\delta_i+g_o\delta_o,
        \qquad \delta=v-r,

    with :math:`\log\psi_j(\mu+Mu_a)` evaluated directly: the expanded form
    :math:`\log\psi_j(\mu)+b^\top u-\frac12u^\top Au` cancels (in float32, badly) when :math:`\psi_j` is
    narrow along a long ellipse.
    """
    b0, b1 = pp["b0"], pp["b1"]
    stiff = a1 >= _STIFF
    nb = torch.hypot(b0, b1)
    has_b = nb > 0
    nb_safe = torch.where(has_b, nb, 1.0)
    eo0 = torch.where(stiff, torch.cos(angle), torch.where(has_b, b0 / nb_safe, 1.0))
    eo1 = torch.where(stiff, torch.sin(angle), torch.where(has_b, b1 / nb_safe, 0.0))
    ei0, ei1 = -eo1, eo0
    A00, A01, A11 = pp["A00"], pp["A01"], pp["A11"]
    form = lambda x0, x1, y0, y1: x0 * (A00 * y0 + A01 * y1) + x1 * (A01 * y0 + A11 * y1)  # noqa: E731
    ao, ai = form(eo0, eo1, eo0, eo1).clamp_min(0.0), form(ei0, ei1, ei0, ei1).clamp_min(0.0)
    ci = form(ei0, ei1, eo0, eo1)
    bo, bi = eo0 * b0 + eo1 * b1, ei0 * b0 + ei1 * b1
    ro, go = _anchor(ao, bo, ao >= _STIFF)
    ri, gi = _anchor(ai, bi, ai >= _STIFF)
    go, gi = go - ci * ri, gi - ci * ro  # the gradient b - A u_a at the anchor
    # log psi_j at t_a = mu + M u_a: e = t_a - mu_j = M u_a - d
    ua0, ua1 = ri * ei0 + ro * eo0, ri * ei1 + ro * eo1
    e0 = Mp[:, 0, 0] * ua0 - pp["d0"]
    e1 = Mp[:, 1, 0] * ua0 + Mp[:, 1, 1] * ua1 - pp["d1"]
    q_a = pp["i00"] * e0 * e0 + 2.0 * pp["i01"] * e0 * e1 + pp["i11"] * e1 * e1
    log_a = pp["lognorm"] - 0.5 * q_a
    return {"ei0": ei0, "ei1": ei1, "eo0": eo0, "eo1": eo1, "ao": ao, "ai": ai, "ci": ci,
            "ro": ro, "ri": ri, "go": go, "gi": gi, "log_a": log_a}


def _slice_bounds_2d(pp, fr, a1):
    r"""Upper bound ``log_sup`` of :math:`\log\psi_j(\mu+Mu)` on the disk, the bound ``i_max`` of its
    inner part (its coupling to the outer coordinate included), and a lower bound ``lb`` of the mean of
    :math:`\psi_j(\mu+Mu)` over the disk."""
    ao, ai, ci, ro, ri, go, gi, log_a = (fr[k] for k in ("ao", "ai", "ci", "ro", "ri", "go", "gi", "log_a"))
    e_max, _ = _max_quadratic(ao, go, -1.0 - ro, 1.0 - ro)
    # |coupling| <= |c_i| |delta_i| |delta_o| <= |c_i| (1 + |r_i|) (1 + |r_o|)
    i_max = _max_quadratic(ai, gi, -1.0 - ri, 1.0 - ri)[0] + ci.abs() * (1.0 + ri.abs()) * (1.0 + ro.abs())
    # the ball of radius rho around a point v* of the disk: E(v) >= E(v*) - |grad E(v*)| rho - a1 rho^2 / 2
    rho = torch.where(a1 > 4.0, a1.clamp_min(4.0).rsqrt(), 0.5)
    lim = 1.0 - rho
    _, do = _max_quadratic(ao, go, -lim - ro, lim - ro)
    vo = ro + do
    reach = (lim * lim - vo * vo).clamp_min(0.0).sqrt()
    _, di = _max_quadratic(ai, gi - ci * do, -reach - ri, reach - ri)
    energy = -0.5 * (ai * di * di + 2.0 * ci * di * do + ao * do * do) + gi * di + go * do
    grad = torch.hypot(gi - ai * di - ci * do, go - ci * di - ao * do)
    at_centre = -0.5 * (ai * ri * ri + 2.0 * ci * ri * ro + ao * ro * ro) - gi * ri - go * ro  # v = 0, rho = 1
    grad_centre = torch.hypot(gi + ai * ri + ci * ro, go + ci * ri + ao * ro)
    lb = torch.maximum(torch.exp(log_a + at_centre - 0.5 * a1 - grad_centre),
                       rho * rho * torch.exp(log_a + energy - grad * rho - 0.5 * a1 * rho * rho))
    return log_a + e_max + i_max, i_max, lb


def _slice_windows(fr, log_a, i_max, log_tol_abs, m):
    r"""The window of angles :math:`\theta` (:math:`v_o=\sin\theta`) outside which every slice adds less
    than ``tol_abs / 8`` to any moment entry, as ``(start, span, factor)``: nodes ``start + k span / m``.

    Slices with :math:`\log\psi_j(\mu+Mu_a)+E(\delta_o)+I_{max}<\log(\mathrm{tol_{abs}}/24)`,
    :math:`E(\delta)=-\frac12a_o\delta^2+g_o\delta`, are skipped: each moment entry is a mean over the
    disk with a weight at most :math:`\pi/Z_2=3`.  :math:`F(\theta)=F(\pi-\theta)`, so a window that
    reaches :math:`v_o=\pm1` is mirrored about :math:`\theta=\pm\pi/2` (and its sum halved) and its ends
    stay negligible; one that reaches both ends is the whole circle (periodic, halved).
    """
    ao, go, ro = fr["ao"], fr["go"], fr["ro"]
    c = log_tol_abs - math.log(24.0) - log_a - i_max  # keep E(delta) >= c
    disc = (go * go - 2.0 * ao * c).clamp_min(0.0)
    qv = go + torch.copysign(disc.sqrt(), go)
    ok = qv != 0
    r_a = torch.where(ao > 0, qv / torch.where(ao > 0, ao, 1.0), torch.copysign(torch.full_like(qv, math.inf), qv))
    r_b = 2.0 * c / torch.where(ok, qv, 1.0)
    lo = torch.where(ok, ro + torch.minimum(r_a, r_b), -1.0).clamp(-1.0, 1.0)
    hi = torch.where(ok, ro + torch.maximum(r_a, r_b), 1.0).clamp(-1.0, 1.0)
    top, bot = hi >= 1.0, lo <= -1.0
    t_lo, t_hi = torch.asin(lo), torch.asin(hi)
    half_pi = 0.5 * math.pi
    start = torch.where(top & bot, -half_pi, torch.where(bot, -math.pi - t_hi, t_lo))
    span = torch.where(top, math.pi - 2.0 * t_lo, torch.where(bot, math.pi + 2.0 * t_hi, t_hi - t_lo))
    span = torch.where(top & bot, 2.0 * math.pi, span)
    factor = torch.where(top | bot, 0.5, 1.0)
    return start, span, factor


_SLICE_ROWS = ("log_a", "ao", "ai", "ci", "ro", "ri", "go", "gi", "wi")


def _slice_terms(prm, theta, x, w):
    r"""The ten slice integrands at the angles ``theta`` (``(p, m)``), ``prm`` ``(7, p)`` (:data:`_SLICE_ROWS`).

    :math:`v_o=\sin\theta` and the chord :math:`|v_i|\le h=|\cos\theta|`; :math:`dv_o=h\,d\theta` (with
    :math:`|\cos\theta|`, the integrand :math:`G(h)h` of an odd :math:`G` is analytic and
    :math:`\pi`-periodic in :math:`\theta`), :math:`1-|v|^2=h^2-v_i^2`.  On each chord the inner factor
    :math:`e^{-a_iv_i^2/2+(b_i-c_iv_o)v_i}` is integrated by Gauss--Legendre (nodes ``x``, weights ``w``)
    on the chord, or, for a stiff one, on its window of half-width ``wi`` around the inner maximum
    (where the factor stays within a given depth of its peak).  Returns ``(15, p, m)``:
    :math:`h\int(1-|v|^2)^l v^\alpha f\,dv_i` for :math:`(l,\alpha)` = (1, 1), (1, v_i), (1, v_o), (2, 1),
    (2, v_i), (2, v_o), (2, v_i^2), (2, v_iv_o), (2, v_o^2), (0, 1), (0, v_i), (0, v_o), (0, v_i^2),
    (0, v_iv_o), (0, v_o^2).
    """
    log_a, ao, ai, ci, ro, ri, go, gi, wi = prm.unsqueeze(-1)
    vo = torch.sin(theta)
    h = torch.cos(theta).abs()
    do = vo - ro
    outer = log_a + do * (go - 0.5 * ao * do)  # (p, m)
    beta = gi - ci * do  # the inner slope at v_i = r_i
    centre = ri + torch.where(ai > 0, beta / torch.where(ai > 0, ai, 1.0), 0.0)
    lo = torch.maximum(-h, centre - wi)
    hi = torch.maximum(torch.minimum(h, centre + wi), lo)
    mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    v = mid.unsqueeze(-1) + half.unsqueeze(-1) * x  # (p, m, n)
    di = v - ri.unsqueeze(-1)
    expo = outer.unsqueeze(-1) + di * (beta.unsqueeze(-1) - (0.5 * ai).unsqueeze(-1) * di)
    f = torch.exp(expo.clamp_min(math.log(torch.finfo(expo.dtype).tiny))) * w
    hv = h.unsqueeze(-1)
    fg = f * ((hv - v) * (hv + v))  # weight 1 - |v|^2 = h^2 - v_i^2, without cancellation at the ends
    fgg = fg * ((hv - v) * (hv + v))
    fggv = fgg * v
    scale = h * half  # dv_o = h dtheta, dv_i = half dx
    fv = f * v
    T0, T2 = fg.sum(-1) * scale, fgg.sum(-1) * scale
    T1, T3 = (fg * v).sum(-1) * scale, fggv.sum(-1) * scale
    T4, T5 = (fggv * v).sum(-1) * scale, f.sum(-1) * scale
    T6, T7 = fv.sum(-1) * scale, (fv * v).sum(-1) * scale
    return torch.stack([T0, T1, vo * T0, T2, T3, vo * T2, T4, vo * T3, vo * vo * T2, T5,
                        T6, vo * T5, T7, vo * T6, vo * vo * T5])


def _slice_sum(prm, theta, x, w, block=32):
    """``_slice_terms`` summed over the angles, in blocks of angles to bound the memory."""
    return sum(_sum_last(_slice_terms(prm, theta[:, k:k + block], x, w)) for k in range(0, theta.shape[-1], block))


def _slice_norms(D, dtype, device):
    """Normalizers of the fifteen entries: Z1 (E_w), Z2 (E_w2), the volume of the ball (means)."""
    Z1, Z2 = _BALL_Z[D]
    vol = 2.0 if D == 1 else math.pi
    full = lambda n, value: torch.full((n,), value, dtype=dtype, device=device)  # noqa: E731  (no host-to-device copy)
    return torch.cat([full(3, Z1), full(6, Z2), full(6, vol)])[:, None]


def _slice_quadrature_2d(pp, fr, log_sup, i_max, lb, mask, B, bidx, tol, rule, info):
    r"""Moments of the slice route (2D) for flat pairs: ``(10, p)`` entries
    :math:`[E_wf, E_wv_if, E_wv_of, E_{w2}f, E_{w2}v_if, E_{w2}v_of, E_{w2}v_i^2f, E_{w2}v_iv_of,
    E_{w2}v_o^2f, \bar f]` in the frame ``fr`` (zero for the negligible pairs and those not in ``mask``;
    ``mask=None``: all).  ``lb`` is the per-pair lower bound of :math:`s_b` (a mean over the disk) that
    sets the tolerance, ``bidx`` the batch element of each pair."""
    p = lb.shape[0]
    dtype, device = lb.dtype, lb.device
    log_a = fr["log_a"]
    log_tol_abs = math.log(tol) + torch.log(lb)
    quad = log_sup + math.log(12.0) > log_tol_abs  # the others add less than tol_abs / 4
    if mask is not None:
        quad = quad & mask
    m = min(_nodes_for_tol(tol), 2 * (rule.max_quadrature // 2))
    # chord windows: points where the inner factor is below e^{-depth} of its peak add less than
    # tol_abs / 24 (each moment entry is a mean with a weight at most pi / Z2 = 3); the rule there has to
    # resolve an exponent that varies by the depth (a stiff chord) or by a_i / 2 + |b_i| + |c_i| (a whole one)
    ai = fr["ai"]
    depth = (log_sup - log_tol_abs + math.log(72.0)).clamp_min(1.0)
    if rule.read_free:
        depth = depth.clamp_max(_READ_FREE_DEPTH)
    wi = torch.where(ai > 0, (2.0 * depth / torch.where(ai > 0, ai, 1.0)).sqrt(), math.inf)
    whole = wi >= 2.0
    wi = torch.where(whole, math.inf, wi)
    reach = 1.0 + fr["ri"].abs()  # |delta_i| on a chord
    chord = 0.5 * ai * reach**2 + (fr["gi"].abs() + fr["ci"].abs() * (1.0 + fr["ro"].abs())) * reach
    variation = torch.where(whole, chord, depth)
    prm = torch.stack([fr[k] if k != "wi" else wi for k in _SLICE_ROWS])
    start, span, factor = _slice_windows(fr, log_a, i_max, log_tol_abs, m)
    if rule.n_quadrature is not None:  # the fixed rule: n angles on the whole circle
        start = torch.full_like(start, -0.5 * math.pi)
        span, factor = torch.full_like(span, 2.0 * math.pi), torch.full_like(factor, 0.5)
    norms = _slice_norms(2, dtype, device)
    if rule.read_free:
        n = rule.n_quadrature or min(m * 2**_READ_FREE_SLICE_ROUNDS, 2 * (rule.max_quadrature // 2))
        x, w = _legendre_gauss(_gl_count(_READ_FREE_DEPTH, tol), dtype, device)
        theta = start[:, None] + (span[:, None] / n) * torch.arange(n, dtype=dtype, device=device)
        E = _slice_sum(prm, theta, x, w) * ((span * factor) / n / norms)
        return torch.where(quad, E, 0.0)
    E = torch.zeros(15, p, dtype=dtype, device=device)
    idx = quad.nonzero().squeeze(-1)
    info["slices"].update(quadrature=idx.numel(), skipped=p - idx.numel() if mask is None else int((mask & ~quad).sum()))
    if idx.numel() == 0:
        return E
    n_in = _gl_count(float(variation[idx].max()), tol)
    info["slices"]["chord_nodes"] = n_in
    x, w = _legendre_gauss(n_in, dtype, device)
    if rule.n_quadrature is not None:
        n = rule.n_quadrature
        theta = start[idx, None] + (span[idx, None] / n) * torch.arange(n, dtype=dtype, device=device)
        E[:, idx] = _slice_sum(prm[:, idx], theta, x, w) * ((span * factor)[idx] / n / norms)
        return E
    _slice_adaptive(prm[:, idx], start[idx], span[idx], factor[idx], idx, bidx[idx], B, lb, tol,
                    rule.max_quadrature, m, x, w, norms, E, info)
    return E


def _slice_adaptive(prm, start, span, factor, idx, bidx, B, lb, tol, max_nodes, m, x, w, norms, E, info):
    """Refine the windowed trapezoid rule of the slice route by doubling, as :func:`_lemma1_adaptive`."""
    dtype, device = prm.dtype, prm.device
    h = span / m
    j = torch.cat([torch.arange(0, m, 2), torch.arange(1, m, 2)]).to(dtype=dtype, device=device)
    halves = _sum_last(_slice_terms(prm, start[:, None] + j * h[:, None], x, w).view(15, -1, 2, m // 2))
    tot = halves.sum(-1)
    wt = factor / norms  # (15, p)
    I_cur = tot * (wt * h)
    est = (I_cur - halves[..., 0] * (wt * 2.0 * h)).abs().amax(0)
    conv = torch.zeros_like(est, dtype=torch.bool)
    s_start = torch.zeros(B, dtype=dtype, device=device).scatter_reduce(0, bidx, lb[idx], "amax")
    mean = 9  # the entry of the mean of f over the disk
    nodes, rounds, m_r = idx.numel() * m, 0, m
    while True:
        for _ in range(2):  # s_b from the lower bound and the converged pairs; it grows
            s_b = s_start.scatter_reduce(0, bidx, torch.where(conv, I_cur[mean], 0.0), "amax")
            conv = est <= tol * torch.maximum(s_b[bidx], I_cur[mean])
        act = (~conv).nonzero().squeeze(-1)
        if act.numel() == 0 or 2 * m_r > max_nodes:
            break
        rounds += 1
        h_a = h[act] / 2 ** (rounds - 1)
        theta = start[act, None] + (torch.arange(m_r, dtype=dtype, device=device) + 0.5) * h_a[:, None]
        tot_a = tot[:, act] + _slice_sum(prm[:, act], theta, x, w)
        I_new = tot_a * (wt[:, act] * h_a * 0.5)
        est[act] = (I_new - I_cur[:, act]).abs().amax(0)
        tot[:, act], I_cur[:, act] = tot_a, I_new
        nodes += act.numel() * m_r
        m_r *= 2
    E[:, idx] = I_cur
    info["slices"].update(rounds=rounds, nodes=nodes, unconverged=act.numel(),
                          max_error_estimate=float((est / s_b[bidx]).max()))


def _slice_setup_1d(pp, Mp):
    """The anchor (``b / a`` if ``a >= 1``, else 0), the slope there and ``log psi_j(mu + m r)`` (1D)."""
    a, b = pp["A00"], pp["b0"]
    r, g = _anchor(a, b, a >= _STIFF)
    e = Mp[:, 0, 0] * r - pp["d0"]
    return {"a": a, "r": r, "g": g, "log_a": pp["lognorm"] - 0.5 * pp["i00"] * e * e}


def _slice_bounds_1d(fr):
    """Upper bound of log psi_j(mu + M u) on [-1, 1] and a lower bound of its mean there (1D)."""
    a, r, g, log_a = fr["a"], fr["r"], fr["g"], fr["log_a"]
    e_max, _ = _max_quadratic(a, g, -1.0 - r, 1.0 - r)
    rho = torch.where(a > 4.0, a.clamp_min(4.0).rsqrt(), 0.5)
    e_c, x_c = _max_quadratic(a, g, -(1.0 - rho) - r, (1.0 - rho) - r)
    grad = (g - a * x_c).abs()
    lb = rho * torch.exp(log_a + e_c - grad * rho - 0.5 * a * rho * rho)
    return log_a + e_max, lb


def _slice_quadrature_1d(fr, log_sup, lb, mask, tol, rule, info):
    """The slice route in 1D: one chord, [-1, 1], by Gauss-Legendre; ``(15, p)`` entries as in 2D (the
    v_o entries zero).  The number of nodes covers the pairs that are not negligible."""
    dtype, device = lb.dtype, lb.device
    a, r, g, log_a = fr["a"], fr["r"], fr["g"], fr["log_a"]
    variation = 0.5 * a * (1.0 + r.abs()) ** 2 + g.abs() * (1.0 + r.abs())
    if rule.read_free:
        n_in = _gl_count(_GL_VARIATION[-1], tol)
    else:
        relevant = log_sup + math.log(12.0) > math.log(tol) + torch.log(lb)
        n_in = _gl_count(float(torch.where(relevant, variation, 0.0).max()), tol)
        info["slices"].update(quadrature=lb.shape[0], chord_nodes=n_in)
    x, w = _legendre_gauss(n_in, dtype, device)
    dx = x - r.unsqueeze(-1)
    expo = log_a.unsqueeze(-1) + dx * (g.unsqueeze(-1) - 0.5 * a.unsqueeze(-1) * dx)
    f = torch.exp(expo.clamp_min(math.log(torch.finfo(dtype).tiny)))
    S0, S1, S2, S3, S4, S5, S6, S7 = (f @ _chord_matrix(x, w)).unbind(-1)
    zero = torch.zeros_like(S0)
    E = torch.stack([S0, S1, zero, S2, S3, zero, S4, zero, zero, S5, S6, zero, S7, zero, zero])
    E = E / _slice_norms(1, dtype, device)
    return E if mask is None else torch.where(mask, E, 0.0)


class _Rule(NamedTuple):
    """How the moments are integrated: ``n_quadrature`` (``None``: adaptive), ``tol``, ``max_quadrature``,
    and ``read_free`` (no host reads: fixed refinement instead of the adaptive loop)."""

    n_quadrature: int | None
    tol: float
    max_quadrature: int
    read_free: bool


def _empty_info():
    keys = ("closed_form", "skipped", "quadrature", "rounds", "nodes", "unconverged")
    return {"lemma1": dict.fromkeys(keys, 0) | {"max_error_estimate": 0.0},
            "slices": dict.fromkeys(keys[1:], 0) | {"chord_nodes": 0, "max_error_estimate": 0.0}}


def _routes(pairs, D, rule):
    r"""``(stiff, movable, a1, angle)``: the ``(B, N)`` masks of the pairs whose :math:`\psi_j` is narrower
    than the ellipse in every direction (:math:`a_2\ge1`, which makes :math:`M` invertible: the route of
    Lemma 1) and of those among them that the chords of the slice route can take (see
    :func:`_lemma1_masks` for the ones moved there); the largest eigenvalue of :math:`A_j`, and the angle
    of its eigenvector (2D)."""
    if D == 1:
        a1 = a2 = pairs["A00"]
        stiff = a2 >= _STIFF
        v_max = _GL_READ_FREE_VARIATION if rule.read_free else _GL_VARIATION[-1]
        return stiff, stiff & (0.5 * a2 + pairs["b0"].abs() <= v_max), a1, None
    # in 2D the chords of the slice route are windowed: they take any pair
    a1, a2, angle = _eig2(pairs["A00"], pairs["A01"], pairs["A11"], pairs["detA"])
    return a2 >= _STIFF, a2 >= _STIFF, a1, angle


def _sparsemax_moments(mu, M, centers, cov, rule):
    r"""Forward of continuous sparsemax for the lower-triangular factor ``M`` (``(B, D, D)``) of
    :math:`S=MM^\top=-2\lambda\Sigma=(D+4)V`.

    Returns ``(r, saved, info)``: ``r`` ``(B, N)``, the tensors the backward pass needs, and the
    diagnostics (``None`` on the read-free path).
    """
    B, D = mu.shape
    N = centers.shape[0]
    P = B * N
    dtype, device = mu.dtype, mu.device
    tol = rule.tol
    detM = torch.diagonal(M, dim1=-2, dim2=-1).prod(-1)  # (B,)
    Z1 = _BALL_Z[D][0]
    vol = 2.0 if D == 1 else math.pi  # the volume of the unit ball
    tiny = torch.finfo(dtype).tiny
    pairs = _pairs(mu, M, centers, cov)
    info = None if rule.read_free else _empty_info() | {"pairs": P}
    stiff, movable, a1, angle = _routes(pairs, D, rule)
    # ---- route 1: Lemma 1 (U moments: masses on the ellipse E, of area |E| = vol det M).  Pairs in the tails
    # whose round-off there could exceed the tolerance go to the slice route instead (see _lemma1_masks).
    zero_b = torch.zeros(B, dtype=dtype, device=device)
    if D == 1:
        lemma1 = stiff & ~(movable & (pairs["mt0"].abs() > _FAR))
        U0, U1, U2 = _ball_moments_1d(torch.where(lemma1, pairs["mt0"], 0.0), 1.0 / torch.where(lemma1, a1, 1.0))
        U0, U1, U2 = (torch.where(lemma1.view(B, N, *([1] * k)), x, 0.0) for k, x in ((0, U0), (1, U1), (2, U2)))
        lb1_route = zero_b
    elif not rule.read_free and not bool(stiff.any()):  # no Lemma-1 pair
        lemma1 = stiff
        U0 = torch.zeros(B, N, dtype=dtype, device=device)
        U1, U2 = U0.new_zeros(B, N, D), U0.new_zeros(B, N, D, D)
        lb1_route = zero_b
    else:
        pair = _lemma1_pair_2d(pairs, stiff, all_route=not rule.read_free and bool(stiff.all()))
        U, closed, quad1, lb1_b, lb1_route, tail = _lemma1_masks(pair, tol, stiff, zero_b)
        moved = movable & tail
        if rule.read_free:  # needles: the rays would need more angles than the fixed rule has
            moved = moved | (quad1 & (a1 > _READ_FREE_ANISOTROPY * _eig_small(pairs, a1)))
        lemma1, quad1 = stiff & ~moved, quad1 & ~moved
        if rule.n_quadrature is not None:  # the fixed rule for every pair of the route
            U = torch.where(lemma1.view(-1), _ball_moments_2d_entries(pair, rule.n_quadrature).view(6, -1), U)
        elif rule.read_free:
            U = _lemma1_read_free(pair, quad1, tol, lb1_b, U, rule.max_quadrature)
        else:
            idx = quad1.view(-1).nonzero().squeeze(-1)
            n_closed = int(closed.sum())
            info["lemma1"].update(closed_form=n_closed, quadrature=idx.numel(),
                                  skipped=int(lemma1.sum()) - n_closed - idx.numel())
            if idx.numel() > 0:
                _lemma1_adaptive(pair, idx, tol, lb1_b, closed, U, info, rule.max_quadrature)
        U0, U1, U2 = _moments_from_entries(U.view(6, B, N))
    if info is not None and D == 1:
        info["lemma1"]["closed_form"] = int(lemma1.sum())
    # The pairs of the slice route: all of them, masked, without host reads; else their list.
    if rule.read_free:
        sel, mask2 = None, ~lemma1.reshape(-1)
        bidx2 = torch.arange(P, device=device) // N
    else:
        sel, mask2 = (~lemma1).reshape(-1).nonzero().squeeze(-1), None
        bidx2 = sel // N
    n2 = P if sel is None else sel.numel()
    has1 = lemma1.any(-1)
    detM_safe = torch.where(has1, detM, 1.0)
    minus_lam = torch.where(has1, 1.0 / (Z1 * detM_safe), 0.0)  # -lambda = 1 / (Z1 det M)
    trU2 = torch.diagonal(U2, dim1=-2, dim2=-1).sum(-1)
    r = (minus_lam[:, None] * (U0 - trU2)).reshape(-1)  # (A.15)/(A.23)
    # ---- route 2: slices (means over the disk), with s_b at least the Lemma-1 results
    if n2:
        pp = _gather(pairs, sel, B, N)
        if D == 1:
            fr = _slice_setup_1d(pp, M[bidx2])
            log_sup, lb2 = _slice_bounds_1d(fr)
        else:
            a1_2, angle_2 = (x.reshape(-1) if sel is None else x.reshape(-1)[sel] for x in (a1, angle))
            fr = _slice_setup_2d(pp, a1_2, angle_2, M[bidx2])
            log_sup, i_max, lb2 = _slice_bounds_2d(pp, fr, a1_2)
        lb2_b = zero_b.scatter_reduce(0, bidx2, lb2 if mask2 is None else torch.where(mask2, lb2, 0.0), "amax")
        ellipse_safe = vol * detM_safe
        floor = torch.maximum(torch.maximum(lb2_b, lb1_route / ellipse_safe),
                              torch.where(lemma1, U0 / ellipse_safe[:, None], 0.0).amax(-1))
        lb_b = floor.clamp_min(math.sqrt(tiny))
        if D == 1:
            E = _slice_quadrature_1d(fr, log_sup, lb_b[bidx2], mask2, tol, rule, info)
            one, zero = torch.ones_like(pp["q"]), torch.zeros_like(pp["q"])
            e_i, e_o = one[:, None], zero[:, None]
        else:
            E = _slice_quadrature_2d(pp, fr, log_sup, i_max, lb_b[bidx2], mask2, B, bidx2, tol, rule, info)
            e_i, e_o = torch.stack([fr["ei0"], fr["ei1"]], -1), torch.stack([fr["eo0"], fr["eo1"]], -1)
        W0, Wi, Wo, X0, Xi, Xo, Xii, Xio, Xoo, K0, Ki, Ko, Kii, Kio, Koo = E
        outer = lambda x, y: x.unsqueeze(-1) * y.unsqueeze(-2)  # noqa: E731
        io = outer(e_i, e_o) + outer(e_o, e_i)

        def vec(a, b):  # back to u = v_i e_i + v_o e_o
            return a[:, None] * e_i + b[:, None] * e_o

        def mat(a, b, c):
            return a[:, None, None] * outer(e_i, e_i) + b[:, None, None] * io + c[:, None, None] * outer(e_o, e_o)

        W1, X1, X2 = vec(Wi, Wo), vec(Xi, Xo), mat(Xii, Xio, Xoo)
        K1, K2 = vec(Ki, Ko), mat(Kii, Kio, Koo)
        stiff2 = stiff.reshape(-1) if sel is None else stiff.reshape(-1)[sel]
        r = torch.where(mask2, W0, r) if sel is None else r.index_copy(0, sel, W0)
        if D == 1:
            d2 = pp["d0"][:, None]
            Sinv2 = pp["i00"][:, None, None]
        else:
            d2 = torch.stack([pp["d0"], pp["d1"]], -1)
            Sinv2 = torch.stack([torch.stack([pp["i00"], pp["i01"]], -1), torch.stack([pp["i01"], pp["i11"]], -1)], -2)
        route2 = (W0, W1, X0, X1, X2, K0, K1, K2, stiff2, d2, Sinv2, bidx2, mask2 if sel is None else sel)
    else:
        route2 = ()
    saved = (M, lemma1, minus_lam, U0, U1, U2) + route2
    return r.view(B, N), saved, info


def _sparsemax_grads(grad_r, mu, saved):
    """``(dL/dmu, dL/dS)`` from the saved moments (see the comment at the head of this section)."""
    M, lemma1, minus_lam, U0, U1, U2, *route2 = saved
    D = mu.shape[-1]
    Z1, Z2 = _BALL_Z[D]
    eye = torch.eye(D, dtype=mu.dtype, device=mu.device)
    # route 1: 2 (-lambda) M^{-T} sum_j g_j U1_j and (-lambda) M^{-T} sum_j g_j (U2_j - (U0_j - tr U2_j) I / 2) M^{-1}
    g1 = torch.where(lemma1, grad_r, 0.0)
    V1 = torch.einsum("bn,bnd->bd", g1, U1)
    trU2 = torch.diagonal(U2, dim1=-2, dim2=-1).sum(-1)
    Q = torch.einsum("bn,bnde->bde", g1, U2) - 0.5 * torch.einsum("bn,bn->b", g1, U0 - trU2)[:, None, None] * eye
    has1 = lemma1.any(-1)[:, None, None]
    M_inv = torch.where(has1, torch.linalg.solve_triangular(torch.where(has1, M, eye), eye, upper=False), 0.0)
    grad_mu = 2.0 * minus_lam[:, None] * (M_inv.transpose(-1, -2) @ V1.unsqueeze(-1)).squeeze(-1)
    grad_S = minus_lam[:, None, None] * (M_inv.transpose(-1, -2) @ Q @ M_inv)
    if route2:
        W0, W1, X0, X1, X2, K0, K1, K2, stiff2, d, Sinv, bidx, sel = route2
        g = grad_r.reshape(-1)
        g2 = torch.where(sel, g, 0.0) if sel.dtype == torch.bool else g[sel]
        Mp = M[bidx]  # (p, D, D)
        outer = lambda x, y: x.unsqueeze(-1) * y.unsqueeze(-2)  # noqa: E731
        # route 2, soft pairs, per pair: E_w[grad psi_j] and Z2 / (8 Z1) E_w2[Hess psi_j], with grad psi_j =
        # Sigma_j^{-1} e psi_j and Hess psi_j = (Sigma_j^{-1} e e^T Sigma_j^{-1} - Sigma_j^{-1}) psi_j, e = mu_j - t
        # = d - M u: no M^{-1}, but the Hessian's terms cancel by about a_1 (psi_j narrow along a direction)
        MW1 = (Mp @ W1.unsqueeze(-1)).squeeze(-1)
        MX1 = (Mp @ X1.unsqueeze(-1)).squeeze(-1)
        e_w = d * W0[:, None] - MW1  # E_w[e f]
        ee = X0[:, None, None] * outer(d, d) - outer(d, MX1) - outer(MX1, d) + Mp @ X2 @ Mp.transpose(-1, -2)
        mu_soft = (Sinv @ e_w.unsqueeze(-1)).squeeze(-1)
        S_soft = (Z2 / (8.0 * Z1)) * (Sinv @ ee @ Sinv - X0[:, None, None] * Sinv)
        # stiff pairs (a_2 >= 1, M invertible; moved here from the tails of Lemma 1): the first form, from the
        # means K of u^k f over the ball, -lambda det M = 1 / Z1: U_k = vol det M K_k
        vol = 2.0 if D == 1 else math.pi
        Mp_inv = torch.linalg.solve_triangular(torch.where(stiff2[:, None, None], Mp, eye), eye, upper=False)
        mu_stiff = (2.0 * vol / Z1) * (Mp_inv.transpose(-1, -2) @ K1.unsqueeze(-1)).squeeze(-1)
        trK2 = torch.diagonal(K2, dim1=-2, dim2=-1).sum(-1)
        S_stiff = (vol / Z1) * (Mp_inv.transpose(-1, -2) @ (K2 - 0.5 * (K0 - trK2)[:, None, None] * eye) @ Mp_inv)
        mu_pair = torch.where(stiff2[:, None], mu_stiff, mu_soft)
        S_pair = torch.where(stiff2[:, None, None], S_stiff, S_soft)
        grad_mu = grad_mu.index_add(0, bidx, g2[:, None] * mu_pair)
        grad_S = grad_S.index_add(0, bidx, g2[:, None, None] * S_pair)
    return grad_mu, _sym(grad_S)


class _ContinuousSparsemaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mu, S, M, centers, cov, rule):
        r, saved, info = _sparsemax_moments(mu, M, centers, cov, rule)
        if info is not None:
            bad = {k: v for k, v in info.items() if isinstance(v, dict) and v["unconverged"]}
            if bad:
                worst = max(v["max_error_estimate"] for v in bad.values())
                count = sum(v["unconverged"] for v in bad.values())
                warnings.warn(
                    f"continuous_sparsemax: the adaptive angular rule reached max_quadrature={rule.max_quadrature} "
                    f"nodes for {count} of {info['pairs']} (batch, basis) pairs; largest error estimate "
                    f"{worst:.1e} (relative), tol={rule.tol:.1e}",
                    RuntimeWarning,
                    stacklevel=4,
                )
        ctx.save_for_backward(mu, *saved)
        return r

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_r):
        mu, *saved = ctx.saved_tensors
        grad_mu, grad_S = _sparsemax_grads(grad_r, mu, saved)
        return grad_mu, grad_S, None, None, None, None


def _default_tol(dtype: torch.dtype) -> float:
    """``DEFAULT_TOL`` in float64; 32 machine epsilons (about 3.8e-6) in float32 and below."""
    return DEFAULT_TOL if dtype == torch.float64 else 32.0 * torch.finfo(torch.float32).eps


def _check_quadrature_args(n_quadrature, tol, max_quadrature):
    if n_quadrature is not None:
        n_quadrature = check_int(n_quadrature, "n_quadrature")
        if tol is not None:
            raise ValueError("tol applies to the adaptive rule only; pass n_quadrature=None to use it")
    if tol is not None:
        tol = check_number(tol, "tol", low=0.0, high=1.0, low_open=True, high_open=True)
    max_quadrature = check_int(max_quadrature, "max_quadrature", minimum=8)
    return n_quadrature, tol, max_quadrature


def _sparsemax_scale(Sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r""":math:`S=-2\lambda\Sigma` (eq. (3.15)) for SPD ``(B, D, D)`` scales, differentiable, without reading
    values, and its factor :math:`M=\sqrt{-2\lambda}\operatorname{chol}\Sigma` (detached: a factor of the
    rounded :math:`S` would lose digits on needle-like scales)."""
    d = Sigma.shape[-1]
    L = torch.linalg.cholesky_ex(Sigma)[0]
    half_logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    minus_lam = torch.exp((2.0 / (d + 2)) * (math.log(_gaussian_const(d)) - half_logdet))
    S = (2.0 * minus_lam)[:, None, None] * Sigma
    return S, ((2.0 * minus_lam).sqrt()[:, None, None] * L).detach()


def _sparsemax_from_S(mu_f, S, centers, cov, n_quadrature, tol, max_quadrature, M=None):
    """Continuous sparsemax for validated ``(B, D)`` means and ``S = (D + 4) V`` in the compute dtype
    (``M``: a lower-triangular factor of ``S`` computed more accurately than from ``S``, if any)."""
    if mu_f.shape[0] == 0:
        return mu_f.new_zeros((0, centers.shape[0]))
    rule = _Rule(n_quadrature, tol, max_quadrature, not host_reads_allowed(mu_f, S))
    M = _psd_factor(S.detach()) if M is None else M
    return _ContinuousSparsemaxFn.apply(mu_f, S, M, centers, cov, rule)


def _sparsemax_diagnostics(mu, Sigma, basis, *, tol=None, max_quadrature=DEFAULT_MAX_QUADRATURE) -> dict:
    """The adaptive rule's diagnostics for ``continuous_sparsemax(mu, Sigma, basis)`` (benchmarks, tests):
    per route, the pairs in closed form, negligible and by quadrature, the refinement rounds, the nodes
    evaluated (angles; times the chord nodes for slices) and the largest error estimate left."""
    mu_f, Sigma_f, centers, cov, _, _ = _prepare(mu, Sigma, basis, "continuous_sparsemax", definite=True)
    tol = _default_tol(mu_f.dtype) if tol is None else tol
    rule = _Rule(None, tol, max_quadrature, False)
    return _sparsemax_moments(mu_f, _sparsemax_scale(Sigma_f)[1], centers, cov, rule)[-1]


def continuous_sparsemax(
    mu: torch.Tensor,
    Sigma: torch.Tensor,
    basis: GaussianRBF,
    n_quadrature: int | None = DEFAULT_N_QUADRATURE,
    *,
    tol: float | None = None,
    max_quadrature: int = DEFAULT_MAX_QUADRATURE,
) -> torch.Tensor:
    r"""Continuous sparsemax attention :math:`r_j=\mathbb E_{\mathcal{TP}(\mu,\Sigma)}[\psi_j(t)]`, :math:`D\in\{1,2\}`.

    For :math:`p(t)=[-\lambda-\frac12(t-\mu)^\top\Sigma^{-1}(t-\mu)]_+` (eq. (3.14)) the affine map
    :math:`t=\mu+Mu`, :math:`MM^\top=-2\lambda\Sigma` (:math:`M=\sqrt{-2\lambda}\,\operatorname{chol}\Sigma`),
    sends the support to the unit ball, :math:`p(t)\,dt` to :math:`w(u)\,du=(1-\|u\|^2)\,du/Z_1`, and

    .. math::

        r_j = \int_{\|u\|\le1} w(u)\,\psi_j(\mu+Mu)\,du,

        \psi_j(\mu+Mu)=\psi_j(\mu)\,e^{-\frac12u^\top A_ju+b_j^\top u},

        A_j=M^\top\Sigma_j^{-1}M,\qquad b_j=M^\top\Sigma_j^{-1}(\mu_j-\mu).

    No inverse of :math:`M` appears, so the computation stays accurate down to the point-mass limit
    :math:`\Sigma\to0`, where :math:`r_j\to\psi_j(\mu)`.  Each pair (batch element :math:`b`, basis
    function :math:`j`) takes one of two routes:

    * when the smallest eigenvalue of :math:`A_j` is at least 1 (:math:`\psi_j` narrower than the
      ellipse in every direction), Lemma 1 of Appendix A.2 of Farinhas (2021): the
      Gaussian :math:`\mathcal N(u;\tilde\mu_j,\tilde\Sigma_j)`, :math:`\tilde\Sigma_j=A_j^{-1}`,
      :math:`\tilde\mu_j=A_j^{-1}b_j`, integrated in polar coordinates, the radial integral in closed form
      (eqs. (A.15), (A.22), (A.23); :math:`D=1`: truncated Gaussian moments in closed form) and the
      angular one by the periodic trapezoid rule
      :math:`T_n=\frac{2\pi}{n}\sum_kh(\varphi_0+2\pi k/n)`, which converges geometrically because the
      integrand is analytic and :math:`2\pi`-periodic;
    * otherwise (:math:`\psi_j` wide along some direction: small or needle-like ellipses, the basis
      function far away), Cartesian slices of the disk: Gauss--Legendre on each chord along a soft
      direction of :math:`A_j` (its number of nodes chosen from the variation of the exponent along the
      chords), and the periodic trapezoid rule in :math:`\theta`, :math:`v_o=\sin\theta`, across them.

    ``n_quadrature=None`` (default) is an **adaptive** rule with a relative tolerance ``tol``.  Every
    moment entry (below) of every pair is computed to within ``tol`` :math:`\cdot\,s_b`, :math:`s_b` the
    largest mean of a basis function over the ellipse (:math:`\max_j\int_E\psi_j/|E|`), as follows.
    Lemma-1 pairs whose Gaussian's tail outside the disk is provably below that bound are integrated in
    closed form (:math:`U_0=1`, :math:`U_1=\tilde\mu_j`, :math:`U_2=\tilde\Sigma_j+\tilde\mu_j\tilde\mu_j^\top`);
    pairs whose mass on the ellipse is provably below it contribute zero; of the others, the angles (rays
    or slices) that provably add less are skipped, and the trapezoid rule on the remaining window of
    angles is refined by doubling :math:`n` (reusing the old nodes; the new ones are the midpoints) until
    :math:`|T_n-T_{n/2}|`, the error estimate of :math:`T_{n/2}`, is below the bound for all moment
    entries (which are also those of the backward pass); :math:`T_n` is returned, so by the geometric
    convergence the actual error is usually far below ``tol``.  The refinement is batched over the pairs
    that have not converged; at most ``max_quadrature`` angles per pair are evaluated, and a
    ``RuntimeWarning`` is issued if a pair is still above the tolerance then.

    **Without host reads.**  The adaptive loop reads values back (which pairs remain, their number, the
    diagnostics); on a GPU each read is a synchronisation.  Where reads are not allowed
    (host reads not allowed, see :func:`attnopt.set_checks`: on a GPU under the default checks mode ``"auto"``, or in
    mode ``"async"``), a read-free rule runs instead, on every pair at once (masked): the same closed
    forms, negligible pairs and windows, then a fixed number of angles per pair, :math:`4m` rays for
    Lemma-1 pairs and :math:`2m` slices for the others (:math:`m` is the first round of the adaptive rule:
    34 in float64 at the default ``tol``, 22 in float32; at most ``max_quadrature``), Gauss--Legendre
    chords with the nodes for an exponent varying by 24 (32 nodes in float64, 24 in float32), and
    Lemma-1 pairs whose :math:`A_j` has an axis ratio above 8 (needles, on which the rays converge
    slowly) integrated by slices; no error estimate, no warning.  Measured against SciPy
    (``benchmarks/continuous.py``) it is as accurate as the adaptive rule on the regimes of the tests
    (within :math:`10^{-10}` in float64 on Farinhas's (2021) hard cases, :math:`2\cdot10^{-6}` in float32).
    On the CPU it is about 40 (float32) to 100 (float64) times slower than the adaptive rule, since it
    integrates every pair by both routes; it is meant for GPUs, where the adaptive loop would
    synchronise at every round.

    ``n_quadrature=n``: the fixed rule with :math:`n` angles :math:`\varphi_k=2\pi k/n` for every
    Lemma-1 pair (and :math:`n` slice angles on the whole circle for the others).  Its error depends on
    the ellipse: :math:`n=256` is within :math:`10^{-8}` in the VQA setting of Farinhas (2021)
    (:math:`\Sigma_j=10^{-3}I` on a :math:`10\times10` grid, ellipses moment-matched from :math:`14\times14`
    locations, near-uniform and corner-heavy weights included), :math:`n=64` is not (about
    :math:`6\cdot10^{-3}` on the widest ellipses).

    The backward pass needs no further integral: it uses moments computed and kept by the forward pass.
    For Lemma-1 pairs, eq. (3.20) with :math:`\beta=0` (the covariance
    :math:`\operatorname{cov}_{p,0}(\phi(t),\psi_j(t))`, eqs. (A.24)--(A.27)), i.e. the moments
    :math:`\int_{\|u\|\le1}u^{\otimes k}\mathcal N(u;\tilde\mu_j,\tilde\Sigma_j)du`, :math:`k\le2`; for
    the others :math:`\partial r_j/\partial\mu=\mathbb E_w[\nabla\psi_j]` and, with
    :math:`S=MM^\top`, :math:`\partial r_j/\partial S=\frac{Z_2}{8Z_1}\mathbb E_{w_2}[\nabla^2\psi_j]`
    (:math:`w_2\propto(1-\|u\|^2)^2`, by integrating by parts), which need no :math:`M^{-1}` either;
    the chain to :math:`\Sigma` is done by autograd.  Gradients are finite for every SPD
    :math:`\Sigma`; w.r.t. :math:`\Sigma` they grow like :math:`|\Sigma|^{-1/2}` as :math:`\Sigma\to0`,
    as the function does (:class:`ContinuousAttention` differentiates w.r.t. the covariance, which has
    a finite gradient at 0).

    Args:
        mu: ``(..., D)`` locations.
        Sigma: ``(..., D, D)`` scale parameters (symmetric positive definite); *not* the
            covariance of the density, see :func:`moment_match`.  A singular scale has
            :math:`\lambda=-\infty` and is refused; for a density with a singular covariance (a segment
            or a point) use :class:`ContinuousAttention`, which works from the covariance.
        basis: :class:`GaussianRBF` on :math:`\mathbb R^D`, :math:`D\in\{1,2\}`.
        n_quadrature: ``None`` for the adaptive rule, or a fixed number of angular nodes (``D=2``;
            ignored for ``D=1``).
        tol: relative tolerance of the adaptive rule; default :data:`DEFAULT_TOL` (``1e-10``) in
            float64 and 32 machine epsilons (about ``3.8e-6``) in float32 and lower precisions, whose
            round-off a smaller value would not get below.
        max_quadrature: the largest number of angular nodes per pair in the adaptive rule.

    Returns:
        ``(..., N)`` tensor :math:`r` in the dtype of ``mu``; an empty batch gives an empty result.

    Raises:
        ValueError: if ``Sigma`` is not symmetric positive definite (singular included) or not finite,
            ``mu`` is not finite, ``D`` is not 1 or 2, dimensions disagree, ``n_quadrature < 1``,
            ``tol`` is not in :math:`(0,1)` or is given with a fixed ``n_quadrature``, or
            ``max_quadrature < 8``.
        TypeError: if ``basis`` is not a :class:`GaussianRBF`, a tensor is not floating point, ``mu``
            and ``Sigma`` differ in dtype, ``n_quadrature``/``max_quadrature`` are not ints, or ``tol``
            is not a real number.

    Example:
        >>> basis = GaussianRBF.grid(3, 0.3, dim=2, dtype=torch.float64)
        >>> mu = torch.tensor([0.5, 0.5], dtype=torch.float64)
        >>> tiny = 1e-22 * torch.eye(2, dtype=torch.float64)
        >>> r = continuous_sparsemax(mu, tiny, basis)
        >>> bool(torch.allclose(r, basis(mu), rtol=1e-9))  # the point-mass limit
        True

    References:
        Farinhas (2021), chapter 4 and Appendix A.2; Martins et al. (2020).
    """
    n_quadrature, tol, max_quadrature = _check_quadrature_args(n_quadrature, tol, max_quadrature)
    mu_f, Sigma_f, centers, cov, batch, dtype = _prepare(mu, Sigma, basis, "continuous_sparsemax", definite=True)
    if mu_f.shape[-1] not in (1, 2):
        raise ValueError(f"continuous_sparsemax supports D in {{1, 2}}; got D={mu_f.shape[-1]}")
    if tol is None:
        tol = _default_tol(mu_f.dtype)
    S, M = _sparsemax_scale(Sigma_f) if mu_f.shape[0] else (Sigma_f, Sigma_f)
    r = _sparsemax_from_S(mu_f, S, centers, cov, n_quadrature, tol, max_quadrature, M=M)
    return r.reshape(*batch, basis.n_basis).to(dtype)


# --------------------------------------------------------------------------------------------
# the attention density: one type for every head
# --------------------------------------------------------------------------------------------


class ContinuousDensity(NamedTuple):
    r"""An attention density on :math:`\mathbb R^D`: a mixture of :math:`K` Gaussians or truncated paraboloids.

    .. math::

        p(t)=\sum_{k=1}^K\pi_k\,p_k(t),\qquad
        \mathbb E_p[\psi(t)]=\sum_{k=1}^K\pi_k\,\mathbb E_{p_k}[\psi(t)],

    eqs. (5.3)--(5.4) of Farinhas (2021); :math:`K=1` is the unimodal density of continuous softmax
    (:math:`p_k=\mathcal N(\mu_k,\Sigma_k)`, eq. (3.12)) or continuous sparsemax (a truncated
    paraboloid, eq. (3.14)).  Each component is stored by its mean and its **covariance**
    :math:`V_k`, which stays defined in the limits a softmax reaches (weights on one location or on a
    line: a singular :math:`V_k`); the paraboloid's scale :math:`\Sigma_k` is the property
    :attr:`scales` (Theorem 1, :math:`-2\lambda\Sigma=(D+4)V`).  :class:`ContinuousAttention` returns
    one with :math:`K=1`, :class:`attnopt.mixture.MultimodalContinuousAttention` one with :math:`K`
    components, and :func:`attnopt.mixture.select_components` pads unused components with mixing
    weight exactly 0.

    Attributes:
        mixing: ``(..., K)`` mixing weights :math:`\pi_k\ge0` (zero for unused components).
        means: ``(..., K, D)`` means :math:`\mu_k`.
        covariances: ``(..., K, D, D)`` covariances :math:`V_k` (symmetric positive semi-definite).
        family: ``"gaussian"`` or ``"truncated_paraboloid"``.

    Example:
        >>> density = ContinuousDensity(torch.ones(1), torch.full((1, 2), 0.5), 0.01 * torch.eye(2)[None])
        >>> basis = GaussianRBF.grid(3, 0.3)
        >>> density.expected_basis(basis).shape  # r = E_p[psi(t)]
        torch.Size([9])
        >>> round(density.pdf(torch.tensor([[0.5, 0.5]])).item(), 2)  # N(mu; mu, V) = 1 / (2 pi 0.01)
        15.92

    References:
        Farinhas (2021), eqs. (3.12), (3.14), (5.3)-(5.4) and Theorem 1; Martins et al. (2020).
    """

    mixing: torch.Tensor
    means: torch.Tensor
    covariances: torch.Tensor
    family: str = "gaussian"

    @property
    def n_components(self) -> torch.Tensor:
        """``(...)`` number of components with positive mixing weight."""
        return (self.mixing > 0).sum(-1)

    @property
    def scales(self) -> torch.Tensor:
        r"""``(..., K, D, D)`` the matrices :math:`\Sigma_k` of :math:`f(t)=-\frac12(t-\mu_k)^\top\Sigma_k^{-1}(t-\mu_k)`:
        the covariance for a Gaussian, :math:`k^{-(1+D/2)}|V|^{1/2}V` for a truncated paraboloid
        (eq. (4.6) in 2D; 0 where :math:`V` is singular)."""
        check_choice(self.family, "family", _FAMILIES)
        return self.covariances if self.family == "gaussian" else _paraboloid_scale(self.covariances)

    def _checked(self):
        family = check_choice(self.family, "family", _FAMILIES)
        mixing = as_float_tensor(self.mixing, "mixing", min_ndim=1)
        means = as_float_tensor(self.means, "means", min_ndim=2)
        covs = as_float_tensor(self.covariances, "covariances", min_ndim=3)
        for x, name in ((mixing, "mixing"), (covs, "covariances")):
            check_same_dtype(x, name, means, "means")
            check_same_device(x, name, means, "means")
        check_shape_match(mixing, "mixing", means, "means", [(-1, -2)])
        check_shape_match(covs, "covariances", means, "means", [(-3, -2), (-2, -1), (-1, -1)])
        broadcast_shapes(mixing=mixing.shape[:-1], means=means.shape[:-2], covariances=covs.shape[:-3])
        check_finite(mixing, "mixing")
        check_nonnegative(mixing, "mixing")
        return family, mixing, means, covs

    def expected_basis(
        self,
        basis: GaussianRBF,
        *,
        n_quadrature: int | None = DEFAULT_N_QUADRATURE,
        tol: float | None = None,
        max_quadrature: int = DEFAULT_MAX_QUADRATURE,
    ) -> torch.Tensor:
        r""":math:`r=\mathbb E_p[\psi(t)]=\sum_k\pi_k\,\mathbb E_{p_k}[\psi(t)]` (eq. (5.4)); the context is :math:`c=Br`.

        Each component's expectation is :func:`continuous_softmax` (closed form, eq. (4.10)) or
        :func:`continuous_sparsemax` computed from the covariance (so that a singular covariance,
        a density on a segment or a point mass, is the limit of the formula rather than an error).

        Args:
            basis: the :class:`GaussianRBF` :math:`\psi` on :math:`\mathbb R^D`.
            n_quadrature, tol, max_quadrature: the angular rule of 2D sparsemax, as in
                :func:`continuous_sparsemax` (ignored for Gaussians).

        Returns:
            ``(..., N)`` in the dtype of ``means``.

        Raises:
            TypeError: ``basis`` not a :class:`GaussianRBF`, non-float or mixed-dtype fields.
            ValueError: shapes that disagree with each other or with the basis, negative or
                non-finite mixing weights, covariances that are not symmetric positive
                semi-definite or not finite, an unknown ``family``, sparsemax with :math:`D>2`.

        Example:
            >>> basis = GaussianRBF.grid(3, 0.3, dtype=torch.float64)
            >>> mu = torch.tensor([[0.2, 0.3], [0.8, 0.6]], dtype=torch.float64)
            >>> two = ContinuousDensity(torch.tensor([0.25, 0.75], dtype=torch.float64), mu,
            ...                         torch.zeros(2, 2, 2, dtype=torch.float64))
            >>> bool(torch.allclose(two.expected_basis(basis), 0.25 * basis(mu[0]) + 0.75 * basis(mu[1])))
            True
        """
        family, mixing, means, covs = self._checked()
        n_quadrature, tol, max_quadrature = _check_quadrature_args(n_quadrature, tol, max_quadrature)
        if family == "truncated_paraboloid" and means.shape[-1] not in (1, 2):
            raise ValueError(f"continuous sparsemax supports D in {{1, 2}}; got D={means.shape[-1]}")
        mu_f, V_f, centers, cov, batch, dtype = _prepare(means, covs, basis, "expected_basis", definite=False,
                                                            names=("means", "covariances"))
        return _expected_basis(family, mixing, mu_f, V_f, centers, cov, batch, dtype, basis.n_basis,
                               (n_quadrature, tol, max_quadrature))

    def pdf(self, points: torch.Tensor) -> torch.Tensor:
        r"""The density :math:`p(t)=\sum_k\pi_kp_k(t)` at ``(P, D)`` points: ``(..., P)``.

        Components with mixing weight 0 are skipped (their parameters may be placeholders); the
        others need a positive-definite covariance (a density on a segment or a point has no
        values to plot).

        Raises:
            TypeError, ValueError: as :meth:`expected_basis`, and for ``points`` not ``(P, D)``
                floats of the means' dtype, or a used component with a singular covariance.

        Example:
            >>> g = ContinuousDensity(torch.ones(1), torch.zeros(1, 2), torch.eye(2)[None])
            >>> round(g.pdf(torch.zeros(1, 2)).item(), 4)  # 1 / (2 pi)
            0.1592
        """
        family, mixing, means, covs = self._checked()
        points = as_float_tensor(points, "points", min_ndim=2)
        if points.ndim != 2:
            raise ValueError(f"points must have shape (P, D); got {tuple(points.shape)}")
        check_same_dtype(points, "points", means, "means")
        check_same_device(points, "points", means, "means")
        check_shape_match(points, "points", means, "means", [(-1, -1)])
        used = mixing > 0
        eye = torch.eye(means.shape[-1], dtype=means.dtype, device=means.device)
        V = torch.where(used[..., None, None], covs, eye)
        mu = torch.where(used[..., None], means, torch.zeros_like(means))
        Sigma = V if family == "gaussian" else _paraboloid_scale(V)
        values = continuous_density(points[:, None, :], mu.unsqueeze(-3), Sigma.unsqueeze(-4), family)  # (..., P, K)
        return (values * torch.where(used, mixing, torch.zeros_like(mixing)).unsqueeze(-2)).sum(-1)


def _expected_basis(family, mixing, mu_f, V_f, centers, cov, batch, dtype, n_basis, rule):
    """``sum_k pi_k E_{p_k}[psi]`` from flattened, validated ``(B K, D)`` means and covariances."""
    n_quadrature, tol, max_quadrature = rule
    if family == "gaussian":
        r = _softmax_flat(mu_f, V_f, centers, cov)
    else:
        tol = _default_tol(mu_f.dtype) if tol is None else tol
        r = _sparsemax_from_S(mu_f, (mu_f.shape[-1] + 4.0) * V_f, centers, cov, n_quadrature, tol, max_quadrature)
    r = r.reshape(*batch, n_basis).to(dtype)  # batch = (..., K)
    return torch.einsum("...k,...kn->...n", mixing.to(dtype), r)


def _discrete_weights(scores: torch.Tensor, uniform_mix: float) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(weights, dead)``: :math:`(1-\epsilon)\operatorname{softmax}(s)+\epsilon u` with :math:`u` uniform on the
    locations of finite score, and the rows whose scores are all ``-inf`` (given uniform weights, for
    a finite fit that the caller then zeroes).  Shared by the continuous and multimodal modules."""
    dead = (scores == -math.inf).all(-1, keepdim=True)
    safe = torch.where(dead, torch.zeros_like(scores), scores)
    weights = torch.softmax(safe, dim=-1)
    if uniform_mix > 0:
        live = (safe > -math.inf).to(weights.dtype)
        weights = (1.0 - uniform_mix) * weights + uniform_mix * live / live.sum(-1, keepdim=True)
    return weights, dead


# --------------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------------


class ContinuousAttention(nn.Module):
    r"""Continuous softmax / sparsemax attention over a grid of locations (§6.2.2 and Fig. 6.3 of Farinhas, 2021).

    Given discrete scores :math:`s\in\mathbb R^L` over locations :math:`t_l` and value features
    :math:`h_l\in\mathbb R^d`:

    1. discrete weights :math:`w=(1-\epsilon)\operatorname{softmax}(s)+\epsilon\,u` (:math:`u`
       uniform, :math:`\epsilon=` ``uniform_mix``, 0 by default) and their mean :math:`\mu` and
       covariance :math:`V` on the locations (moment matching, Alg. 2; :func:`moment_match`):
       the attention density (:meth:`density`, a :class:`ContinuousDensity` with one component);
    2. :math:`r=\mathbb E_p[\psi(t)]` under the Gaussian (:func:`continuous_softmax`,
       :math:`\Sigma=V`) or the truncated paraboloid (:func:`continuous_sparsemax`) with mean
       :math:`\mu` and covariance :math:`V` (:meth:`ContinuousDensity.expected_basis`);
    3. :math:`B=HG` by ridge regression (:func:`ridge_operator`; :math:`G` depends only on the
       locations and the basis, so it is computed once here, as Fig. 6.3 suggests);
    4. context :math:`c=Br` (eq. (3.16)).

    Args:
        basis: the :class:`GaussianRBF` :math:`\psi` (e.g. ``GaussianRBF.grid(10, 0.001 ** 0.5)``).
        locations: ``(L, D)`` locations of the scores/features (e.g. ``grid_locations(14)``).
        family: ``"gaussian"`` (continuous softmax) or ``"truncated_paraboloid"`` (sparsemax).
        penalty: ridge penalty :math:`\lambda` (0.01 in Table 6.1 of Farinhas, 2021).
        padding: optional ``(P, D)`` padding locations (:func:`padding_locations`), or ``True``
            to build them for a square grid of side ``round(L ** (1/D))`` on the unit cube.
        uniform_mix: :math:`\epsilon\in[0,1]`, the weight of the uniform distribution (over the
            locations of finite score) mixed into the softmax before moment matching; it bounds
            the covariance away from 0 (a regularizer; not needed for finiteness, see below).
        n_quadrature, tol, max_quadrature: the angular rule of 2D sparsemax, as in
            :func:`continuous_sparsemax` (default: adaptive with the dtype's default tolerance).

    Peaked scores are handled in the limit.  The covariance :math:`V` of a one-hot softmax is 0 and
    that of two tied locations is singular; both are valid: the Gaussian :math:`\mathcal N(\mu,V)` is
    then the point mass (:math:`r=\psi(\mu)`) or a Gaussian on a line, and the truncated paraboloid is
    parametrized by its covariance, :math:`-2\lambda\Sigma=(D+4)V` (Thm. 1), which stays defined when
    its scale :math:`\Sigma` would be 0 (a density :math:`\propto(1-x^2)^{3/2}` on a segment in 2D, the
    point mass at :math:`V=0`).  The backward pass differentiates w.r.t. :math:`V`, whose gradient is
    finite at these limits (:math:`\partial r_j/\partial V\to\frac12\nabla^2\psi_j(\mu)` at the
    point mass), so gradients w.r.t. the scores and values are finite for any finite scores.

    Shapes:
        ``forward(scores (..., L), values (..., L, d)) -> (..., d)``.  ``scores`` may hold ``-inf``
        (masked locations) but not NaN or ``+inf``, and every row needs a finite score; an empty batch
        gives an empty context.

    Example:
        >>> basis, locations = GaussianRBF.grid(3, 0.3), grid_locations(4)
        >>> family = "truncated_paraboloid"
        >>> att = ContinuousAttention(basis, locations, family=family)
        >>> scores = torch.full((16,), -float("inf"))
        >>> scores[5] = 0.0  # one location: a point mass
        >>> values = torch.eye(16)[:, :3]
        >>> context, density = att(scores, values, return_density=True)
        >>> context.shape, density.means.tolist(), density.covariances.abs().max().item()
        (torch.Size([3]), [[0.3333333432674408, 0.3333333432674408]], 0.0)

    References:
        Farinhas (2021), §6.2.2, Alg. 2, eqs. (3.16)-(3.17) and Fig. 6.3; Martins et al. (2020).
    """

    def __init__(
        self,
        basis: GaussianRBF,
        locations: torch.Tensor,
        *,
        family: str = "gaussian",
        penalty: float = 0.01,
        padding: torch.Tensor | bool | None = None,
        uniform_mix: float = 0.0,
        n_quadrature: int | None = DEFAULT_N_QUADRATURE,
        tol: float | None = None,
        max_quadrature: int = DEFAULT_MAX_QUADRATURE,
    ):
        super().__init__()
        if not isinstance(basis, GaussianRBF):
            raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
        self.family = check_choice(family, "family", _FAMILIES)
        if self.family == "truncated_paraboloid" and basis.dim not in (1, 2):
            raise ValueError(f"continuous sparsemax supports D in {{1, 2}}; the basis has D={basis.dim}")
        self.n_quadrature, self.tol, self.max_quadrature = _check_quadrature_args(n_quadrature, tol, max_quadrature)
        self.penalty = check_positive(penalty, "penalty", allow_zero=True)
        self.uniform_mix = check_number(uniform_mix, "uniform_mix", low=0.0, high=1.0)
        self.basis = basis
        locations = _check_locations(locations, basis).to(device=basis.centers.device, dtype=basis.centers.dtype)
        if padding is True:
            side = round(locations.shape[0] ** (1.0 / basis.dim))
            if side**basis.dim != locations.shape[0]:
                raise ValueError("padding=True needs a square grid of locations; pass padding locations instead")
            padding = padding_locations(side, basis.dim, dtype=locations.dtype, device=locations.device)
        elif padding is False:
            padding = None
        if padding is not None:
            padding = _check_locations(padding, basis, "padding").to(locations)
        self.register_buffer("locations", locations)
        self.register_buffer("ridge_operator", _ridge_operator(locations, basis, self.penalty, padding))

    def _check_scores(self, scores):
        scores = as_float_tensor(scores, "scores", min_ndim=1)
        check_shape_match(scores, "scores", self.locations, "locations", [(-1, 0)])
        check_finite(scores, "scores", allow_neg_inf=True)
        if scores.numel():
            require((scores > -math.inf).any(-1).all(), "scores must have at least one finite entry in every row")
        return scores

    def density(self, scores: torch.Tensor) -> ContinuousDensity:
        """The attention density of ``(..., L)`` scores: one component, moment-matched (Alg. 2).

        Returns:
            :class:`ContinuousDensity` with ``mixing (..., 1)`` (ones), ``means (..., 1, D)`` and
            ``covariances (..., 1, D, D)``, in the dtype of ``scores``.

        Raises:
            ValueError: ``scores`` with NaN, ``+inf``, a row with no finite entry, or a last
                dimension other than ``L``.
            TypeError: non-float ``scores``.
        """
        scores = self._check_scores(scores)
        weights, _ = _discrete_weights(scores, self.uniform_mix)
        mu, var = _match_moments(weights, self.locations.to(device=weights.device, dtype=weights.dtype))
        return ContinuousDensity(torch.ones_like(mu[..., :1]), mu.unsqueeze(-2), var.unsqueeze(-3), self.family)

    def forward(self, scores: torch.Tensor, values: torch.Tensor, *, return_density: bool = False):
        """Context vectors ``(..., d)``; with ``return_density=True`` also the :class:`ContinuousDensity`.

        Raises:
            ValueError: if ``scores`` holds NaN or ``+inf`` or a row with no finite entry, ``values``
                is not finite, or the shapes do not match the locations.
            TypeError: for non-float tensors.
        """
        values = as_float_tensor(values, "values", min_ndim=2)
        check_shape_match(values, "values", self.locations, "locations", [(-2, 0)])
        check_finite(values, "values")
        density = self.density(scores)
        batch = broadcast_shapes(scores=density.mixing.shape[:-1], values=values.shape[:-2])
        # the density is valid by construction: no second validation of the moments
        D, cdt = self.locations.shape[-1], _compute_dtype(density.means.dtype)
        mu_f, V_f = density.means.reshape(-1, D).to(cdt), density.covariances.reshape(-1, D, D).to(cdt)
        centers = self.basis.centers.to(device=mu_f.device, dtype=cdt)
        cov = self.basis.covariance.to(device=mu_f.device, dtype=cdt)
        r = _expected_basis(self.family, density.mixing, mu_f, V_f, centers, cov, density.mixing.shape,
                            values.dtype, self.basis.n_basis, (self.n_quadrature, self.tol, self.max_quadrature))
        B = torch.einsum("...ld,ln->...dn", values, self.ridge_operator.to(values))  # eq. (3.17)
        context = (B @ r.unsqueeze(-1)).squeeze(-1).expand(*batch, values.shape[-1])
        return (context, density) if return_density else context

    def extra_repr(self) -> str:
        return (f"family={self.family!r}, n_locations={self.locations.shape[0]}, penalty={self.penalty}, "
                f"uniform_mix={self.uniform_mix}")
