r"""The engine of :func:`attnopt.continuous.mixture.weighted_em`: EM iterations for weighted data, their
initializations (weighted k-means++ and Gumbel-top-k seeds, Lloyd steps, regions) and the
covariance floors that keep every fit positive definite in any dtype.

Everything is batched over examples and components; the iterations make no host read unless
early stopping asks for one (see :func:`fit`).

References:
    Farinhas (2021), eqs. (5.7), (5.12)--(5.16) and §6.3 (the region initialization).
    Arthur and Vassilvitskii (2007), k-means++ seeding.  Kool, van Hoof and Welling (2019),
    Gumbel-top-k sampling without replacement.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .._validation import host_reads_allowed

#: Multiple of the unit roundoff in the resolution floor of the covariances (see :func:`~attnopt.continuous.mixture.weighted_em`).
RESOLUTION_ULPS = 10.0


def symmetric(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x + x.transpose(-1, -2))


def gaussian_log_prob(points: torch.Tensor, means: torch.Tensor, covariances: torch.Tensor) -> torch.Tensor:
    """``(..., N, K)`` values of :math:`\\log\\mathcal N(t_n;\\mu_k,\\Sigma_k)`.

    ``points`` ``(..., N, D)``, ``means`` ``(..., K, D)``, ``covariances`` ``(..., K, D, D)``.
    For ``D = 2`` the inverse and the determinant are in closed form (elementwise, much faster than
    batched 2x2 triangular solves); otherwise ``cholesky_ex`` is used (no host synchronization).  The
    covariances are SPD by construction.
    """
    d = points.shape[-1]
    if d == 2:
        a, b, c = (covariances[..., i, j].unsqueeze(-1) for i, j in ((0, 0), (0, 1), (1, 1)))  # (..., K, 1)
        det = a * c - b * b
        dx = points[..., 0].unsqueeze(-2) - means[..., 0].unsqueeze(-1)  # (..., K, N)
        dy = points[..., 1].unsqueeze(-2) - means[..., 1].unsqueeze(-1)
        maha = (c * dx * dx - 2.0 * b * dx * dy + a * dy * dy) / det
        logp = -0.5 * (maha + torch.log(det)) - math.log(2.0 * math.pi)
        return logp.transpose(-1, -2)
    chol, _ = torch.linalg.cholesky_ex(covariances)  # (..., K, D, D)
    diff = points.unsqueeze(-3) - means.unsqueeze(-2)  # (..., K, N, D)
    z = torch.linalg.solve_triangular(chol, diff.transpose(-1, -2), upper=False)  # (..., K, D, N)
    maha = (z * z).sum(-2)  # (..., K, N)
    half_logdet = torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)  # (..., K)
    logp = -0.5 * maha - half_logdet.unsqueeze(-1) - 0.5 * d * math.log(2.0 * math.pi)
    return logp.transpose(-1, -2)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half precision has no Cholesky factorization and too little range for a covariance: float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def power_of_two_scale(x: torch.Tensor) -> torch.Tensor:
    """Entrywise the power of two :math:`2^e\\le x<2^{e+1}` (1 where ``x`` is 0), at least ``tiny``.

    Dividing by a power of two is exact, so a problem rescaled by it is solved with the same
    rounding (and with none at all where the scale is 1, e.g. for locations in the unit square)."""
    _, exponent = torch.frexp(x)  # x = m 2^exponent with m in [0.5, 1)
    scale = torch.where(x > 0, torch.ldexp(torch.ones_like(x), exponent - 1), torch.ones_like(x))
    return scale.clamp_min(torch.finfo(x.dtype).tiny)


class CovarianceFloor(NamedTuple):
    """The covariance floor of :func:`~attnopt.continuous.mixture.weighted_em`, in its rescaled coordinates."""

    given: torch.Tensor  # (..., 1): cov_floor / s^2
    roundoff: float  # the unit roundoff u of the user's dtype (half precision is computed in float32)


def resolution_floor(covs: torch.Tensor, roundoff: float) -> torch.Tensor:
    """``(..., K)`` the smallest diagonal term that keeps the ``(..., K, D, D)`` covariances positive
    definite in a dtype of unit roundoff ``u``, in coordinates of magnitude below 2 (see
    :func:`~attnopt.continuous.mixture.weighted_em`).

    A Gram matrix of collinear or coincident points is singular, and rounding (or rounding the
    result to the user's dtype) makes its smallest eigenvalue about ``u`` times its trace, of either
    sign; the means are rounded to about ``u``.  ``10 u (tr Sigma + u)`` dominates both."""
    trace = torch.diagonal(covs, dim1=-2, dim2=-1).sum(-1)
    return RESOLUTION_ULPS * roundoff * (trace + roundoff)


def one_hot(index: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """``one_hot`` without its host read of the largest index (``index`` is in ``[0, k)`` here)."""
    return (index.unsqueeze(-1) == torch.arange(k, device=index.device)).to(dtype)


class MStep(NamedTuple):
    """The parameters an M-step estimates, and the weighted mass :math:`N_k` of each component."""

    means: torch.Tensor  # (..., K, D)
    covariances: torch.Tensor  # (..., K, D, D)
    mixing: torch.Tensor  # (..., K)
    mass: torch.Tensor  # (..., K): N_k of (5.12)


def m_step(points, weights, resp, floor) -> MStep:
    """Weighted M-step (5.12)--(5.15); ``resp`` is ``(..., N, K)``, ``floor`` a :class:`CovarianceFloor`.

    The covariances get ``max(cov_floor, resolution floor)`` on their diagonal."""
    d = points.shape[-1]
    rw = weights.unsqueeze(-1) * resp  # (..., N, K)
    total = weights.sum(-1, keepdim=True)  # (..., 1)
    # a tiny mass on every component (as sklearn's 10 * eps) keeps empty components finite
    tiny = 10.0 * torch.finfo(points.dtype).eps * total
    nk = rw.sum(-2) + tiny  # (..., K)
    means = torch.einsum("...nk,...nd->...kd", rw, points) / nk.unsqueeze(-1)
    diff = points.unsqueeze(-3) - means.unsqueeze(-2)  # (..., K, N, D)
    covs = symmetric((diff * rw.transpose(-1, -2).unsqueeze(-1)).transpose(-1, -2) @ diff / nk[..., None, None])
    diagonal = torch.maximum(floor.given, resolution_floor(covs, floor.roundoff))  # (..., K)
    eye = torch.eye(d, dtype=points.dtype, device=points.device)
    covs = covs + diagonal[..., None, None] * eye
    mixing = nk / nk.sum(-1, keepdim=True)
    return MStep(means, covs, mixing, nk - tiny)


def e_step(points, weights, means, covs, mixing):
    """Responsibilities (5.7) ``(..., N, K)`` and the weighted log-likelihood (5.16) ``(...)``."""
    log_joint = gaussian_log_prob(points, means, covs) + torch.log(mixing).unsqueeze(-2)
    # one exp for both the normalizer and the responsibilities (a stable logsumexp)
    shift = log_joint.amax(-1, keepdim=True).detach()
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    e = torch.exp(log_joint - shift)
    total = e.sum(-1, keepdim=True)
    resp = e / total
    log_norm = (torch.log(total) + shift).squeeze(-1)  # (..., N)
    # zero-weight points contribute nothing (and may have log_norm = -inf far in the tails)
    ll = torch.where(weights > 0, weights * log_norm, torch.zeros_like(log_norm)).sum(-1)
    return resp, ll


def gumbel(shape, like, generator):
    """Standard Gumbel noise :math:`-\\log(-\\log u)`, finite (``u`` and ``-log u`` kept above ``tiny``)."""
    u = torch.rand(shape, dtype=like.dtype, device=like.device, generator=generator)
    tiny = torch.finfo(like.dtype).tiny
    return -torch.log((-torch.log(u.clamp_min(tiny))).clamp_min(tiny))


def seed_kmeanspp(points, log_weights, k, generator):
    """Weighted k-means++ seeding: first center with probability :math:`\\propto w_l`, then
    :math:`\\propto w_l\\,\\min_j\\|t_l-c_j\\|^2`.  Sequential over the ``k`` seeds (an
    initialization, not a hot path); batched over examples by the Gumbel-max trick, with all the
    noise drawn at once, example by example."""
    noise = gumbel((*log_weights.shape[:-1], k, log_weights.shape[-1]), log_weights, generator)  # (..., k, N)
    idx = (log_weights + noise[..., 0, :]).argmax(-1)  # (...)
    gather = lambda i: torch.gather(points, -2, i[..., None, None].expand(*i.shape, 1, points.shape[-1])).squeeze(-2)
    centers = [gather(idx)]
    d2 = ((points - centers[0].unsqueeze(-2)) ** 2).sum(-1)
    for j in range(1, k):
        logits = log_weights + torch.log(d2)
        idx = (logits + noise[..., j, :]).argmax(-1)
        centers.append(gather(idx))
        d2 = torch.minimum(d2, ((points - centers[-1].unsqueeze(-2)) ** 2).sum(-1))
    return torch.stack(centers, dim=-2)


def seed_random(points, log_weights, k, generator):
    """``k`` distinct locations drawn without replacement with probability :math:`\\propto w_l`
    (Gumbel-top-k)."""
    keys = log_weights + gumbel(log_weights.shape, log_weights, generator)
    idx = keys.topk(k, dim=-1).indices  # (..., k)
    return torch.gather(points, -2, idx.unsqueeze(-1).expand(*idx.shape, points.shape[-1]))



def region_one_hot(points, k):
    if points.shape[-2] == 0:
        return points.new_zeros(*points.shape[:-1], k)
    lo = points.amin(-2, keepdim=True)
    hi = points.amax(-2, keepdim=True)
    rel = (points - lo) / (hi - lo).clamp_min(torch.finfo(points.dtype).tiny)  # in [0, 1]
    if k == 4 and points.shape[-1] >= 2:
        a = (rel[..., 0] >= 0.5).long()
        b = (rel[..., 1] >= 0.5).long()
        lab = 2 * a + b
    else:
        lab = (rel[..., 0] * k).floor().long().clamp(0, k - 1)
    return one_hot(lab, k, points.dtype)


def init_from_labels(points, weights, resp, floor):
    """Moment-match each group of a hard assignment (Farinhas's (2021) region initialization): means,
    covariances and mixing (mass of each group).  Groups that are empty or whose covariance is
    singular get the global moments."""
    groups = m_step(points, weights, resp, floor)
    everything = m_step(points, weights, torch.ones_like(resp[..., :1]), floor)  # one group: (..., 1, D), (..., 1, D, D)
    empty = groups.mass <= 0
    means = torch.where(empty.unsqueeze(-1), everything.means, groups.means)
    _, info = torch.linalg.cholesky_ex(groups.covariances)
    covs = torch.where(((info > 0) | empty)[..., None, None], everything.covariances, groups.covariances)
    return means, covs, groups.mixing


def nearest_mean(points, means):
    """``(..., N, K)`` one-hot assignment of every point to its nearest mean."""
    d2 = ((points.unsqueeze(-2) - means.unsqueeze(-3)) ** 2).sum(-1)  # (..., N, K)
    return one_hot(d2.argmin(-1), means.shape[-2], points.dtype)


def init_from_means(points, weights, means, floor, n_lloyd=10):
    """From seed means: a few weighted Lloyd (k-means) steps, then moment matching within each
    cluster (as scikit-learn initializes from k-means) with *uniform* mixing weights.

    Uniform rather than mass-proportional mixing keeps a seed that landed where the attention
    weights are negligible from starting (and staying) dead: its cluster's weighted moments sit at
    the edge nearest the mass, and with :math:`\\pi_k=1/K` it competes for it in the first E-step."""
    k = means.shape[-2]
    for _ in range(n_lloyd):
        rw = weights.unsqueeze(-1) * nearest_mean(points, means)
        mass = rw.sum(-2)  # (..., K)
        new = torch.einsum("...nk,...nd->...kd", rw, points) / mass.clamp_min(torch.finfo(points.dtype).tiny).unsqueeze(-1)
        means = torch.where((mass > 0).unsqueeze(-1), new, means)
    means, covs, _ = init_from_labels(points, weights, nearest_mean(points, means), floor)
    mixing = torch.full(means.shape[:-1], 1.0 / k, dtype=points.dtype, device=points.device)
    return means, covs, mixing



def initialize(points, weights, log_weights, k, init, floor, generator, scale):
    """Initial ``(means, covariances, mixing)`` in the rescaled coordinates ``points`` (``scale``
    ``(...)`` is the factor removed from the user's ones)."""
    if isinstance(init, str):
        if init == "regions":
            return init_from_labels(points, weights, region_one_hot(points, k), floor)
        seed = seed_kmeanspp if init == "kmeans++" else seed_random
        return init_from_means(points, weights, seed(points, log_weights, k, generator), floor)
    means, covs, mixing = (None if t is None else t.to(points.dtype) for t in init)
    means = means / scale[..., None, None]
    _, c0, pi0 = init_from_means(points, weights, means, floor, n_lloyd=0)
    if covs is not None:
        c0 = covs / scale[..., None, None, None] / scale[..., None, None, None]
    if mixing is not None:
        pi0 = mixing
    return means, c0, pi0


def take_along(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Entry ``index[b]`` of the axis after the batch axes of ``x`` for every batch position ``b``
    (``index`` ``(...)`` int64, ``x`` ``(..., C, *rest)``; returns ``(..., *rest)``)."""
    nb = index.ndim
    rest = x.shape[nb + 1:]
    return torch.gather(x, nb, index.view(*index.shape, 1, *([1] * len(rest))).expand(*index.shape, 1, *rest)).squeeze(nb)


class Candidate(NamedTuple):
    """The best fit of one candidate number of components, padded to ``K_max`` components."""

    means: torch.Tensor  # (..., K_max, D); the padding copies component 0
    covariances: torch.Tensor  # (..., K_max, D, D); the padding copies component 0
    mixing: torch.Tensor  # (..., K_max); zero on the padding
    log_likelihood: torch.Tensor  # (...)


def best_padded(means, covariances, mixing, log_likelihood, k_max) -> Candidate:
    """The initialization (axis after the batch axes) of highest log-likelihood, padded to ``k_max`` components."""
    best = log_likelihood.argmax(-1)  # (...)
    means, covs, mixing, ll = (take_along(x, best) for x in (means, covariances, mixing, log_likelihood))
    pad = k_max - means.shape[-2]
    if pad:
        batch, d = means.shape[:-2], means.shape[-1]
        means = torch.cat([means, means[..., :1, :].expand(*batch, pad, d)], dim=-2)
        covs = torch.cat([covs, covs[..., :1, :, :].expand(*batch, pad, d, d)], dim=-3)
        mixing = torch.cat([mixing, torch.zeros_like(mixing[..., :1]).expand(*batch, pad)], dim=-1)
    return Candidate(means, covs, mixing, ll)


def fit(points, weights, k, n_iter, init, tol, cov_floor, generator) -> tuple:
    """EM on checked ``(..., N, D)`` points and ``(..., N)`` weights (broadcast to one batch), from a
    checked ``init`` (a name or a ``(means, covariances, mixing)`` triple); see
    :func:`~attnopt.continuous.mixture.weighted_em` for the rescaling, the floors and early stopping.

    Returns the fields of :class:`~attnopt.continuous.mixture.WeightedEMResult`, in the user's units and dtype:
    ``(means, covariances, mixing, log_likelihood, history, n_iter)``."""
    d = points.shape[-1]
    dtype, work = points.dtype, work_dtype(points.dtype)
    points, weights = points.to(work), weights.to(work)
    log_weights = torch.log(weights)  # for the random seeds, from the weights as given
    # exact rescaling by powers of two (see weighted_em): coordinates below 2, weights below 2; a
    # scale of at least tiny^(1/4) keeps the resolution floor representable in the user's units
    least = max(math.sqrt(cov_floor), torch.finfo(work).tiny ** 0.25)
    scale = power_of_two_scale(points.abs().amax((-2, -1)).clamp_min(least))  # (...)
    weight_scale = power_of_two_scale(weights.amax(-1))
    points = points / scale[..., None, None]
    weights = weights / weight_scale[..., None]
    if cov_floor < torch.finfo(work).tiny:
        given = torch.zeros_like(scale).unsqueeze(-1)
    else:  # <= 4 by the choice of scale (the clamp only guards the rounding)
        given = (cov_floor * scale.reciprocal().square()).clamp_max(4.0).unsqueeze(-1)
    floor = CovarianceFloor(given, torch.finfo(dtype).eps)
    means, covs, mixing = initialize(points, weights, log_weights, k, init, floor, generator, scale)
    resp, ll = e_step(points, weights, means, covs, mixing)
    history = []
    # without host reads, early stopping freezes every example once all have converged
    frozen = None if tol is None or host_reads_allowed(points) else torch.zeros((), dtype=torch.bool, device=points.device)
    it = 0
    for it in range(1, n_iter + 1):
        step = m_step(points, weights, resp, floor)[:3]
        resp, ll_new = e_step(points, weights, *step)
        gain = (ll_new - ll) * weight_scale  # in the user's units (the offset of to_user cancels)
        if frozen is None:
            (means, covs, mixing), ll = step, ll_new
            history.append(ll)
            if tol is not None and bool((gain < tol).all()):
                break
        else:
            means, covs, mixing = (torch.where(frozen, old, new) for old, new in zip((means, covs, mixing), step))
            ll = torch.where(frozen, ll, ll_new)
            history.append(ll)
            frozen = frozen | (gain < tol).all()
    # back to the user's units: N(t; s mu, s^2 Sigma) = N(t/s; mu, Sigma) / s^D
    total = weights.sum(-1)
    log_scale = torch.log(scale)
    to_user = lambda value: ((value - d * log_scale * total) * weight_scale).to(dtype)
    return (
        (means * scale[..., None, None]).to(dtype),
        (covs * scale[..., None, None, None] * scale[..., None, None, None]).to(dtype),
        mixing.to(dtype),
        to_user(ll),
        to_user(torch.stack(history)),
        it,
    )
