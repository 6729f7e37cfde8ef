r"""Continuous attention over :math:`\mathbb{R}^D` with Gaussian radial basis functions.

Discrete attention averages :math:`L` value vectors with weights :math:`p\in\Delta^L`.  Continuous
attention (chapters 3--4 of Farinhas's thesis) replaces the simplex by densities on
:math:`S=\mathbb{R}^D` and the weighted average by an expectation.  With a value function
:math:`V_B(t) = B\psi(t)` written in a basis :math:`\psi:\mathbb{R}^D\to\mathbb{R}^N` and a density
:math:`p` that maximizes :math:`\mathbb{E}_p[f(t)] - \Omega_\alpha(p)` for a quadratic score

.. math::

    f(t) = -\tfrac12 (t-\mu)^\top \Sigma^{-1} (t-\mu)
         = \theta^\top \phi(t), \qquad
    \phi(t) = [t,\ tt^\top],\quad \theta = [\Sigma^{-1}\mu,\ -\tfrac12\Sigma^{-1}],

the context vector is :math:`c = \mathbb{E}_p[V_B(t)] = B r` with :math:`r = \mathbb{E}_p[\psi(t)]`
(eq. (3.16) of the continuous-attention thesis).  Shannon's negentropy (:math:`\alpha=1`) gives a
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
import warnings
from typing import Sequence

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ._validation import as_float_tensor, check_finite, check_int, check_positive, check_shape_match

__all__ = [
    "DEFAULT_MAX_QUADRATURE",
    "DEFAULT_N_QUADRATURE",
    "DEFAULT_TOL",
    "ContinuousAttention",
    "GaussianRBF",
    "continuous_density",
    "continuous_softmax",
    "continuous_sparsemax",
    "grid_locations",
    "moment_match",
    "padding_locations",
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


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # erf/erfc/cholesky are not implemented (or are too coarse) in half precision
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _check_spd(S: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` unless every ``(..., D, D)`` matrix of ``S`` is symmetric positive definite."""
    if S.ndim < 2 or S.shape[-1] != S.shape[-2]:
        raise ValueError(f"{name} must have shape (..., D, D) with square trailing dimensions; got {tuple(S.shape)}")
    check_finite(S, name)
    if S.numel() == 0:
        return
    scale = S.abs().amax().clamp_min(torch.finfo(S.dtype).tiny)
    tol = math.sqrt(torch.finfo(S.dtype).eps)
    asym = (S - S.transpose(-1, -2)).abs().amax()
    if asym > tol * scale:
        raise ValueError(
            f"{name} must be symmetric; max |{name} - {name}^T| = {asym.item():.3g} "
            f"(relative {(asym / scale).item():.3g} > {tol:.1g})"
        )
    _, info = torch.linalg.cholesky_ex(_sym(S).to(_compute_dtype(S.dtype)))
    if (info > 0).any():
        raise ValueError(f"{name} must be positive definite; at least one matrix is not (Cholesky failed)")


