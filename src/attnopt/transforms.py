r"""Attention weights as solutions of regularized one-sided transport problems.

Seed 002 (the blog note on the one-sided EOT paper) and seed 003 (the paper's summary) write the
attention weights of one query as the minimizer over the simplex :math:`\Delta^{m-1}` of

.. math::

    J(p) = \sum_j C_j\, p_j + \varepsilon\, \Omega(p), \qquad C_j = -s_j ,

(the note's eq. (4); its eq. (13) writes the cost term as :math:`-\sum_j C_j p_j`, a sign slip:
with :math:`C_j=-s_j` the cost must enter with a plus sign).  Each choice of :math:`\Omega` gives a
transform:

* :math:`\Omega(p)=\sum_j p_j\log p_j` gives :math:`\operatorname{softmax}(s/\varepsilon)`: :func:`softmax`;
* :math:`\Omega(p)=\tfrac12\|p\|^2` gives :math:`p_j=[s_j/\varepsilon-\lambda]_+`: :func:`sparsemax`;
* the Tsallis :math:`\alpha`-entropy gives
  :math:`p_j=[(\alpha-1)s_j-\lambda]_+^{1/(\alpha-1)}`: :func:`entmax`, :func:`entmax15`;
* :math:`\Omega(p)=\mathrm{KL}(p\,\|\,\pi)` gives :math:`p_j\propto \pi_j e^{s_j/\varepsilon}`: :func:`prior_softmax`.

:func:`one_sided_eot` solves the same problem by a generic dual bisection that uses only
:math:`\nabla\Omega`, so that every closed form above can be checked against it.
:func:`sinkhorn_attention` is the two-sided problem (both marginals fixed, eq. (3) of seed 002).

Conventions shared by every transform here:

* ``-inf`` scores are forbidden keys and get weight exactly 0 (and gradient 0).
* A row whose scores are all ``-inf`` has no feasible point on the simplex; we *define* its output
  to be the all-zero row (as :func:`attnopt.attention.attention_weights` does), with zero gradient.
  Nothing returns NaN, forward or backward.
* ``float16``/``bfloat16`` inputs are computed in ``float32`` and the result is cast back.
* ``+inf`` or NaN scores raise ``ValueError``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from ._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool,
    check_bool_mask,
    check_choice,
    check_dim,
    check_finite,
    check_float_dtype,
    check_int,
    check_nonnegative,
    check_number,
    check_positive,
    check_same_device,
    host_reads_allowed,
    require,
)

__all__ = [
    "alibi_log_prior",
    "entmax",
    "entmax15",
    "one_sided_eot",
    "prior_softmax",
    "sinkhorn_attention",
    "softmax",
    "sparsemax",
]

_METHODS = ("auto", "newton", "sort")


# --------------------------------------------------------------------------------------------
# Shared plumbing
# --------------------------------------------------------------------------------------------


def _prepare(scores, dim: int, name: str = "scores") -> tuple[torch.Tensor, int]:
    x = as_float_tensor(scores, name, min_ndim=1)
    check_finite(x, name, allow_neg_inf=True)
    return x, check_dim(dim, x.ndim)


def _empty_result(x: torch.Tensor) -> torch.Tensor:
    """The result for an input with no entries (no rows, or rows of no keys): itself, times 0.

    Multiplying keeps the autograd graph, so an empty batch flows through training code."""
    return x * 0


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    # Half precision would lose the threshold entirely; float64 stays float64 (gradcheck).
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _to_last(x: torch.Tensor, dim: int) -> torch.Tensor:
    # Move the normalised dimension last once, so every reduction below is over contiguous memory.
    if dim == x.ndim - 1:
        return x.to(_work_dtype(x))
    return x.movedim(dim, -1).to(_work_dtype(x)).contiguous()


def _from_last(p: torch.Tensor, dim: int, like: torch.Tensor) -> torch.Tensor:
    if dim != like.ndim - 1:
        p = p.movedim(-1, dim)
    return p.to(like.dtype)


def _safe_max(y: torch.Tensor) -> torch.Tensor:
    """Row maximum with all-``-inf`` rows mapped to 0, so that shifting by it never makes NaN."""
    top = y.amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def _entmax_vjp(s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    r"""Jacobian-vector product of every entmax: :math:`s\odot(g - \langle s,g\rangle/\textstyle\sum s)`.

    ``s`` is :math:`p^{2-\alpha}` on the support and 0 off it (the indicator for sparsemax,
    :math:`\sqrt p` for 1.5-entmax, :math:`p` for softmax).  An all-zero row has ``s = 0`` and so
    gets a zero gradient instead of 0/0.  One temporary, updated in place (see
    :func:`_threshold_newton` for why allocations matter here).
    """
    total = s.sum(dim=-1, keepdim=True)
    coef = _rowdot(s, g) / torch.where(total > 0, total, torch.ones_like(total))
    return (g - coef).mul_(s)


def _resolve_method(method: str, x: torch.Tensor) -> str:
    check_choice(method, "method", _METHODS)
    if method == "auto":
        # On CPU a full sort costs far more than a handful of Newton passes (which read the host to
        # retire settled rows, free there); on GPUs sorting is cheap and never synchronises.
        return "newton" if host_reads_allowed(x) else "sort"
    return method


# --------------------------------------------------------------------------------------------
# Softmax and prior softmax
# --------------------------------------------------------------------------------------------


class _SoftmaxFunction(Function):
    @staticmethod
    def forward(ctx, z):
        p = torch.softmax(z, dim=-1)
        # An all -inf row comes out as NaN (0/0); define it as zeros.  The backward below then
        # gives it a zero gradient, since p = 0 on the whole row.
        p.masked_fill_(torch.isneginf(z.amax(dim=-1, keepdim=True)), 0.0)  # in place: no new tensor
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _entmax_vjp(p, grad)  # s = p: the softmax Jacobian diag(p) - p p^T


def _softmax_last(z: torch.Tensor) -> torch.Tensor:
    return _SoftmaxFunction.apply(z)


def softmax(scores: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Softmax at temperature :math:`\tau`, the entropic one-sided transport plan.

    .. math::

        p_j = \frac{\exp(s_j/\tau)}{\sum_l \exp(s_l/\tau)}
            = \arg\min_{p\in\Delta} \; -\langle s, p\rangle + \tau \sum_j p_j \log p_j ,

    eq. (1) and the result (5)/(12) of seed 002 (cost :math:`C_j=-s_j`, :math:`\varepsilon=\tau`);
    the "forward problem" of seed 003.

    Args:
        scores: any shape; ``-inf`` marks a forbidden key.
        tau: temperature :math:`\tau > 0` (the entropic regularization strength).
        dim: dimension that is normalized.

    Returns:
        Weights of the shape and dtype of ``scores``; an all-``-inf`` row gives an all-zero row.

    Raises:
        TypeError: ``scores`` not a floating tensor, ``dim`` not an int.
        ValueError: ``tau <= 0``, ``dim`` out of range, NaN or ``+inf`` scores.

    Example:
        >>> softmax(torch.tensor([1.0, 2.0, float("-inf")]), tau=0.5)
        tensor([0.1192, 0.8808, 0.0000])
    """
    x, d = _prepare(scores, dim)
    tau = check_positive(tau, "tau")
    if x.numel() == 0:
        return _empty_result(x)
    z = _to_last(x, d)
    if tau != 1.0:
        # Shift by the row maximum *before* dividing: a small tau would overflow s / tau.  The
        # weights do not depend on the shift, so no gradient flows through it (detach: exact).
        z = (z - _safe_max(z).detach()) / tau
    return _from_last(_softmax_last(z), d, x)


