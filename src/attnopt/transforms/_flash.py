r"""Flash :math:`\alpha`-entmax attention in Triton: the threshold found blockwise from the dual.

Import this module only after deciding to use Triton (:func:`attnopt.transforms.attention.flash_attention`
does so lazily): it imports :mod:`triton` at the top, and ``TRITON_INTERPRET=1`` must be set
before ``triton.jit`` decorates the kernels for them to run on the CPU.

**The problem.**  For one query :math:`i` with scores :math:`s_j = \mathrm{scale}\,\langle q_i,
k_j\rangle` over its allowed keys, write :math:`z_j = (\alpha-1)s_j`.  :math:`\alpha`-entmax is

.. math::

    p_j = [z_j - \tau]_+^{1/(\alpha-1)}, \qquad
    f(\tau) = \sum_j [z_j-\tau]_+^{1/(\alpha-1)} - 1 = 0 ,

where :math:`\tau` is the Lagrange multiplier of :math:`\sum_j p_j = 1`: the solution of a
one-dimensional dual problem whose derivative is :math:`f` (chapter 3).  One scalar per query is
all the state a row needs, which is why the row never has to be stored.

**Bounds.**  With :math:`m = \max_j z_j` and :math:`n` allowed keys, :math:`f(m-1)\ge 0` (the
maximal key alone contributes 1) and :math:`f(m - n^{-(\alpha-1)})\le 0` (every term is at most
:math:`1/n`), so :math:`\tau\in[m-1,\ m-n^{1-\alpha}]`.  A first pass over the key blocks gives
:math:`m`, :math:`n` and the maximum :math:`M_{IJ}` of :math:`z` on every tile (query block
:math:`I` times key block :math:`J`): a matrix of :math:`(n_q/B_M)(n_k/B_N)` numbers.

**Newton from the left, with a bisection guard.**  :math:`f` is decreasing, and for
:math:`\alpha\le 2` also convex, so Newton's step
:math:`\tau \leftarrow \tau + f(\tau)/g(\tau)` with
:math:`g = -f' = \tfrac{1}{\alpha-1}\sum_j [z_j-\tau]_+^{(2-\alpha)/(\alpha-1)}`, started at the
lower bound, increases monotonically to the root; for :math:`\alpha = 2` (sparsemax) :math:`f` is
piecewise linear and Newton ends exactly once the support is found.  For :math:`\alpha>2`
:math:`f` is concave between its kinks and a step may leave the bracket :math:`[lo, hi]`, kept
from the signs of :math:`f`; such a step, or one that does not halve the previous move, is replaced
by bisection.  A row stops when its step, or its bracket, is below a few units in the last place
of :math:`m`.

**Skipping.**  A key with :math:`z_j\le\tau` has weight 0 and no part in :math:`f`, :math:`g`, the
output or the gradient.  So a tile whose maximum :math:`M_{IJ}` is at most :math:`\min_{i\in I}
\tau_i` is never loaded: every pass after the first visits only the tiles that can still meet the
support, and since the iterates increase the set shrinks as the threshold is found.

**Output and what the backward needs.**  The last pass forms :math:`o_i=\sum_jp_{ij}v_j` (divided
by :math:`\sum_j p_{ij}`, which is 1 up to rounding) and, with the weights' derivative
:math:`w_{ij} = \partial p_{ij}/\partial s_{ij} = [z_{ij}-\tau_i]_+^{(2-\alpha)/(\alpha-1)}`
(:math:`=p^{2-\alpha}` on the support), :math:`\bar u_i = \sum_j w_{ij}v_j / \sum_j w_{ij}`.  The
Jacobian of entmax is :math:`\mathrm{diag}(w)-ww^\top/\sum w`, so with
:math:`dp_{ij} = \langle do_i, v_j\rangle`

.. math::

    ds_{ij} = w_{ij}\,(dp_{ij} - \delta_i),\qquad \delta_i = \frac{\sum_j w_{ij}\,dp_{ij}}{\sum_j w_{ij}}
    = \langle do_i, \bar u_i\rangle ,

    dq_i = \mathrm{scale}\sum_j ds_{ij}k_j,\quad dk_j = \mathrm{scale}\sum_i ds_{ij} q_i,\quad
    dv_j = \sum_i p_{ij}\, do_i ,

computed tile by tile as in FlashAttention-2 (scores recomputed, the same tiles skipped): one
kernel over key blocks for :math:`dk, dv`, one over query blocks for :math:`dq`.  Softmax
(:math:`\alpha = 1`) is the online-softmax flash algorithm (Dao, 2023): the state is the log-sum-exp
:math:`\ell_i`, :math:`p_{ij}=e^{s_{ij}-\ell_i}`, :math:`w = p` and :math:`\delta_i = \langle do_i,
o_i\rangle`.  Nothing of size :math:`n_q\times n_k` is stored, forward or backward.

Masks: key :math:`j` is allowed for query :math:`i` when the padding mask keeps it and, if causal,
:math:`j \le i + n_k - n_q` (queries aligned with the last keys).  A query with no allowed key has
output 0 and gradient 0 (the library's dead-row convention); its state is :math:`\tau=+\infty`.

References:
    Peters, Niculae and Martins (2019), *Sparse Sequence-to-Sequence Models* (entmax, its
    threshold and Jacobian).  Dao (2023), *FlashAttention-2* (the tiling of forward and backward).
    Gonçalves et al. (2025), *AdaSplash* (flash entmax attention with Halley/bisection steps).
"""

