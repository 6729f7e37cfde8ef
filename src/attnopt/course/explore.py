r"""What the explorers of the course compute: one function per chapter, no widgets.

Each chapter of the book ends with an *explorer* notebook: a few sliders over one question a
student would ask of the chapter.  This module holds the computation behind each explorer, as plain
functions of tensors that return a small named tuple of everything the picture shows; the widgets
that move the arguments live in :mod:`attnopt.course.widgets`.  Keeping them apart lets the tests drive
every explorer without a browser, and lets a reader call the same function in a script.

* Chapter 1, :func:`preference_view`: the exact estimate :math:`\hat h` of the Fenchel-dual
  paper against its closed form (18), as the reliability :math:`\alpha` and the preference
  :math:`u` move.
* Chapter 2, :func:`particle_flow`: tokens as interacting particles under self-attention, layer
  after layer, at a temperature :math:`\tau`.
* Chapter 3, :func:`regularized_weights`: the attention weights of one query when the
  regularizer (softmax, sparsemax, :math:`\alpha`-entmax), its strength :math:`\tau` and an ALiBi
  bias change.
* Chapter 4, :func:`image_value_function` and :func:`density_view`: a Gaussian or truncated
  paraboloid density over an image, its support and the context vector it gives.
* Chapter 5, :func:`four_views`: one query's weights computed by the four views of the book, and
  what happens when one view's problem is changed.

These functions draw pictures, not training batches: they check their arguments once, through the
library's validation layer, and compute with the views' engines; they are not hot paths (several
call a solver that may read the host to stop early).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._explore_checks import float_arg, grid_arg
from ._explore_clusters import count_clusters
from .._numerics import log_or_neg_inf
from .._validation import (broadcast_shapes, check_choice, check_int, check_no_overflow, check_number, check_positive,
                           check_probability_vector, check_shape_match, check_spd)
from ..continuous import _expectations as expectations
from ..continuous._moments import match_moments, paraboloid_scale
from ..continuous.value_functions import GaussianRBF, ridge_value_function
from ..fenchel._solvers import KLFamily, generalized_weights, solve as fenchel_solve
from ..kernels._softmatch import flow, kernel_logits
from ..transforms import alibi_log_prior, entmax, one_sided_eot, softmax, sparsemax
from ..transforms._one_sided import one_sided_plan
from ..transforms._thresholds import softmax_last

__all__ = [
    "DensityView",
    "FlowView",
    "FourViews",
    "ImageValues",
    "PreferenceView",
    "RegularizerView",
    "density_view",
    "four_views",
    "image_value_function",
    "particle_flow",
    "preference_view",
    "regularized_weights",
]

#: The regularizers of :func:`regularized_weights`.
REGULARIZERS = ("softmax", "sparsemax", "entmax")
#: The regularizers of the transport view in :func:`four_views` (names of :func:`~attnopt.transforms.one_sided_eot`).
TRANSPORT_REGULARIZERS = ("entropy", "sparsemax", "tsallis")


# --------------------------------------------------------------------------------------------
# Chapter 1: the exact estimate against generalized attention
# --------------------------------------------------------------------------------------------


class PreferenceView(NamedTuple):
    r"""What :func:`preference_view` returns (batch shape ``...`` of its inputs, ``G`` grid points).

    Attributes:
        templates: the templates, ``(..., n, d)``.
        u: the preference, ``(..., n)``.
        alpha: the reliability :math:`\alpha` of the evidence.
        mu: the preference's mean :math:`\mu=\sum_iu_it_i`, ``(..., d)``.
        b: the observation :math:`b=\mu+z`, ``(..., d)``.
        exact: the exact estimate :math:`\hat h` (eq. 12), ``(..., d)``.
        closed_form: generalized attention :math:`\hat h_\alpha` (eq. 18), ``(..., d)``.
        exact_weights: the minimizer :math:`\tilde p` of problem (4) (eq. 11), ``(..., n)``.
        closed_form_weights: the weights of eq. (18), ``(..., n)``.
        error: :math:`\lVert\hat h-\hat h_\alpha\rVert`, ``(...)``.
        shift: :math:`\lVert\hat h-\mu\rVert`, how far the evidence moved the estimate, ``(...)``.
        alpha_grid: the reliabilities of the error curve, ``(G,)``.
        error_curve: :math:`\lVert\hat h-\hat h_\alpha\rVert` at each of them, ``(G, ...)``.
    """

    templates: torch.Tensor
    u: torch.Tensor
    alpha: float
    mu: torch.Tensor
    b: torch.Tensor
    exact: torch.Tensor
    closed_form: torch.Tensor
    exact_weights: torch.Tensor
    closed_form_weights: torch.Tensor
    error: torch.Tensor
    shift: torch.Tensor
    alpha_grid: torch.Tensor
    error_curve: torch.Tensor


def preference_view(templates, u, z, alpha, *, alpha_grid=None, tol: float | None = None) -> PreferenceView:
    r"""The exact estimate and its closed form (18) for one preference, reliability and evidence.

    With templates :math:`t_1,\dots,t_n`, preference :math:`u` (mean :math:`\mu`) and evidence
    :math:`z`, problem (4) of Anonymous authors (2024),
    :math:`\min_p\frac\alpha2\lVert b-\sum_ip_it_i\rVert^2+\operatorname{KL}(p\,\Vert\,u)` with
    :math:`b=\mu+z`, has the exact estimate :math:`\hat h=\sum_i\tilde p_it_i` of eq. (12), and
    replacing the dual maximizer by :math:`\alpha z` gives generalized attention, eq. (18),

    .. math::

        \hat h_\alpha=\sum_{i=1}^n t_i\,
        \frac{u_i\,e^{\alpha\langle t_i,z\rangle}}{\sum_j u_j\,e^{\alpha\langle t_j,z\rangle}} .

    The error :math:`\lVert\hat h-\hat h_\alpha\rVert` is computed at ``alpha`` and along
    ``alpha_grid``.  All reliabilities are solved in one batched call of
    :func:`~attnopt.fenchel.solve_dual`: problem (4) at reliability :math:`a` on :math:`(t_i, b)`
    is problem (4) at reliability 1 on :math:`(\sqrt a\,t_i,\sqrt a\,b)` (the objective is the
    same function of :math:`p`), so its minimizer :math:`\tilde p` is the same.

    Args:
        templates: ``(..., n, d)``.
        u: the preference, ``(..., n)``: non-negative, summing to one.
        z: the evidence, ``(..., d)``.
        alpha: the reliability :math:`\alpha>0` of the evidence.
        alpha_grid: reliabilities of the error curve, a 1-D tensor of numbers > 0 (default 41
            points from :math:`10^{-2}` to :math:`10`).
        tol: tolerance of the dual solver (default :math:`10^{-12}` in float64, :math:`10^{-5}`
            otherwise).

    Returns:
        A :class:`PreferenceView`; the leading dimensions of the three tensors broadcast.

    Raises:
        TypeError: non-float tensors or mixed dtypes; ``alpha`` or ``tol`` not a real number.
        ValueError: NaN or infinite entries; ``u`` negative or not summing to one; shapes that do
            not match (``n`` of ``templates`` and ``u``, ``d`` of ``templates`` and ``z``) or do not
            broadcast; ``alpha``, ``tol`` or a grid point not > 0; tensors on different devices.

    Example:
        >>> T = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]).double()
        >>> u = torch.full((3,), 1 / 3, dtype=torch.float64)
        >>> z = torch.tensor([1.0, 0.0], dtype=torch.float64)
        >>> view = preference_view(T, u, z, 0.1)
        >>> bool(view.error < 0.1 * view.shift)  # small alpha: (18) is close
        True

    References:
        Anonymous authors (2024), *Deciphering attention mechanisms: optimization and Fenchel dual
        solutions*, eqs. (4), (11), (12) and (18).
    """
    T = float_arg(templates, "templates", 2)
    if T.shape[-2] == 0:
        raise ValueError("templates must hold at least one template (shape (..., n, d) with n >= 1)")
    u = float_arg(u, "u", 1, T, "templates")
    z = float_arg(z, "z", 1, T, "templates")
    check_shape_match(u, "u", T, "templates", [(-1, -2)])
    check_shape_match(z, "z", T, "templates", [(-1, -1)])
    check_probability_vector(u, "u")
    alpha = check_positive(alpha, "alpha")
    tol = (1e-12 if T.dtype == torch.float64 else 1e-5) if tol is None else check_positive(tol, "tol")
    grid = grid_arg(alpha_grid, "alpha_grid", (-2.0, 1.0, 41), T)
    batch = broadcast_shapes(templates=T.shape[:-2], u=u.shape[:-1], z=z.shape[:-1])
    n, d = T.shape[-2:]
    T, u, z = T.expand(*batch, n, d), u.expand(*batch, n), z.expand(*batch, d)
    mu = (u.unsqueeze(-2) @ T).squeeze(-2)
    b = mu + z

    # The chosen alpha first, then the grid: one batched solve at reliability 1 on scaled data.
    alphas = torch.cat([grid.new_tensor([alpha]), grid])
    root = alphas.sqrt().reshape(-1, *([1] * (len(batch) + 1)))
    # The fenchel view's engines on the tensors checked above (nothing is checked twice), with
    # query axes: vectors (..., 1, d), u laid out like the weights (..., 1, n).
    T_scaled = root.unsqueeze(-1) * T
    uq, log_uq = u.unsqueeze(-2), log_or_neg_inf(u).unsqueeze(-2)
    lam = fenchel_solve((root * b).unsqueeze(-2), T_scaled, KLFamily(uq), 1.0, tol, 100, "auto", "preference_view")
    exact_weights = generalized_weights(lam, T_scaled, 1.0, log_uq, "lam").squeeze(-2)
    exact = (exact_weights.unsqueeze(-2) @ T).squeeze(-2)
    # eq. (18): only alpha * <t_i, z> enters the weights, so (alpha * z, 1) = (z, alpha)
    T_all = T.expand(len(alphas), *T.shape)
    closed_weights = generalized_weights((root.square() * z).unsqueeze(-2), T_all, 1.0, log_uq, "z").squeeze(-2)
    closed = (closed_weights.unsqueeze(-2) @ T).squeeze(-2)
    errors = (exact - closed).norm(dim=-1)
    return PreferenceView(
        templates=T,
        u=u,
        alpha=alpha,
        mu=mu,
        b=b,
        exact=exact[0],
        closed_form=closed[0],
        exact_weights=exact_weights[0],
        closed_form_weights=closed_weights[0],
        error=errors[0],
        shift=(exact[0] - mu).norm(dim=-1),
        alpha_grid=grid,
        error_curve=errors[1:],
    )


# --------------------------------------------------------------------------------------------
# Chapter 2: tokens as interacting particles
# --------------------------------------------------------------------------------------------


class FlowView(NamedTuple):
    r"""What :func:`particle_flow` returns (``L`` = depth, batch shape ``...``).

    Attributes:
        layers: the particles after each layer, ``(L + 1, ..., N, d)`` (index 0: the input).
        diameters: the largest distance between two particles, per layer, ``(L + 1, ...)``.
        clusters: the number of groups of particles closer than ``resolution`` times the initial
            diameter (single linkage), per layer, ``(L + 1, ...)``, int64.
    """

    layers: torch.Tensor
    diameters: torch.Tensor
    clusters: torch.Tensor


def particle_flow(x, temperature, depth: int, *, variant: str = "attention", resolution: float = 1e-3) -> FlowView:
    r"""Self-attention iterated on its own tokens: an interacting particle system.

    Vuckovic et al. (2020, Sec. 3) read self-attention as the motion of particles
    :math:`q_i^{h+1}` under the attention kernel :math:`\mathbf A_{m(Q^h)}` of their own empirical
    measure.  With identity projections and the potential :math:`a(x,y)=\langle x,y\rangle/\tau`,

    .. math::

        x^{h+1}_i = \sum_j \frac{e^{\langle x^h_i,x^h_j\rangle/\tau}}
        {\sum_l e^{\langle x^h_i,x^h_l\rangle/\tau}}\,x^h_j
        \quad(\text{variant } \texttt{"attention"}),

    a convex combination of the particles, so the cloud's diameter cannot grow; variant
    ``"sphere"`` adds the residual connection and projects every particle back onto the unit
    sphere after each layer (the input is projected first).  A high temperature averages widely
    and collapses the cloud; a low one lets each particle follow its strongest neighbours, and the
    cloud freezes into clusters.  Computed by :func:`~attnopt.kernels.self_attention_flow`.

    Args:
        x: the initial particles, ``(..., N, d)``.
        temperature: :math:`\tau>0`.
        depth: the number of layers :math:`L\ge0`.
        variant: ``"attention"`` or ``"sphere"``.
        resolution: particles closer than this fraction of the initial diameter are one cluster.

    Returns:
        A :class:`FlowView`.

    Raises:
        TypeError: ``x`` not a float tensor; ``depth`` not an int; ``temperature`` or
            ``resolution`` not a real number; ``variant`` not a string.
        ValueError: NaN or infinite particles, no particle (``N = 0``), ``temperature`` or
            ``resolution`` not > 0, ``depth < 0``, an unknown ``variant``.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]).double()
        >>> view = particle_flow(x, temperature=1000.0, depth=3)
        >>> view.clusters.tolist()  # a hot flow collapses the cloud at once
        [3, 1, 1, 1]

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A mathematical theory of attention*,
        Sec. 3 ("Attention as a system of interacting particles") and Sec. 6.2.
    """
    x = float_arg(x, "x", 2)
    if x.shape[-2] == 0:
        raise ValueError("x must hold at least one particle (shape (..., N, d) with N >= 1)")
    temperature = check_positive(temperature, "temperature")
    depth = check_int(depth, "depth", minimum=0)
    variant = check_choice(variant, "variant", ("attention", "sphere"))
    resolution = check_positive(resolution, "resolution")
    sphere = variant == "sphere"
    if sphere:
        x = x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    # the engine of kernels.self_attention_flow: x is checked above, not again there
    layers = flow(x, depth, wq=None, wk=None, wv=None, weights=None, similarity="dot", scale=1.0 / temperature,
                  residual=sphere, step_size=1.0, normalize="sphere" if sphere else None)
    diameters = torch.cdist(layers, layers).amax(dim=(-2, -1))
    clusters = count_clusters(layers, resolution * diameters[0])
    return FlowView(layers=layers, diameters=diameters, clusters=clusters)


# --------------------------------------------------------------------------------------------
# Chapter 3: the regularizer, its strength and an ALiBi bias
# --------------------------------------------------------------------------------------------


class RegularizerView(NamedTuple):
    r"""What :func:`regularized_weights` returns (``n`` keys, batch shape ``...``, ``G`` grid points).

    Attributes:
        scores: the scores :math:`s`, ``(..., n)``.
        weights: the attention weights :math:`p^\star`, ``(..., n)``.
        bias: the ALiBi bias :math:`b_j=-m\,(n-1-j)` of each key, ``(n,)`` (zeros for ``m = 0``).
        support_size: the number of keys with a positive weight, ``(...)``, int64.
        tau_grid: the strengths of the support curve, ``(G,)``.
        support_curve: the support size at each of them, ``(G, ...)``, int64.
    """

    scores: torch.Tensor
    weights: torch.Tensor
    bias: torch.Tensor
    support_size: torch.Tensor
    tau_grid: torch.Tensor
    support_curve: torch.Tensor


def _regularized(scores: torch.Tensor, tau, regularizer: str, alpha: float) -> torch.Tensor:
    if regularizer == "softmax":
        return softmax(scores, tau)
    if regularizer == "sparsemax":
        return sparsemax(scores / tau)
    return entmax(scores / tau, alpha, n_iter=60)


def regularized_weights(
    scores, tau, regularizer: str = "softmax", *, alpha: float = 1.5, alibi_slope: float = 0.0, tau_grid=None
) -> RegularizerView:
    r"""One query's attention weights for a regularizer, its strength and an ALiBi bias.

    The query sits at the last of ``n`` positions and attends to the keys :math:`j=0,\dots,n-1`
    with scores :math:`s_j`.  Changing the regularizer of the one-sided transport problem, eq. (13)
    of Litman (2025), and adding ALiBi's linear bias :math:`b_j=-m\,(n-1-j)` (Press et al.,
    2022) gives

    .. math::

        p^\star=\arg\max_{p\in\Delta^{n-1}}\;\langle s+b,\,p\rangle-\tau\,\Omega(p),

    with :math:`\Omega` the negative entropy (``"softmax"``: :math:`p\propto e^{(s+b)/\tau}`, which
    is the prior softmax with the ALiBi prior :math:`\pi_j\propto e^{b_j/\tau}`), half the squared
    norm (``"sparsemax"``) or the Tsallis entropy of order :math:`\alpha`
    (``"entmax"``: :math:`\alpha`-entmax of :math:`(s+b)/\tau`; :math:`\alpha=1` is the softmax,
    :math:`\alpha=2` sparsemax).  The sparse regularizers give keys weight exactly zero: the support
    shrinks as :math:`\tau` falls, which the support curve along ``tau_grid`` shows.

    Args:
        scores: ``(..., n)`` finite scores, ``n >= 1``.
        tau: the strength :math:`\tau>0` of the regularizer (the temperature).
        regularizer: ``"softmax"``, ``"sparsemax"`` or ``"entmax"``.
        alpha: the order :math:`\alpha\ge1` of ``"entmax"`` (ignored otherwise).
        alibi_slope: the ALiBi slope :math:`m\ge0` (0: no bias).
        tau_grid: strengths of the support curve, a 1-D tensor of numbers > 0 (default 41 points
            from :math:`10^{-1.5}` to :math:`10`).

    Returns:
        A :class:`RegularizerView`.

    Raises:
        TypeError: ``scores`` not a float tensor; ``tau``, ``alpha`` or ``alibi_slope`` not a real
            number; ``regularizer`` not a string.
        ValueError: NaN or infinite scores, no key, ``tau`` or a grid point not > 0, an unknown
            ``regularizer``, ``alpha < 1``, ``alibi_slope < 0``.

    Example:
        >>> s = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)
        >>> regularized_weights(s, 1.0, "sparsemax").weights
        tensor([0., 0., 1.], dtype=torch.float64)

    References:
        Litman (2025), *Scaled-dot-product attention as one-sided entropic optimal transport*,
        eqs. (4)-(5) and (13); Peters, Niculae and Martins (2019) for :math:`\alpha`-entmax; Press,
        Smith and Lewis (2022) for ALiBi.
    """
    s = float_arg(scores, "scores", 1)
    n = s.shape[-1]
    if n == 0:
        raise ValueError("scores must hold at least one key (shape (..., n) with n >= 1)")
    tau = check_positive(tau, "tau")
    regularizer = check_choice(regularizer, "regularizer", REGULARIZERS)
    alpha = check_number(alpha, "alpha", low=1.0, hint=" (alpha = 1 is the softmax)")
    slope = check_number(alibi_slope, "alibi_slope", low=0.0)
    grid = grid_arg(tau_grid, "tau_grid", (-1.5, 1.0, 41), s)
    if slope > 0:
        bias = alibi_log_prior(1, n, slope, dtype=s.dtype, device=s.device)[0]
    else:
        bias = torch.zeros(n, dtype=s.dtype, device=s.device)
    biased = s + bias
    weights = _regularized(biased, tau, regularizer, alpha)
    # the support curve: one batched call over the grid of strengths
    taus = grid.reshape(-1, *([1] * s.ndim))
    if regularizer == "softmax":
        curve = torch.softmax((biased - biased.amax(-1, keepdim=True)) / taus, dim=-1)
    else:
        curve = _regularized(biased / taus, 1.0, regularizer, alpha)
    return RegularizerView(
        scores=s,
        weights=weights,
        bias=bias,
        support_size=(weights > 0).sum(-1),
        tau_grid=grid,
        support_curve=(curve > 0).sum(-1),
    )


# --------------------------------------------------------------------------------------------
# Chapter 4: a density over an image
# --------------------------------------------------------------------------------------------


class ImageValues(NamedTuple):
    r"""An image as a value function :math:`V_B(t)=B\psi(t)` (what :func:`image_value_function` returns).

    Attributes:
        image: the image, ``(C, H, W)``.
        locations: the pixel centres :math:`t_l=((i+\frac12)/H,(j+\frac12)/W)` (row, column) in
            the unit square, ``(H * W, 2)``, row-major.
        basis: the Gaussian RBFs :math:`\psi`.
        coefficients: :math:`B`, ``(C, N)``.
    """

    image: torch.Tensor
    locations: torch.Tensor
    basis: GaussianRBF
    coefficients: torch.Tensor


def image_value_function(image, n_per_axis: int = 14, *, penalty: float = 1e-3) -> ImageValues:
    r"""Fit the value function :math:`V_B(t)=B\psi(t)` of an image, for continuous attention over it.

    The pixels' values (e.g. their colours) are the features at the pixel centres :math:`t_l` of the
    unit square; :math:`B` is fitted by ridge regression, eq. (3.17) of Farinhas (2021), on
    ``n_per_axis ** 2`` isotropic Gaussian RBFs on a regular grid of :math:`[0,1]^2`, each with
    standard deviation half the grid's spacing (by :func:`~attnopt.continuous.value_functions.ridge_value_function`).

    Args:
        image: ``(C, H, W)`` with finite values.
        n_per_axis: RBF centres per axis, at least 2.
        penalty: the ridge penalty, > 0.

    Returns:
        An :class:`ImageValues`.

    Raises:
        TypeError: ``image`` not a float tensor; ``n_per_axis`` not an int; ``penalty`` not a real
            number.
        ValueError: ``image`` not 3-D or empty, NaN or infinite pixels, ``n_per_axis < 2``,
            ``penalty`` not > 0.

    Example:
        >>> image = torch.ones(3, 8, 8, dtype=torch.float64)
        >>> values = image_value_function(image, 4)
        >>> values.coefficients.shape, values.locations.shape
        (torch.Size([3, 16]), torch.Size([64, 2]))

    References:
        Farinhas (2021), *Visual Attention with Sparse and Continuous Transformations*, eq. (3.17)
        and Sec. 6.2.2.
    """
    image = float_arg(image, "image", 3)
    if image.ndim != 3 or 0 in image.shape:
        raise ValueError(f"image must have shape (C, H, W) with C, H, W >= 1; got {tuple(image.shape)}")
    n_per_axis = check_int(n_per_axis, "n_per_axis", minimum=2)
    penalty = check_positive(penalty, "penalty")
    channels, height, width = image.shape
    like = dict(dtype=image.dtype, device=image.device)
    rows = (torch.arange(height, **like) + 0.5) / height
    cols = (torch.arange(width, **like) + 0.5) / width
    locations = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(-1, 2)
    basis = GaussianRBF.grid(n_per_axis, 0.5 / (n_per_axis - 1), dim=2, **like)
    coefficients = ridge_value_function(image.reshape(channels, -1).T, locations, basis, penalty)
    return ImageValues(image=image, locations=locations, basis=basis, coefficients=coefficients)


class DensityView(NamedTuple):
    r"""What :func:`density_view` returns (``(H, W)`` the image's size, batch shape ``...``).

    Attributes:
        image: the image, ``(C, H, W)``.
        density: the density at the pixel centres, ``(..., H, W)``.
        support: where it is positive, ``(..., H, W)``, bool.
        mass: its integral over the image by the pixel rule (mean density times the unit area),
            ``(...)``.
        context: the context vector :math:`c=B\,\mathbb E_p[\psi(t)]` (eq. 3.16), ``(..., C)``.
        pixel_context: the same expectation of the pixel values by the pixel rule over the image,
            :math:`\frac1{HW}\sum_l p(t_l)\,v_l`, ``(..., C)``.
    """

    image: torch.Tensor
    density: torch.Tensor
    support: torch.Tensor
    mass: torch.Tensor
    context: torch.Tensor
    pixel_context: torch.Tensor


def density_view(values: ImageValues, mu, covariance, family: str = "gaussian") -> DensityView:
    r"""A Gaussian or truncated-paraboloid density over an image, and the context vector it gives.

    For the score :math:`f(t)=-\frac12(t-\mu)^\top\Sigma^{-1}(t-\mu)` continuous softmax gives the
    Gaussian :math:`\mathcal N(t;\mu,\Sigma)` (eq. 3.12 of Farinhas, 2021) and continuous
    sparsemax the truncated paraboloid
    :math:`\mathcal{TP}(t;\mu,\Sigma)=[-\lambda-\frac12(t-\mu)^\top\Sigma^{-1}(t-\mu)]_+`
    (eq. 3.14), whose support is an ellipse.  The context vector is, eq. (3.16),

    .. math::

        c=\mathbb E_p[V_B(t)]=B\,r,\qquad r=\mathbb E_p[\psi(t)],

    computed by :func:`~attnopt.continuous.continuous_softmax` or
    :func:`~attnopt.continuous.continuous_sparsemax`; the pixel rule on the image gives the same
    expectation of the pixels themselves, up to the fit of :math:`V_B` and the mass that falls
    outside the image.

    Both families are given by their mean and *covariance* :math:`V`, so that switching the family
    keeps the spread (as moment matching does): the Gaussian has :math:`\Sigma=V`, the truncated
    paraboloid the scale :math:`\Sigma` with :math:`V=-\lambda\Sigma/(D/2+2)` (Theorem 1 of
    Farinhas, 2021), which in the plane is :math:`\Sigma=9\pi\sqrt{\det V}\,V`.

    Args:
        values: the image's value function, from :func:`image_value_function`.
        mu: ``(..., 2)`` the mean (row, column) in the unit square.
        covariance: ``(..., 2, 2)`` the covariance :math:`V`, symmetric positive definite.
        family: ``"gaussian"`` or ``"truncated_paraboloid"``.

    Returns:
        A :class:`DensityView`.

    Raises:
        TypeError: ``values`` not an :class:`ImageValues`; non-float tensors or dtypes other than
            the image's; ``family`` not a string.
        ValueError: NaN or infinite entries, ``covariance`` not symmetric positive definite, shapes
            that do not match or broadcast, an unknown ``family``.

    Example:
        >>> image = torch.ones(1, 16, 16, dtype=torch.float64)
        >>> values = image_value_function(image, 6)
        >>> mu = torch.tensor([0.5, 0.5], dtype=torch.float64)
        >>> Sigma = 0.004 * torch.eye(2, dtype=torch.float64)
        >>> view = density_view(values, mu, Sigma, "truncated_paraboloid")
        >>> # the image is all ones: mass 1 and context 1
        >>> round(view.mass.item(), 1), round(view.context.item(), 2)
        (1.0, 1.0)

    References:
        Farinhas (2021), *Visual Attention with Sparse and Continuous Transformations*, eqs.
        (3.12), (3.14), (3.16) and Theorem 1; Martins et al. (2020).
    """
    if not isinstance(values, ImageValues):
        raise TypeError(f"values must be the ImageValues of image_value_function; got {type(values).__name__}")
    image = values.image
    mu = float_arg(mu, "mu", 1, image, "the image")
    V = float_arg(covariance, "covariance", 2, image, "the image")
    family = check_choice(family, "family", ("gaussian", "truncated_paraboloid"))
    if mu.shape[-1] != 2:
        raise ValueError(f"mu must have shape (..., 2) (row, column); got {tuple(mu.shape)}")
    check_shape_match(mu, "mu", V, "covariance", [(-1, -1), (-1, -2)])
    batch = broadcast_shapes(mu=mu.shape[:-1], covariance=V.shape[:-2])
    check_spd(V, "covariance")
    Sigma = V if family == "gaussian" else paraboloid_scale(V)
    channels, height, width = image.shape
    # the continuous view's engines on the tensors checked above (nothing is checked twice)
    density = expectations.density(values.locations, mu.unsqueeze(-2), Sigma.unsqueeze(-3), family)
    density = density.reshape(*batch, height, width)
    expect = expectations.softmax_expectations if family == "gaussian" else expectations.sparsemax_expectations
    r = expect(mu, Sigma, values.basis, batch)
    context = r @ values.coefficients.T
    pixels = image.reshape(channels, -1)
    pixel_context = density.reshape(*batch, -1) @ pixels.T / (height * width)
    return DensityView(
        image=image,
        density=density,
        support=density > 0,
        mass=density.mean(dim=(-2, -1)),
        context=context,
        pixel_context=pixel_context,
    )


# --------------------------------------------------------------------------------------------
# Chapter 5: one query, four views
# --------------------------------------------------------------------------------------------


class FourViews(NamedTuple):
    r"""What :func:`four_views` returns (``m`` keys, batch shape ``...``).

    Attributes:
        sdpa: scaled dot-product attention's weights, ``(..., m)``.
        fenchel: generalized attention with preference :math:`u` (chapter 1), ``(..., m)``.
        kernel: the attention kernel on the key measure :math:`\sum_ju_j\delta_{k_j}` (chapter 2),
            ``(..., m)``.
        transport: the one-sided transport plan with the chosen regularizer (chapter 3), ``(..., m)``.
        mean: the mean :math:`\mu` of the Gaussian matched to the SDPA weights over the key
            locations :math:`t_j=j/(m-1)` (chapter 4), ``(...)``.
        variance: its variance :math:`\sigma^2`, ``(...)``.
        gaps: the largest difference from the SDPA weights of the views ``fenchel``, ``kernel``
            and ``transport``, in this order, ``(3, ...)``.
    """

    sdpa: torch.Tensor
    fenchel: torch.Tensor
    kernel: torch.Tensor
    transport: torch.Tensor
    mean: torch.Tensor
    variance: torch.Tensor
    gaps: torch.Tensor


def four_views(query, keys, tau, *, regularizer: str = "entropy", absent: int | None = None) -> FourViews:
    r"""One query's attention weights computed by the four views of the book.

    With scores :math:`s_j=\langle q,k_j\rangle/\sqrt d`, scaled dot-product attention at
    temperature :math:`\tau` gives :math:`p=\operatorname{softmax}(s/\tau)`.  The same weights are

    * generalized attention, eq. (18) of Anonymous authors (2024), with :math:`z=q`, templates
      :math:`k_j`, :math:`\alpha=1/(\tau\sqrt d)` and the uniform preference :math:`u`;
    * the attention kernel of Vuckovic et al. (2020, Def. 8) on the uniform key measure with the
      potential :math:`e^{\langle q,k\rangle/(\tau\sqrt d)}`;
    * the one-sided entropic transport plan of Litman (2025, eqs. 4-5), cost :math:`-s`,
      :math:`\varepsilon=\tau`;

    and continuous softmax summarizes them by the Gaussian with their mean and variance over the key
    locations :math:`t_j=j/(m-1)` (Farinhas, 2021, Sec. 4.1).  Two changes separate the views: a
    key ``absent`` from the preference (:math:`u_j=0`, the others uniform) changes chapters 1 and 2,
    another ``regularizer`` changes chapter 3.

    Args:
        query: ``(..., d)``.
        keys: ``(..., m, d)``, ``m >= 2``.
        tau: the temperature :math:`\tau>0`.
        regularizer: the transport view's ``"entropy"``, ``"sparsemax"`` or ``"tsallis"``
            (order 1.5).
        absent: the index of a key with preference 0, or ``None``.

    Returns:
        A :class:`FourViews`.

    Raises:
        TypeError: non-float tensors or mixed dtypes; ``tau`` not a real number; ``absent`` not an
            int or ``None``; ``regularizer`` not a string.
        ValueError: NaN or infinite entries, fewer than two keys, ``d`` of ``query`` and ``keys``
            different, shapes that do not broadcast, ``tau`` not > 0, ``absent`` not a key's index,
            an unknown ``regularizer``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> q, K = torch.randn(4, generator=g), torch.randn(6, 4, generator=g)
        >>> views = four_views(q.double(), K.double(), 1.0)
        >>> bool(views.gaps.max() < 1e-12)  # one computation, four derivations
        True

    References:
        Anonymous authors (2024), eq. (18); Vuckovic, Baratin and Tachet des Combes (2020), Def. 8
        and Prop. 9; Litman (2025), eqs. (4)-(5) and (13); Farinhas (2021), Sec. 4.1.
    """
    q = float_arg(query, "query", 1)
    K = float_arg(keys, "keys", 2, q, "query")
    check_shape_match(q, "query", K, "keys", [(-1, -1)])
    m, d = K.shape[-2:]
    if m < 2:
        raise ValueError(f"keys must hold at least two keys (shape (..., m, d) with m >= 2); got {tuple(K.shape)}")
    tau = check_positive(tau, "tau")
    regularizer = check_choice(regularizer, "regularizer", TRANSPORT_REGULARIZERS)
    if absent is not None:
        absent = check_int(absent, "absent", minimum=0, maximum=m - 1)
    batch = broadcast_shapes(query=q.shape[:-1], keys=K.shape[:-2])
    q, K = q.expand(*batch, d), K.expand(*batch, m, d)
    like = dict(dtype=q.dtype, device=q.device)

    # Each view through its own engine, on the tensors checked above or built here (nothing is
    # checked twice); past the inputs' checks, each path that forms scores guards their overflow.
    alpha = 1.0 / (tau * math.sqrt(d))
    scores = (K @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(d)
    check_no_overflow(scores, "the scores <query, k_j> / sqrt(d)", "query or keys")
    sdpa = softmax_last(scores, tau)
    log_u = torch.full((m,), -math.log(m if absent is None else m - 1), **like)  # u uniform on the keys present
    if absent is not None:
        log_u[absent] = float("-inf")
    fenchel = generalized_weights(q.unsqueeze(-2), K, alpha, log_u, "query").squeeze(-2)
    kernel_scores = kernel_logits(q.unsqueeze(-2), K, log_u.exp(), "dot", alpha, "query", "keys")
    kernel = torch.softmax(kernel_scores, dim=-1).squeeze(-2)
    transport = one_sided_plan(-scores.to(torch.float64), tau, regularizer, alpha=1.5).to(q.dtype)
    mean, variance = match_moments(sdpa, torch.linspace(0.0, 1.0, m, **like).unsqueeze(-1))  # at t_j = j/(m-1)
    gaps = torch.stack([(view - sdpa).abs().amax(-1) for view in (fenchel, kernel, transport)])
    return FourViews(
        sdpa=sdpa,
        fenchel=fenchel,
        kernel=kernel,
        transport=transport,
        mean=mean.squeeze(-1),
        variance=variance.squeeze(-1).squeeze(-1),
        gaps=gaps,
    )
