r"""Continuous attention over :math:`\mathbb{R}^D`: Gaussian and truncated-paraboloid densities.

Discrete attention averages :math:`L` value vectors with weights :math:`p\in\Delta^L`.  Continuous
attention (chapters 3--4 of Farinhas, 2021) replaces the simplex by densities on
:math:`S=\mathbb{R}^D` and the weighted average by an expectation.  With a value function
:math:`V_B(t) = B\psi(t)` written in a basis :math:`\psi:\mathbb{R}^D\to\mathbb{R}^N` (the Gaussian
RBFs of :mod:`attnopt.continuous.value_functions`) and a density :math:`p` that maximizes
:math:`\mathbb{E}_p[f(t)] - \Omega_\alpha(p)` for a quadratic score

.. math::

    f(t) = -\tfrac12 (t-\mu)^\top \Sigma^{-1} (t-\mu) = \theta^\top \phi(t),

    \phi(t) = [t,\ tt^\top],\qquad \theta = [\Sigma^{-1}\mu,\ -\tfrac12\Sigma^{-1}],

the context vector is :math:`c = \mathbb{E}_p[V_B(t)] = B r` with :math:`r = \mathbb{E}_p[\psi(t)]`
(eq. (3.16) of Farinhas (2021)).  Shannon's negentropy (:math:`\alpha=1`) gives a
Gaussian :math:`p=\mathcal N(\mu,\Sigma)`; the Gini--Simpson index (:math:`\alpha=2`) gives a
*truncated paraboloid* :math:`p(t) = [-\lambda - \tfrac12(t-\mu)^\top\Sigma^{-1}(t-\mu)]_+`, whose
support is an ellipsoid.

This module provides

* :func:`truncated_paraboloid_threshold` and :func:`continuous_density` -- the threshold
  :math:`\lambda` of eq. (3.15) and the two densities (eqs. (3.12) and (3.14));
* :func:`moment_match` -- :math:`(\mu,\Sigma)` from discrete weights, including the inversion of
  Theorem 1 for the truncated paraboloid;
* :func:`continuous_softmax` / :func:`continuous_sparsemax` -- :math:`r=\mathbb{E}_p[\psi(t)]` with
  analytic backward passes (the Jacobian w.r.t. :math:`\theta` is the generalized covariance
  :math:`\operatorname{cov}_{p,2-\alpha}(\phi(t),\psi(t))` of eq. (3.20), chained to
  :math:`(\mu,\Sigma)`).

The basis :math:`\psi` (:class:`~attnopt.continuous.value_functions.GaussianRBF`) and the value function
fitted by ridge regression (Alg. 1) are in :mod:`attnopt.continuous.value_functions`; the attention layer
built from them, :class:`~attnopt.continuous.attention.ContinuousAttention`, is in
:mod:`attnopt.continuous.attention`.

Conventions.  ``mu`` has shape ``(..., D)`` and ``Sigma`` ``(..., D, D)``.  ``Sigma`` is always the
*scale* parameter of the density, i.e. the matrix in :math:`\theta_2=-\frac12\Sigma^{-1}`; for the
Gaussian it equals the covariance, for the truncated paraboloid the covariance is
:math:`-\lambda\Sigma/(D/2+2)` (Theorem 1).  Gradients w.r.t. ``Sigma`` are symmetric: they are
gradients of the function of the symmetric part of ``Sigma``.  The basis is a constant: no
gradient flows to its centers or covariances.

References:
    Farinhas (2021), *Visual Attention with Sparse and Continuous Transformations*, chapters 3--4
    and Appendix A.2: eqs. (3.12), (3.14)--(3.16), (3.20), (4.3), (4.6)--(4.12), Theorem 1, Lemma 1
    and Algs. 2--4.  Martins et al. (2020), *Sparse and Continuous Attention Mechanisms*.
"""

from __future__ import annotations

import math

import torch

