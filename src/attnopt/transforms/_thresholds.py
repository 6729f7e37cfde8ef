r"""The engine of the sparse transforms of :mod:`attnopt.transforms`: thresholds and autograd functions.

Every :math:`\alpha`-entmax (softmax :math:`\alpha\to1`, 1.5-entmax, sparsemax :math:`\alpha=2`) is
:math:`p_j=[(\alpha-1)s_j-\lambda]_+^{1/(\alpha-1)}` with the threshold :math:`\lambda` that makes
:math:`\sum_jp_j=1`.  This module finds :math:`\lambda`: exactly for sparsemax and 1.5-entmax, by
sorting (:func:`threshold_sort`) or by Michelot/Newton passes with an exactness certificate
(:func:`threshold_newton`), and for any :math:`\alpha` by safeguarded Newton/bisection
(:func:`threshold_bisect`).  All of them share one Jacobian-vector product, :func:`entmax_vjp`, the
backward pass of their autograd functions (:class:`SoftmaxFunction`, :class:`SparseEntmaxFunction`,
:class:`EntmaxBisectFunction`).

References:
    Martins and Astudillo (2016), *From Softmax to Sparsemax*, Prop. 1 and Algorithm 1 (the
    threshold by sorting).  Michelot (1986), *A finite algorithm for finding the projection of a
    point onto the canonical simplex of R^n*.  Peters, Niculae and Martins (2019), *Sparse
    Sequence-to-Sequence Models* (1.5-entmax by sorting, :math:`\alpha`-entmax by bisection, and
    the backward pass shared by all of them).
"""

from __future__ import annotations

import math

import torch
from torch.autograd import Function

from .._validation import host_reads_allowed