def prior_softmax(
    scores: torch.Tensor,
    prior: torch.Tensor,
    tau: float = 1.0,
    dim: int = -1,
    *,
    log_prior: bool = False,
) -> torch.Tensor:
    r"""Softmax regularized towards a prior :math:`\pi` by :math:`\tau\,\mathrm{KL}(p\,\|\,\pi)`.

    .. math::

        p_j = \frac{\pi_j \exp(s_j/\tau)}{\sum_l \pi_l \exp(s_l/\tau)}
            = \arg\min_{p\in\Delta} \; -\langle s, p\rangle + \tau\,\mathrm{KL}(p\,\|\,\pi),

    the "PriorSoftmax" row of seed 002's table (the table drops the factor :math:`\tau` in front of
    the KL; with it, the stated minimizer is exact).  ALiBi is the special case of a log-prior that
    is linear in the query-key distance, :math:`\log\pi_{ij} = -m\,|i-j|/\tau`; see
    :func:`alibi_log_prior`.  The prior needs no normalization: a constant factor cancels.

    Args:
        scores: any shape.
        prior: non-negative weights :math:`\pi` broadcastable to ``scores`` (``pi_j = 0`` forbids
            key ``j``), or :math:`\log\pi` when ``log_prior=True`` (then ``-inf`` forbids).
        tau: temperature :math:`\tau>0`.
        dim: dimension that is normalized.
        log_prior: interpret ``prior`` as :math:`\log \pi` (avoids underflow for long ALiBi spans).

    Returns:
        Weights shaped like the broadcast of ``scores`` and ``prior``, in ``scores``' dtype.

    Raises:
        TypeError: ``scores`` or ``prior`` not floating.
        ValueError: negative, NaN or ``+inf`` prior (``+inf`` or NaN log-prior), ``tau <= 0``,
            shapes that do not broadcast, tensors on different devices.
    """
    x, d = _prepare(scores, dim)
    tau = check_positive(tau, "tau")
    prior = as_float_tensor(prior, "prior", like=x)
    check_same_device(prior, "prior", x, "scores")
    shape = broadcast_shapes(scores=x.shape, prior=prior.shape)
    if log_prior:
        check_finite(prior, "prior", allow_neg_inf=True)
        log_pi = prior.to(_work_dtype(x))
    else:
        check_finite(prior, "prior")
        check_nonnegative(prior, "prior", what=" (a zero entry forbids that key)")
        pi = prior.to(_work_dtype(x))
        positive = pi > 0
        # log(0) = -inf would send 0 * inf = NaN into the prior's gradient; mask it instead.
        log_pi = torch.where(positive, torch.log(torch.where(positive, pi, torch.ones_like(pi))), -torch.inf)
    if 0 in shape:
        return _empty_result(torch.broadcast_to(x, shape))
    # Shift the scores by their row maximum before dividing: a small tau would overflow s / tau.
    z = x.to(_work_dtype(x))
    z = (z - _safe_max(z.movedim(d, -1)).movedim(-1, d).detach()) / tau + log_pi
    d = check_dim(dim, z.ndim)
    return _from_last(_softmax_last(_to_last(z, d)), d, x)


