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

import torch
from torch.autograd import Function

from ._validation import host_reads_allowed


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
    return (g - coef).mul_(s)


def support_weights(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """:math:`p^{2-\\alpha}` on the support, 0 elsewhere (also for alpha >= 2)."""
    if alpha == 2.0:
        return torch.sign(p)
    if alpha < 2.0:
        return p ** (2.0 - alpha)
    on = p > 0
    return torch.where(on, torch.where(on, p, torch.ones_like(p)) ** (2.0 - alpha), torch.zeros_like(p))


def threshold_sort(y: torch.Tensor, power: int) -> torch.Tensor:
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


def threshold_newton(x: torch.Tensor, top: torch.Tensor, power: int, buf: torch.Tensor, max_steps: int = 12) -> torch.Tensor:
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

    def moments(row_scores, row_tops, d, out):  # sum of [y - d]_+, of its square (power 2), and the support size
        s1 = torch.sub(row_scores, row_tops, out=out).sub_(d).clamp_(min=0).sum(dim=-1, keepdim=True)
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
    # Certificate (Michelot's settled rows are exact by construction and need none).
    bad = unsettled
    if power == 2 or not reads:
        count = torch.sub(rows, tops, out=scratch).sub_(result).clamp_(min=0).sign_().sum(dim=-1, keepdim=True)
        bad = bad | (count != sizes).squeeze(-1)
    if bool(bad.any()):  # one host read per call, outside any loop
        y = (rows[bad] - tops[bad]) / power
        result[bad] = power * threshold_sort(y, power)
    return result.reshape(top.shape)


def threshold_bisect(x: torch.Tensor, alpha: float, n_iter: int) -> torch.Tensor:
    r"""The weights :math:`p=[(\alpha-1)(x-\max x)-\lambda]_+^{1/(\alpha-1)}` of :math:`\alpha`-entmax, normalized.

    The threshold :math:`\lambda` is bracketed in :math:`[-1,-n^{1-\alpha}]` (the top key alone gives mass 1 at
    :math:`-1`; :math:`n` live keys give at most 1 at the upper end) and refined for ``n_iter``
    iterations without a host read: Newton steps from the lower end for :math:`\alpha\le2`, where
    :math:`f(\lambda)=\sum_j[y_j-\lambda]_+^{1/(\alpha-1)}-1` is convex and decreasing (so they never
    overshoot; the bracket guards against rounding and flat rows), bisection for :math:`\alpha>2`.
    ``x`` has the keys last; ``alpha > 1``.
    """
    am1 = alpha - 1.0
    a = 1.0 / am1  # p = [y - lam]_+^a
    y = (x - safe_max(x)) * am1
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


class SparseEntmaxFunction(_TsallisBackward):
    """Sparsemax (``power=1``) and 1.5-entmax (``power=2``): :math:`p=[(x-\\theta)/power]_+^{power}`."""

    @staticmethod
    def forward(ctx, x, power, method):
        top = safe_max(x)
        if method == "sort":
            y = (x - top) / power
            p = torch.clamp(y - threshold_sort(y, power), min=0)
        else:
            buf = torch.empty_like(x)
            delta = threshold_newton(x, top, power, buf)
            p = torch.sub(x, top, out=buf).sub_(delta).clamp_(min=0)  # the buffer's pages are already mapped
            if power == 2:
                p.mul_(0.5)
        if power == 2:
            p = p.square_()
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
