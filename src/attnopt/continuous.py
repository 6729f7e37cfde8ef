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
from typing import Sequence

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ._validation import as_float_tensor, check_finite, check_int, check_positive, check_shape_match

__all__ = [
    "DEFAULT_N_QUADRATURE",
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

#: Default number of angular nodes of the periodic trapezoid rule in 2D continuous sparsemax.
DEFAULT_N_QUADRATURE = 256

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


def _ball_moments_2d(mu_t, P, log_det_t, q, n):
    r"""Moments over the unit disk of :math:`\mathcal N(u;\tilde\mu,\tilde\Sigma)` by polar coordinates.

    ``mu_t`` (B, N, 2), ``P`` :math:`=\tilde\Sigma^{-1}` (B, N, 2, 2), ``log_det_t``
    :math:`=\log|\tilde\Sigma|` (B, N), ``q`` :math:`=\tilde\mu^\top P\tilde\mu` (B, N); ``n``
    angular nodes :math:`\varphi_k = 2\pi k/n`, :math:`k=0,\dots,n-1`, each of weight :math:`2\pi/n`.
    Along the ray :math:`u=\rho a`, :math:`a=(\cos\varphi,\sin\varphi)`, Lemma 1 gives a 1D
    Gaussian in :math:`\rho` with :math:`1/\sigma^2=a^\top Pa`, :math:`r_0=\sigma^2a^\top P\tilde\mu`
    and scale :math:`\tilde s` (eq. (A.17)); the radial integrals
    :math:`\tilde s\int_0^1\rho^k\mathcal N(\rho;r_0,\sigma^2)d\rho`, :math:`k=1,2,3`, are in closed form.
    """
    dtype, device = mu_t.dtype, mu_t.device
    phi = torch.arange(n, dtype=dtype, device=device) * (2.0 * math.pi / n)  # no duplicated endpoint
    co, si = torch.cos(phi), torch.sin(phi)
    trig2 = torch.stack([co * co, 2.0 * co * si, si * si])  # (3, n)
    trig1 = torch.stack([co, si])  # (2, n)
    Pv = torch.stack([P[..., 0, 0], P[..., 0, 1], P[..., 1, 1]], dim=-1)  # (B, N, 3)
    Pm = (P @ mu_t.unsqueeze(-1)).squeeze(-1)  # (B, N, 2)
    det_p = (P[..., 0, 0] * P[..., 1, 1] - P[..., 0, 1] ** 2).unsqueeze(-1)
    A = Pv @ trig2  # a^T P a = 1 / sigma^2          (B, N, n)
    b = Pm @ trig1  # a^T P mu~ = r0 / sigma^2
    cross = torch.stack([-mu_t[..., 1], mu_t[..., 0]], dim=-1) @ trig1  # a x mu~ (up to sign)
    # The arrays below have B*N*n entries; they are updated in place to avoid allocations.
    sig = A.rsqrt()  # sigma(phi)
    v = sig * sig  # sigma^2
    r0 = b * v  # r0 = sigma^2 a^T P mu~
    # exponent of s~ (A.17): mu~^T P mu~ - (a^T P mu~)^2 / a^T P a = det(P) (a x mu~)^2 / a^T P a >= 0,
    # written without the cancellation of the left-hand side
    # Arguments of exp/erfc are clamped where the result would underflow: the clamped values
    # (~1e-35 in float32, ~1e-300 in float64) are negligible, and the underflowing inputs would take
    # the slow path of the vectorized exp/erfc (about 25x slower on CPU).
    log_tiny = -math.log(torch.finfo(dtype).tiny)
    exp_floor, erfc_ceil = -(log_tiny - 8.0), math.sqrt(log_tiny) - 0.5
    e_perp = cross.mul_(cross).mul_(v).mul_(det_p).mul_(-0.5).clamp_(min=exp_floor).exp_()  # s~ / (C sqrt(2 pi))
    x_hi = torch.sub(1.0, r0).mul_(A.sqrt_()).mul_(_SQRT_HALF)  # (1 - r0) / (sigma sqrt 2); A is free now
    x_lo = b.mul_(sig).mul_(-_SQRT_HALF)  # -r0 / (sigma sqrt 2); b is free now
    hh = torch.mul(x_hi, x_hi).neg_().clamp_(min=exp_floor).exp_().mul_(e_perp)  # s~ phi((1 - r0)/sigma) / C
    ll = torch.exp(-0.5 * q).unsqueeze(-1)  # s~ phi(-r0/sigma) / C  (independent of the angle)
    # G = s~ [Phi(hi) - Phi(lo)] / C, with erfc(x) = 2 [x < 0] + sign(x) erfc(|x|) in both tails
    straddle = (x_lo < 0).logical_and_(x_hi >= 0)
    g = x_lo.abs().clamp_(max=erfc_ceil).erfc_().copysign_(x_lo)
    g.sub_(x_hi.abs().clamp_(max=erfc_ceil).erfc_().copysign_(x_hi)).mul_(0.5).add_(straddle)
    g.mul_(e_perp).mul_(_SQRT_2PI)
    # radial moments S_k = sigma * s~ int_0^1 rho^k N(rho; r0, sigma^2) d rho / C, by the recurrence
    # int rho^k N = r0 int rho^{k-1} N + sigma^2 ((k-1) int rho^{k-2} N + N(0) [k=1] - N(1))
    # (the closed forms (A.22), (A.31), (A.34), (A.40) of the thesis, regrouped)
    t1 = g.mul_(sig)  # sigma * G
    h2 = hh.mul_(v)  # sigma^2 * s~ phi(hi) / C
    S1 = torch.mul(r0, t1).add_(ll * v).sub_(h2)
    S2 = torch.mul(r0, S1).addcmul_(v, t1).sub_(h2)
    S3 = torch.mul(r0, S2).addcmul_(v, S1, value=2.0).sub_(h2)
    # C * (2 pi / n) = sigma |Sigma~|^{-1/2} / n  (one factor sigma is already in S_k)
    w = (torch.exp(-0.5 * log_det_t) / n).unsqueeze(-1)  # (B, N, 1)
    U0 = S1.sum(-1, keepdim=True) * w
    U1 = S2 @ trig1.T * w
    U2v = S3 @ trig2.T * w  # (B, N, 3): [xx, 2 xy, yy]
    U2 = torch.stack(
        [torch.stack([U2v[..., 0], 0.5 * U2v[..., 1]], -1), torch.stack([0.5 * U2v[..., 1], U2v[..., 2]], -1)], -2
    )
    return U0.squeeze(-1), U1, U2


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
    def forward(ctx, mu, Sigma, centers, cov, n_quadrature):
        d = mu.shape[-1]
        Lc, minus_lam, M, P, mu_t, log_det_t, q = _sparsemax_setup(mu, Sigma, centers, cov)
        if d == 1:
            U0, U1, U2 = _ball_moments_1d(mu_t[..., 0], 1.0 / P[..., 0, 0])
        else:
            U0, U1, U2 = _ball_moments_2d(mu_t, P, log_det_t, q, n_quadrature)
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
        return grad_mu, grad_Sigma, None, None, None


def continuous_sparsemax(
    mu: torch.Tensor,
    Sigma: torch.Tensor,
    basis: GaussianRBF,
    n_quadrature: int = DEFAULT_N_QUADRATURE,
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
    :math:`D=2` the angular integral uses the periodic trapezoid rule with ``n_quadrature``
    equispaced nodes :math:`\varphi_k=2\pi k/n` (no duplicated endpoint), which converges
    geometrically in ``n_quadrature`` because the integrand is analytic and :math:`2\pi`-periodic.

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
        n_quadrature: angular nodes for :math:`D=2` (ignored for :math:`D=1`).  The default 256
            gives a relative error below :math:`10^{-8}` (float64) in the VQA setting of the thesis
            (:math:`\Sigma_j=10^{-3}I` on a :math:`10\times10` grid, ellipses moment-matched from
            attention over :math:`14\times14` locations, including near-uniform and corner-heavy
            weights); 128 suffices for compact ellipses.  Nearly degenerate (needle-like) ellipses
            converge slowly, because the angular integrand then has singularities close to the
            real axis.

    Returns:
        ``(..., N)`` tensor :math:`r`.

    Raises:
        ValueError: if ``Sigma`` is not symmetric positive definite, ``D`` is not 1 or 2,
            dimensions disagree or ``n_quadrature < 1``.
    """
    n_quadrature = check_int(n_quadrature, "n_quadrature")
    mu_f, Sigma_f, centers, cov, batch, dtype = _prepare(mu, Sigma, basis, "continuous_sparsemax")
    if mu_f.shape[-1] not in (1, 2):
        raise ValueError(f"continuous_sparsemax supports D in {{1, 2}}; got D={mu_f.shape[-1]}")
    r = _ContinuousSparsemaxFn.apply(mu_f, Sigma_f, centers, cov, n_quadrature)
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
        n_quadrature: angular nodes for 2D sparsemax.

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
        n_quadrature: int = DEFAULT_N_QUADRATURE,
    ):
        super().__init__()
        if not isinstance(basis, GaussianRBF):
            raise TypeError(f"basis must be a GaussianRBF; got {type(basis).__name__}")
        self.family = _check_family(family)
        if self.family == "truncated_paraboloid" and basis.dim not in (1, 2):
            raise ValueError(f"continuous sparsemax supports D in {{1, 2}}; the basis has D={basis.dim}")
        self.n_quadrature = check_int(n_quadrature, "n_quadrature")
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
            r = continuous_sparsemax(mu, Sigma, self.basis, self.n_quadrature)
        B = torch.einsum("...ld,ln->...dn", values, self.ridge_operator.to(values))  # eq. (3.17)
        context = (B @ r.to(values.dtype).unsqueeze(-1)).squeeze(-1)
        return (context, (mu, Sigma)) if return_density else context

    def extra_repr(self) -> str:
        return f"family={self.family!r}, n_locations={self.locations.shape[0]}, penalty={self.penalty}"