from __future__ import annotations

import math

import torch

from .._numerics import differentiable_once

try:
    import triton
    import triton.language as tl
except ImportError:  # the core without the triton extra: the module imports (the package's test
    triton = tl = None  # imports every module), and flash_attention never reaches the kernels


def _jit(fn):
    """``triton.jit`` where Triton is installed (compiled, or interpreted under TRITON_INTERPRET=1)."""
    return fn if triton is None else triton.jit(fn)

# MODE: which transform (a compile-time constant, so each kernel specialises its powers).
SOFTMAX, SPARSEMAX, ENTMAX15, ENTMAX = 0, 1, 2, 3


@_jit
def _scores(q, K, b, kb, n_k, n_q, d, KM, offs_m, coef, causal_off,
            HAS_KM: tl.constexpr, CAUSAL: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, WORK: tl.constexpr, DOT: tl.constexpr):
    """Tile of z = coef * q k^T (coef = (alpha-1)*scale, or scale for softmax), -inf where not allowed."""
    offs_n = kb * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    k = tl.load(K + b * n_k * d + offs_n[:, None] * d + offs_d[None, :],
                mask=(offs_n[:, None] < n_k) & (offs_d[None, :] < d), other=0.0).to(DOT)
    z = tl.dot(q, tl.trans(k), input_precision="ieee", out_dtype=WORK) * coef
    allowed = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
    if HAS_KM:
        keep = tl.load(KM + b * n_k + offs_n, mask=offs_n < n_k, other=0)
        allowed = allowed & (keep[None, :] != 0)
    if CAUSAL:
        allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + causal_off)
    return tl.where(allowed, z, float("-inf")), allowed, offs_n