def _check_family(family: str) -> str:
    if family not in _FAMILIES:
        raise ValueError(f"family must be one of {_FAMILIES}; got {family!r}")
    return family


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
        ``(...)`` tensor of :math:`\lambda` (negative).

    Raises:
        ValueError: if ``Sigma`` is not square.
    """
    Sigma = as_float_tensor(Sigma, "Sigma", min_ndim=2)
    if Sigma.shape[-1] != Sigma.shape[-2]:
        raise ValueError(f"Sigma must have shape (..., D, D); got {tuple(Sigma.shape)}")
    d = Sigma.shape[-1]
    logdet = torch.logdet(Sigma)
    log_minus_lam = (2.0 / (d + 2)) * (math.log(_gaussian_const(d)) - 0.5 * logdet)
    return -torch.exp(log_minus_lam)


def _theta_grad_to_mu_sigma(g1, g2, mu, Sigma_inv):
    r"""Chain :math:`\partial\mathcal L/\partial\theta` to :math:`(\mu,\Sigma)` for
    :math:`\theta_1=\Sigma^{-1}\mu`, :math:`\theta_2=-\frac12\Sigma^{-1}`:
    :math:`\bar\mu=\Sigma^{-1}\bar\theta_1`,
    :math:`\bar\Sigma=\operatorname{sym}(-\Sigma^{-1}\bar\theta_1\mu^\top\Sigma^{-1}
    +\frac12\Sigma^{-1}\bar\theta_2\Sigma^{-1})`."""
    a = (Sigma_inv @ g1.unsqueeze(-1)).squeeze(-1)
    m = (Sigma_inv @ mu.unsqueeze(-1)).squeeze(-1)
    grad_mu = a
    grad_Sigma = -a.unsqueeze(-1) * m.unsqueeze(-2) + 0.5 * Sigma_inv @ _sym(g2) @ Sigma_inv
    return grad_mu, _sym(grad_Sigma)


# --------------------------------------------------------------------------------------------
# basis functions and locations
# --------------------------------------------------------------------------------------------


class GaussianRBF(nn.Module):
    r"""Gaussian radial basis functions :math:`\psi_j(t) = \mathcal N(t;\mu_j,\Sigma_j)`, :math:`j\in[N]`.

    Each basis function is a normalized Gaussian *density* (as in chapter 4 of the
    continuous-attention thesis), not an unnormalized bump: :math:`\int\psi_j = 1`.

    Args:
        centers: ``(N, D)`` centers :math:`\mu_j` (a ``(N,)`` tensor is read as ``D = 1``).
        sigma: standard deviations: a number (shared, isotropic), ``(N,)`` (isotropic per basis
            function) or ``(N, D)`` (axis-aligned per basis function); the covariance is
            :math:`\Sigma_j=\operatorname{diag}(\sigma_j^2)`.  The thesis's VQA basis,
            :math:`\Sigma_j = 0.001\,I`, is ``sigma=0.001 ** 0.5``.
        covariance: instead of ``sigma``, full covariances ``(D, D)`` (shared) or ``(N, D, D)``.

    Raises:
        ValueError: if both or neither of ``sigma``/``covariance`` are given, a standard deviation
            is not positive, a covariance is not symmetric positive definite, or shapes disagree.

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
            if (sigma <= 0).any():
                raise ValueError("sigma (standard deviations) must be > 0")
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
            _check_spd(cov, "covariance")
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
        basis of Table 6.1 of the thesis.

        Args:
            n_per_axis: centers per axis, one int for every level or one per level.
            sigmas: a standard deviation or a sequence of them (one level each).
            dim: the dimension :math:`D` of the domain.
            low, high: the grid's bounds on each axis.
            dtype, device: of the buffers (defaults: torch's default dtype, CPU).

        Returns:
            A :class:`GaussianRBF` with ``N = sum_k n_per_axis[k] ** dim`` functions.

        Raises:
            ValueError: on non-positive sizes or standard deviations, or mismatched lengths.
        """
        dim = check_int(dim, "dim")
        sig = [sigmas] if isinstance(sigmas, (int, float)) else list(sigmas)
        if len(sig) == 0:
            raise ValueError("sigmas must hold at least one standard deviation")
        sig = [check_positive(s, "sigmas") for s in sig]
        ns = [n_per_axis] * len(sig) if isinstance(n_per_axis, int) else list(n_per_axis)
        if len(ns) != len(sig):
            raise ValueError(f"n_per_axis has {len(ns)} entries but sigmas has {len(sig)}")
        ns = [check_int(n, "n_per_axis") for n in ns]
        if not high > low:
            raise ValueError(f"high must be > low; got low={low}, high={high}")
        dtype = dtype or torch.get_default_dtype()
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

    The locations :math:`t_l` of §6.2.2 of the thesis (a :math:`14\times14` feature map normalized to
    the unit square) are ``grid_locations(14)``; the flattening order is ``'ij'`` (row-major), as
    for ``features.flatten(-3, -2)`` of a ``(..., H, W, C)`` map.

    Returns:
        ``(n_per_axis ** dim, dim)`` tensor.
    """
    n_per_axis = check_int(n_per_axis, "n_per_axis")
    dim = check_int(dim, "dim")
    axis = torch.linspace(low, high, n_per_axis, dtype=dtype or torch.get_default_dtype(), device=device)
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
    """
    n_per_axis = check_int(n_per_axis, "n_per_axis")
    dim = check_int(dim, "dim")
    if n_per_axis < 2:
        raise ValueError("padding needs n_per_axis >= 2 (a grid step)")
    step = (high - low) / (n_per_axis - 1)
    m = int(round(0.5 * (high - low) / step))
    k = torch.arange(-m, n_per_axis + m, device=device)
    mesh = torch.meshgrid(*([k] * dim), indexing="ij")
    idx = torch.stack([g.reshape(-1) for g in mesh], dim=-1)
    outside = ((idx < 0) | (idx > n_per_axis - 1)).any(-1)
    dtype = dtype or torch.get_default_dtype()
    return low + idx[outside].to(dtype) * step


# --------------------------------------------------------------------------------------------
# value function: ridge regression (Alg. 1)
# --------------------------------------------------------------------------------------------


def _ridge_operator(locations, basis, penalty, padding=None):
    """``G = F (F^T F + penalty I)^{-1}`` restricted to the rows of ``locations``: ``(L, N)``."""
    F = basis(locations)  # (L, N)
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
    if (info > 0).any() or not torch.isfinite(G).all():
        raise ValueError("the ridge normal equations are singular; use penalty > 0 (or more locations)")
    G = G.transpose(-1, -2)  # gram is symmetric
    return G[:n_loc]


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
    the continuous-attention thesis is

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
        penalty: the ridge penalty :math:`\lambda\ge0` (the thesis uses 0.01).
        padding: optional ``(P, D)`` extra locations where :math:`V_B` is fitted to zero
            (see :func:`padding_locations`).

    Returns:
        ``(..., d, N)`` tensor :math:`B`; the context for :math:`r=\mathbb E_p[\psi(t)]` is
        ``B @ r.unsqueeze(-1)``.

    Raises:
        ValueError: if shapes disagree, ``penalty < 0`` or the normal equations are singular
            (``penalty = 0`` with fewer locations than basis functions).
    """
    if not isinstance(basis, GaussianRBF):
        raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
    features = as_float_tensor(features, "features", min_ndim=2)
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
    :math:`\Sigma=\mathrm{Var}`.  For a truncated paraboloid Theorem 1 of the thesis gives
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
        ``(mu, Sigma)`` of shapes ``(..., D)`` and ``(..., D, D)``; ``Sigma`` is the scale
        parameter, equal to the variance only for the Gaussian.

    Raises:
        ValueError: on negative or all-zero weights, an unknown family, or mismatched ``L``.
    """
    family = _check_family(family)
    weights = as_float_tensor(weights, "weights", min_ndim=1)
    locations = as_float_tensor(locations, "locations", min_ndim=2, like=weights)
    check_finite(weights, "weights")
    check_finite(locations, "locations")
    check_shape_match(weights, "weights", locations, "locations", [(-1, -2)])
    if (weights < 0).any():
        raise ValueError("weights must be non-negative; found entries < 0")
    total = weights.sum(-1, keepdim=True)
    if (total <= 0).any():
        raise ValueError("weights must have a positive sum along the last dimension")
    p = weights / total
    locations = locations.to(dtype=p.dtype, device=p.device)
    mu = torch.einsum("...l,...ld->...d", p, locations)
    centred = locations - mu.unsqueeze(-2)
    var = torch.einsum("...l,...ld,...le->...de", p, centred, centred)
    var = _sym(var)
    if family == "gaussian":
        return mu, var
    d = var.shape[-1]
    k = _gaussian_const(d) ** (2.0 / (d + 2)) / (d / 2 + 2)
    det = torch.linalg.det(var) if d > 1 else var[..., 0, 0]
    scale = det.clamp_min(0).sqrt() * k ** (-(1 + d / 2))
    return mu, scale[..., None, None] * var


def continuous_density(t: torch.Tensor, mu: torch.Tensor, Sigma: torch.Tensor, family: str = "gaussian") -> torch.Tensor:
    r"""Evaluate :math:`\mathcal N(t;\mu,\Sigma)` (eq. (3.12)) or
    :math:`\mathcal{TP}(t;\mu,\Sigma)=[-\lambda-\frac12(t-\mu)^\top\Sigma^{-1}(t-\mu)]_+` (eq. (3.14)).

    Args:
        t: ``(..., D)`` points; ``mu`` ``(..., D)`` and ``Sigma`` ``(..., D, D)`` broadcast against them.
        family: ``"gaussian"`` or ``"truncated_paraboloid"``.

    Returns:
        ``(...)`` density values (for plotting attention maps).
    """
    family = _check_family(family)
    t = as_float_tensor(t, "t", min_ndim=1)
    mu = as_float_tensor(mu, "mu", min_ndim=1)
    Sigma = as_float_tensor(Sigma, "Sigma", min_ndim=2)
    _check_spd(Sigma, "Sigma")
    check_shape_match(t, "t", mu, "mu", [(-1, -1)])
    check_shape_match(mu, "mu", Sigma, "Sigma", [(-1, -1)])
    d = mu.shape[-1]
    L = torch.linalg.cholesky(_sym(Sigma))
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
        # mu (B, D), Sigma (B, D, D), centers (N, D), cov (N, D, D)
        d = mu.shape[-1]
        S = Sigma.unsqueeze(-3) + cov  # (B, N, D, D): Sigma + Sigma_j
        Ls = torch.linalg.cholesky(S)
        diff = mu.unsqueeze(-2) - centers  # (B, N, D): mu - mu_j
        w = torch.cholesky_solve(diff.unsqueeze(-1), Ls).squeeze(-1)  # S^{-1}(mu - mu_j)
        quad = (diff * w).sum(-1)
        half_logdet = torch.log(torch.diagonal(Ls, dim1=-2, dim2=-1)).sum(-1)
        r = torch.exp(-0.5 * quad - half_logdet - 0.5 * d * math.log(2 * math.pi))  # eq. (4.10)
        ctx.save_for_backward(mu, Sigma, cov, w, r)
        return r

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_r):
        mu, Sigma, cov, w, r = ctx.saved_tensors
        # product-of-Gaussians parameters, eq. (4.9):
        #   Sigma_tilde = (Sigma^{-1} + Sigma_j^{-1})^{-1} = Sigma S^{-1} Sigma_j
        #   mu_tilde - mu = -Sigma S^{-1} (mu - mu_j)
        Sig = Sigma.unsqueeze(-3)
        dmu = -(Sig @ w.unsqueeze(-1)).squeeze(-1)  # (B, N, D)
        S = Sig + cov
        sig_tilde = _sym(Sig - Sig @ torch.linalg.solve(S, Sig))  # Sigma - Sigma S^{-1} Sigma
        mu_t = mu.unsqueeze(-2) + dmu
        gs = grad_r * r  # g_j * s_tilde_j
        # rows of the Jacobian (covariances), eqs. (4.11)-(4.12), contracted with g
        g1 = torch.einsum("bn,bnd->bd", gs, dmu)
        second = sig_tilde + mu_t.unsqueeze(-1) * mu_t.unsqueeze(-2)
        mm = Sigma + mu.unsqueeze(-1) * mu.unsqueeze(-2)
        g2 = torch.einsum("bn,bnde->bde", gs, second) - gs.sum(-1)[:, None, None] * mm
        Sigma_inv = torch.cholesky_inverse(torch.linalg.cholesky(Sigma))
        grad_mu, grad_Sigma = _theta_grad_to_mu_sigma(g1, g2, mu, Sigma_inv)
        return grad_mu, grad_Sigma, None, None


def _prepare(mu, Sigma, basis, name_fn):
    if not isinstance(basis, GaussianRBF):
        raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
    mu = as_float_tensor(mu, "mu", min_ndim=1)
    Sigma = as_float_tensor(Sigma, "Sigma", min_ndim=2)
    if mu.dtype != Sigma.dtype:
        raise TypeError(f"mu and Sigma must have the same dtype; got {mu.dtype} and {Sigma.dtype}")
    if mu.device != Sigma.device:
        raise ValueError(f"mu and Sigma must be on the same device; got {mu.device} and {Sigma.device}")
    check_finite(mu, "mu")
    d = mu.shape[-1]
    if Sigma.shape[-2:] != (d, d):
        raise ValueError(f"Sigma must have shape (..., {d}, {d}) to match mu of shape {tuple(mu.shape)}; got {tuple(Sigma.shape)}")
    if basis.dim != d:
        raise ValueError(f"{name_fn}: mu has dimension D={d} but the basis lives in D={basis.dim}")
    _check_spd(Sigma, "Sigma")
    try:
        batch = torch.broadcast_shapes(mu.shape[:-1], Sigma.shape[:-2])
    except RuntimeError as err:
        raise ValueError(f"leading shapes of mu {tuple(mu.shape)} and Sigma {tuple(Sigma.shape)} do not broadcast") from err
    cdt = _compute_dtype(mu.dtype)
    mu_f = mu.expand(*batch, d).reshape(-1, d).to(cdt)
    Sigma_f = _sym(Sigma.expand(*batch, d, d).reshape(-1, d, d).to(cdt))
    centers = basis.centers.to(device=mu.device, dtype=cdt)
    cov = basis.covariance.to(device=mu.device, dtype=cdt)
    return mu_f, Sigma_f, centers, cov, batch, mu.dtype


def continuous_softmax(mu: torch.Tensor, Sigma: torch.Tensor, basis: GaussianRBF) -> torch.Tensor:
    r"""Continuous softmax attention :math:`r_j=\mathbb E_{\mathcal N(\mu,\Sigma)}[\psi_j(t)]`, any :math:`D`.

    The product of two Gaussian densities is a scaled Gaussian (eqs. (4.8)--(4.9) of the
    continuous-attention thesis), so eq. (4.7) has the closed form (eq. (4.10))

    .. math::

        r_j = \int_{\mathbb R^D}\mathcal N(t;\mu,\Sigma)\,\mathcal N(t;\mu_j,\Sigma_j)\,dt
            = \mathcal N(\mu;\mu_j,\Sigma+\Sigma_j).

    The backward pass (Alg. 3) uses the Jacobian w.r.t. the canonical parameters
    :math:`\theta=[\Sigma^{-1}\mu,-\frac12\Sigma^{-1}]`, a covariance (eq. (3.20) with
    :math:`\beta=1`), whose rows are eqs. (4.11)--(4.12):
    :math:`\partial r_j/\partial\theta_1=\tilde s_j(\tilde\mu_j-\mu)`,
    :math:`\partial r_j/\partial\theta_2=\tilde s_j(\tilde\Sigma_j+\tilde\mu_j\tilde\mu_j^\top-\Sigma-\mu\mu^\top)`;
    it is then chained to :math:`(\mu,\Sigma)`.

    Args:
        mu: ``(..., D)`` means.
        Sigma: ``(..., D, D)`` covariances (symmetric positive definite); leading dims broadcast
            with ``mu``'s.
        basis: :class:`GaussianRBF` with ``N`` functions on :math:`\mathbb R^D`.

    Returns:
        ``(..., N)`` tensor :math:`r`.

    Raises:
        ValueError: if ``Sigma`` is not symmetric positive definite or dimensions disagree.
        TypeError: if ``basis`` is not a :class:`GaussianRBF` or dtypes differ.
    """
    mu_f, Sigma_f, centers, cov, batch, dtype = _prepare(mu, Sigma, basis, "continuous_softmax")
    r = _ContinuousSoftmaxFn.apply(mu_f, Sigma_f, centers, cov)
    return r.reshape(*batch, basis.n_basis).to(dtype)


# --------------------------------------------------------------------------------------------
# continuous sparsemax (alpha = 2), D in {1, 2}: Appendix A.2, Alg. 4
# --------------------------------------------------------------------------------------------
#
# Write the support E = {t : (t-mu)^T Sigma^{-1} (t-mu) <= -2 lambda} as t = mu + M u, |u| <= 1,
# with M = sqrt(-2 lambda) chol(Sigma).  Lemma 1 turns N(t; mu_j, Sigma_j) dt into
# N(u; mu~_j, Sigma~_j) du with mu~_j = M^{-1}(mu_j - mu), Sigma~_j = M^{-1} Sigma_j M^{-T}.
# Everything (forward and backward) follows from the three moments over the unit ball
#     U0_j = int N(u),   U1_j = int u N(u),   U2_j = int u u^T N(u):
#     r_j   = -lambda (U0_j - tr U2_j)                                   (A.15)
#     int_E psi_j = U0_j,  int_E t psi_j = mu U0_j + M U1_j,  int_E t t^T psi_j = ...
# and, with E-averages  mu  and  mu mu^T + (-2 lambda) Sigma / (D + 2)   (A.26),
#     cov_{p,0}(t, psi_j)     = M U1_j                                   (A.24)
#     cov_{p,0}(tt^T, psi_j)  = M U1_j mu^T + mu U1_j^T M^T + M U2_j M^T - (-2 lambda) Sigma U0_j / (D+2)   (A.25)
# In 2D the moments are integrals in polar coordinates u = rho a(phi): the radial integral is in
# closed form (eqs. A.18-A.22, A.31, A.34, A.40) and the angular one uses the periodic trapezoid
# rule, which converges geometrically for smooth periodic integrands.


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


def _setup_2d(mu, Sigma, centers, cov):
    r"""Closed-form 2x2 set-up of the unit-disk problem for :math:`D=2`.

    Returns ``Lc`` (chol Sigma), ``minus_lam`` (eq. (3.15)), ``M = sqrt(-2 lambda) Lc`` and a dict of
    ``(B, N)`` tensors: :math:`P=\tilde\Sigma^{-1}` (``P00, P01, P11``), ``detP``, :math:`P\tilde\mu`
    (``Pm0, Pm1``), :math:`\tilde\mu` (``mt0, mt1``) and :math:`q=\tilde\mu^\top P\tilde\mu`.
    """
    s00, s01, s11 = Sigma[:, 0, 0], Sigma[:, 0, 1], Sigma[:, 1, 1]
    l00 = s00.sqrt()
    l10 = s01 / l00
    l11 = (s11 - l10 * l10).sqrt()
    minus_lam = torch.exp(0.5 * (math.log(_gaussian_const(2)) - torch.log(l00 * l11)))  # eq. (3.15), D = 2
    c = torch.sqrt(2.0 * minus_lam)
    zero = torch.zeros_like(l00)
    Lc = torch.stack([torch.stack([l00, zero], -1), torch.stack([l10, l11], -1)], -2)
    M = c[:, None, None] * Lc  # t = mu + M u
    m00, m10, m11 = (c * l00)[:, None], (c * l10)[:, None], (c * l11)[:, None]
    v00, v01, v11 = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1]
    det_j = v00 * v11 - v01 * v01
    i00, i01, i11 = v11 / det_j, -v01 / det_j, v00 / det_j  # Sigma_j^{-1}
    d0 = centers[:, 0] - mu[:, :1]  # (B, N): mu_j - mu
    d1 = centers[:, 1] - mu[:, 1:]
    w0 = i00 * d0 + i01 * d1  # Sigma_j^{-1}(mu_j - mu)
    w1 = i01 * d0 + i11 * d1
    mt0 = d0 / m00  # mu~ = M^{-1}(mu_j - mu), M lower triangular
    mt1 = (d1 - m10 * mt0) / m11
    k10 = i01 * m00 + i11 * m10  # P = M^T Sigma_j^{-1} M
    k11 = i11 * m11
    pair = {
        "P00": m00 * (i00 * m00 + i01 * m10) + m10 * k10,
        "P01": m11 * k10,
        "P11": m11 * k11,
        "detP": (m00 * m11) ** 2 / det_j,
        "Pm0": m00 * w0 + m10 * w1,  # P mu~ = M^T Sigma_j^{-1}(mu_j - mu)
        "Pm1": m11 * w1,
        "mt0": mt0,
        "mt1": mt1,
        "q": d0 * w0 + d1 * w1,  # mu~^T P mu~ (affine invariant)
    }
    return Lc, minus_lam, M, pair


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
    # (the closed forms (A.22), (A.31), (A.34), (A.40) of the thesis, regrouped), all over sqrt(pi)/2
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


def _ball_moments_2d(pair, n):
    r"""Moments over the unit disk of :math:`\mathcal N(u;\tilde\mu,\tilde\Sigma)` by the periodic trapezoid
    rule with ``n`` angular nodes :math:`\varphi_k = 2\pi k/n`, :math:`k=0,\dots,n-1`, for every pair."""
    q = pair["q"]
    phi = torch.arange(n, dtype=q.dtype, device=q.device) * (2.0 * math.pi / n)  # no duplicated endpoint
    s = _sum_last(_ray_terms(_ray_params(pair), phi[None])).view(6, *q.shape)
    # the weight of a node, sqrt(det P) / (2 pi) * 2 pi / n, times the factor sqrt(pi) / 2 of _ray_terms
    return _moments_from_entries(s * (pair["detP"].sqrt() * (0.5 * _SQRT_PI / n)))


def _nodes_for_tol(tol: float) -> int:
    """Nodes per (batch, basis) pair in the first round of the adaptive rule (even, grows like log(1/tol))."""
    return 2 * math.ceil(2.0 + 0.65 * math.log(1.0 / tol))


def _ball_moments_2d_adaptive(pair, tol, max_nodes):
    r"""Unit-disk moments to a guaranteed tolerance: closed forms where provable, else an adaptive,
    windowed periodic trapezoid rule.  Returns ``(U0, U1, U2, info)``, ``info`` a dict of diagnostics.

    Every moment entry of the pair :math:`(b,j)` is within ``tol`` :math:`\cdot\,s_b` of its exact value,
    :math:`s_b=\max_jU_{0,bj}` (the largest mass of a basis function on the ellipse), by a rigorous
    tail bound (closed forms, skipped pairs, skipped angles) or by the estimate :math:`|T_n-T_{n/2}|` of
    the error of :math:`T_{n/2}`, :math:`T_n` being returned.
    """
    P00, P01, P11, detP = pair["P00"], pair["P01"], pair["P11"], pair["detP"]
    mt0, mt1, q = pair["mt0"], pair["mt1"], pair["q"]
    B, N = q.shape
    dtype = q.dtype
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
    lb_b = lb.amax(-1).clamp_min(math.sqrt(tiny))
    tol_abs = tol * lb_b[:, None]  # (B, 1)
    closed = inside & (bound_in <= tol_abs)
    skip = (bound_out <= tol_abs) & ~closed
    # Results are kept as [U0, U1x, U1y, tr U2, (U2)xx - (U2)yy, (U2)xy] (see _moments_from_entries), first
    # the closed forms U0 = 1, U1 = mu~, U2 = Sigma~ + mu~ mu~^T, Sigma~ = P^{-1}
    xx, yy = P11 / detP + mt0 * mt0, P00 / detP + mt1 * mt1
    exact = torch.stack([torch.ones_like(rad), mt0, mt1, xx + yy, xx - yy, -P01 / detP + mt0 * mt1])
    U = torch.where(closed, exact, 0.0).view(6, -1)
    idx = (~(closed | skip)).view(-1).nonzero().squeeze(-1)
    info = {"pairs": B * N, "closed_form": int(closed.sum()), "skipped": int(skip.sum()), "quadrature": idx.numel(),
            "rounds": 0, "nodes": 0, "unconverged": 0, "max_error_estimate": 0.0}
    if idx.numel() > 0:
        _adaptive_angular_rule(pair, idx, tol, lb_b, closed, U, info, max_nodes)
    return _moments_from_entries(U.view(6, B, N)) + (info,)


def _adaptive_angular_rule(pair, idx, tol, lb_b, closed, U, info, max_nodes):
    """The windowed, adaptive periodic trapezoid rule for the pairs ``idx``; writes ``U[:, idx]``."""
    B, N = pair["q"].shape
    dtype, device = U.dtype, U.device
    m = min(_nodes_for_tol(tol), 2 * (max_nodes // 2))

    keys = ("q", "P00", "P01", "P11", "detP", "mt0", "mt1", "Pm0", "Pm1")
    sub = dict(zip(keys, torch.stack([pair[k].reshape(-1) for k in keys])[:, idx].unbind(0)))  # the quadrature pairs
    qq, P00, P01, P11, detP, m0, m1 = (sub[k] for k in keys[:7])
    bidx = idx // N
    # Angular window.  The P-distance from mu~ to the ray {rho a, 0 <= rho <= 1} is at least perp(a),
    # perp^2 = det(P) (a x mu~)^2 / a^T P a, and at least sqrt(q) if a^T P mu~ < 0; the ray integrand
    # is at most rho * peak * exp(-dist^2 / 2), so all directions with dist >= d, d^2 = 2 log(4 pi peak /
    # tol_abs), add at most tol_abs / 4 to any moment entry, and are skipped.  perp(a) < d <=> a^T Q a < 0
    # with Q = det(P) n n^T - d^2 P, n = (-mu~_2, mu~_1), det Q = d^2 det(P) (d^2 - q): if q > d^2 the window
    # is the cone of half-width w = atan(sqrt(-l_- / l_+)) around the eigenvector of l_- facing mu~.
    peak = detP.sqrt() / (2.0 * math.pi)
    d2 = 2.0 * torch.log(4.0 * math.pi * peak / (tol * lb_b[bidx]))
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
    prm = _ray_params(sub)
    wt = detP.sqrt() / (4.0 * _SQRT_PI)  # times the spacing: the weight of a node, sqrt(det P) / (2 pi) * sqrt(pi) / 2
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
    info.update(rounds=rounds, nodes=nodes, unconverged=act.numel(), max_error_estimate=float((est / s_b[bidx]).max()))


def _sparsemax_setup(mu, Sigma, centers, cov):
    d = mu.shape[-1]
    Lc = torch.linalg.cholesky(Sigma)  # (B, D, D)
    half_logdet = torch.log(torch.diagonal(Lc, dim1=-2, dim2=-1)).sum(-1)
    minus_lam = torch.exp((2.0 / (d + 2)) * (math.log(_gaussian_const(d)) - half_logdet))  # eq. (3.15)
    c = torch.sqrt(2.0 * minus_lam)
    M = c[:, None, None] * Lc  # t = mu + M u
    diff = centers - mu.unsqueeze(-2)  # (B, N, D): mu_j - mu
    Lj = torch.linalg.cholesky(cov)  # (N, D, D)
    Sj_inv = torch.cholesky_inverse(Lj)
    wj = (Sj_inv @ diff.unsqueeze(-1)).squeeze(-1)  # Sigma_j^{-1}(mu_j - mu)
    q = (diff * wj).sum(-1)  # mu~^T Sigma~^{-1} mu~  (affine invariant)
    Mexp = M.unsqueeze(-3)
    MT = Mexp.transpose(-1, -2)
    P = _sym(MT @ Sj_inv @ Mexp)  # Sigma~^{-1} = M^T Sigma_j^{-1} M   (B, N, D, D)
    Pmu = (MT @ wj.unsqueeze(-1)).squeeze(-1)  # P mu~
    mu_t = torch.linalg.solve(P, Pmu.unsqueeze(-1)).squeeze(-1)  # mu~ = M^{-1}(mu_j - mu)
    log_det_t = 2.0 * torch.log(torch.diagonal(Lj, dim1=-2, dim2=-1)).sum(-1) - 2.0 * (d * torch.log(c) + half_logdet).unsqueeze(-1)
    return Lc, minus_lam, M, P, mu_t, log_det_t, q


class _ContinuousSparsemaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mu, Sigma, centers, cov, n_quadrature, tol, max_quadrature):
        if mu.shape[-1] == 1:
            Lc, minus_lam, M, P, mu_t, _, _ = _sparsemax_setup(mu, Sigma, centers, cov)
            U0, U1, U2 = _ball_moments_1d(mu_t[..., 0], 1.0 / P[..., 0, 0])
        else:
            Lc, minus_lam, M, pair = _setup_2d(mu, Sigma, centers, cov)
            if n_quadrature is None:
                U0, U1, U2, info = _ball_moments_2d_adaptive(pair, tol, max_quadrature)
                if info["unconverged"]:
                    warnings.warn(
                        f"continuous_sparsemax: the adaptive angular rule reached max_quadrature={max_quadrature} "
                        f"nodes for {info['unconverged']} of {info['pairs']} (batch, basis) pairs; largest error "
                        f"estimate {info['max_error_estimate']:.1e} (relative), tol={tol:.1e}",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            else:
                U0, U1, U2 = _ball_moments_2d(pair, n_quadrature)
        trU2 = torch.diagonal(U2, dim1=-2, dim2=-1).sum(-1)
        r = minus_lam.unsqueeze(-1) * (U0 - trU2)  # (A.15)/(A.23)
        ctx.save_for_backward(mu, Sigma, Lc, minus_lam, M, U0, U1, U2)
        return r

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_r, *_):
        mu, Sigma, Lc, minus_lam, M, U0, U1, U2 = ctx.saved_tensors
        d = mu.shape[-1]
        # contract the beta=0 covariance (A.24)-(A.25) with g before forming matrices
        W0 = (grad_r * U0).sum(-1)  # (B,)
        W1 = torch.einsum("bn,bnd->bd", grad_r, U1)
        W2 = torch.einsum("bn,bnde->bde", grad_r, U2)
        MW1 = (M @ W1.unsqueeze(-1)).squeeze(-1)
        g1 = MW1
        g2 = (
            MW1.unsqueeze(-1) * mu.unsqueeze(-2)
            + mu.unsqueeze(-1) * MW1.unsqueeze(-2)
            + M @ W2 @ M.transpose(-1, -2)
            - (2.0 * minus_lam / (d + 2) * W0)[:, None, None] * Sigma
        )
        Sigma_inv = torch.cholesky_inverse(Lc)
        grad_mu, grad_Sigma = _theta_grad_to_mu_sigma(g1, g2, mu, Sigma_inv)
        return grad_mu, grad_Sigma, None, None, None, None, None


def _default_tol(dtype: torch.dtype) -> float:
    """``DEFAULT_TOL`` in float64; 32 machine epsilons (about 3.8e-6) in float32 and below."""
    return DEFAULT_TOL if dtype == torch.float64 else 32.0 * torch.finfo(torch.float32).eps


def _check_quadrature_args(n_quadrature, tol, max_quadrature):
    if n_quadrature is not None:
        n_quadrature = check_int(n_quadrature, "n_quadrature")
        if tol is not None:
            raise ValueError("tol applies to the adaptive rule only; pass n_quadrature=None to use it")
    if tol is not None:
        tol = check_positive(tol, "tol")
        if tol >= 1:
            raise ValueError(f"tol must be a relative tolerance in (0, 1); got {tol}")
    max_quadrature = check_int(max_quadrature, "max_quadrature")
    if max_quadrature < 8:
        raise ValueError(f"max_quadrature must be >= 8; got {max_quadrature}")
    return n_quadrature, tol, max_quadrature


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
    :math:`t=\mu+\sqrt{-2\lambda}\,\Sigma^{1/2}u` sends the support to the unit ball and, by Lemma 1
    of Appendix A.2 of the continuous-attention thesis,

    .. math::

        r_j = -\lambda\int_{\|u\|\le1}(1-\|u\|^2)\,\mathcal N(u;\tilde\mu_j,\tilde\Sigma_j)\,du
            \;\overset{D=2}{=}\; -\lambda\int_0^{2\pi}\tilde s_j(\varphi)F_j(\varphi)\,d\varphi

    (eqs. (A.15), (A.23)), with :math:`F_j` the radial integral of eq. (A.22) in closed form.
    For :math:`D=1` the whole integral is in closed form (truncated Gaussian moments).  For
    :math:`D=2` the angular integral uses the periodic trapezoid rule
    :math:`T_n=\frac{2\pi}{n}\sum_{k}h(\varphi_0+2\pi k/n)` (no duplicated endpoint), which converges
    geometrically in :math:`n` because the integrand is analytic and :math:`2\pi`-periodic.

    * ``n_quadrature=None`` (default): an **adaptive** rule with a relative tolerance ``tol``.  Every
      moment :math:`\int_{\|u\|\le1}u^{\otimes k}\mathcal N(u;\tilde\mu_j,\tilde\Sigma_j)du`, :math:`k\le2`,
      of every pair (batch element :math:`b`, basis function :math:`j`) is computed to within
      ``tol`` :math:`\cdot\,s_b`, :math:`s_b=\max_j\int_{\|u\|\le1}\mathcal N(u;\tilde\mu_j,\tilde\Sigma_j)du`,
      as follows.  A Gaussian whose tail outside the disk is provably below that bound is integrated in
      closed form (:math:`U_0=1`, :math:`U_1=\tilde\mu_j`, :math:`U_2=\tilde\Sigma_j+\tilde\mu_j\tilde\mu_j^\top`);
      one whose mass on the disk is provably below it contributes zero.  For the others, the angles whose
      rays stay farther than a provable distance from :math:`\tilde\mu_j` are skipped, and the rule
      :math:`T_n` on the remaining window of angles is refined by doubling :math:`n` (reusing the old
      nodes; the new ones are the midpoints) until :math:`|T_n-T_{n/2}|`, the error estimate of
      :math:`T_{n/2}`, is below the bound for all six moment entries (which are also those of the
      backward pass); :math:`T_n` is returned, so by the geometric convergence the actual error is
      usually far below ``tol``.  The refinement is batched over the pairs that have not converged;
      at most ``max_quadrature`` nodes per pair are evaluated, and a ``RuntimeWarning`` is issued if a
      pair is still above the tolerance then.  The relative error of :math:`r` is of the order of
      ``tol`` (:math:`r_j=-\lambda(U_{0,j}-\operatorname{tr}U_{2,j})`).
    * ``n_quadrature=n``: the fixed rule with :math:`n` nodes :math:`\varphi_k=2\pi k/n` for every pair.
      Its error depends on the ellipse: :math:`n=256` is within :math:`10^{-8}` in the VQA setting of the
      thesis (:math:`\Sigma_j=10^{-3}I` on a :math:`10\times10` grid, ellipses moment-matched from
      :math:`14\times14` locations, near-uniform and corner-heavy weights included), :math:`n=64` is
      not (about :math:`6\cdot10^{-3}` on the widest ellipses).

    Nearly degenerate (needle-like) ellipses converge slowly with either rule, because the angular
    integrand then has singularities close to the real axis.

    The backward pass uses eq. (3.20) with :math:`\beta=0`: the Jacobian w.r.t. :math:`\theta`
    is :math:`\operatorname{cov}_{p,0}(\phi(t),\psi_j(t))=\int_E\phi\psi_j-\frac1{|E|}\int_E\phi\int_E\psi_j`
    (eqs. (A.24)--(A.27)); its integrals are the same unit-ball moments
    :math:`\int u^{\otimes k}\mathcal N(u;\tilde\mu_j,\tilde\Sigma_j)`, :math:`k\le2`, as the forward
    pass, so they are computed once, kept, and the backward pass costs a few small matrix products.

    Args:
        mu: ``(..., D)`` locations.
        Sigma: ``(..., D, D)`` scale parameters (symmetric positive definite); *not* the
            covariance of the density, see :func:`moment_match`.
        basis: :class:`GaussianRBF` on :math:`\mathbb R^D`, :math:`D\in\{1,2\}`.
        n_quadrature: ``None`` for the adaptive rule, or a fixed number of angular nodes (``D=2``;
            ignored for ``D=1``).
        tol: relative tolerance of the adaptive rule; default :data:`DEFAULT_TOL` (``1e-10``) in
            float64 and 32 machine epsilons (about ``3.8e-6``) in float32 and lower precisions, whose
            round-off a smaller value would not get below.
        max_quadrature: the largest number of angular nodes per pair in the adaptive rule.

    Returns:
        ``(..., N)`` tensor :math:`r`.

    Raises:
        ValueError: if ``Sigma`` is not symmetric positive definite, ``D`` is not 1 or 2,
            dimensions disagree, ``n_quadrature < 1``, ``tol`` is not in :math:`(0,1)` or is given
            with a fixed ``n_quadrature``, or ``max_quadrature < 8``.
    """
    n_quadrature, tol, max_quadrature = _check_quadrature_args(n_quadrature, tol, max_quadrature)
    mu_f, Sigma_f, centers, cov, batch, dtype = _prepare(mu, Sigma, basis, "continuous_sparsemax")
    if mu_f.shape[-1] not in (1, 2):
        raise ValueError(f"continuous_sparsemax supports D in {{1, 2}}; got D={mu_f.shape[-1]}")
    if tol is None:
        tol = _default_tol(mu_f.dtype)
    r = _ContinuousSparsemaxFn.apply(mu_f, Sigma_f, centers, cov, n_quadrature, tol, max_quadrature)
    return r.reshape(*batch, basis.n_basis).to(dtype)


# --------------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------------


class ContinuousAttention(nn.Module):
    r"""Continuous softmax / sparsemax attention over a grid of locations (§6.2.2, Fig. 6.3).

    Given discrete scores :math:`s\in\mathbb R^L` over locations :math:`t_l` and value features
    :math:`h_l\in\mathbb R^d`:

    1. :math:`p=\operatorname{softmax}(s)`; :math:`(\mu,\Sigma)` by :func:`moment_match`;
    2. :math:`r=\mathbb E_p[\psi(t)]` by :func:`continuous_softmax` (Gaussian :math:`p`) or
       :func:`continuous_sparsemax` (truncated paraboloid :math:`p`);
    3. :math:`B=HG` by ridge regression (:func:`ridge_value_function`; :math:`G` depends only on
       the locations and the basis, so it is computed once here, as the thesis suggests);
    4. context :math:`c=Br`.

    Args:
        basis: the :class:`GaussianRBF` :math:`\psi` (e.g. ``GaussianRBF.grid(10, 0.001 ** 0.5)``).
        locations: ``(L, D)`` locations of the scores/features (e.g. ``grid_locations(14)``).
        family: ``"gaussian"`` (continuous softmax) or ``"truncated_paraboloid"`` (sparsemax).
        penalty: ridge penalty :math:`\lambda` (0.01 in the thesis).
        padding: optional ``(P, D)`` padding locations (:func:`padding_locations`), or ``True``
            to build them for a square grid of side ``round(L ** (1/D))`` on the unit cube.
        n_quadrature, tol, max_quadrature: the angular rule of 2D sparsemax, as in
            :func:`continuous_sparsemax` (default: adaptive with the dtype's default tolerance).

    Shapes:
        ``forward(scores (..., L), values (..., L, d)) -> (..., d)``.
    """

    def __init__(
        self,
        basis: GaussianRBF,
        locations: torch.Tensor,
        *,
        family: str = "gaussian",
        penalty: float = 0.01,
        padding: torch.Tensor | bool | None = None,
        n_quadrature: int | None = DEFAULT_N_QUADRATURE,
        tol: float | None = None,
        max_quadrature: int = DEFAULT_MAX_QUADRATURE,
    ):
        super().__init__()
        if not isinstance(basis, GaussianRBF):
            raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
        self.family = _check_family(family)
        if self.family == "truncated_paraboloid" and basis.dim not in (1, 2):
            raise ValueError(f"continuous sparsemax supports D in {{1, 2}}; the basis has D={basis.dim}")
        self.n_quadrature, self.tol, self.max_quadrature = _check_quadrature_args(n_quadrature, tol, max_quadrature)
        self.penalty = check_positive(penalty, "penalty", allow_zero=True)
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

    def forward(self, scores: torch.Tensor, values: torch.Tensor, *, return_density: bool = False):
        """Context vectors; with ``return_density=True`` also ``(mu, Sigma)`` of the attention density."""
        scores = as_float_tensor(scores, "scores", min_ndim=1)
        values = as_float_tensor(values, "values", min_ndim=2)
        check_shape_match(scores, "scores", self.locations, "locations", [(-1, 0)])
        check_shape_match(values, "values", self.locations, "locations", [(-2, 0)])
        p = torch.softmax(scores, dim=-1)
        mu, Sigma = moment_match(p, self.locations.to(p), self.family)
        if self.family == "gaussian":
            r = continuous_softmax(mu, Sigma, self.basis)
        else:
            r = continuous_sparsemax(
                mu, Sigma, self.basis, self.n_quadrature, tol=self.tol, max_quadrature=self.max_quadrature
            )
        B = torch.einsum("...ld,ln->...dn", values, self.ridge_operator.to(values))  # eq. (3.17)
        context = (B @ r.to(values.dtype).unsqueeze(-1)).squeeze(-1)
        return (context, (mu, Sigma)) if return_density else context

    def extra_repr(self) -> str:
        return f"family={self.family!r}, n_locations={self.locations.shape[0]}, penalty={self.penalty}"
