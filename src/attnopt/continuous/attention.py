r"""The attention layer over a continuous domain: densities, expectations of basis functions, contexts.

The pieces of continuous attention (chapters 3--4 of Farinhas, 2021) are in two modules:
:mod:`attnopt.continuous.value_functions` has the Gaussian basis :math:`\psi`
(:class:`~attnopt.continuous.value_functions.GaussianRBF`) and the value function :math:`V_B(t)=B\psi(t)`
fitted by ridge regression (eq. (3.17)); :mod:`attnopt.continuous` has moment matching (Alg. 2)
and the expectations :math:`r=\mathbb E_p[\psi(t)]` under continuous softmax and sparsemax
(eqs. (3.12), (3.14) and (4.10)).  This module assembles them into the attention layer of §3.3
and §6.2.2 of Farinhas (2021): discrete scores over locations :math:`t_l` become a density :math:`p` on
:math:`\mathbb R^D`, and the context is

.. math::

    c = \mathbb E_p[V_B(t)] = B\,r,

    r=\mathbb E_p[\psi(t)]=\sum_{k=1}^K\pi_k\,\mathbb E_{p_k}[\psi(t)],

eqs. (3.16) and (5.3)--(5.4) of Farinhas (2021) (:math:`K=1` for the unimodal heads).

This module provides

* :class:`ContinuousDensity` -- the attention density, a mixture of :math:`K` Gaussians or
  truncated paraboloids stored by means and covariances, with :meth:`~ContinuousDensity.expected_basis`
  and :meth:`~ContinuousDensity.pdf`; every continuous head returns one (the multimodal head of
  :mod:`attnopt.continuous.mixture` too);
* :class:`ContinuousAttention` -- the whole pipeline of §6.2.2 (Fig. 6.3) as an ``nn.Module``.

Conventions are those of :mod:`attnopt.continuous`: ``mu`` has shape ``(..., D)``, covariances
``(..., D, D)``, and the basis is a constant (no gradient flows to its centers or covariances).

References:
    Farinhas (2021), §3.3, §6.2.2, Alg. 2, eqs. (3.12), (3.14), (3.16)--(3.17), (5.3)--(5.4),
    Theorem 1 and Fig. 6.3.  Martins et al. (2020).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from ._checks import quadrature_args
from ._softmax import softmax_flat
from ._sparsemax import sparsemax_from_S
from .._numerics import compute_dtype
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_choice,
    check_finite,
    check_nonnegative,
    check_number,
    check_positive,
    check_same_device,
    check_same_dtype,
    check_shape_match,
    require,
)
from ._value_functions_checks import locations_arg
from . import (
    _FAMILIES,
    DEFAULT_MAX_QUADRATURE,
    DEFAULT_N_QUADRATURE,
    _default_tol,
    _match_moments,
    _paraboloid_scale,
    _prepare,
    continuous_density,
)
from .value_functions import GaussianRBF, _check_basis, _ridge_operator, padding_locations

__all__ = [
    "ContinuousAttention",
    "ContinuousDensity",
]


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
    one with :math:`K=1`, :class:`attnopt.continuous.mixture.MultimodalContinuousAttention` one with :math:`K`
    components, and :func:`attnopt.continuous.mixture.select_components` pads unused components with mixing
    weight exactly 0.

    Attributes:
        mixing: ``(..., K)`` mixing weights :math:`\pi_k\ge0` (zero for unused components).
        means: ``(..., K, D)`` means :math:`\mu_k`.
        covariances: ``(..., K, D, D)`` covariances :math:`V_k` (symmetric positive semi-definite).
        family: ``"gaussian"`` or ``"truncated_paraboloid"``.

    Example:
        >>> mean, cov = torch.full((1, 2), 0.5), 0.01 * torch.eye(2)[None]
        >>> density = ContinuousDensity(torch.ones(1), mean, cov)
        >>> basis = GaussianRBF.grid(3, 0.3)
        >>> density.expected_basis(basis).shape  # r = E_p[psi(t)]
        torch.Size([9])
        >>> # N(mu; mu, V) = 1 / (2 pi 0.01)
        >>> round(density.pdf(torch.tensor([[0.5, 0.5]])).item(), 2)
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

        Each component's expectation is :func:`~attnopt.continuous.continuous_softmax` (closed form, eq. (4.10)) or
        :func:`~attnopt.continuous.continuous_sparsemax` computed from the covariance (so that a singular covariance,
        a density on a segment or a point mass, is the limit of the formula rather than an error).

        Args:
            basis: the :class:`~attnopt.continuous.value_functions.GaussianRBF` :math:`\psi` on :math:`\mathbb R^D`.
            n_quadrature, tol, max_quadrature: the angular rule of 2D sparsemax, as in
                :func:`~attnopt.continuous.continuous_sparsemax` (ignored for Gaussians).

        Returns:
            ``(..., N)`` in the dtype of ``means``.

        Raises:
            TypeError: ``basis`` not a :class:`~attnopt.continuous.value_functions.GaussianRBF`, non-float
                or mixed-dtype fields.
            ValueError: shapes that disagree with each other or with the basis, negative or
                non-finite mixing weights, covariances that are not symmetric positive
                semi-definite or not finite, an unknown ``family``, sparsemax with :math:`D>2`.

        Example:
            >>> basis = GaussianRBF.grid(3, 0.3, dtype=torch.float64)
            >>> mu = torch.tensor([[0.2, 0.3], [0.8, 0.6]], dtype=torch.float64)
            >>> w = torch.tensor([0.25, 0.75], dtype=torch.float64)
            >>> zero = torch.zeros(2, 2, 2, dtype=torch.float64)
            >>> two = ContinuousDensity(w, mu, zero)
            >>> mixed = 0.25 * basis(mu[0]) + 0.75 * basis(mu[1])
            >>> bool(torch.allclose(two.expected_basis(basis), mixed))
            True
        """
        family, mixing, means, covs = self._checked()
        n_quadrature, tol, max_quadrature = quadrature_args(n_quadrature, tol, max_quadrature)
        if family == "truncated_paraboloid" and means.shape[-1] not in (1, 2):
            raise ValueError(f"continuous sparsemax supports D in {{1, 2}}; got D={means.shape[-1]}")
        mu_f, V_f, centers, cov, batch, dtype = _prepare(means, covs, basis, "expected_basis", definite=False,
                                                            names=("means", "covariances"))
        return expected_basis(family, mixing, mu_f, V_f, centers, cov, batch, dtype, basis.n_basis,
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
            >>> eye = torch.eye(2)[None]
            >>> g = ContinuousDensity(torch.ones(1), torch.zeros(1, 2), eye)
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


def expected_basis(family, mixing, mu_f, V_f, centers, cov, batch, dtype, n_basis, rule):
    """``sum_k pi_k E_{p_k}[psi]`` from flattened, validated ``(B K, D)`` means and covariances."""
    n_quadrature, tol, max_quadrature = rule
    if family == "gaussian":
        r = softmax_flat(mu_f, V_f, centers, cov)
    else:
        tol = _default_tol(mu_f.dtype) if tol is None else tol
        r = sparsemax_from_S(mu_f, (mu_f.shape[-1] + 4.0) * V_f, centers, cov, n_quadrature, tol, max_quadrature)
    r = r.reshape(*batch, n_basis).to(dtype)  # batch = (..., K)
    return torch.einsum("...k,...kn->...n", mixing.to(dtype), r)


def fitted_expected_basis(density: ContinuousDensity, basis: GaussianRBF, dtype: torch.dtype,
                          rule) -> torch.Tensor:
    """:meth:`ContinuousDensity.expected_basis` in ``dtype`` of a density that a head fitted itself (valid
    by construction: no second validation); ``rule`` is ``(n_quadrature, tol, max_quadrature)``.  Shared
    by the continuous and multimodal modules."""
    D, cdt = density.means.shape[-1], compute_dtype(density.means.dtype)
    mu_f, V_f = density.means.reshape(-1, D).to(cdt), density.covariances.reshape(-1, D, D).to(cdt)
    centers = basis.centers.to(device=mu_f.device, dtype=cdt)
    cov = basis.covariance.to(device=mu_f.device, dtype=cdt)
    return expected_basis(density.family, density.mixing, mu_f, V_f, centers, cov, density.mixing.shape,
                          dtype, basis.n_basis, rule)


def discrete_weights(scores: torch.Tensor, uniform_mix: float) -> tuple[torch.Tensor, torch.Tensor]:
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
       covariance :math:`V` on the locations (moment matching, Alg. 2; :func:`~attnopt.continuous.moment_match`):
       the attention density (:meth:`density`, a :class:`ContinuousDensity` with one component);
    2. :math:`r=\mathbb E_p[\psi(t)]` under the Gaussian (:func:`~attnopt.continuous.continuous_softmax`,
       :math:`\Sigma=V`) or the truncated paraboloid (:func:`~attnopt.continuous.continuous_sparsemax`) with mean
       :math:`\mu` and covariance :math:`V` (:meth:`ContinuousDensity.expected_basis`);
    3. :math:`B=HG` by ridge regression (:func:`~attnopt.continuous.value_functions.ridge_operator`;
       :math:`G` depends only on the locations and the basis, so it is computed once here, as
       Fig. 6.3 suggests);
    4. context :math:`c=Br` (eq. (3.16)).

    Args:
        basis: the :class:`~attnopt.continuous.value_functions.GaussianRBF` :math:`\psi`
            (e.g. ``GaussianRBF.grid(10, 0.001 ** 0.5)``).
        locations: ``(L, D)`` locations of the scores/features (e.g. ``grid_locations(14)``).
        family: ``"gaussian"`` (continuous softmax) or ``"truncated_paraboloid"`` (sparsemax).
        penalty: ridge penalty :math:`\eta` (0.01 in Table 6.1 of Farinhas, 2021).
        padding: optional ``(P, D)`` padding locations
            (:func:`~attnopt.continuous.value_functions.padding_locations`), or ``True`` to build them for a
            square grid of side ``round(L ** (1/D))`` on the unit cube.
        uniform_mix: :math:`\epsilon\in[0,1]`, the weight of the uniform distribution (over the
            locations of finite score) mixed into the softmax before moment matching; it bounds
            the covariance away from 0 (a regularizer; not needed for finiteness, see below).
        n_quadrature, tol, max_quadrature: the angular rule of 2D sparsemax, as in
            :func:`~attnopt.continuous.continuous_sparsemax` (default: adaptive with the dtype's default tolerance).

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
        >>> from attnopt.value_functions import grid_locations
        >>> basis, locations = GaussianRBF.grid(3, 0.3), grid_locations(4)
        >>> family = "truncated_paraboloid"
        >>> att = ContinuousAttention(basis, locations, family=family)
        >>> scores = torch.full((16,), -float("inf"))
        >>> scores[5] = 0.0  # one location: a point mass
        >>> values = torch.eye(16)[:, :3]
        >>> context, density = att(scores, values, return_density=True)
        >>> context.shape, density.means.tolist()
        (torch.Size([3]), [[0.3333333432674408, 0.3333333432674408]])
        >>> density.covariances.abs().max().item()
        0.0

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
        _check_basis(basis)
        self.family = check_choice(family, "family", _FAMILIES)
        if self.family == "truncated_paraboloid" and basis.dim not in (1, 2):
            raise ValueError(f"continuous sparsemax supports D in {{1, 2}}; the basis has D={basis.dim}")
        self.n_quadrature, self.tol, self.max_quadrature = quadrature_args(n_quadrature, tol, max_quadrature)
        self.penalty = check_positive(penalty, "penalty", allow_zero=True)
        self.uniform_mix = check_number(uniform_mix, "uniform_mix", low=0.0, high=1.0)
        self.basis = basis
        locations = locations_arg(locations, basis).to(device=basis.centers.device, dtype=basis.centers.dtype)
        if padding is True:
            side = round(locations.shape[0] ** (1.0 / basis.dim))
            if side**basis.dim != locations.shape[0]:
                raise ValueError("padding=True needs a square grid of locations; pass padding locations instead")
            padding = padding_locations(side, basis.dim, dtype=locations.dtype, device=locations.device)
        elif padding is False:
            padding = None
        if padding is not None:
            padding = locations_arg(padding, basis, "padding").to(locations)
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
        weights, _ = discrete_weights(scores, self.uniform_mix)
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
        rule = (self.n_quadrature, self.tol, self.max_quadrature)
        r = fitted_expected_basis(density, self.basis, values.dtype, rule)
        # c = B r with B = H G (eq. (3.17)), computed as H (G r): G r is a weight per location, so
        # the (d, N) matrix B is never formed (N times fewer products for each value channel)
        location_weights = torch.einsum("ln,...n->...l", self.ridge_operator.to(values), r)
        context = torch.einsum("...ld,...l->...d", values, location_weights).expand(*batch, values.shape[-1])
        return (context, density) if return_density else context

    def extra_repr(self) -> str:
        return (f"family={self.family!r}, n_locations={self.locations.shape[0]}, penalty={self.penalty}, "
                f"uniform_mix={self.uniform_mix}")