@_jit
def _key_blocks_end(pid_m, n_k, causal_off, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Number of key blocks a query block may see (causal: up to its last query's diagonal)."""
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, tl.maximum((pid_m + 1) * BM + causal_off, 0))
    return tl.cdiv(hi, BN)


@_jit
def _weights(x, pexp, wexp, MODE: tl.constexpr):
    """p = [x]_+^{1/(alpha-1)} and w = dp/ds = [x]_+^{(2-alpha)/(alpha-1)} from x = z - tau."""
    pos = x > 0
    if MODE == 1:
        p = tl.where(pos, x, 0.0)
        w = tl.where(pos, 1.0, 0.0).to(x.dtype)
    elif MODE == 2:
        p = tl.where(pos, x * x, 0.0)
        w = tl.where(pos, x, 0.0)
    else:
        lx = tl.log(tl.where(pos, x, 1.0))
        p = tl.where(pos, tl.exp(pexp * lx), 0.0)
        w = tl.where(pos, tl.exp(wexp * lx), 0.0)
    return p, w


@_jit
def _max_kernel(Q, K, KM, TileMax, RowMax, Count, n_q, n_k, d, coef, causal_off, n_qb, n_kb,
                HAS_KM: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BD: tl.constexpr, WORK: tl.constexpr, DOT: tl.constexpr):
    """Pass 1: the row maxima m_i, the counts of allowed keys, and the tile maxima M_IJ."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)  # 64-bit offsets: batch x heads x n x d passes 2^31
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    q = tl.load(Q + b * n_q * d + offs_m[:, None] * d + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < d), other=0.0).to(DOT)
    m = tl.full((BM,), float("-inf"), WORK)
    cnt = tl.zeros((BM,), WORK)
    for kb in range(0, _key_blocks_end(pid_m, n_k, causal_off, CAUSAL, BM, BN)):
        z, allowed, offs_n = _scores(q, K, b, kb, n_k, n_q, d, KM, offs_m, coef, causal_off,
                                     HAS_KM, CAUSAL, BN, BD, WORK, DOT)
        m = tl.maximum(m, tl.max(z, axis=1))
        cnt += tl.sum(allowed.to(WORK), axis=1)
        tl.store(TileMax + (b * n_qb + pid_m) * n_kb + kb, tl.max(tl.max(z, axis=1), axis=0))
    tl.store(RowMax + b * n_q + offs_m, m, mask=offs_m < n_q)
    tl.store(Count + b * n_q + offs_m, cnt, mask=offs_m < n_q)


@_jit
def _entmax_fwd_kernel(Q, K, V, KM, TileMax, RowMax, Count, O, Tau, Ubar, Visits,
                       n_q, n_k, d, dv, coef, causal_off, n_qb, n_kb, am1, pexp, wexp, tol_rel, max_iter,
                       MODE: tl.constexpr, HAS_KM: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, WORK: tl.constexpr, DOT: tl.constexpr):
    """Newton/bisection passes for tau, then the output pass (o, tau, u-bar), skipping dead tiles."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)  # 64-bit offsets: batch x heads x n x d passes 2^31
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    row_ok = offs_m < n_q
    q = tl.load(Q + b * n_q * d + offs_m[:, None] * d + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < d), other=0.0).to(DOT)
    m = tl.load(RowMax + b * n_q + offs_m, mask=row_ok, other=float("-inf"))
    cnt = tl.load(Count + b * n_q + offs_m, mask=row_ok, other=0.0)
    live = cnt > 0
    m0 = tl.where(live, m, 0.0)
    lo = m0 - 1.0
    hi = m0 - tl.exp(-am1 * tl.log(tl.maximum(cnt, 1.0)))
    tau = lo
    tol = tol_rel * tl.maximum(tl.abs(m0), 1.0)
    n_end = _key_blocks_end(pid_m, n_k, causal_off, CAUSAL, BM, BN)
    visits = 0  # tiles loaded by the threshold passes
    out_visits = 0  # tiles loaded by the output pass
    active = live
    moved = hi - lo + 1.0  # the length of the previous move (none yet: the whole bracket)
    concave = am1 > 1.0
    it = 0
    while (it < max_iter) & (tl.sum(active.to(tl.int32), axis=0) > 0):
        tau_min = tl.min(tl.where(live, tau, float("inf")), axis=0)
        f = tl.zeros((BM,), WORK)
        g = tl.zeros((BM,), WORK)
        for kb in range(0, n_end):
            if tl.load(TileMax + (b * n_qb + pid_m) * n_kb + kb) > tau_min:
                z, allowed, offs_n = _scores(q, K, b, kb, n_k, n_q, d, KM, offs_m, coef, causal_off,
                                             HAS_KM, CAUSAL, BN, BD, WORK, DOT)
                p, w = _weights(z - tau[:, None], pexp, wexp, MODE)
                f += tl.sum(p, axis=1)
                g += tl.sum(w, axis=1)
                visits += 1
        f = f - 1.0
        g = g * pexp  # -f'(tau)
        lo = tl.where(active & (f > 0), tau, lo)
        hi = tl.where(active & (f < 0), tau, hi)
        step = f / tl.where(g > 0, g, 1.0)
        done = (tl.abs(step) <= tol) | (f == 0) | (hi - lo <= tol)
        cand = tau + step
        # Bisect when Newton leaves the bracket, and (alpha > 2, where f is not convex) when it
        # does not at least halve the previous move (the guard of Numerical Recipes' rtsafe).
        bad = (g <= 0) | (cand < lo) | (cand > hi) | (concave & (tl.abs(step) > 0.5 * moved))
        cand = tl.where(bad, 0.5 * (lo + hi), cand)
        active = active & ~done
        moved = tl.where(active, tl.abs(cand - tau), moved)
        tau = tl.where(active, cand, tau)
        it += 1
    # Output pass: o = sum p v / sum p, u-bar = sum w v / sum w.
    tau_min = tl.min(tl.where(live, tau, float("inf")), axis=0)
    acc_o = tl.zeros((BM, BDV), WORK)
    acc_u = tl.zeros((BM, BDV), WORK)
    sp = tl.zeros((BM,), WORK)
    sw = tl.zeros((BM,), WORK)
    for kb in range(0, n_end):
        if tl.load(TileMax + (b * n_qb + pid_m) * n_kb + kb) > tau_min:
            z, allowed, offs_n = _scores(q, K, b, kb, n_k, n_q, d, KM, offs_m, coef, causal_off,
                                         HAS_KM, CAUSAL, BN, BD, WORK, DOT)
            p, w = _weights(z - tau[:, None], pexp, wexp, MODE)
            v = tl.load(V + b * n_k * dv + offs_n[:, None] * dv + offs_v[None, :],
                        mask=(offs_n[:, None] < n_k) & (offs_v[None, :] < dv), other=0.0).to(DOT)
            acc_o = tl.dot(p.to(DOT), v, acc_o, input_precision="ieee", out_dtype=WORK)
            acc_u = tl.dot(w.to(DOT), v, acc_u, input_precision="ieee", out_dtype=WORK)
            sp += tl.sum(p, axis=1)
            sw += tl.sum(w, axis=1)
            out_visits += 1
    o = tl.where(live[:, None], acc_o / tl.where(sp > 0, sp, 1.0)[:, None], 0.0)
    u = tl.where(live[:, None], acc_u / tl.where(sw > 0, sw, 1.0)[:, None], 0.0)
    out_mask = row_ok[:, None] & (offs_v[None, :] < dv)
    tl.store(O + b * n_q * dv + offs_m[:, None] * dv + offs_v[None, :], o.to(O.dtype.element_ty), mask=out_mask)
    tl.store(Ubar + b * n_q * dv + offs_m[:, None] * dv + offs_v[None, :], u, mask=out_mask)
    tl.store(Tau + b * n_q + offs_m, tl.where(live, tau, float("inf")), mask=row_ok)
    tl.store(Visits + (b * n_qb + pid_m) * 3, visits)
    tl.store(Visits + (b * n_qb + pid_m) * 3 + 1, out_visits)
    tl.store(Visits + (b * n_qb + pid_m) * 3 + 2, it)