def alibi_log_prior(
    n_queries: int,
    n_keys: int,
    slope,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    r"""ALiBi as a log-prior over query-key distances, for :func:`prior_softmax`.

    .. math::

        \log \pi_{ij} = \begin{cases} -m\,(i' - j) & j \le i',\\ -\infty & j > i', \end{cases}
        \qquad\text{or}\qquad \log \pi_{ij} = -m\,|i'-j|

    when causal or not, with :math:`i' = i + n_{\text{keys}} - n_{\text{queries}}` (queries aligned
    with the last keys).
    ``prior_softmax(s, alibi_log_prior(...), log_prior=True)`` equals the ALiBi attention
    ``softmax(s + b)`` at :math:`\tau=1`; at other temperatures pass ``log_prior / tau`` (seed 003
    names ALiBi as a prior-type regularizer :math:`\Omega`).

    Args:
        n_queries, n_keys: sequence lengths.
        slope: the slope :math:`m>0`, or a 1-D tensor of per-head slopes (adds a leading head axis).
        causal: forbid keys after the query.
        device, dtype: of the result (default: those of ``slope`` if a tensor, else torch defaults).

    Returns:
        ``(n_queries, n_keys)`` or ``(n_heads, n_queries, n_keys)`` log-prior (empty when a length
        is 0).

    Raises:
        TypeError: lengths not ints, ``slope`` not a number or floating tensor, ``dtype`` not floating.
        ValueError: negative lengths; a slope that is not finite and > 0; ``causal`` with more
            queries than keys (aligned with the last keys, the first queries would see no key).

    Example:
        >>> alibi_log_prior(2, 3, 0.5)
        tensor([[-0.5000, -0.0000,    -inf],
                [-1.0000, -0.5000, -0.0000]])
    """
    n_queries = check_int(n_queries, "n_queries", minimum=0)
    n_keys = check_int(n_keys, "n_keys", minimum=0)
    causal = check_bool(causal, "causal")
    if causal and n_queries > n_keys:
        raise ValueError(
            f"causal ALiBi needs n_queries <= n_keys (queries are aligned with the last keys, so the first "
            f"{n_queries - n_keys} of n_queries={n_queries} would see none of n_keys={n_keys}); pass causal=False "
            "or more keys"
        )
    if dtype is not None:
        check_float_dtype(dtype)
    if isinstance(slope, torch.Tensor):
        slope = as_float_tensor(slope, "slope")
        if slope.ndim > 1:
            raise ValueError(f"slope must be a scalar or a 1-D tensor of per-head slopes; got shape {tuple(slope.shape)}")
        # NaN > 0 is False and inf is caught by the finiteness test: one reduction for both.
        require(((slope > 0) & torch.isfinite(slope)).all(), "slope must hold finite numbers > 0")
        device = slope.device if device is None else device
        dtype = slope.dtype if dtype is None else dtype
        m = slope.to(device=device, dtype=dtype)
    else:
        m = torch.tensor(check_positive(slope, "slope"), device=device, dtype=dtype)
    i = torch.arange(n_queries, device=m.device, dtype=m.dtype) + (n_keys - n_queries)
    j = torch.arange(n_keys, device=m.device, dtype=m.dtype)
    dist = i[:, None] - j[None, :]
    if m.ndim == 1:
        m = m[:, None, None]
    logp = -m * dist.abs()
    if causal:
        logp = logp.masked_fill(dist < 0, float("-inf"))
    return logp


# --------------------------------------------------------------------------------------------
# Sparsemax and 1.5-entmax: exact thresholds
# --------------------------------------------------------------------------------------------


def _threshold_sort(y: torch.Tensor, power: int) -> torch.Tensor:
    r"""Exact threshold :math:`\lambda` with :math:`\sum_j [y_j-\lambda]_+^{power} = 1` by sorting.

    ``y`` has its maximum at 0 (or is all ``-inf``).  For ``power=1`` (sparsemax) the support is
    the largest :math:`k` with :math:`1 + k\,y_{(k)} > \sum_{l\le k} y_{(l)}`; for ``power=2``
    (1.5-entmax) the threshold on a support of size :math:`k` solves a quadratic.
    """
    z, _ = torch.sort(y, dim=-1, descending=True)
    valid = torch.isfinite(z)
    z = torch.where(valid, z, torch.zeros_like(z))  # -inf would poison the cumulative sums
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    cs = z.cumsum(dim=-1)
    if power == 1:
        lam = (cs - 1) / k
    else:
        mean = cs / k
        var = (z * z).cumsum(dim=-1) / k - mean * mean
        lam = mean - torch.sqrt(torch.clamp(1 / k - var, min=0))
    support = valid & (z > lam)
    size = support.sum(dim=-1, keepdim=True).clamp(min=1)
    lam = lam.gather(-1, size - 1)
    # A dead row has size clamped to 1 and lam = -1 (power 1) or -1 (power 2): output stays 0.
    return lam


def _threshold_newton(x: torch.Tensor, top: torch.Tensor, power: int, buf: torch.Tensor, max_steps: int = 12) -> torch.Tensor:
    r"""The threshold of :func:`_threshold_sort`, relative to the row maximum, by Newton passes from below.

    With :math:`y = x - \max_j x_j` and a threshold :math:`\delta` in the units of the scores,
    sparsemax is :math:`p=[y-\delta]_+` and 1.5-entmax is :math:`p=[(y-\delta)/2]_+^2`, so
    :math:`\delta` solves :math:`f(\delta)=\sum_j[y_j-\delta]_+^{power}=power^2`.  Working in
    :math:`y` rather than :math:`x` makes the result shift invariant: a threshold in the units of
    :math:`x` near :math:`10^7` would carry a rounding error of the order of the gaps between the
    scores.  :math:`y` is never stored: each pass forms :math:`(x-\max)-\delta` in the scratch
    buffer, two in-place operations.

    :math:`f` is convex and decreasing, so Newton steps started at the lower bound
    :math:`-power` increase monotonically to the root, and the support
    :math:`S=\{y_j>\delta\}` shrinks to the true one.  For ``power=1`` a step is Michelot's
    :math:`\delta\leftarrow(\sum_S y_j-1)/|S|`, the root on the current support, exact as soon as
    :math:`S` stops changing.  For ``power=2`` the root on a fixed support is the smaller root of
    a quadratic; it is taken once :math:`S` stops changing and certified by one more pass (the
    support it gives must be the one it was computed on).  Rows that fail the certificate or run
    out of steps (rare) are solved by sorting, so the result is exact.

    Speed: every pass works in the preallocated buffer ``buf`` (shaped like ``x``) with in-place
    operations, since on large inputs a fresh tensor per operation costs several times the
    arithmetic (page faults).  Where host reads are allowed (:func:`host_reads_allowed`: the
    CPU), rows whose support has settled are retired after each pass and later passes touch
    only the unsettled rows; elsewhere every row takes ``max_steps`` passes and no pass reads
    the host, but the sorting fallback reads one flag (``method="auto"`` sorts there instead).
    """
    target = float(power * power)
    n = x.shape[-1]
    rows, scratch = x.reshape(-1, n), buf.view(-1, n)
    tops = top.reshape(-1, 1)
    delta = torch.full_like(tops, -float(power))  # f(-power) >= power^2: the top key alone gives that much
    reads = host_reads_allowed(x)
    if power == 1 and reads and bool(x.amin() > -torch.inf):
        # The full-support solution is another lower bound, and the answer for dense rows.
        shifted_sum = torch.sub(rows, tops, out=scratch).sum(dim=-1, keepdim=True)
        delta = torch.maximum(delta, (shifted_sum - 1) / n)

    def moments(xa, ta, d, out):  # sum of [y - d]_+, of its square (power 2), and the support size
        s1 = torch.sub(xa, ta, out=out).sub_(d).clamp_(min=0).sum(dim=-1, keepdim=True)
        s2 = out.square_().sum(dim=-1, keepdim=True) if power == 2 else None
        return s1, s2, out.sign_().sum(dim=-1, keepdim=True)

    def root_on_support(d, s1, s2, size):
        k = size.clamp(min=1)
        if power == 1:
            return d + (s1 - 1) / k
        return d + (s1 - torch.sqrt(torch.clamp(s1 * s1 - k * (s2 - target), min=0))) / k

    def newton_step(d, s1, s2, size):
        if power == 1:
            return root_on_support(d, s1, s2, size)
        live = s1 > 0  # dead (all -inf) rows do not move
        return d + torch.where(live, (s2 - target) / torch.where(live, 2 * s1, 1.0), 0.0)

    if not reads:
        for _ in range(max_steps):
            delta = newton_step(delta, *moments(rows, tops, delta, scratch))
        s1, s2, size = moments(rows, tops, delta, scratch)
        result, sizes = root_on_support(delta, s1, s2, size), size
        unsettled = torch.zeros_like(size, dtype=torch.bool).squeeze(-1)
    else:
        result, sizes = torch.empty_like(delta), torch.empty_like(delta)
        active = torch.arange(len(rows), device=x.device)  # the rows still iterating
        xa, ta, da, previous = rows, tops, delta, None
        for _ in range(max_steps):
            s1, s2, size = moments(xa, ta, da, scratch[: len(xa)])
            if previous is not None:
                settled = (size == previous).squeeze(-1)
                # Retiring rows copies the rest, so it waits until at least half have settled.
                if 2 * int(settled.sum()) >= len(active):
                    done = active[settled]
                    result[done] = root_on_support(da[settled], s1[settled], s2[settled] if power == 2 else None, size[settled])
                    sizes[done] = size[settled]
                    keep = ~settled
                    active, xa, ta, da, s1, size = active[keep], xa[keep], ta[keep], da[keep], s1[keep], size[keep]
                    s2 = s2[keep] if power == 2 else None
                    if not len(active):
                        break
            da, previous = newton_step(da, s1, s2, size), size
        unsettled = torch.zeros(len(rows), dtype=torch.bool, device=x.device)
        unsettled[active] = True
        result[active] = da
    # Certificate (Michelot's settled rows are exact by construction and need none).
    bad = unsettled
    if power == 2 or not reads:
        count = torch.sub(rows, tops, out=scratch).sub_(result).clamp_(min=0).sign_().sum(dim=-1, keepdim=True)
        bad = bad | (count != sizes).squeeze(-1)
    if bool(bad.any()):  # one host read per call, outside any loop
        y = (rows[bad] - tops[bad]) / power
        result[bad] = power * _threshold_sort(y, power)
    return result.reshape(top.shape)


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise inner product over the last dimension, keepdim; a batched matmul, no temporary."""
    return torch.einsum("...i,...i->...", a, b).unsqueeze(-1)


class _SparseEntmaxFunction(Function):
    """Sparsemax (``power=1``) and 1.5-entmax (``power=2``): :math:`p=[(x-\\theta)/power]_+^{power}`."""

    @staticmethod
    def forward(ctx, x, power, method):
        top = _safe_max(x)
        if method == "sort":
            y = (x - top) / power
            p = torch.clamp(y - _threshold_sort(y, power), min=0)
        else:
            buf = torch.empty_like(x)
            delta = _threshold_newton(x, top, power, buf)
            p = torch.sub(x, top, out=buf).sub_(delta).clamp_(min=0)  # the buffer's pages are already mapped
            if power == 2:
                p.mul_(0.5)
        if power == 2:
            p = p.square_()
        ctx.power = power
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        alpha = 1.0 + 1.0 / ctx.power  # sparsemax is 2-entmax, p = [.]_+^(1/(alpha-1))
        return _entmax_vjp(_support_weights(p, alpha), grad), None, None


def sparsemax(scores: torch.Tensor, dim: int = -1, *, method: str = "auto") -> torch.Tensor:
    r"""Sparsemax, the Euclidean projection of the scores onto the simplex.

    .. math::

        p_j = [s_j - \lambda]_+ ,\quad \textstyle\sum_j p_j = 1
        \qquad = \arg\min_{p\in\Delta}\; -\langle s, p\rangle + \tfrac12\|p\|_2^2 ,

    the "Sparsemax" row of seed 002's table (its threshold, written :math:`\tau` there, is
    :math:`\lambda` here).  Exact: the threshold is found by sorting (``method="sort"``) or by
    Michelot/Newton passes with an exactness certificate and a sorting fallback
    (``method="newton"``, several times faster on CPU); ``"auto"`` picks Newton on CPU, sort
    elsewhere.  Backward is closed form: :math:`\partial p/\partial s = \mathrm{diag}(m) - m m^\top/|S|`
    with :math:`m` the support indicator.

    Args:
        scores: any shape; ``-inf`` entries get weight 0; an all-``-inf`` row gives zeros.
        dim: dimension that is normalized.
        method: ``"auto"``, ``"sort"`` or ``"newton"``.

    Returns:
        Sparse weights shaped and typed like ``scores``.

    Raises:
        ValueError: ``dim`` out of range, NaN/``+inf`` scores, unknown ``method``.
    """
    x, d = _prepare(scores, dim)
    method = _resolve_method(method, x)
    if x.numel() == 0:
        return _empty_result(x)
    y = _to_last(x, d)
    return _from_last(_SparseEntmaxFunction.apply(y, 1, method), d, x)


def entmax15(scores: torch.Tensor, dim: int = -1, *, method: str = "auto") -> torch.Tensor:
    r"""1.5-entmax, the Tsallis-regularized transport plan with :math:`\alpha=3/2`.

    .. math::

        p_j = \big[\tfrac{s_j}{2} - \lambda\big]_+^{2},\quad \textstyle\sum_j p_j = 1
        \qquad = \arg\min_{p\in\Delta}\; -\langle s, p\rangle
        + \tfrac{4}{3}\big(\textstyle\sum_j p_j^{3/2} - 1\big),

    the :math:`\alpha`-entmax case of seed 003's "changing :math:`\Omega(p)`" (see :func:`entmax`
    for general :math:`\alpha`).  Exact (sort or Newton with certificate, as in :func:`sparsemax`);
    backward :math:`\partial p/\partial s = \mathrm{diag}(\sqrt p) - \sqrt p\sqrt p^\top/\sum_j\sqrt{p_j}`.

    Args:
        scores: any shape; ``-inf`` entries get weight 0; an all-``-inf`` row gives zeros.
        dim: dimension that is normalized.
        method: ``"auto"``, ``"sort"`` or ``"newton"``.

    Returns:
        Sparse weights shaped and typed like ``scores``.
    """
    x, d = _prepare(scores, dim)
    method = _resolve_method(method, x)
    if x.numel() == 0:
        return _empty_result(x)
    y = _to_last(x, d)
    return _from_last(_SparseEntmaxFunction.apply(y, 2, method), d, x)


# --------------------------------------------------------------------------------------------
# alpha-entmax by safeguarded Newton / bisection
# --------------------------------------------------------------------------------------------


def _support_weights(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """:math:`p^{2-\\alpha}` on the support, 0 elsewhere (also for alpha >= 2)."""
    if alpha == 2.0:
        return torch.sign(p)
    if alpha < 2.0:
        return p ** (2.0 - alpha)
    on = p > 0
    return torch.where(on, torch.where(on, p, torch.ones_like(p)) ** (2.0 - alpha), torch.zeros_like(p))


class _EntmaxBisectFunction(Function):
    @staticmethod
    def forward(ctx, x, alpha, n_iter):
        am1 = alpha - 1.0
        a = 1.0 / am1  # p = [y - lam]_+^a
        y = (x - _safe_max(x)) * am1
        n = torch.isfinite(y).sum(dim=-1, keepdim=True).clamp(min=1).to(y.dtype)
        # Bracket: f(-1) >= 0 (the top key alone gives 1) and f(-(1/n)^(alpha-1)) <= 0.
        lo = torch.full_like(n, -1.0)
        hi = -(1.0 / n) ** am1
        newton = alpha <= 2.0  # f is convex exactly when a >= 1

        def f_and_slope(lam):
            r = torch.clamp(y - lam, min=0)
            if a == 1.0:
                return r.sum(-1, keepdim=True) - 1, torch.sign(r).sum(-1, keepdim=True)
            t = r ** (a - 1.0) if newton else None
            q = t * r if newton else r**a
            slope = a * t.sum(-1, keepdim=True) if newton else None
            return q.sum(-1, keepdim=True) - 1, slope

        f_lo, df_lo = f_and_slope(lo)
        for _ in range(n_iter):
            mid = (lo + hi) / 2
            if newton:
                # Newton from the lower end never overshoots a convex decreasing f; the bracket
                # guards against rounding and flat rows.
                step = lo + f_lo / df_lo.clamp(min=torch.finfo(y.dtype).tiny)
                c = torch.where((step > lo) & (step < hi), step, mid)
            else:
                c = mid
            f_c, df_c = f_and_slope(c)
            up = f_c >= 0
            lo = torch.where(up, c, lo)
            hi = torch.where(up, hi, c)
            f_lo = torch.where(up, f_c, f_lo)
            if newton:
                df_lo = torch.where(up, df_c, df_lo)
        if newton:
            step = lo + f_lo / df_lo.clamp(min=torch.finfo(y.dtype).tiny)
            lam = torch.where((step >= lo) & (step <= hi), step, lo)
        else:
            lam = (lo + hi) / 2
        p = torch.clamp(y - lam, min=0) ** a
        total = p.sum(dim=-1, keepdim=True)
        p = p / torch.where(total > 0, total, torch.ones_like(total))  # exact normalization
        ctx.alpha = alpha
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _entmax_vjp(_support_weights(p, ctx.alpha), grad), None, None


def entmax(
    scores: torch.Tensor,
    alpha: float,
    dim: int = -1,
    n_iter: int | None = None,
    tol: float = 1e-6,
) -> torch.Tensor:
    r""":math:`\alpha`-entmax for any :math:`\alpha\ge 1`, the Tsallis-regularized transport plan.

    .. math::

        p_j = \big[(\alpha-1)s_j - \lambda\big]_+^{1/(\alpha-1)},\qquad \textstyle\sum_j p_j=1,

        p = \arg\min_{p\in\Delta}\; -\langle s,p\rangle
        + \frac{\sum_j p_j^\alpha - 1}{\alpha(\alpha-1)} ,

    the family seed 003 obtains by "changing the regularizer :math:`\Omega(p)`": :math:`\alpha\to 1`
    is :func:`softmax` (used when :math:`|\alpha-1|\le 10^{-6}`), :math:`\alpha=2` is
    :func:`sparsemax`, :math:`\alpha=1.5` is :func:`entmax15`.

    The threshold is bracketed in :math:`[-1, -n^{1-\alpha}]` (after shifting the maximum of
    :math:`(\alpha-1)s` to 0) and refined for a fixed number of iterations, with no host
    synchronization: Newton steps from the lower end for :math:`\alpha\le2` (where the residual is
    convex, so they never overshoot), bisection for :math:`\alpha>2`.  The result is normalized to
    sum to one.  Backward is closed form,
    :math:`\partial p/\partial s = \mathrm{diag}(w) - w w^\top/\sum_j w_j` with
    :math:`w = p^{2-\alpha}` on the support.

    Args:
        scores: any shape; ``-inf`` entries get weight 0; an all-``-inf`` row gives zeros.
        alpha: :math:`\alpha\ge1`.
        dim: dimension that is normalized.
        n_iter: number of refinement iterations; default
            :math:`\lceil\log_2(1/\mathrm{tol})\rceil`, the number of bisection steps that shrink the
            (width < 1) bracket below ``tol``.
        tol: target accuracy on the threshold, used only when ``n_iter`` is None.

    Returns:
        Weights shaped and typed like ``scores``.

    Raises:
        ValueError: ``alpha < 1``, ``tol <= 0``, ``n_iter < 1``, ``dim`` out of range.
    """
    x, d = _prepare(scores, dim)
    alpha = check_number(alpha, "alpha", low=1.0, hint=" (alpha=1 is softmax)")
    tol = check_positive(tol, "tol")
    if n_iter is None:
        n_iter = max(1, math.ceil(math.log2(1.0 / tol)))
    n_iter = check_int(n_iter, "n_iter")
    if x.numel() == 0:
        return _empty_result(x)
    y = _to_last(x, d)
    if alpha - 1.0 <= 1e-6:
        return _from_last(_softmax_last(y), d, x)
    return _from_last(_EntmaxBisectFunction.apply(y, alpha, n_iter), d, x)


# --------------------------------------------------------------------------------------------
# Generic one-sided regularized transport (the reference solver)
# --------------------------------------------------------------------------------------------


def _regularizer_gradient(regularizer, alpha: float, log_prior: torch.Tensor | None) -> Callable:
    r"""Return :math:`\omega'` for a separable :math:`\Omega(p)=\sum_j\omega_j(p_j)`."""
    if callable(regularizer):
        return regularizer
    if regularizer == "entropy":  # omega = p log p
        return lambda p: torch.log(p) + 1
    if regularizer in ("sparsemax", "l2"):  # omega = p^2 / 2
        return lambda p: p
    if regularizer == "tsallis":  # omega = (p^alpha - p) / (alpha (alpha - 1))
        return lambda p: (alpha * p ** (alpha - 1) - 1) / (alpha * (alpha - 1))
    if regularizer == "kl":  # omega_j = p log(p / pi_j)
        return lambda p: torch.log(p) - log_prior + 1
    raise ValueError(
        f"regularizer must be 'entropy', 'sparsemax'/'l2', 'tsallis', 'kl' or a callable giving "
        f"the elementwise gradient of a separable strictly convex Omega; got {regularizer!r}"
    )


def _solve_one_sided(cost: torch.Tensor, eps: float, grad_omega: Callable, active: torch.Tensor, n_iter: int) -> torch.Tensor:
    r"""Nested bisection on the KKT conditions, using nothing but :math:`\omega'`.

    Stationarity gives :math:`p_j(\lambda) = (\omega_j')^{-1}((\lambda - C_j)/\varepsilon)`
    clipped to :math:`[0,1]`, increasing in the multiplier :math:`\lambda` of
    :math:`\sum_j p_j = 1`.  The inner bisection inverts :math:`\omega'` on :math:`[0,1]`; the
    outer one finds :math:`\lambda`.  Bracket: at :math:`\lambda_{hi}=\min_j C_j+\varepsilon\omega_j'(1)`
    some :math:`p_j\ge1`; at :math:`\lambda_{lo}=\min_j C_j+\varepsilon\omega_j'(1/n)` all
    :math:`p_j\le 1/n`.
    """
    c = torch.where(active, cost, torch.zeros_like(cost))
    n = active.sum(dim=-1, keepdim=True).clamp(min=1).to(c.dtype)
    big = torch.finfo(c.dtype).max

    def omega_prime(p):
        return grad_omega(p).expand_as(c)

    at_one = c + eps * omega_prime(torch.ones_like(c))
    at_uniform = c + eps * omega_prime((1 / n).expand_as(c))
    lam_hi = torch.where(active, at_one, torch.full_like(c, big)).amin(dim=-1, keepdim=True)
    lam_lo = torch.where(active, at_uniform, torch.full_like(c, big)).amin(dim=-1, keepdim=True)

    def primal(lam):
        target = (lam - c) / eps
        lo = torch.zeros_like(c)
        hi = torch.ones_like(c)
        for _ in range(n_iter):
            mid = (lo + hi) / 2
            below = omega_prime(mid) <= target
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        # The lower end is exactly 0 for coordinates off the support.
        return torch.where(active, lo, torch.zeros_like(lo))

    for _ in range(n_iter):
        mid = (lam_lo + lam_hi) / 2
        under = primal(mid).sum(dim=-1, keepdim=True) <= 1
        lam_lo = torch.where(under, mid, lam_lo)
        lam_hi = torch.where(under, lam_hi, mid)
    p = primal((lam_lo + lam_hi) / 2)
    total = p.sum(dim=-1, keepdim=True)
    return p / torch.where(total > 0, total, torch.ones_like(total))


class _OneSidedEOTFunction(Function):
    @staticmethod
    def forward(ctx, cost, eps, grad_omega, active, n_iter):
        p = _solve_one_sided(cost, eps, grad_omega, active, n_iter)
        ctx.eps = eps
        ctx.grad_omega = grad_omega
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        # Implicit function theorem on the KKT system: dp/dC = -(diag(h) - h h^T / sum h) / eps
        # with h = 1 / omega''(p) on the support, omega'' obtained by autograd of omega'.
        on = p > 0
        with torch.enable_grad():
            q = torch.where(on, p, torch.full_like(p, 0.5)).detach().requires_grad_(True)
            (second,) = torch.autograd.grad(ctx.grad_omega(q).expand_as(q).sum(), q)
        h = torch.where(on, 1 / second, torch.zeros_like(p))
        return -_entmax_vjp(h, grad) / ctx.eps, None, None, None, None


def one_sided_eot(
    cost: torch.Tensor,
    eps: float = 1.0,
    regularizer: str | Callable = "entropy",
    *,
    alpha: float = 1.5,
    prior: torch.Tensor | None = None,
    n_iter: int = 60,
    dim: int = -1,
) -> torch.Tensor:
    r"""Solve the regularized one-sided transport problem by a generic method.

    .. math::

        p^\star = \arg\min_{p\in\Delta^{m-1}}\; \sum_j C_j p_j + \varepsilon\,\Omega(p),

    eq. (4) of seed 002 (the "forward problem" of seed 003) with :math:`-H` replaced by a separable
    strictly convex :math:`\Omega(p)=\sum_j \omega_j(p_j)` (seed 002's eq. (13)).  The solver uses
    only :math:`\omega'`: it bisects on the multiplier :math:`\lambda` of :math:`\sum_j p_j=1` and,
    inside, inverts the stationarity condition
    :math:`C_j + \varepsilon\,\omega_j'(p_j) = \lambda` on :math:`[0,1]` by bisection.  It never
    calls a closed form, so :func:`softmax`, :func:`sparsemax`, :func:`entmax` and
    :func:`prior_softmax` can be tested against it.  Its gradient with respect to ``cost`` comes
    from the implicit function theorem, again using only :math:`\omega''` (by autograd).

    Regularizers: ``"entropy"`` :math:`\omega=p\log p` (gives ``softmax(-C/eps)``);
    ``"sparsemax"``/``"l2"`` :math:`\omega=p^2/2` (``sparsemax(-C/eps)``); ``"tsallis"``
    :math:`\omega=(p^\alpha-p)/(\alpha(\alpha-1))` (``entmax(-C/eps, alpha)``); ``"kl"``
    :math:`\omega_j=p\log(p/\pi_j)` (``prior_softmax(-C, prior, tau=eps)``); or a callable returning
    :math:`\omega'(p)` elementwise (strictly increasing on :math:`(0,1]`).

    Args:
        cost: ``(..., m)`` costs :math:`C`; ``+inf`` marks a forbidden key (weight 0).
        eps: regularization strength :math:`\varepsilon>0`.
        regularizer: see above.
        alpha: Tsallis parameter, :math:`\alpha>1` (``"tsallis"`` only).
        prior: :math:`\pi\ge0` broadcastable to ``cost`` (``"kl"`` only; zeros forbid keys).
        n_iter: bisection steps of each of the two loops (60 reaches float64 resolution).
        dim: dimension holding the keys.

    Returns:
        :math:`p^\star` shaped and typed like ``cost``; an all-forbidden row gives zeros.
        Computed in float64 whatever the input dtype (it is a reference solver).

    Raises:
        ValueError: ``eps <= 0``, unknown regularizer, ``alpha <= 1`` for Tsallis, missing prior.
    """
    c = as_float_tensor(cost, "cost", min_ndim=1)
    # -inf costs (and NaN) have no meaning here; +inf forbids a key.  -cost < +inf is exactly that.
    check_finite(-c, "cost", allow_neg_inf=True)
    d = check_dim(dim, c.ndim)
    eps = check_positive(eps, "eps")
    n_iter = check_int(n_iter, "n_iter")
    if not callable(regularizer):
        check_choice(regularizer, "regularizer", ("entropy", "sparsemax", "l2", "tsallis", "kl"))
    if regularizer == "tsallis":
        alpha = check_number(alpha, "alpha", low=1.0, low_open=True, hint=" for the Tsallis regularizer (alpha=1 is 'entropy')")
    if regularizer == "kl" and prior is None:
        raise ValueError("regularizer='kl' needs a prior")
    if c.numel() == 0:
        return _empty_result(c)
    work = c.movedim(d, -1).to(torch.float64)
    active = torch.isfinite(work)
    log_prior = None
    if regularizer == "kl":
        pi = as_float_tensor(prior, "prior", like=c)
        check_finite(pi, "prior")
        check_nonnegative(pi, "prior")
        broadcast_shapes(cost=c.shape, prior=pi.shape)
        pi = torch.broadcast_to(pi, c.shape).movedim(d, -1).to(torch.float64)
        active = active & (pi > 0)
        log_prior = torch.log(torch.where(pi > 0, pi, torch.ones_like(pi)))
    grad_omega = _regularizer_gradient(regularizer, alpha, log_prior)
    p = _OneSidedEOTFunction.apply(work, eps, grad_omega, active, n_iter)
    return p.movedim(-1, d).to(c.dtype)


# --------------------------------------------------------------------------------------------
# Two-sided (Sinkhorn) attention
# --------------------------------------------------------------------------------------------


def _masked_log(x: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    # log of a scaling that is 0 on dead rows/columns: use 1 there (their kernel entries are
    # already 0), so that no log(0) enters the graph.
    return torch.log(torch.where(live, x, torch.ones_like(x)))


def _sinkhorn_plan(M, a, b, n_iter, absorb_every, f0=None, record=None):
    r"""Log-stabilized Sinkhorn iterations for :math:`P = \mathrm{diag}(e^f) e^{M} \mathrm{diag}(e^g)`.

    The potentials :math:`f, g` live in the log domain.  Every ``absorb_every`` iterations the
    current scalings are absorbed into them and the kernel :math:`\tilde K = e^{M+f\oplus g}` (whose
    entries are at most about 1, being an approximate plan) is re-exponentiated; in between, the
    updates :math:`v = b / \tilde K^\top u`, :math:`u = a/\tilde K v` are matrix-vector products.
    With ``absorb_every=1`` this is the plain log-domain (log-sum-exp) iteration.  The schedule
    depends only on the iteration counter: no host synchronization, no data-dependent branches.
    Each iteration ends with the row update, so rows match ``a`` exactly.  ``f0`` is the initial
    row potential (default :math:`-\max_j M_{ij}`); ``record``, a list, receives per segment the
    kernel and the iterates that :class:`_SinkhornUnrolledFunction` needs to run them backwards.
    """
    tiny = torch.finfo(M.dtype).tiny
    row_live, col_live = a > 0, b > 0
    f = -_safe_max(M).squeeze(-1) if f0 is None else f0
    g = torch.zeros_like(b)
    u = torch.ones_like(a)
    v = torch.ones_like(b)
    kernel = None
    for t in range(n_iter):
        if t % absorb_every == 0:
            if kernel is not None:
                f = f + _masked_log(u, row_live)
                g = g + _masked_log(v, col_live)
                u, v = torch.ones_like(a), torch.ones_like(b)
            kernel = torch.exp(M + f.unsqueeze(-1) + g.unsqueeze(-2))
            if record is not None:
                record.append((kernel, []))
        u_prev = u
        col = torch.matmul(u.unsqueeze(-2), kernel).squeeze(-2)
        v = torch.where(col_live, b / col.clamp(min=tiny), torch.zeros_like(b))
        row = torch.matmul(kernel, v.unsqueeze(-1)).squeeze(-1)
        u = torch.where(row_live, a / row.clamp(min=tiny), torch.zeros_like(a))
        if record is not None:
            record[-1][1].append((u_prev, col, v, row, u))
    return u.unsqueeze(-1) * kernel * v.unsqueeze(-2)


class _SinkhornUnrolledFunction(Function):
    r"""The plan of :func:`_sinkhorn_plan` with its unrolled gradient, run backwards by hand.

    The gradient is exactly autograd's through the iterations, but cheaper: each iteration only
    touches vectors (``u``, ``v`` and their adjoints, through products with the saved kernel), and
    the kernel's adjoint :math:`\bar K=\sum_t \bar r_t v_t^\top + u_{t-1}\bar c_t^\top` of a segment
    is formed at once as one batched matrix product, instead of two rank-one matrices per
    iteration.  Reverse of one iteration (:math:`c=K^\top u_{t-1}`, :math:`v=b/c`, :math:`r=Kv`,
    :math:`u=a/r`): :math:`\bar r=-\bar u\,u/r`, :math:`\bar v\mathrel{+}=K^\top\bar r`,
    :math:`\bar c=-\bar v\,v/c`, :math:`\bar u_{t-1}=K\bar c`; at a segment's start
    :math:`K=e^{M+f\oplus g}` gives :math:`\bar M=\bar K\odot K` and the potentials' adjoints, which
    flow to the previous segment's last :math:`u, v` through :math:`f\mathrel{+}=\log u`,
    :math:`g\mathrel{+}=\log v`.
    """

    @staticmethod
    def forward(ctx, M, f0, a, b, n_iter, absorb_every):
        record = []
        plan = _sinkhorn_plan(M, a, b, n_iter, absorb_every, f0=f0, record=record)
        kernels = [k for k, _ in record]
        ctx.steps = [steps for _, steps in record]  # vectors only: small
        ctx.save_for_backward(a, b, *kernels)
        return plan

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_plan):
        a, b, *kernels = ctx.saved_tensors
        tiny = torch.finfo(a.dtype).tiny
        row_live, col_live = a > 0, b > 0
        zero_a, zero_b = torch.zeros_like(a), torch.zeros_like(b)
        # P = u K v: adjoints of the last u and v, and the last kernel's first term.
        _, _, v, _, u = ctx.steps[-1][-1]
        GK = grad_plan * kernels[-1]
        du = torch.matmul(GK, v.unsqueeze(-1)).squeeze(-1)
        dv = torch.matmul(u.unsqueeze(-2), GK).squeeze(-2)
        dK = GK.copy_(grad_plan).mul_(u.unsqueeze(-1)).mul_(v.unsqueeze(-2))  # reuse GK's memory
        grad_M = df = dg = None
        for s in range(len(kernels) - 1, -1, -1):
            K, left, right = kernels[s], [], []  # this segment's dK = sum of left_i right_i^T
            for u_prev, col, v_t, row, u_t in reversed(ctx.steps[s]):
                # Where the forward clamped a sum that underflowed (v = b / max(c, tiny)), the clamp's
                # derivative is 0: without this the adjoint would be inf and meet K = 0 as NaN.
                drow = torch.where(row_live & (row >= tiny), -du * u_t / row.clamp(min=tiny), zero_a)
                dv = dv + torch.matmul(drow.unsqueeze(-2), K).squeeze(-2)
                dcol = torch.where(col_live & (col >= tiny), -dv * v_t / col.clamp(min=tiny), zero_b)
                du = torch.matmul(K, dcol.unsqueeze(-1)).squeeze(-1)  # the adjoint of u_prev
                left += [drow, u_prev]
                right += [v_t, dcol]
                dv = zero_b  # an earlier v is used by its own row update only
            seg = torch.matmul(torch.stack(left, dim=-1), torch.stack(right, dim=-2))
            dZ = seg if dK is None else dK.add_(seg)
            # K = exp(Z), Z = M + f (+) g.  Where K underflowed to 0 the chain is 0 times an adjoint that
            # may have overflowed (u, v near 1 / tiny): the derivative of the computed K is exactly 0.
            dZ = dZ.mul_(K).masked_fill_(K == 0, 0.0)
            dK = None
            grad_M = dZ if grad_M is None else grad_M.add_(dZ)
            # f_s = f_(s-1) + log u_last: the potentials' adjoints accumulate down the segments.
            df = dZ.sum(dim=-1) if df is None else df + dZ.sum(dim=-1)
            dg = dZ.sum(dim=-2) if dg is None else dg + dZ.sum(dim=-2)
            if s > 0:
                _, _, v_last, _, u_last = ctx.steps[s - 1][-1]
                du = torch.where(row_live, df / torch.where(row_live, u_last, torch.ones_like(u_last)), zero_a)
                dv = torch.where(col_live, dg / torch.where(col_live, v_last, torch.ones_like(v_last)), zero_b)
        return grad_M, df, None, None, None, None


def _rows_to_attention(plan: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    live = a > 0
    inv = torch.where(live, 1 / torch.where(live, a, torch.ones_like(a)), torch.zeros_like(a))
    return plan * inv.unsqueeze(-1)


class _SinkhornImplicitFunction(Function):
    @staticmethod
    def forward(ctx, M, a, b, n_iter, absorb_every):
        plan = _sinkhorn_plan(M, a, b, n_iter, absorb_every)
        ctx.save_for_backward(plan, a, b)
        return _rows_to_attention(plan, a)

    @staticmethod
    def backward(ctx, grad_out):
        # Implicit differentiation of the marginal constraints P 1 = a, P^T 1 = b at the fixed
        # point P = exp(M + f (+) g).  With G = dL/dP, r = (G*P) 1, c = (G*P)^T 1, the adjoint
        # (x, y) solves [diag a, P; P^T, diag b] [x; y] = [r; c] and dL/dM = P * (G - x 1^T - 1 y^T).
        plan, a, b = ctx.saved_tensors
        G = _rows_to_attention(grad_out, a)  # d(P/a)/dP scales each row by 1/a
        GP = G * plan
        r, c = GP.sum(dim=-1), GP.sum(dim=-2)
        row_live, col_live = a > 0, b > 0
        a_safe = torch.where(row_live, a, torch.ones_like(a))
        # Schur complement on y: (diag b - P^T diag(1/a) P) y = c - P^T (r / a); its null vector
        # (the live columns' indicator) is pinned by adding w w^T, w = 1_live / m_live, to it.
        scaled = plan / a_safe.unsqueeze(-1)
        schur = torch.diag_embed(b) - plan.transpose(-1, -2) @ scaled
        w = col_live.to(plan.dtype)
        w = w / w.sum(dim=-1, keepdim=True).clamp(min=1)
        schur = schur + w.unsqueeze(-1) * w.unsqueeze(-2) + torch.diag_embed((~col_live).to(plan.dtype))
        rhs = c - (plan.transpose(-1, -2) @ (r / a_safe).unsqueeze(-1)).squeeze(-1)
        # solve_ex: the pinned Schur complement is nonsingular, and solve() would read its error flag
        y = torch.linalg.solve_ex(schur, rhs.unsqueeze(-1))[0].squeeze(-1)
        x = torch.where(row_live, (r - (plan @ y.unsqueeze(-1)).squeeze(-1)) / a_safe, torch.zeros_like(a))
        grad_M = plan * (G - x.unsqueeze(-1) - y.unsqueeze(-2))
        return grad_M, None, None, None, None


def sinkhorn_attention(
    scores: torch.Tensor,
    eps: float = 1.0,
    n_iter: int = 20,
    *,
    key_mask: torch.Tensor | None = None,
    query_mask: torch.Tensor | None = None,
    grad: str = "unrolled",
    absorb_every: int = 10,
) -> torch.Tensor:
    r"""Two-sided (doubly stochastic) attention: the entropic OT plan between queries and keys.

    .. math::

        P^\star = \arg\min_{P\in U(a,b)} \sum_{ij} C_{ij}P_{ij} - \varepsilon H(P),

        C_{ij} = -s_{ij}, \qquad W_{ij} = P^\star_{ij}/a_i ,

    eq. (3) of seed 002 (the EOT problem whose one-sided special case, eq. (4), is softmax), with
    uniform marginals :math:`a_i = 1/n`, :math:`b_j = 1/m` over the live queries and keys.  The
    solution is :math:`P^\star = \mathrm{diag}(e^{f})\,e^{s/\varepsilon}\,\mathrm{diag}(e^{g})`,
    computed by ``n_iter`` Sinkhorn iterations (see ``_sinkhorn_plan``; each ends with the row
    update, so every live row of :math:`W` sums to exactly 1 and columns to :math:`n/m` at
    convergence, i.e. :math:`W` is doubly stochastic when :math:`n=m`).

    Args:
        scores: ``(..., n_queries, n_keys)``; ``-inf`` entries get zero mass.
        eps: entropic regularization :math:`\varepsilon>0` (the temperature).
        n_iter: number of Sinkhorn iterations (a fixed count: no convergence test, no host sync).
        key_mask: boolean ``(..., n_keys)``, ``True`` = real key; padding keys get zero mass and
            are excluded from the marginal (:math:`b_j = 1/m_{\text{valid}}`).
        query_mask: boolean ``(..., n_queries)``, ``True`` = real query; padded queries get all-zero
            rows.  Rows (columns) whose scores are all ``-inf`` are treated as padded too.
        grad: ``"unrolled"`` (the exact gradient of the ``n_iter`` iterations, as autograd would
            give it, from a hand-written reverse pass that touches only vectors per iteration and
            forms the kernel's adjoint once per re-exponentiation; differentiable once) or
            ``"implicit"`` (implicit differentiation at the fixed point; exact only at
            convergence).
        absorb_every: iterations between re-exponentiations of the stabilized kernel (1 = plain
            log-domain iteration, most robust for very small ``eps``).

    Returns:
        Attention weights :math:`W` shaped like ``scores``, in its dtype.

    Raises:
        TypeError: ``scores`` not floating, masks not boolean tensors.
        ValueError: NaN or ``+inf`` scores, ``eps <= 0``, ``n_iter < 1``, unknown ``grad``, masks
            that do not fit.  Empty scores give an empty result.
    """
    x = as_float_tensor(scores, "scores", min_ndim=2)
    check_finite(x, "scores", allow_neg_inf=True)
    eps = check_positive(eps, "eps")
    n_iter = check_int(n_iter, "n_iter")
    absorb_every = check_int(absorb_every, "absorb_every")
    check_choice(grad, "grad", ("unrolled", "implicit"))
    n_queries, n_keys = x.shape[-2:]
    if key_mask is not None:
        check_bool_mask(key_mask, "key_mask", x.shape[:-2] + (n_keys,), device=x.device, meaning="True = real key")
    if query_mask is not None:
        check_bool_mask(query_mask, "query_mask", x.shape[:-2] + (n_queries,), device=x.device, meaning="True = real query")
    if x.numel() == 0:
        return _empty_result(x)
    work = x.to(_work_dtype(x))
    live = torch.isfinite(work)  # before dividing by eps, which may overflow
    if key_mask is not None:
        live = live & key_mask.unsqueeze(-2)
    if query_mask is not None:
        live = live & query_mask.unsqueeze(-1)
    # A row (column) left without any live entry would be infeasible: treat it as padding.
    rows = live.any(dim=-1)
    cols = live.any(dim=-2)
    # Shift each row by its largest live score before dividing: a small eps would overflow s / eps.
    # The plan does not change (the row potential absorbs the shift); entries far below the row's
    # maximum may underflow to exp(-inf) = 0, which is their limit.
    M = torch.where(live, work, torch.full_like(work, float("-inf")))
    M = (M - _safe_max(M).detach()) / eps  # the plan does not depend on the shift: detach is exact
    a = rows.to(M.dtype)
    a = a / a.sum(dim=-1, keepdim=True).clamp(min=1)
    b = cols.to(M.dtype)
    b = b / b.sum(dim=-1, keepdim=True).clamp(min=1)
    if grad == "implicit":
        W = _SinkhornImplicitFunction.apply(M, a, b, n_iter, absorb_every)
    else:
        f0 = -_safe_max(M).squeeze(-1)
        W = _rows_to_attention(_SinkhornUnrolledFunction.apply(M, f0, a, b, n_iter, absorb_every), a)
    return W.to(x.dtype)