def safe_max(y: torch.Tensor) -> torch.Tensor:
    """Row maximum with all-``-inf`` rows mapped to 0, so that shifting by it never makes NaN."""
    top = y.amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise inner product over the last dimension, keepdim; a batched matmul, no temporary."""
    return torch.einsum("...i,...i->...", a, b).unsqueeze(-1)


def entmax_vjp(s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    r"""Jacobian-vector product of every entmax: :math:`s\odot(g - \langle s,g\rangle/\textstyle\sum s)`.

    ``s`` is :math:`p^{2-\alpha}` on the support and 0 off it (the indicator for sparsemax,
    :math:`\sqrt p` for 1.5-entmax, :math:`p` for softmax).  An all-zero row has ``s = 0`` and so
    gets a zero gradient instead of 0/0.  One temporary, updated in place (see
    :func:`threshold_newton` for why allocations matter here).
    """
    total = s.sum(dim=-1, keepdim=True)
    coef = rowdot(s, g) / torch.where(total > 0, total, torch.ones_like(total))
    if torch.is_grad_enabled():  # a double backward (create_graph=True) differentiates this: no in-place op
        return (g - coef) * s
    return (g - coef).mul_(s)


def support_weights(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """:math:`p^{2-\\alpha}` on the support, 0 elsewhere (also for alpha >= 2).

    Differentiable in ``p`` with finite derivatives (a double backward goes through it): off the
    support the power is taken of 1, not of 0, whose derivative :math:`(2-\\alpha)0^{1-\\alpha}` is
    infinite for :math:`\\alpha>1`; ``sign`` (sparsemax) has derivative 0.
    """
    if alpha == 2.0:
        return torch.sign(p)
    if alpha < 2.0 and not torch.is_grad_enabled():
        return p ** (2.0 - alpha)  # 0 ** (2 - alpha) = 0: exact, and the fast path of a first backward
    on = p > 0
    return torch.where(on, torch.where(on, p, torch.ones_like(p)) ** (2.0 - alpha), torch.zeros_like(p))


def threshold_sort(y: torch.Tensor, power: int, *, split: bool = False):
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
    # The cumulative sums add up to n terms one after the other (and the variance formula
    # subtracts two nearly equal numbers on flat rows): their rounding error grows with the row
    # length, and on a row of 10^6 keys it is enough to miss sum(p) = 1 by 1e-6 in float32.
    # One exact solve on the support found (root_step), from sums that torch adds pairwise and
    # accumulates in float64 (see threshold_newton), removes it.
    # With ``split`` the result is the pair (hi, lo) of :func:`split_threshold`.
    r = torch.clamp(y - lam, min=0)
    acc = long_row_sum_dtype(y.shape[-1], y.dtype)
    s1 = r.sum(dim=-1, keepdim=True, dtype=acc).to(torch.float64)
    s2 = (r * r).sum(dim=-1, keepdim=True, dtype=acc).to(torch.float64) if power == 2 else None
    size = torch.sign(r).sum(dim=-1, keepdim=True, dtype=acc).to(torch.float64)
    lam = lam.to(torch.float64) + root_step(s1, s2, size, power, 1.0)
    return split_threshold(lam, y.dtype) if split else lam.to(y.dtype)


def long_row_sum_dtype(n: int, dtype: torch.dtype) -> torch.dtype | None:
    """float64 accumulation for the sums of rows longer than 1024 keys, else None (the dtype's own).

    A float32 sum of 10^6 terms is off by several units in the last place, enough to move a
    threshold; on short rows it is not, and ``sum(dtype=float64)`` costs a float64 copy of the
    whole input on the CPU (a third of sparsemax's time on a (64, 12, 128, 128) input).
    """
    return torch.float64 if n > 1024 and dtype != torch.float64 else None


def split_threshold(lam: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    r"""A float64 threshold as ``hi + lo`` in ``dtype`` (``lo = 0`` for float64), for :math:`(y - hi) - lo`.

    On a long row a float32 threshold is not fine enough: its rounding, :math:`\epsilon|\delta|/2`,
    moves every one of the :math:`|S|` weights, by :math:`\epsilon|\delta|\sum_S\sqrt{p_j}/2` in
    all for 1.5-entmax, :math:`10^{-6}` on a row of :math:`10^6` scores near :math:`10^6` (float32
    spacing 1/16, so in ties of a third of the row).  :math:`y - hi` is exact where it matters
    (Sterbenz: :math:`y` near the threshold), and subtracting the small ``lo`` then rounds only
    relative to the weight.
    """
    hi = lam.to(dtype)
    return hi, (lam - hi.to(torch.float64)).to(dtype)


def root_step(s1: torch.Tensor, s2: torch.Tensor | None, size: torch.Tensor, power: int, target: float) -> torch.Tensor:
    r"""The move :math:`t` from a threshold :math:`d` to the root on the support :math:`S` at :math:`d`.

    With :math:`r_j = y_j - d` on :math:`S` (``size`` keys), :math:`s_1=\sum_S r_j`,
    :math:`s_2=\sum_S r_j^2`, the root solves :math:`\sum_S (r_j - t)^{power} = target`: for
    ``power=1`` :math:`t = (s_1 - target)/|S|` (Michelot's step), for ``power=2`` the smaller root
    of :math:`|S|t^2 - 2s_1t + s_2 - target = 0`, written as
    :math:`t = (s_2 - target)/(s_1 + \sqrt{s_1^2 - |S|(s_2 - target)})` so that nothing cancels
    when :math:`d` is near the root (the textbook form :math:`(s_1 - \sqrt{\cdot})/|S|` subtracts
    two numbers that agree to all digits there, and on a flat row of :math:`3\cdot10^5` keys in
    float32 it gave weights summing to 1.065).  A row with an empty support does not move.
    """
    live = size > 0
    if power == 1:
        return torch.where(live, (s1 - target) / torch.where(live, size, torch.ones_like(size)), torch.zeros_like(s1))
    disc = torch.sqrt(torch.clamp(s1 * s1 - size * (s2 - target), min=0))
    den = s1 + disc
    return torch.where(live & (den > 0), (s2 - target) / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(s1))


def threshold_newton(x: torch.Tensor, top: torch.Tensor, power: int, buf: torch.Tensor, max_steps: int = 12, *,
                     fallback: bool = True):
    r"""The threshold of :func:`threshold_sort`, relative to the row maximum, by Newton passes from below.

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
    a quadratic; it is taken once :math:`S` stops changing.  One more pass certifies every row (the
    support at the result must be the one it was computed on) and solves on that support once more
    from the result (:func:`root_step`), which removes the rounding error of a root computed far
    from it.  Rows that fail the certificate or run out of steps (rare) are solved by sorting, so
    the result is exact; with ``fallback=False`` they are returned instead, as the flags ``bad``,
    with the threshold as ``delta + delta_lo`` (:func:`split_threshold`), the support size and
    :math:`s_1=\sum_S[y_j-\delta]` before the last solve: ``(delta, delta_lo, bad, size, s1)``
    (:func:`sparse_entmax_newton` adds the residual certificate and sorts them).

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

    def moments(row_scores, row_tops, d, out, acc=None):  # sum of [y - d]_+, of its square (power 2), and the support size
        s1 = torch.sub(row_scores, row_tops, out=out).sub_(d).clamp_(min=0).sum(dim=-1, keepdim=True, dtype=acc)
        s2 = out.square_().sum(dim=-1, keepdim=True, dtype=acc) if power == 2 else None
        return s1, s2, out.sign_().sum(dim=-1, keepdim=True, dtype=acc)

    def root_on_support(d, s1, s2, size):
        return d + root_step(s1, s2, size, power, target)

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
        rows_left, tops_left, delta_left, previous = rows, tops, delta, None
        for _ in range(max_steps):
            s1, s2, size = moments(rows_left, tops_left, delta_left, scratch[: len(rows_left)])
            if previous is not None:
                settled = (size == previous).squeeze(-1)
                # Retiring rows copies the rest, so it waits until at least half have settled.
                if 2 * int(settled.sum()) >= len(active):
                    done = active[settled]
                    result[done] = root_on_support(delta_left[settled], s1[settled], s2[settled] if power == 2 else None, size[settled])
                    sizes[done] = size[settled]
                    keep = ~settled
                    active, rows_left, tops_left = active[keep], rows_left[keep], tops_left[keep]
                    delta_left, s1, size = delta_left[keep], s1[keep], size[keep]
                    s2 = s2[keep] if power == 2 else None
                    if not len(active):
                        break
            delta_left, previous = newton_step(delta_left, s1, s2, size), size
        unsettled = torch.zeros(len(rows), dtype=torch.bool, device=x.device)
        unsettled[active] = True
        result[active] = delta_left
    # Certificate and polish, one pass: the support at the result must be the one its root was
    # computed on, and the root on that support is solved once more from there.  Near the root
    # s2 - target is small and the stable form of root_step loses nothing, whereas the root
    # computed where the support settled may be far from there (on a flat row the support is
    # settled from the first pass) and carries the rounding error of sums of size ~ the row length.
    # On long rows its sums accumulate in float64 (long_row_sum_dtype): a float32 sum of 10^6
    # terms is off by several units in the last place, and the threshold would carry that error
    # into every weight.
    s1, s2, count = moments(rows, tops, result, scratch, acc=long_row_sum_dtype(n, x.dtype))
    bad = unsettled | (count != sizes).squeeze(-1)
    s1, count = s1.to(torch.float64), count.to(torch.float64)
    step = root_step(s1, s2 if s2 is None else s2.to(torch.float64), count, power, target)
    precise = result.to(torch.float64) + torch.where(bad.unsqueeze(-1), torch.zeros_like(step), step)
    result, low = split_threshold(precise, result.dtype)
    s1, count = s1.to(result.dtype), count.to(result.dtype)
    if not fallback:
        shape = top.shape
        return result.reshape(shape), low.reshape(shape), bad.reshape(shape[:-1]), count.reshape(shape), s1.reshape(shape)
    if bool(bad.any()):  # one host read per call, outside any loop
        y = (rows[bad] - tops[bad]) / power
        result[bad] = power * threshold_sort(y, power)
    return result.reshape(top.shape)


def bisect_iterations(alpha: float, n: int, dtype: torch.dtype, tol: float | None) -> int:
    r"""The default number of iterations of :func:`threshold_bisect` on rows of ``n`` keys.

    For :math:`\alpha>2` the bisection is on :math:`\log(-\lambda)\in[(1-\alpha)\log n, 0]`, an
    interval of width :math:`W=(\alpha-1)\log n`: :math:`\lceil\log_2(W/tol)\rceil` halvings
    leave a relative error ``tol`` on :math:`\lambda`, and with ``tol=None`` the working precision
    (``tol`` = the dtype's epsilon / 4).  For :math:`\alpha\le2` safeguarded Newton steps from
    below converge monotonically and then quadratically: 30 steps reach the working precision on
    every row tested (flat rows of :math:`10^6` keys included; the test suite checks it), and with
    a ``tol`` the old count :math:`\lceil\log_2(1/tol)\rceil` is kept.
    """
    if alpha <= 2.0:
        return 30 if tol is None else max(1, math.ceil(math.log2(1.0 / tol)))
    tol = torch.finfo(dtype).eps / 4 if tol is None else tol
    width = max(1.0, (alpha - 1.0) * math.log(max(n, 2)))
    return max(1, math.ceil(math.log2(width / tol)))


def threshold_bisect(x: torch.Tensor, alpha: float, n_iter: int) -> torch.Tensor:
    r"""The weights :math:`p=[(\alpha-1)(x-\max x)-\lambda]_+^{1/(\alpha-1)}` of :math:`\alpha`-entmax, normalized.

    The threshold :math:`\lambda` lies in :math:`[-1,-n^{1-\alpha}]` (the top key alone gives mass 1
    at :math:`-1`; :math:`n` live keys give at most 1 at the upper end) and is refined for
    ``n_iter`` iterations without a host read.  For :math:`\alpha\le2`,
    :math:`f(\lambda)=\sum_j[y_j-\lambda]_+^{1/(\alpha-1)}-1` is convex and decreasing, and
    Newton steps from the lower end never overshoot (the bracket guards against rounding and flat
    rows).  For :math:`\alpha>2` it is concave, the slope is unbounded at the support's edge and
    Newton stalls there, so the iteration is bisection, on :math:`\log(-\lambda)`: the threshold
    may be as small as :math:`n^{1-\alpha}` (:math:`10^{-27}` for :math:`\alpha=10` and a thousand
    near-ties), and halving the interval of :math:`\lambda` itself would need about a hundred steps
    more to resolve it, while near the edge of the support :math:`p_j = r_j^{1/(\alpha-1)}` turns
    an error :math:`\epsilon` in :math:`\lambda` into :math:`\epsilon^{1/(\alpha-1)}` in
    :math:`p` (:math:`10^{-2}` for :math:`\alpha=5` with the :math:`10^{-6}` of a 20-step
    bisection).  ``x`` has the keys last; ``alpha > 1``.
    """
    am1 = alpha - 1.0
    a = 1.0 / am1  # p = [y - lam]_+^a
    y = (x - safe_max(x)) * am1
    n = torch.isfinite(y).sum(dim=-1, keepdim=True).clamp(min=1).to(y.dtype)
    newton = alpha <= 2.0  # f is convex exactly when a >= 1

    f64 = torch.float64

    def f_and_slope(lam, acc=None):  # acc=float64: the sums accumulate in float64 (see threshold_newton)
        r = torch.clamp(y - lam, min=0)
        if a == 1.0:
            return r.sum(-1, keepdim=True, dtype=acc) - 1, torch.sign(r).sum(-1, keepdim=True, dtype=acc)
        t = r ** (a - 1.0) if newton else None
        q = t * r if newton else r**a
        slope = a * t.sum(-1, keepdim=True, dtype=acc) if newton else None
        return q.sum(-1, keepdim=True, dtype=acc) - 1, slope

    if not newton:
        # g(u) = f(-exp(u)) increases with u; g(0) = f(-1) >= 0 >= g((1 - alpha) log n).
        u_lo, u_hi = -am1 * torch.log(n), torch.zeros_like(n)
        for _ in range(n_iter):
            mid = (u_lo + u_hi) / 2
            up = f_and_slope(-torch.exp(mid))[0] >= 0
            u_hi = torch.where(up, mid, u_hi)
            u_lo = torch.where(up, u_lo, mid)
        lam = -torch.exp((u_lo + u_hi) / 2)
    else:
        # Bracket: f(-1) >= 0 (the top key alone gives 1) and f(-(1/n)^(alpha-1)) <= 0.
        lo = torch.full_like(n, -1.0)
        hi = -(1.0 / n) ** am1
        f_lo, df_lo = f_and_slope(lo)
        for _ in range(n_iter):
            mid = (lo + hi) / 2
            # Newton from the lower end never overshoots a convex decreasing f; the bracket
            # guards against rounding and flat rows.
            step = lo + f_lo / df_lo.clamp(min=torch.finfo(y.dtype).tiny)
            c = torch.where((step > lo) & (step < hi), step, mid)
            f_c, df_c = f_and_slope(c)
            up = f_c >= 0
            lo = torch.where(up, c, lo)
            hi = torch.where(up, hi, c)
            f_lo = torch.where(up, f_c, f_lo)
            df_lo = torch.where(up, df_c, df_lo)
        # The last step starts from sums accumulated in float64 (one more pass, below float64),
        # is kept in float64 and applied as hi + lo (split_threshold): on a long row a float32
        # sum, or a float32 threshold, is too coarse.
        if long_row_sum_dtype(y.shape[-1], y.dtype) is not None:
            f_lo, df_lo = f_and_slope(lo, f64)
        step = lo.to(f64) + f_lo / df_lo.clamp(min=torch.finfo(y.dtype).tiny)
        # Clamped into the bracket: a float32 bracket end may sit a rounding error on the wrong
        # side of the float64 step, which is then still the better estimate.
        lam = torch.minimum(torch.maximum(step, lo.to(f64)), hi.to(f64))
    lam_hi, lam_lo = split_threshold(lam.to(f64), y.dtype)
    p = y - lam_hi
    if y.dtype != f64:
        p = p.sub_(lam_lo)
    p = torch.clamp(p, min=0) ** a
    total = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(total > 0, total, torch.ones_like(total))  # exact normalization
    return p


# -------- the autograd functions of softmax and the entmaxes ---------------------------------


class SoftmaxFunction(Function):
    """Softmax over the last dimension, an all ``-inf`` row giving zeros (and a zero gradient)."""

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
        return entmax_vjp(p, grad)  # s = p: the softmax Jacobian diag(p) - p p^T


class _TsallisBackward(Function):
    """The backward pass of an :math:`\\alpha`-entmax: ``forward`` saves ``p`` and sets ``ctx.alpha``.

    The two arguments after the scores (the order and the method, or the iterations) get no
    gradient."""

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return entmax_vjp(support_weights(p, ctx.alpha), grad), None, None


def sparse_entmax_sort(x: torch.Tensor, top: torch.Tensor, power: int) -> torch.Tensor:
    """Sparsemax (``power=1``) or 1.5-entmax (``power=2``) of the rows of ``x`` by :func:`threshold_sort`."""
    y = (x - top) / power
    hi, lo = threshold_sort(y, power, split=True)
    p = (y - hi).sub_(lo).clamp_(min=0) if y.dtype != torch.float64 else (y - hi).clamp_(min=0)
    return p.square_() if power == 2 else p


def sparse_entmax_newton(x: torch.Tensor, top: torch.Tensor, power: int, live: torch.Tensor) -> torch.Tensor:
    r"""Sparsemax or 1.5-entmax by :func:`threshold_newton`, certified by the residual :math:`\sum_j p_j - 1`.

    The support certificate of :func:`threshold_newton` cannot see a threshold that is on the
    right support but wrong in its last digits; the sum of the weights can.  A live row whose
    weights miss 1 by more than the rounding of its threshold allows,
    :math:`16\,\varepsilon\,(1 + |\delta|\,g)` with :math:`g=|S|` (sparsemax) or
    :math:`g=\sum_S\sqrt{p_j}` (1.5-entmax), the slope of the sum in :math:`\delta`, is solved
    again by sorting (so is a row that failed the support certificate).  One host read per call;
    where reads are not allowed (``method="newton"`` off the CPU) it is that one read.
    """
    buf = torch.empty_like(x)
    delta, delta_lo, bad, size, s1 = threshold_newton(x, top, power, buf, fallback=False)
    p = torch.sub(x, top, out=buf).sub_(delta)  # the buffer's pages are already mapped
    if p.dtype != torch.float64:
        p.sub_(delta_lo)  # the threshold's low part (split_threshold)
    p.clamp_(min=0)
    if power == 2:
        p.mul_(0.5).square_()
    live = live.squeeze(-1)  # (rows with a finite score) an all -inf row sums to 0
    slope = size if power == 1 else s1 / 2  # d sum(p) / d delta: |S|, or sum_S sqrt(p) = s1 / 2
    tol = 16 * torch.finfo(p.dtype).eps * (1 + delta.abs() * slope).squeeze(-1)
    total = p.sum(dim=-1, dtype=long_row_sum_dtype(p.shape[-1], p.dtype)).to(torch.float64)
    bad = bad | ((total - live.to(torch.float64)).abs() > tol)
    if bool(bad.any()):  # one host read per call, outside any loop
        p[bad] = sparse_entmax_sort(x[bad], top[bad], power)
    return p


class SparseEntmaxFunction(_TsallisBackward):
    """Sparsemax (``power=1``) and 1.5-entmax (``power=2``): :math:`p=[(x-\\theta)/power]_+^{power}`."""

    @staticmethod
    def forward(ctx, x, power, method):
        top = x.amax(dim=-1, keepdim=True)
        live = torch.isfinite(top)
        top = torch.where(live, top, torch.zeros_like(top))  # safe_max
        if method == "sort":
            p = sparse_entmax_sort(x, top, power)
        else:
            p = sparse_entmax_newton(x, top, power, live)
        ctx.alpha = 1.0 + 1.0 / power  # sparsemax is 2-entmax, p = [.]_+^(1/(alpha-1))
        ctx.save_for_backward(p)
        return p


class EntmaxBisectFunction(_TsallisBackward):
    """:math:`\\alpha`-entmax for any :math:`\\alpha>1` by :func:`threshold_bisect`."""

    @staticmethod
    def forward(ctx, x, alpha, n_iter):
        p = threshold_bisect(x, alpha, n_iter)
        ctx.alpha = alpha
        ctx.save_for_backward(p)
        return p


def softmax_last(z: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    r""":math:`\operatorname{softmax}(z/\tau)` along the last dimension of checked scores, in their dtype.

    The row maximum is subtracted *before* the division (a small :math:`\tau` would overflow
    :math:`z/\tau`); the weights do not depend on the shift, so no gradient flows through it
    (detached: exact).  An all ``-inf`` row gives zeros (:class:`SoftmaxFunction`)."""
    if tau != 1.0:
        z = (z - safe_max(z).detach()) / tau
    return SoftmaxFunction.apply(z)