@_jit
def _softmax_fwd_kernel(Q, K, V, KM, O, Lse, n_q, n_k, d, dv, coef, causal_off,
                        HAS_KM: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BD: tl.constexpr, BDV: tl.constexpr, WORK: tl.constexpr, DOT: tl.constexpr):
    """Online softmax (FlashAttention-2): running max, running sum, rescaled accumulator."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)  # 64-bit offsets: batch x heads x n x d passes 2^31
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    row_ok = offs_m < n_q
    q = tl.load(Q + b * n_q * d + offs_m[:, None] * d + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < d), other=0.0).to(DOT)
    m = tl.full((BM,), float("-inf"), WORK)
    lsum = tl.zeros((BM,), WORK)
    acc = tl.zeros((BM, BDV), WORK)
    for kb in range(0, _key_blocks_end(pid_m, n_k, causal_off, CAUSAL, BM, BN)):
        z, allowed, offs_n = _scores(q, K, b, kb, n_k, n_q, d, KM, offs_m, coef, causal_off,
                                     HAS_KM, CAUSAL, BN, BD, WORK, DOT)
        m_new = tl.maximum(m, tl.max(z, axis=1))
        # A row with no allowed key so far keeps m = -inf: shift by 0 there, not by -inf (NaN).
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(z - shift[:, None])
        rescale = tl.exp(m - shift)
        v = tl.load(V + b * n_k * dv + offs_n[:, None] * dv + offs_v[None, :],
                    mask=(offs_n[:, None] < n_k) & (offs_v[None, :] < dv), other=0.0).to(DOT)
        acc = tl.dot(p.to(DOT), v, acc * rescale[:, None], input_precision="ieee", out_dtype=WORK)
        lsum = lsum * rescale + tl.sum(p, axis=1)
        m = m_new
    live = lsum > 0
    o = tl.where(live[:, None], acc / tl.where(live, lsum, 1.0)[:, None], 0.0)
    lse = tl.where(live, m + tl.log(tl.where(live, lsum, 1.0)), float("inf"))
    tl.store(O + b * n_q * dv + offs_m[:, None] * dv + offs_v[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_v[None, :] < dv))
    tl.store(Lse + b * n_q + offs_m, lse, mask=row_ok)


@_jit
def _probs(z, state, pexp, wexp, MODE: tl.constexpr):
    """(p, w) of a tile from its z and the per-query state (lse for softmax, tau otherwise)."""
    if MODE == 0:
        p = tl.exp(z - state[:, None])
        w = p
    else:
        p, w = _weights(z - state[:, None], pexp, wexp, MODE)
    return p, w


@_jit
def _bwd_kv_kernel(Q, K, V, KM, TileMax, State, Delta, dO, dK, dV,
                   n_q, n_k, d, dv, coef, scale, causal_off, n_qb, n_kb, pexp, wexp,
                   MODE: tl.constexpr, HAS_KM: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, WORK: tl.constexpr, DOT: tl.constexpr):
    """dk_j = scale sum_i ds_ij q_i and dv_j = sum_i p_ij do_i for one key block, over query blocks."""
    kb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)  # 64-bit offsets: batch x heads x n x d passes 2^31
    offs_n = kb * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    col_ok = offs_n < n_k
    v = tl.load(V + b * n_k * dv + offs_n[:, None] * dv + offs_v[None, :],
                mask=col_ok[:, None] & (offs_v[None, :] < dv), other=0.0).to(DOT)
    dk = tl.zeros((BN, BD), WORK)
    dvacc = tl.zeros((BN, BDV), WORK)
    qb_start = 0
    if CAUSAL:
        # Query i sees key j only if i >= j - causal_off.
        qb_start = tl.maximum(kb * BN - causal_off, 0) // BM
    for qb in range(qb_start, n_qb):
        offs_m = qb * BM + tl.arange(0, BM)
        row_ok = offs_m < n_q
        state = tl.load(State + b * n_q + offs_m, mask=row_ok, other=float("inf"))
        go = True
        if MODE != 0:
            go = tl.load(TileMax + (b * n_qb + qb) * n_kb + kb) > tl.min(state, axis=0)
        if go:
            q = tl.load(Q + b * n_q * d + offs_m[:, None] * d + offs_d[None, :],
                        mask=row_ok[:, None] & (offs_d[None, :] < d), other=0.0).to(DOT)
            do = tl.load(dO + b * n_q * dv + offs_m[:, None] * dv + offs_v[None, :],
                         mask=row_ok[:, None] & (offs_v[None, :] < dv), other=0.0).to(DOT)
            delta = tl.load(Delta + b * n_q + offs_m, mask=row_ok, other=0.0)
            z, allowed, _ = _scores(q, K, b, kb, n_k, n_q, d, KM, offs_m, coef, causal_off,
                                    HAS_KM, CAUSAL, BN, BD, WORK, DOT)
            p, w = _probs(z, state, pexp, wexp, MODE)
            dvacc = tl.dot(tl.trans(p.to(DOT)), do, dvacc, input_precision="ieee", out_dtype=WORK)
            dp = tl.dot(do, tl.trans(v), input_precision="ieee", out_dtype=WORK)
            ds = w * (dp - delta[:, None])
            dk = tl.dot(tl.trans(ds.to(DOT)), q, dk, input_precision="ieee", out_dtype=WORK)
    tl.store(dK + b * n_k * d + offs_n[:, None] * d + offs_d[None, :], (dk * scale).to(dK.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < d))
    tl.store(dV + b * n_k * dv + offs_n[:, None] * dv + offs_v[None, :], dvacc.to(dV.dtype.element_ty),
             mask=col_ok[:, None] & (offs_v[None, :] < dv))


@_jit
def _bwd_q_kernel(Q, K, V, KM, TileMax, State, Delta, dO, dQ,
                  n_q, n_k, d, dv, coef, scale, causal_off, n_qb, n_kb, pexp, wexp,
                  MODE: tl.constexpr, HAS_KM: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, WORK: tl.constexpr, DOT: tl.constexpr):
    """dq_i = scale sum_j ds_ij k_j for one query block, over the key blocks it may see."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)  # 64-bit offsets: batch x heads x n x d passes 2^31
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    row_ok = offs_m < n_q
    q = tl.load(Q + b * n_q * d + offs_m[:, None] * d + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < d), other=0.0).to(DOT)
    do = tl.load(dO + b * n_q * dv + offs_m[:, None] * dv + offs_v[None, :],
                 mask=row_ok[:, None] & (offs_v[None, :] < dv), other=0.0).to(DOT)
    state = tl.load(State + b * n_q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(Delta + b * n_q + offs_m, mask=row_ok, other=0.0)
    state_min = tl.min(state, axis=0)
    dq = tl.zeros((BM, BD), WORK)
    for kb in range(0, _key_blocks_end(pid_m, n_k, causal_off, CAUSAL, BM, BN)):
        go = True
        if MODE != 0:
            go = tl.load(TileMax + (b * n_qb + pid_m) * n_kb + kb) > state_min
        if go:
            z, allowed, offs_n = _scores(q, K, b, kb, n_k, n_q, d, KM, offs_m, coef, causal_off,
                                         HAS_KM, CAUSAL, BN, BD, WORK, DOT)
            p, w = _probs(z, state, pexp, wexp, MODE)
            v = tl.load(V + b * n_k * dv + offs_n[:, None] * dv + offs_v[None, :],
                        mask=(offs_n[:, None] < n_k) & (offs_v[None, :] < dv), other=0.0).to(DOT)
            k = tl.load(K + b * n_k * d + offs_n[:, None] * d + offs_d[None, :],
                        mask=(offs_n[:, None] < n_k) & (offs_d[None, :] < d), other=0.0).to(DOT)
            dp = tl.dot(do, tl.trans(v), input_precision="ieee", out_dtype=WORK)
            ds = w * (dp - delta[:, None])
            dq = tl.dot(ds.to(DOT), k, dq, input_precision="ieee", out_dtype=WORK)
    tl.store(dQ + b * n_q * d + offs_m[:, None] * d + offs_d[None, :], (dq * scale).to(dQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < d))


# -------- host side ---------------------------------------------------------------------------

_TL = {} if tl is None else {torch.float32: tl.float32, torch.float64: tl.float64, torch.float16: tl.float16,
                               torch.bfloat16: tl.bfloat16}


def _mode(alpha: float) -> int:
    if alpha - 1.0 <= 1e-6:  # as attnopt.transforms.entmax: softmax within 1e-6 of alpha = 1
        return SOFTMAX
    if alpha == 2.0:
        return SPARSEMAX
    if alpha == 1.5:
        return ENTMAX15
    return ENTMAX


def _pow2(n: int, low: int = 16) -> int:
    return max(low, 1 << (max(n, 1) - 1).bit_length())


def default_blocks(dtype: torch.dtype, d: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for the GPU: 64 x 64 tiles, smaller for float64 and wide heads."""
    if dtype == torch.float64 or d > 128:
        return 32, 32
    return 64, 64


class _Plan:
    """Shapes, constants and block sizes shared by the forward and backward launches."""

    def __init__(self, q, k, v, key_mask, alpha, scale, causal, block_m, block_n, max_iter):
        self.B, self.n_q, self.d = q.shape
        self.n_k, self.dv = k.shape[1], v.shape[2]
        self.alpha, self.scale, self.causal = alpha, scale, causal
        self.mode = _mode(alpha)
        self.work = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.WORK = _TL[self.work]
        # Half-precision inputs enter the tensor-core products as they are (exact products, float32
        # sums, as FlashAttention does); weights are rounded to that dtype only for p @ v.
        # Triton 3.9's interpreter gets bfloat16 products wrong (a bare tl.dot of two bfloat16
        # tiles is off by 1e10), so on the CPU bfloat16 is multiplied in float32.
        self.DOT = self.WORK if q.dtype == torch.bfloat16 and not q.is_cuda else _TL[q.dtype]
        bm, bn = default_blocks(q.dtype, self.d) if block_m is None else (block_m, block_n)
        self.BM, self.BN = bm, bn
        self.BD, self.BDV = _pow2(self.d), _pow2(self.dv)
        self.n_qb, self.n_kb = triton.cdiv(self.n_q, bm), triton.cdiv(self.n_k, bn)
        self.coef = scale if self.mode == SOFTMAX else (alpha - 1.0) * scale
        am1 = alpha - 1.0
        self.am1 = am1
        self.pexp = 1.0 / am1 if am1 > 0 else 1.0
        self.wexp = (2.0 - alpha) / am1 if am1 > 0 else 1.0
        self.causal_off = self.n_k - self.n_q
        # Triton (3.6 at least) sizes a register dot operand by the narrowest load it depends on:
        # an int8 mask behind the float64 weights asks for a float64 MMA layout its lowering
        # rejects ("fp64 don't support largeK MMA"), so float64 reads a 64-bit mask.
        if key_mask is not None and self.work == torch.float64:
            key_mask = key_mask.to(torch.int64)
        self.key_mask = key_mask
        self.has_km = key_mask is not None
        self.tol_rel = 4.0 * torch.finfo(self.work).eps
        self.max_iter = max_iter

    def km(self, like):
        # A 1-element placeholder when there is no mask (never read: HAS_KM is a constant).
        return self.key_mask if self.has_km else torch.empty(1, dtype=torch.int8, device=like.device)


def forward(q, k, v, key_mask, alpha, scale, causal, block_m=None, block_n=None, max_iter=100):
    """Run the forward kernels on contiguous (B, n, d) tensors.

    Returns ``(o, state, ubar, tile_max, visits)``: ``state`` is tau (entmax) or the log-sum-exp
    (softmax) per query, ``ubar`` is u-bar (entmax; None for softmax), ``tile_max`` the tile maxima
    (None for softmax), ``visits`` per query block: the tiles loaded by the threshold passes, the
    tiles loaded by the output pass, and the number of threshold passes (None for softmax).
    """
    P = _Plan(q, k, v, key_mask, alpha, scale, causal, block_m, block_n, max_iter)
    dev = q.device
    o = torch.empty(P.B, P.n_q, P.dv, dtype=q.dtype, device=dev)
    grid = (P.n_qb, P.B)
    km = P.km(q)
    if P.mode == SOFTMAX:
        lse = torch.empty(P.B, P.n_q, dtype=P.work, device=dev)
        _softmax_fwd_kernel[grid](q, k, v, km, o, lse, P.n_q, P.n_k, P.d, P.dv, P.coef, P.causal_off,
                                  HAS_KM=P.has_km, CAUSAL=P.causal, BM=P.BM, BN=P.BN, BD=P.BD, BDV=P.BDV,
                                  WORK=P.WORK, DOT=P.DOT)
        return o, lse, None, None, None, P
    tile_max = torch.full((P.B, P.n_qb, P.n_kb), float("-inf"), dtype=P.work, device=dev)
    row_max = torch.empty(P.B, P.n_q, dtype=P.work, device=dev)
    count = torch.empty(P.B, P.n_q, dtype=P.work, device=dev)
    _max_kernel[grid](q, k, km, tile_max, row_max, count, P.n_q, P.n_k, P.d, P.coef, P.causal_off,
                      P.n_qb, P.n_kb, HAS_KM=P.has_km, CAUSAL=P.causal, BM=P.BM, BN=P.BN, BD=P.BD, WORK=P.WORK, DOT=P.DOT)
    tau = torch.empty(P.B, P.n_q, dtype=P.work, device=dev)
    ubar = torch.empty(P.B, P.n_q, P.dv, dtype=P.work, device=dev)
    visits = torch.zeros(P.B, P.n_qb, 3, dtype=torch.int32, device=dev)
    _entmax_fwd_kernel[grid](q, k, v, km, tile_max, row_max, count, o, tau, ubar, visits,
                             P.n_q, P.n_k, P.d, P.dv, P.coef, P.causal_off, P.n_qb, P.n_kb, P.am1, P.pexp,
                             P.wexp, P.tol_rel, P.max_iter, MODE=P.mode, HAS_KM=P.has_km, CAUSAL=P.causal,
                             BM=P.BM, BN=P.BN, BD=P.BD, BDV=P.BDV, WORK=P.WORK, DOT=P.DOT)
    return o, tau, ubar, tile_max, visits, P


def backward(P, q, k, v, o, state, ubar, tile_max, do):
    """dq, dk, dv from the saved per-query state (no n_q x n_k tensor)."""
    do = do.contiguous()
    # delta_i = <do_i, o_i> (softmax) or <do_i, u-bar_i> (entmax): one number per query.
    delta = (do.to(P.work) * (o.to(P.work) if P.mode == SOFTMAX else ubar)).sum(-1)
    if tile_max is None:
        tile_max = torch.empty(1, dtype=P.work, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    km = P.km(q)
    common = dict(MODE=P.mode, HAS_KM=P.has_km, CAUSAL=P.causal, BM=P.BM, BN=P.BN, BD=P.BD, BDV=P.BDV, WORK=P.WORK, DOT=P.DOT)
    args = (P.n_q, P.n_k, P.d, P.dv, P.coef, P.scale, P.causal_off, P.n_qb, P.n_kb, P.pexp, P.wexp)
    _bwd_kv_kernel[(P.n_kb, P.B)](q, k, v, km, tile_max, state, delta, do, dk, dv, *args, **common)
    _bwd_q_kernel[(P.n_qb, P.B)](q, k, v, km, tile_max, state, delta, do, dq, *args, **common)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: forward and backward both through the kernels above (first derivatives
    only: a second backward raises; the dense path has exact second derivatives)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, alpha, scale, causal, block_m, block_n, max_iter):
        o, state, ubar, tile_max, visits, P = forward(q, k, v, key_mask, alpha, scale, causal, block_m, block_n, max_iter)
        ctx.plan = P
        ctx.save_for_backward(q, k, v, o, state, ubar, tile_max)
        ctx.graph_inputs = (q, k, v)  # a second derivative raises (differentiable_once), never drops to 0
        if visits is None:
            visits = torch.zeros(0, dtype=torch.int32, device=q.device)
        ctx.mark_non_differentiable(visits)
        return o, visits

    @staticmethod
    @differentiable_once
    def backward(ctx, do, _dvisits):
        q, k, v, o, state, ubar, tile_max = ctx.saved_tensors
        dq, dk, dv = backward(ctx.plan, q, k, v, o, state, ubar, tile_max, do)
        return dq, dk, dv, None, None, None, None, None, None, None


def tile_count(n_q: int, n_k: int, block_m: int, block_n: int, causal: bool) -> int:
    """Tiles a query block range may see in one pass (per batch entry): the no-skipping count."""
    total = 0
    off = n_k - n_q
    for qb in range(math.ceil(n_q / block_m)):
        hi = min(n_k, max((qb + 1) * block_m + off, 0)) if causal else n_k
        total += math.ceil(hi / block_n)
    return total