from ._checks import mean_scale_args, mean_scale_checks, quadrature_args
from ._expectations import default_tol as _default_tol, density, minus_lambda as _minus_lambda
from ._expectations import softmax_expectations, sparsemax_expectations, sparsemax_scale as _sparsemax_scale
from ._expectations import DEFAULT_TOL as _DEFAULT_TOL
from ._moments import match_moments as _match_moments, paraboloid_scale as _paraboloid_scale
from ._sparsemax import Rule, sparsemax_moments
from .._numerics import compute_dtype, symmetric_part
from .._validation import (
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
from .value_functions import GaussianRBF, _check_basis
# The value function's names moved to attnopt.value_functions; importable here for older code.
from .value_functions import grid_locations, padding_locations, ridge_operator, ridge_value_function  # noqa: F401

__all__ = [
    "DEFAULT_MAX_QUADRATURE",
    "DEFAULT_N_QUADRATURE",
    "DEFAULT_TOL",
    "continuous_density",
    "continuous_softmax",
    "continuous_sparsemax",
    "moment_match",
    "truncated_paraboloid_threshold",
]

#: Default ``n_quadrature`` of 2D continuous sparsemax.  ``None`` is the adaptive angular rule with
#: tolerance ``tol``; an int gives the fixed periodic trapezoid rule with that many nodes.
DEFAULT_N_QUADRATURE = None
#: Default relative tolerance of the adaptive rule in float64 (32 machine epsilons in float32).
DEFAULT_TOL = _DEFAULT_TOL
#: Default cap on the angular nodes per (batch, basis) pair of the adaptive rule.
DEFAULT_MAX_QUADRATURE = 4096

_FAMILIES = ("gaussian", "truncated_paraboloid")


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


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
    L = torch.linalg.cholesky_ex(symmetric_part(Sigma).to(compute_dtype(Sigma.dtype)))[0]
    return (-_minus_lambda(L)).to(Sigma.dtype)


def _checked(mu, Sigma, basis, name_fn, *, definite):
    """Check ``basis`` and ``(mu, Sigma)``: ``(mu, Sigma, batch)`` (see ``mean_scale_checks``)."""
    _check_basis(basis)
    return mean_scale_checks(mu, Sigma, basis, name_fn, definite=definite)


def _prepare(mu, Sigma, basis, name_fn, *, definite, names=("mu", "Sigma")):
    """Check ``basis`` and ``(mu, Sigma)`` and flatten the batch (see ``mean_scale_args``)."""
    _check_basis(basis)
    return mean_scale_args(mu, Sigma, basis, name_fn, definite=definite, names=names)


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
        is then 0 (its threshold :math:`\lambda` is :math:`-\infty`):
        :class:`~attnopt.continuous.attention.ContinuousAttention` works from the variance instead and handles
        these limits.  An empty batch gives empty outputs.

    Raises:
        ValueError: on negative, NaN or infinite weights, a row of weights summing to 0, non-finite
            locations, mismatched or empty ``L``, shapes that do not broadcast, or an unknown family.
        TypeError: for non-float tensors, ``weights`` and ``locations`` of different dtypes, or a
            non-string family.

    Example:
        >>> from attnopt.value_functions import grid_locations
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
    return density(t, mu, Sigma, family)


# --------------------------------------------------------------------------------------------
# continuous softmax (alpha = 1), any D: eqs. (4.7)-(4.12), Alg. 3
# --------------------------------------------------------------------------------------------


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
        basis: :class:`~attnopt.continuous.value_functions.GaussianRBF` with ``N`` functions on :math:`\mathbb R^D`.

    Returns:
        ``(..., N)`` tensor :math:`r` in the dtype of ``mu``; an empty batch gives an empty result.

    Raises:
        ValueError: if ``mu`` or ``Sigma`` is not finite, ``Sigma`` is not symmetric positive
            semi-definite, or shapes disagree.
        TypeError: if ``basis`` is not a :class:`~attnopt.continuous.value_functions.GaussianRBF`, a tensor
            is not floating point or ``mu`` and ``Sigma`` differ in dtype.

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
    mu, Sigma, batch = _checked(mu, Sigma, basis, "continuous_softmax", definite=False)
    return softmax_expectations(mu, Sigma, basis, batch)


# --------------------------------------------------------------------------------------------
# continuous sparsemax (alpha = 2), D in {1, 2}: Appendix A.2, Alg. 4 (engine: _quadrature)
# --------------------------------------------------------------------------------------------


def _sparsemax_diagnostics(mu, Sigma, basis, *, tol=None, max_quadrature=DEFAULT_MAX_QUADRATURE) -> dict:
    """The adaptive rule's diagnostics for ``continuous_sparsemax(mu, Sigma, basis)`` (benchmarks, tests):
    per route, the pairs in closed form, negligible and by quadrature, the refinement rounds, the nodes
    evaluated (angles; times the chord nodes for slices) and the largest error estimate left."""
    mu_f, Sigma_f, centers, cov, _, _ = _prepare(mu, Sigma, basis, "continuous_sparsemax", definite=True)
    tol = _default_tol(mu_f.dtype) if tol is None else tol
    rule = Rule(None, tol, max_quadrature, False)
    return sparsemax_moments(mu_f, _sparsemax_scale(Sigma_f)[1], centers, cov, rule)[-1]


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
    as the function does (:class:`~attnopt.continuous.attention.ContinuousAttention` differentiates
    w.r.t. the covariance, which has a finite gradient at 0).

    Args:
        mu: ``(..., D)`` locations.
        Sigma: ``(..., D, D)`` scale parameters (symmetric positive definite); *not* the
            covariance of the density, see :func:`moment_match`.  A singular scale has
            :math:`\lambda=-\infty` and is refused; for a density with a singular covariance (a segment
            or a point) use :class:`~attnopt.continuous.attention.ContinuousAttention`, which works
            from the covariance.
        basis: :class:`~attnopt.continuous.value_functions.GaussianRBF` on :math:`\mathbb R^D`, :math:`D\in\{1,2\}`.
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
        TypeError: if ``basis`` is not a :class:`~attnopt.continuous.value_functions.GaussianRBF`, a tensor
            is not floating point, ``mu`` and ``Sigma`` differ in dtype,
            ``n_quadrature``/``max_quadrature`` are not ints, or ``tol`` is not a real number.

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
    n_quadrature, tol, max_quadrature = quadrature_args(n_quadrature, tol, max_quadrature)
    mu, Sigma, batch = _checked(mu, Sigma, basis, "continuous_sparsemax", definite=True)
    if mu.shape[-1] not in (1, 2):
        raise ValueError(f"continuous_sparsemax supports D in {{1, 2}}; got D={mu.shape[-1]}")
    return sparsemax_expectations(mu, Sigma, basis, batch, n_quadrature, tol, max_quadrature)
