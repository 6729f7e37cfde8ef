r"""Multimodal continuous attention: Gaussian mixtures fitted to discrete attention weights.

Chapter 5 of Farinhas (2021) replaces the single attention density by a
mixture :math:`p(t)=\sum_k\pi_k\,\mathcal N(t;\mu_k,\Sigma_k)` (eq. (5.3)); by linearity the context
is the mixture of the component contexts, :math:`c=\sum_k\pi_k B r_k` (eqs. (5.4)--(5.5)).  When only
discrete attention weights :math:`w_l\ge0` over locations :math:`t_l` are available, the mixture is
fitted to them by EM for weighted data (eqs. (5.12)--(5.16)), and the number of components can be
chosen per example by the penalized criterion (5.20).

This module provides

* :func:`weighted_em` -- batched EM for weighted data (no Python loop over examples or components);
* :func:`select_components` -- criterion (5.20) over :math:`K\in\{K_{\min},\dots,K_{\max}\}` and
  several initializations;
* :class:`MultimodalContinuousAttention` -- the K-MCA / test-MCA heads of §6.3 as an ``nn.Module``.

Weights need not sum to one: the mixing weights are :math:`\pi_k=N_k/\sum_l w_l` (eq. (5.14) is
the special case :math:`\sum_lw_l=1`), and the weighted log-likelihood (5.16) is computed with the
weights *as given*.  :func:`select_components` normalizes the weights to sum to one first, so that
its penalty is on the scale of an average log-density (see its docstring).

Gradients.  Every EM step is a composition of smooth tensor operations, so with a fixed number of
iterations the fitted parameters are differentiable functions of the weights, and autograd
back-propagates through the unrolled iterations (this is how Farinhas (2021) trains K-MCA models end to
end: the scores receive gradient only through the fitted :math:`(\pi,\mu,\Sigma)`).  The seeding of
the initial means (``"kmeans++"``/``"random"``: discrete choices of locations) and the choice of
:math:`K` are piecewise constant and contribute no gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from . import _mixture_checks as checks
from . import _mixture_em as em
from .._validation import check_bool, check_choice, check_int, check_number
from .attention import ContinuousDensity, discrete_weights, fitted_expected_basis
from .value_functions import GaussianRBF, _check_basis, ridge_operator

__all__ = [
    "MultimodalContinuousAttention",
    "MixtureSelection",
    "WeightedEMResult",
    "region_labels",
    "select_components",
    "weighted_em",
    "weighted_log_likelihood",
]

class WeightedEMResult(NamedTuple):
    """Result of :func:`weighted_em`.

    Attributes:
        means: ``(..., K, D)`` component means :math:`\\mu_k`.
        covariances: ``(..., K, D, D)`` component covariances :math:`\\Sigma_k` (SPD).
        mixing: ``(..., K)`` mixing weights :math:`\\pi_k` (sum to one).
        log_likelihood: ``(...)`` weighted log-likelihood (5.16) of the returned parameters.
        history: ``(n_iter, ...)``; ``history[i]`` is (5.16) after iteration ``i + 1``.
        n_iter: number of iterations run (a Python int).
    """

    means: torch.Tensor
    covariances: torch.Tensor
    mixing: torch.Tensor
    log_likelihood: torch.Tensor
    history: torch.Tensor
    n_iter: int


class MixtureSelection(NamedTuple):
    """Result of :func:`select_components`.

    Attributes:
        n_components: ``(...)`` int64 chosen :math:`K^\\star` per example.
        means: ``(..., K_max, D)``; components ``k >= K*`` are padding (copies of component 0).
        covariances: ``(..., K_max, D, D)``; padding as for ``means``.
        mixing: ``(..., K_max)``; exactly zero on the padding components.
        log_likelihood: ``(...)`` weighted log-likelihood (normalized weights) of the chosen fit.
        criterion: ``(..., K_max - K_min + 1)`` the value of (5.20) for each candidate ``K``
            (best initialization).
        candidates: the best fit for every candidate ``K`` as a
            :class:`~attnopt.continuous.attention.ContinuousDensity` with a candidate axis,
            ``mixing (..., K_max - K_min + 1, K_max)`` (padded with zeros) and so on.
        penalty: the :math:`\\lambda` of (5.20) that chose ``n_components``.

    The fits do not depend on :math:`\\lambda`: :meth:`with_penalty` chooses again among the same
    candidates for another penalty, without refitting (how a sweep over :math:`\\lambda`, as in
    Table 6.4 of Farinhas, 2021, is computed).
    """

    n_components: torch.Tensor
    means: torch.Tensor
    covariances: torch.Tensor
    mixing: torch.Tensor
    log_likelihood: torch.Tensor
    criterion: torch.Tensor
    candidates: ContinuousDensity
    penalty: float

    @property
    def density(self) -> ContinuousDensity:
        """The chosen mixtures as a :class:`~attnopt.continuous.attention.ContinuousDensity`
        (Gaussian, ``K_max`` components)."""
        return ContinuousDensity(self.mixing, self.means, self.covariances, "gaussian")

    def with_penalty(self, penalty: float) -> "MixtureSelection":
        r"""The selection that criterion (5.20) makes with another penalty :math:`\lambda'` among the same fits.

        :math:`\mathcal C'(K)=\mathcal C(K)+(\lambda'-\lambda)K`; ties go to the smaller :math:`K`.

        Raises:
            TypeError, ValueError: ``penalty`` not a number :math:`\ge0`.

        Example:
            >>> t = torch.tensor([[0.0, 0.0], [0.1, 0.0], [1.0, 1.0], [1.1, 1.0]])
            >>> t, w = t.double(), torch.ones(4, dtype=torch.float64)
            >>> g = torch.Generator().manual_seed(0)
            >>> sel = select_components(t, w, 2, penalty=0.1, generator=g)
            >>> int(sel.n_components), int(sel.with_penalty(100.0).n_components)
            (2, 1)
        """
        penalty = check_number(penalty, "penalty", low=0.0)
        k_max, n_candidates = self.means.shape[-2], self.criterion.shape[-1]
        ks = torch.arange(k_max - n_candidates + 1, k_max + 1, device=self.criterion.device)
        criterion = self.criterion + (penalty - self.penalty) * ks.to(self.criterion.dtype)
        choice = criterion.argmin(-1)  # first minimum: ties go to the smaller K
        log_likelihood = (self.penalty * ks.to(self.criterion.dtype) - self.criterion) / 2
        return _chosen(self.candidates, log_likelihood, criterion, choice, ks, penalty)


def _chosen(candidates, log_likelihood, criterion, choice, ks, penalty) -> MixtureSelection:
    """The :class:`MixtureSelection` that takes candidate ``choice`` ``(...)`` of every example."""
    pick = lambda x: em.take_along(x, choice)
    return MixtureSelection(ks[choice], pick(candidates.means), pick(candidates.covariances), pick(candidates.mixing),
                            pick(log_likelihood), criterion, candidates, penalty)


def region_labels(points: torch.Tensor, n_components: int) -> torch.Tensor:
    r"""Farinhas's (2021) deterministic initialization regions (§6.3): one-hot ``(..., N, K)`` labels.

    ``K = 4`` with ``D >= 2``: the quadrants cut at the midpoints of the bounding box of the first
    two coordinates; otherwise ``K`` equal strips of the bounding box along coordinate 0 (``K = 2``
    gives the upper and lower halves of an image whose locations are ``grid_locations`` in ``'ij'``
    order).  A box of zero width along a coordinate (every point on one line, or one point)
    puts every point in the first region along it.

    Args:
        points: ``(..., N, D)`` finite locations, ``D >= 1``.
        n_components: ``K >= 1``.

    Returns:
        ``(..., N, K)`` one-hot labels in the dtype of ``points``; ``(..., 0, K)`` when ``N = 0``.

    Raises:
        TypeError: ``points`` not a float tensor, ``n_components`` not an int.
        ValueError: ``n_components < 1``, ``points`` with fewer than 2 dimensions or ``D = 0``,
            NaN or infinite ``points``.

    Example:
        >>> import torch
        >>> region_labels(torch.tensor([[0.0], [0.4], [1.0]]), 2)
        tensor([[1., 0.],
                [1., 0.],
                [0., 1.]])
    """
    k = check_int(n_components, "n_components")
    return em.region_one_hot(checks.points_arg(points), k)


def weighted_log_likelihood(points, weights, means, covariances, mixing) -> torch.Tensor:
    r"""The weighted log-likelihood (5.16) :math:`\sum_l w_l\log\sum_k\pi_k\mathcal N(t_l;\mu_k,\Sigma_k)`.

    Args:
        points: ``(N, D)`` or ``(..., N, D)`` locations, ``N, D >= 1``.
        weights: ``(..., N)`` non-negative weights (used as given; an all-zero row gives 0).
        means: ``(..., K, D)``.
        covariances: ``(..., K, D, D)`` symmetric positive definite.
        mixing: ``(..., K)`` non-negative, summing to one.  All five in one dtype and on one
            device; their leading dimensions broadcast.

    Returns:
        ``(...)`` tensor in the dtype of ``points``.

    Raises:
        TypeError: non-float tensors or dtypes that differ.
        ValueError: shapes that do not match, devices that differ, NaN or infinite entries,
            negative ``weights``, ``covariances`` not symmetric positive definite, ``mixing`` not
            a probability vector.

    Example:
        >>> import math, torch
        >>> point, mean = torch.zeros(1, 2), torch.zeros(1, 2)
        >>> cov, one = torch.eye(2)[None], torch.ones(1)
        >>> ll = weighted_log_likelihood(point, one, mean, cov, one)
        >>> round(ll.item(), 6) == round(-math.log(2 * math.pi), 6)
        True
    """
    points, weights, means, covariances, mixing = checks.mixture_args(points, weights, means, covariances,
                                                                      mixing)
    work = em.work_dtype(points.dtype)
    args = (t.to(work) for t in (points, weights, means, em.symmetric(covariances), mixing))
    return em.e_step(*args)[1].to(points.dtype)


# --------------------------------------------------------------------------------------------
# weighted EM
# --------------------------------------------------------------------------------------------


def weighted_em(
    points,
    weights,
    n_components: int,
    n_iter: int = 100,
    init="kmeans++",
    tol: float | None = 1e-6,
    cov_floor: float = 1e-6,
    generator: torch.Generator | None = None,
) -> WeightedEMResult:
    r"""Fit a Gaussian mixture to weighted points by EM (eqs. (5.12)--(5.16) of Farinhas (2021)).

    Maximizes the weighted log-likelihood (5.16)

    .. math::

        \ell_w(\Theta) = \sum_{l=1}^L w_l \log\sum_{k=1}^K \pi_k\,\mathcal N(t_l;\mu_k,\Sigma_k)

    by alternating the E-step :math:`\gamma_{lk}\propto\pi_k\mathcal N(t_l;\mu_k,\Sigma_k)` (5.7) and
    the weighted M-step

    .. math::

        N_k=\sum_l w_l\gamma_{lk},\qquad
        \mu_k=\frac{1}{N_k}\sum_l w_l\gamma_{lk}t_l,\qquad
        \pi_k=\frac{N_k}{\sum_l w_l},

        \Sigma_k=\frac{1}{N_k}\sum_l w_l\gamma_{lk}(t_l-\mu_k)(t_l-\mu_k)^\top+\varepsilon_k I

    (5.12)--(5.15; :math:`\pi_k=N_k` in (5.14) assumes :math:`\sum_lw_l=1`).  The floor
    :math:`\varepsilon_k I` (``cov_floor``, as ``reg_covar`` of scikit-learn) keeps the covariances
    positive definite: on a grid a component can otherwise collapse onto one location.  With
    ``cov_floor = 0`` every iteration provably does not decrease :math:`\ell_w` (up to the
    resolution floor below).

    Resolution floor.  Collinear or coincident points (or a component that collapses onto them)
    have a singular weighted covariance, which rounding makes indefinite; so the floor is never
    below what the dtype can resolve,

    .. math::

        \varepsilon_k=\max\big(\texttt{cov\_floor},\
        10\,u\,(\operatorname{tr}\hat\Sigma_k+u\,s^2)\big),

    with :math:`u` the unit roundoff of the dtype (``torch.finfo(dtype).eps``), :math:`\hat\Sigma_k`
    the weighted covariance of the component and :math:`s` the power of two with
    :math:`s\le\max(\max_l\|t_l\|_\infty,\sqrt{\texttt{cov\_floor}},\tau^{1/4})<2s`
    (:math:`\tau` the smallest normal number of the dtype).  It is about :math:`10^{-15}` of the
    trace in float64, :math:`10^{-6}` in float32 (:math:`10^{-2}` in float16, :math:`10^{-1}` in
    bfloat16) and replaces ``cov_floor`` only where ``cov_floor`` is smaller; with ``cov_floor = 0``
    a degenerate point set gets a finite fit whose covariance is singular up to
    :math:`\varepsilon_k` (never NaN).  The computation runs in coordinates divided by :math:`s`
    and weights divided by a power of two (both exact), so any finite points (in the range below)
    and weights give finite results; half-precision inputs are computed in float32, with the
    floor of their own dtype so that the rounded covariances stay positive definite, and returned
    in their dtype.

    Batched over examples and components (no Python loop over them).  With ``tol=None`` it runs
    exactly ``n_iter`` iterations with no host read (no synchronization on a GPU).  With ``tol``
    the loop stops after the first iteration at which every example improved :math:`\ell_w` by
    less than ``tol``; where host reads are allowed
    (see :func:`attnopt.set_checks`: the CPU in mode ``"auto"``) that is one read
    per iteration; elsewhere (a GPU, or ``attnopt.checks("async")``) all ``n_iter`` iterations run
    without a read and the parameters stop changing at that iteration, so the result is the same,
    ``history`` repeats its last value and ``n_iter`` is the maximum.  Differentiable: autograd
    goes through the unrolled iterations.

    Args:
        points: ``(N, D)`` locations shared by all examples, or ``(..., N, D)``; ``N, D >= 1``,
            finite and below :math:`\sqrt{\max}/4` of the dtype in magnitude (about ``4e153`` in
            float64, ``5e18`` in float32), so that their covariances are representable.
        weights: ``(..., N)`` non-negative weights (e.g. discrete attention probabilities), used as
            given (not normalized) in :math:`\ell_w`; every example needs a positive sum.
            Components may outnumber the points of positive weight: the extra ones share points
            with others (with ``cov_floor = 0`` a component on one point has covariance
            :math:`\varepsilon_k I`, and a large :math:`\ell_w`).
        n_components: ``K`` with ``1 <= K <= N``.
        n_iter: maximum number of iterations (EM steps), ``>= 1``.
        init: ``"kmeans++"`` (weighted k-means++ seeds), ``"random"`` (``K`` distinct locations
            drawn :math:`\propto w` without replacement), ``"regions"`` (Farinhas's (2021)
            halves/quadrants, moment-matched within each region, :math:`\pi_k` = mass of the region,
            see :func:`region_labels`), a tensor ``(..., K, D)`` of initial means, or a dict with
            ``"means"`` and optionally ``"covariances"`` and ``"mixing"``.  Seeds and given means
            (not given means) are refined by 10 weighted k-means (Lloyd) steps; the missing
            covariances are moment-matched within the cluster of each mean (nearest-mean
            assignment) and the missing mixing weights are uniform.  Given parameters are used
            exactly as given (in the dtype and on the device of ``points``).
        tol: ``None`` or a number ``>= 0`` (see above).
        cov_floor: :math:`\ge0` added to the diagonal of every covariance (see the resolution
            floor above).
        generator: ``torch.Generator`` (on the device of ``points``) for the random
            initializations.  The noise of each example is drawn in one block, in the order of
            the examples, so that (on the CPU) the first examples of a batch get the same
            initialization as a call on those examples alone with the same generator state.

    Returns:
        :class:`WeightedEMResult` ``(means, covariances, mixing, log_likelihood, history, n_iter)``
        in the dtype of ``points``, finite (the log-likelihood is infinite only where its value is
        beyond the range of the dtype, for weights near it); an empty batch (e.g. ``weights`` of
        shape ``(0, N)``) gives empty parameters.

    Raises:
        ValueError: on negative, NaN or infinite weights, NaN, infinite or too large points, an all-zero
            example, no points, mismatched shapes or devices, ``K > N``, a bad ``init``, a
            negative ``cov_floor`` or ``tol``.
        TypeError: on non-integer ``n_components``/``n_iter``, non-float tensors, dtypes that
            differ or an ``init`` of the wrong type.

    Example:
        >>> import torch
        >>> t = torch.tensor([[0, 0], [0.1, 0], [1, 1], [1.1, 1]]).double()
        >>> w = torch.ones(4).double()
        >>> fit = weighted_em(t, w, 2, init="regions", tol=None)
        >>> fit.means[fit.means[:, 0].argsort()]
        tensor([[0.0500, 0.0000],
                [1.0500, 1.0000]], dtype=torch.float64)
    """
    points, weights, k, n_iter, init, tol, cov_floor = checks.em_args(
        points, weights, n_components, n_iter, init, tol, cov_floor, generator)
    return WeightedEMResult(*em.fit(points, weights, k, n_iter, init, tol, cov_floor, generator))


# --------------------------------------------------------------------------------------------
# model selection, eq. (5.20)
# --------------------------------------------------------------------------------------------


def select_components(
    points,
    weights,
    max_components: int = 5,
    penalty: float = 0.1,
    n_init: int = 3,
    n_iter: int = 100,
    *,
    min_components: int = 1,
    init: str = "kmeans++",
    tol: float | None = None,
    cov_floor: float = 1e-6,
    generator: torch.Generator | None = None,
) -> MixtureSelection:
    r"""Choose the number of components per example by the penalized criterion (5.20).

    For every :math:`K\in\{K_{\min},\dots,K_{\max}\}`, :func:`weighted_em` is run from ``n_init``
    initializations (one for :math:`K=1`, whose fit does not depend on it) — batched over the
    initializations and the examples — the fit with the highest :math:`\ell_w` is kept, and

    .. math::

        K^\star=\arg\min_K\ \mathcal C(\hat\Theta_K,K),\qquad
        \mathcal C(\hat\Theta_K,K)=-2\,\ell_w(\hat\Theta_K)+\lambda K

    (eqs. (5.17), (5.19)--(5.20); ties go to the smaller :math:`K`).

    Normalization and scale of the penalty.  The weights are first divided by their sum, so
    :math:`\ell_w` is the *average* log-density of the mixture under the discrete attention
    distribution, independent of the number of locations.  Adding a component is therefore worth
    it only if it raises that average log-density by more than :math:`\lambda/2` nats.  The default
    ``penalty=0.1`` (0.05 nats) separates one blob from two well-separated blobs on a 14x14 grid of
    the unit square (with the floor below); tune it by validation as Farinhas (2021) does.  A
    penalty :math:`c\,p_K` proportional to the number of free parameters
    :math:`p_K=K(D+D(D+1)/2+1)-1` is the same rule with :math:`\lambda=c\,(D+D(D+1)/2+1)`.
    (Farinhas (2021) reports values such as :math:`\lambda=500` without saying how the
    log-likelihood was normalized; with this normalization such a value would in practice never select more
    than one component, so we take it to refer to another scale and do not use it.)

    Locations on a grid.  A component can collapse onto a row or a column of a grid: its variance
    across that line falls to ``cov_floor`` and its density on the line, hence :math:`\ell_w`,
    grows without bound as ``cov_floor`` shrinks, so that with a floor far below the grid spacing
    :math:`h` a random initialization that finds such a collapse wins over any ``penalty``.  A floor
    of the variance of a grid cell, :math:`h^2/12`, removes these solutions (with it, the default
    ``penalty`` separates one blob from two on a 14x14 grid for every seed we tried).

    Args:
        points: ``(N, D)`` or ``(..., N, D)`` locations.
        weights: ``(..., N)`` non-negative weights (normalized here).
        max_components: :math:`K_{\max}`.
        penalty: :math:`\lambda\ge0`, per component, in units of :math:`-2\ell_w` (see above).
        n_init: initializations per :math:`K>1` (3 in Farinhas, 2021).
        n_iter: EM iterations per fit.
        min_components: :math:`K_{\min}` (1 in Farinhas, 2021).
        init: ``"kmeans++"`` (random weighted k-means++ seeds; default) or ``"random"``
            (seeds drawn :math:`\propto w`); both are random initializations in the sense of Farinhas (2021).
        tol, cov_floor, generator: as in :func:`weighted_em`.

    Returns:
        :class:`MixtureSelection`; the mixture of example ``i`` is its first ``n_components[i]``
        components, and the others have mixing weight exactly zero, so the padded parameters can be
        used directly in :math:`\sum_k\pi_k r_k`.

    Components beyond the number of distinct points of positive weight only duplicate others,
    so they raise :math:`\ell_w` by (almost) nothing and any positive ``penalty`` rejects them.
    The initializations of an example are drawn after those of the examples before it, so (on
    the CPU, with the same generator state) a call on the first examples of a batch chooses as the
    call on the whole batch does.  Host reads: none beyond those of :func:`weighted_em` (one per
    iteration only with ``tol``).

    Raises:
        ValueError: as :func:`weighted_em`; ``min_components > max_components``,
            ``max_components > N``, a negative ``penalty``, an ``init`` other than
            ``"kmeans++"``/``"random"``.
        TypeError: as :func:`weighted_em`; non-integer ``max_components``, ``min_components``,
            ``n_init`` or ``n_iter``.
    """
    points, weights, batch, k_min, k_max, penalty, n_init, n_iter = checks.selection_args(
        points, weights, max_components, min_components, penalty, n_init, n_iter, init, generator)
    # normalized (after an exact rescaling by a power of two, so that the sum cannot overflow)
    weights = weights / em.power_of_two_scale(weights.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True)
    n, d = points.shape[-2:]
    # a fresh stream per K, seeded from generator (a fixed number of draws from it): an example's
    # initializations then depend on the examples before it only, whatever the size of the batch
    stream_device = generator.device if generator is not None else torch.device("cpu")
    streams = torch.randint(0, 2**62, (k_max - k_min + 1,), generator=generator, device=stream_device).tolist()
    fits = []  # the best fit for each K, padded to K_max components
    for k in range(k_min, k_max + 1):  # candidate models have different shapes: a handful of K
        stream = torch.Generator(device=points.device).manual_seed(streams[k - k_min])
        reps = 1 if k == 1 else n_init
        # the initializations after the examples, so that an example's random seeds do not depend on
        # the examples after it (see weighted_em)
        p = points.unsqueeze(-3).expand(*batch, reps, n, d)
        w = weights.unsqueeze(-2).expand(*batch, reps, n)
        fit = weighted_em(p, w, k, n_iter=n_iter, init=init, tol=tol, cov_floor=cov_floor, generator=stream)
        fits.append(em.best_padded(fit.means, fit.covariances, fit.mixing, fit.log_likelihood, k_max))
    nb = len(batch)
    candidates = ContinuousDensity(*(torch.stack([getattr(f, name) for f in fits], nb) for name in ("mixing", "means", "covariances")))
    log_likelihood = torch.stack([f.log_likelihood for f in fits], dim=-1)  # (..., nK)
    ks = torch.arange(k_min, k_max + 1, device=points.device)
    criterion = -2.0 * log_likelihood + penalty * ks.to(log_likelihood.dtype)
    choice = criterion.argmin(-1)  # first minimum: ties go to the smaller K
    return _chosen(candidates, log_likelihood, criterion, choice, ks, penalty)


# --------------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------------


class MultimodalContinuousAttention(nn.Module):
    r"""Multimodal continuous softmax attention (chapter 5 and §6.3 of Farinhas (2021)).

    Given discrete scores :math:`s\in\mathbb R^L` over locations :math:`t_l` and value features
    :math:`h_l\in\mathbb R^d`:

    1. :math:`w=(1-\epsilon)\operatorname{softmax}(s)+\epsilon\,u` (:math:`u` uniform on the
       locations of finite score, :math:`\epsilon=` ``uniform_mix``, 0 by default);
    2. a Gaussian mixture :math:`(\pi_k,\mu_k,\Sigma_k)_{k\le K}` is fitted to :math:`(t_l,w_l)` by
       :func:`weighted_em` with a fixed number of iterations (K-MCA, ``n_components=K``; initial
       regions as in Farinhas (2021) by default), or :math:`K` is chosen per example by
       :func:`select_components` (test-MCA, ``n_components="auto"``);
    3. :math:`r_k=\mathbb E_{\mathcal N(\mu_k,\Sigma_k)}[\psi(t)]` by
       :func:`~attnopt.continuous.continuous_softmax`, :math:`r=\sum_k\pi_kr_k` (eq. (5.4));
       steps 1--2 are :meth:`density`, which returns the mixture as a
       :class:`~attnopt.continuous.attention.ContinuousDensity` (the type the unimodal
       :class:`~attnopt.continuous.attention.ContinuousAttention` returns), and step 3 its
       :meth:`~attnopt.continuous.attention.ContinuousDensity.expected_basis`;
    4. :math:`B=HG` by ridge regression (:func:`~attnopt.continuous.value_functions.ridge_operator`: one
       :math:`B` shared by all components; :math:`G` is computed once, at construction) and the
       context :math:`c=Br=\sum_k\pi_kBr_k` (eq. (5.5)).

    Gradients: with ``differentiate_em=True`` (default) autograd goes through the unrolled EM
    iterations to the scores, as in Farinhas's (2021) end-to-end K-MCA training; with ``False`` the
    mixture is fitted on detached weights and treated as given (the scores then receive no
    gradient, only the values do) — cheaper, for inference.

    Args:
        basis: the :class:`~attnopt.continuous.value_functions.GaussianRBF` :math:`\psi`.
        locations: ``(L, D)`` locations of the scores/features.
        n_components: ``K >= 1`` or ``"auto"``.
        max_components, selection_penalty, n_init: for ``"auto"`` (see :func:`select_components`).
        n_iter: EM iterations (fixed, as in Farinhas, 2021).
        init: ``"regions"`` (Farinhas's (2021) halves/quadrants, deterministic), ``"kmeans++"`` or
            ``"random"`` for fixed ``K``.
        cov_floor: covariance floor :math:`\varepsilon`; keep it > 0 for ``K > 1`` (a component
            collapsing onto one location would give continuous softmax a singular covariance).
        penalty: ridge penalty of the value function (0.01 in Farinhas, 2021).
        padding: optional ``(P, D)`` padding locations for the ridge regression.
        uniform_mix: :math:`\epsilon\in[0,1]` of step 1 (a floor on the weights of every location).
        differentiate_em: see above.

    Raises:
        TypeError: ``basis`` not a :class:`~attnopt.continuous.value_functions.GaussianRBF`, non-integer counts,
            ``differentiate_em`` not a bool, non-float ``locations``/``padding``.
        ValueError: ``n_components`` neither ``"auto"`` nor an int ``>= 1``, more components
            than locations, an unknown ``init``, negative ``cov_floor``/``penalty``/
            ``selection_penalty``, ``uniform_mix`` outside ``[0, 1]``, ``locations`` or
            ``padding`` not ``(L, D)`` or not finite.

    Example:
        >>> from attnopt.value_functions import GaussianRBF, grid_locations
        >>> basis, locations = GaussianRBF.grid(4, 0.1), grid_locations(8)
        >>> mca = MultimodalContinuousAttention(basis, locations, 2)
        >>> scores = torch.full((64,), -8.0)
        >>> scores[[9, 54]] = 0.0  # two separate peaks
        >>> values = torch.randn(64, 5)
        >>> context, density = mca(scores, values, return_density=True)
        >>> context.shape, [round(p, 2) for p in density.mixing.tolist()]
        (torch.Size([5]), [0.5, 0.5])

    References:
        Farinhas (2021), eqs. (5.3)-(5.5), (5.12)-(5.16), (5.20) and §6.3.
    """

    def __init__(
        self,
        basis: GaussianRBF,
        locations: torch.Tensor,
        n_components: int | str = 2,
        *,
        max_components: int = 5,
        selection_penalty: float = 0.1,
        n_init: int = 3,
        n_iter: int = 10,
        init: str = "regions",
        cov_floor: float = 1e-6,
        penalty: float = 0.01,
        padding: torch.Tensor | None = None,
        uniform_mix: float = 0.0,
        differentiate_em: bool = True,
    ):
        super().__init__()
        _check_basis(basis)
        self.n_components, self.max_components = checks.components_args(n_components, max_components)
        self.init = check_choice(init, "init", checks.INITS)
        self.selection_penalty = check_number(selection_penalty, "selection_penalty", low=0.0)
        self.n_init = check_int(n_init, "n_init")
        self.n_iter = check_int(n_iter, "n_iter")
        self.cov_floor = check_number(cov_floor, "cov_floor", low=0.0)
        self.penalty = check_number(penalty, "penalty", low=0.0)
        self.uniform_mix = check_number(uniform_mix, "uniform_mix", low=0.0, high=1.0)
        self.differentiate_em = check_bool(differentiate_em, "differentiate_em")
        self.basis = basis
        locations = checks.location_set_arg(locations, "locations", "L", basis.dim)
        if self.max_components > locations.shape[0]:
            raise ValueError(f"n_components/max_components={self.max_components} exceeds the number of locations {locations.shape[0]}")
        self.register_buffer("locations", locations.to(dtype=basis.centers.dtype, device=basis.centers.device))
        if padding is not None:
            padding = checks.location_set_arg(padding, "padding", "P", basis.dim).to(self.locations)
        self.register_buffer("padding", padding)
        # G of eq. (3.17) depends only on the basis, the locations and the penalty: computed once (in
        # the basis's dtype, as ContinuousAttention does); not saved in the state dict, being derived
        self.register_buffer(
            "ridge_operator", ridge_operator(self.locations, basis, self.penalty, padding=self.padding), persistent=False
        )

    def fit_mixture(self, weights: torch.Tensor) -> ContinuousDensity:
        """The Gaussian mixture fitted to ``(..., L)`` weights, as a
        :class:`~attnopt.continuous.attention.ContinuousDensity`."""
        locations = self.locations.to(weights)
        if self.n_components == "auto":
            sel = select_components(
                locations, weights, self.max_components, self.selection_penalty, self.n_init, self.n_iter,
                cov_floor=self.cov_floor, tol=None,
            )
            return sel.density
        fit = weighted_em(locations, weights, self.n_components, self.n_iter, init=self.init, tol=None, cov_floor=self.cov_floor)
        return ContinuousDensity(fit.mixing, fit.means, fit.covariances)

    def _density(self, scores):
        weights, dead = discrete_weights(scores, self.uniform_mix)
        if self.differentiate_em:
            density = self.fit_mixture(weights)
        else:
            with torch.no_grad():
                density = self.fit_mixture(weights.detach())
        # a row with every location masked is fitted on uniform weights and given zero attention
        return density._replace(mixing=torch.where(dead, torch.zeros_like(density.mixing), density.mixing))

    def density(self, scores: torch.Tensor) -> ContinuousDensity:
        """The attention density of ``(..., L)`` scores: the mixture fitted to the discrete weights.

        Returns:
            :class:`~attnopt.continuous.attention.ContinuousDensity` (Gaussian) with ``mixing (..., K)``,
            ``means (..., K, D)``, ``covariances (..., K, D, D)`` (``K`` is ``max_components``
            for ``"auto"``; unused components have mixing weight 0); a row of scores that are all
            ``-inf`` gets mixing weights 0.

        Raises:
            TypeError: non-float ``scores``.
            ValueError: ``scores`` with NaN or ``+inf``, a last dimension other than ``L``, another
                device than the module's.
        """
        return self._density(checks.scores_arg(scores, self.locations))

    def forward(self, scores: torch.Tensor, values: torch.Tensor, *, return_density: bool = False):
        """Context vectors ``(..., d)``; with ``return_density=True`` also the
        :class:`~attnopt.continuous.attention.ContinuousDensity`.

        Args:
            scores: ``(..., L)`` scores, finite or ``-inf`` (a masked location gets weight 0).
            values: ``(..., L, d)`` value features, finite, in the dtype of ``scores``; the leading
                dimensions of the two broadcast.  Both on the module's device.

        Returns:
            The context ``(..., d)`` in the dtype of ``values``.  A row whose scores are all
            ``-inf`` attends to nothing: its context and its mixing weights are zero (its means
            and covariances are the fit to uniform weights, finite and positive definite).  An
            empty batch gives an empty context.  With a fixed ``n_components`` the fit makes no
            host read (:func:`weighted_em` with ``tol=None``).

        Raises:
            TypeError: non-float tensors, or ``scores`` and ``values`` in different dtypes.
            ValueError: shapes that do not match the locations or do not broadcast, a device other
                than the module's, NaN or ``+inf`` in ``scores``, NaN or infinities in ``values``.
        """
        scores = checks.scores_arg(scores, self.locations)
        values = checks.values_arg(values, scores, self.locations)
        return_density = check_bool(return_density, "return_density")
        density = self._density(scores)
        # the fitted covariances are positive definite by construction (cov_floor): no second validation
        r = fitted_expected_basis(density, self.basis, values.dtype, (None, None, None))  # eq. (5.4)
        # c = B r (eq. (5.5)) with B = H G (eq. (3.17)), computed as H (G r): B is never formed
        location_weights = torch.einsum("ln,...n->...l", self.ridge_operator.to(values), r)
        context = torch.einsum("...ld,...l->...d", values, location_weights)
        return (context, density) if return_density else context

    def extra_repr(self) -> str:
        return (f"n_components={self.n_components!r}, n_iter={self.n_iter}, init={self.init!r}, "
                f"n_locations={self.locations.shape[0]}, uniform_mix={self.uniform_mix}")
