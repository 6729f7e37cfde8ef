r"""Fused Triton row kernels for :func:`~attnopt.transforms.softmax`, ``sparsemax``, ``entmax15`` and ``entmax``.

Every transform here normalises one row at a time, and its threshold :math:`\lambda` is the dual
variable of a one-dimensional problem per row (chapter 3): a single scalar.  So a row that fits on
chip is read once, solved in registers and written once, forward and backward, whatever the number
of iterations the threshold needs.  This module holds those kernels and their autograd functions;
:mod:`attnopt.transforms` dispatches to them (``method="triton"``, or ``"auto"`` on CUDA).

Forward, with :math:`y = x - \max_j x_j` (so the top key is 0 and the result is shift invariant):

* sparsemax, :math:`p=[y-\lambda]_+`: Michelot's passes :math:`\lambda\leftarrow(\sum_S y_j-1)/|S|`
  on :math:`S=\{y_j>\lambda\}` from the lower bound :math:`\lambda=-1`.  Each is the root on a
  superset of the true support, so :math:`\lambda` increases, the support shrinks, and the loop
  ends exactly when the support stops changing (at most :math:`n` passes; a few in practice).
* 1.5-entmax, :math:`p=[y/2-\lambda]_+^2`: Newton steps from :math:`\lambda=-1` on the convex
  decreasing :math:`f(\lambda)=\sum_j[y_j/2-\lambda]_+^2` (monotone from below), and after each the
  closed-form root on the current support (the smaller root of a quadratic, in the cancellation-free
  form of :func:`~attnopt.transforms._thresholds.root_step`).  That root is never below
  :math:`\lambda`, so it is the answer as soon as it keeps the support, or makes the residual
  :math:`f-1` vanish to rounding (a key tied with the threshold): a finite, certified method.
* :math:`\alpha`-entmax, :math:`p=[(\alpha-1)y-\lambda]_+^{1/(\alpha-1)}`: the algorithm of
  :func:`~attnopt.transforms._thresholds.threshold_bisect` (Newton from below with a bisection
  guard for :math:`\alpha\le2`, bisection on :math:`\log(-\lambda)` above), stopping early once the
  threshold stops moving, one more Newton step in float64 and the exact normalisation.
* softmax at temperature :math:`\tau`: :math:`p=e^{y/\tau}/\sum_j e^{y_j/\tau}`.  A kernel of
  its own rather than ``torch.softmax`` plus fixes: the library's conventions (a dead row gives
  zeros, not NaN; NaN or ``+inf`` input is refused) cost ``torch.softmax`` extra passes over memory
  (a reduction for the check, one for the dead rows, a masked fill), while here they are fused into
  the kernel's one read, and the backward is one pass too.

The threshold and every sum are float64 (for any input dtype: a row is at most
:data:`MAX_KEYS` keys, and on-chip float64 costs little next to the memory traffic); the scores are
held in float32 (float64 for float64 input), half-precision input is read as such and written back
in its dtype.  An all ``-inf`` row gives zeros, forward and backward.

Backward, one pass: :math:`\partial s = w\odot(g-\langle w,g\rangle/\sum_j w_j)` with
:math:`w=p^{2-\alpha}` on the support (the indicator for sparsemax, :math:`\sqrt p` for 1.5-entmax,
:math:`p` for softmax, times :math:`1/\tau`).  Under ``create_graph=True`` the backward runs in
differentiable torch ops instead (:func:`~attnopt.transforms._thresholds.entmax_vjp`), so second
derivatives are exact too.

Triton is optional (``pip install "attnopt[triton]"``).  Importing this module never imports it:
the kernels are built on first use, so ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, what the
tests use without a GPU) takes effect if it is set any time before the first call.

References:
    Michelot (1986), *A finite algorithm for finding the projection of a point onto the canonical
    simplex of R^n*.  Martins and Astudillo (2016), *From Softmax to Sparsemax*.  Peters, Niculae and
    Martins (2019), *Sparse Sequence-to-Sequence Models*.
"""

from __future__ import annotations

import functools
import os
import struct

import torch
from torch.autograd import Function

from ._thresholds import entmax_vjp, support_weights
from .._validation import get_checks, require

#: The longest row the kernels hold on chip; longer rows go to the torch paths.
MAX_KEYS = 16384

#: Launches per kernel name since import: tests read it to prove which path ran.
LAUNCHES: dict[str, int] = {"forward": 0, "backward": 0}

# The transforms: the mode constant of the kernels.
SOFTMAX, SPARSEMAX, ENTMAX15, ENTMAX_ALPHA, ENTMAX_ALPHA_ABOVE_2 = 0, 1, 2, 3, 4


def available() -> bool:
    """Whether Triton imports (cached: a failed import is not retried)."""
    return _triton() is not None


@functools.lru_cache(maxsize=None)
def _triton():
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return None
    return triton


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET`` set to a true value)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def usable_on(x: torch.Tensor) -> bool:
    """Whether the kernels can run on ``x``'s device: CUDA, or any device under the interpreter."""
    return x.device.type == "cuda" or (interpreting() and x.device.type == "cpu")


@functools.lru_cache(maxsize=None)
def _kernels():
    """Build (``triton.jit``) the two kernels once, on first use."""
    triton = _triton()
    tl = triton.language

    @triton.jit
    def forward_kernel(x_ptr, p_ptr, ok_ptr, n_rows, n_cols, scale_hi, scale_lo, alpha_hi, alpha_lo, n_iter, max_iter,
                       BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, F64: tl.constexpr):
        # float arguments arrive as float32: the float64 ones come as hi + lo pairs (split_scalar)
        scale = tl.cast(scale_hi, tl.float64) + tl.cast(scale_lo, tl.float64)
        alpha = tl.cast(alpha_hi, tl.float64) + tl.cast(alpha_lo, tl.float64)
        pid = tl.program_id(0)
        rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=float("-inf"))
        if F64:
            x = x.to(tl.float64)
        else:
            x = x.to(tl.float32)
        # the input check, fused: NaN or +inf anywhere in the block clears its flag (no extra pass)
        # (one flag for the whole launch, set to 1 beforehand; only a block with bad input writes it)
        n_bad = tl.sum(tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), axis=1), axis=0)
        tl.store(ok_ptr, tl.full([], 0, tl.uint8), mask=n_bad > 0)
        top = tl.max(x, axis=1)
        live = top > float("-inf")  # an all -inf row (or a padding row of the block) is dead
        top = tl.where(live, top, 0.0)
        y = x - top[:, None]  # -inf stays -inf; the top key is 0
        if MODE == 0:
            # softmax(y / tau); exp(-inf) = 0, and a dead row sums to 0 and gives zeros
            e = tl.exp(y * scale.to(y.dtype))
            total = tl.sum(e, axis=1)
            p = e / tl.where(total > 0, total, 1.0)[:, None]
        elif MODE == 1:
            # sparsemax: Michelot's passes from lam = -1 (the top key alone gives mass 1 there)
            lam = tl.full([BLOCK_R], -1.0, tl.float64)
            prev = tl.full([BLOCK_R], -1.0, tl.float64)
            todo = live
            it = 0
            while (tl.max(todo.to(tl.int32), axis=0) > 0) & (it < max_iter):
                on = y > lam[:, None]
                k = tl.sum(on.to(tl.float64), axis=1)
                s = tl.sum(tl.where(on, y, 0.0).to(tl.float64), axis=1)
                root = (s - 1.0) / tl.where(k > 0, k, 1.0)
                lam = tl.where(todo, root, lam)
                todo = todo & (k != prev)  # the support kept: lam is the root on it, exact
                prev = k
                it += 1
            p = tl.maximum(y.to(tl.float64) - lam[:, None], 0.0)
        elif MODE == 2:
            # 1.5-entmax: Newton from below, and the closed-form root on the support after each step
            z = y * 0.5
            d = tl.full([BLOCK_R], -1.0, tl.float64)
            lam = tl.zeros([BLOCK_R], tl.float64)
            todo = live
            it = 0
            while (tl.max(todo.to(tl.int32), axis=0) > 0) & (it < max_iter):
                r = tl.maximum(z.to(tl.float64) - d[:, None], 0.0)
                s1 = tl.sum(r, axis=1)
                s2 = tl.sum(r * r, axis=1)
                k = tl.sum((r > 0).to(tl.float64), axis=1)
                # the smaller root of k t^2 - 2 s1 t + s2 - 1 = 0, without cancellation (root_step)
                disc = tl.sqrt(tl.maximum(s1 * s1 - k * (s2 - 1.0), 0.0))
                den = s1 + disc
                t = d + tl.where(den > 0, (s2 - 1.0) / tl.where(den > 0, den, 1.0), 0.0)
                rt = tl.maximum(z.to(tl.float64) - t[:, None], 0.0)
                f_t = tl.sum(rt * rt, axis=1)
                k_t = tl.sum((rt > 0).to(tl.float64), axis=1)
                # t >= the threshold always; it is the threshold when it keeps the support, or when
                # the residual vanishes to rounding (a key tied with the threshold leaves it)
                ok = (k_t == k) | (tl.abs(f_t - 1.0) <= 1e-13)
                lam = tl.where(todo & ok, t, lam)
                newton = d + (s2 - 1.0) / tl.where(s1 > 0, 2.0 * s1, 1.0)
                d = tl.where(todo & ~ok, newton, d)
                todo = todo & ~ok
                it += 1
            lam = tl.where(todo, d, lam)  # out of passes (never seen): the last lower bound
            # Polish: the same closed-form root on the final support, but around lam itself.  Taken
            # from a far origin (d = -1, r ~ 1) the sums s1, s2 ~ k lose log2(k) bits to the
            # cancellation in s2 - 1 (rows summed to 1 within only 3e-12 at 16,384 flat keys in
            # float64); around lam, r ~ 1/sqrt(k), s2 ~ 1 and the correction is a rounding error's
            r = tl.maximum(z.to(tl.float64) - lam[:, None], 0.0)
            s1 = tl.sum(r, axis=1)
            s2 = tl.sum(r * r, axis=1)
            k = tl.sum((r > 0).to(tl.float64), axis=1)
            disc = tl.sqrt(tl.maximum(s1 * s1 - k * (s2 - 1.0), 0.0))
            den = s1 + disc
            lam = lam + tl.where(den > 0, (s2 - 1.0) / tl.where(den > 0, den, 1.0), 0.0)
            p = tl.maximum(z.to(tl.float64) - lam[:, None], 0.0)
            p = p * p
        else:
            # alpha-entmax: p = [(alpha - 1) y - lam]_+^(1 / (alpha - 1)), as threshold_bisect
            # (MODE 3: alpha <= 2, MODE 4: alpha > 2)
            am1 = alpha - 1.0
            a = 1.0 / am1
            u = y * am1.to(y.dtype)
            a_w = a.to(y.dtype)  # the exponents in the working dtype, for the passes
            n = tl.maximum(tl.sum((y > float("-inf")).to(tl.float64), axis=1), 1.0)
            if MODE == 3:
                # f(lam) = sum [u - lam]_+^a - 1 is convex and decreasing: Newton from the lower end
                # never overshoots; the bracket [lo, hi] guards against rounding and flat rows
                lo = tl.full([BLOCK_R], -1.0, tl.float64)
                hi = -tl.exp(am1 * tl.log(1.0 / n))
                r = tl.maximum(u - lo.to(u.dtype)[:, None], 0.0)
                ra = tl.where(r > 0, tl.exp((a_w - 1.0) * tl.log(tl.where(r > 0, r, 1.0))), 0.0)  # r^(a-1), 0 off the support
                f_lo = tl.sum((ra * r).to(tl.float64), axis=1) - 1.0
                df_lo = a * tl.sum(ra.to(tl.float64), axis=1)
                todo = live
                it = 0
                while (tl.max(todo.to(tl.int32), axis=0) > 0) & (it < n_iter):
                    mid = (lo + hi) * 0.5
                    step = lo + f_lo / tl.maximum(df_lo, 1e-300)
                    c = tl.where((step > lo) & (step < hi), step, mid)
                    # the candidate rounded to the working dtype, so that f_lo below is f at lo
                    # itself: the last float64 step starts from (lo, f_lo), and a float32 pass at a
                    # rounded c left weights off by 7e-5 (huge offsets, 16,384 keys, alpha = 2)
                    c = c.to(u.dtype).to(tl.float64)
                    r = tl.maximum(u - c.to(u.dtype)[:, None], 0.0)
                    ra = tl.where(r > 0, tl.exp((a_w - 1.0) * tl.log(tl.where(r > 0, r, 1.0))), 0.0)
                    f_c = tl.sum((ra * r).to(tl.float64), axis=1) - 1.0
                    df_c = a * tl.sum(ra.to(tl.float64), axis=1)
                    up = f_c >= 0
                    moved = tl.where(up, c != lo, c != hi)
                    lo = tl.where(todo & up, c, lo)
                    hi = tl.where(todo & ~up, c, hi)
                    f_lo = tl.where(todo & up, f_c, f_lo)
                    df_lo = tl.where(todo & up, df_c, df_lo)
                    todo = todo & moved  # a step that moves nothing has converged
                    it += 1
                step = lo + f_lo / tl.maximum(df_lo, 1e-300)
                lam = tl.minimum(tl.maximum(step, lo), hi)
            else:
                # f is concave, its slope unbounded at the support's edge: bisect on log(-lam),
                # in [(1 - alpha) log n, 0]
                u_lo = -am1 * tl.log(n)
                u_hi = tl.zeros([BLOCK_R], tl.float64)
                todo = live
                it = 0
                while (tl.max(todo.to(tl.int32), axis=0) > 0) & (it < n_iter):
                    mid = (u_lo + u_hi) * 0.5
                    c = -tl.exp(mid)
                    # in float64: near the support's edge p = r^a with a < 1 magnifies the
                    # rounding of r (a float32 r left weights off by 1e-1 at alpha = 5)
                    r = tl.maximum(u.to(tl.float64) - c[:, None], 0.0)
                    q = tl.where(r > 0, tl.exp(a * tl.log(tl.where(r > 0, r, 1.0))), 0.0)
                    up = tl.sum(q.to(tl.float64), axis=1) >= 1.0
                    moved = (mid != u_lo) & (mid != u_hi)
                    u_hi = tl.where(todo & up, mid, u_hi)
                    u_lo = tl.where(todo & ~up, mid, u_lo)
                    todo = todo & moved  # the interval is down to adjacent floats
                    it += 1
                lam = -tl.exp((u_lo + u_hi) * 0.5)
            r = tl.maximum(u.to(tl.float64) - lam[:, None], 0.0)
            q = tl.where(r > 0, tl.exp(a * tl.log(tl.where(r > 0, r, 1.0))), 0.0)
            total = tl.sum(q, axis=1)
            p = q / tl.where(total > 0, total, 1.0)[:, None]  # the exact normalisation
        if not F64:
            p = p.to(tl.float32)  # to half precision through float32 (the interpreter's float64 -> bfloat16 is wrong)
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def backward_kernel(p_ptr, g_ptr, out_ptr, n_rows, n_cols, scale_hi, scale_lo, alpha_hi, alpha_lo,
                        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, F64: tl.constexpr):
        scale = tl.cast(scale_hi, tl.float64) + tl.cast(scale_lo, tl.float64)
        alpha = tl.cast(alpha_hi, tl.float64) + tl.cast(alpha_lo, tl.float64)
        pid = tl.program_id(0)
        rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        p = tl.load(p_ptr + offs, mask=mask, other=0.0)
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        if F64:
            p = p.to(tl.float64)
            g = g.to(tl.float64)
        else:
            p = p.to(tl.float32)
            g = g.to(tl.float32)
        # w = p^(2 - alpha) on the support: p (softmax), 1 (sparsemax), sqrt(p) (1.5-entmax)
        if MODE == 0:
            w = p
        elif MODE == 1:
            w = tl.where(p > 0, 1.0, 0.0).to(p.dtype)
        elif MODE == 2:
            w = tl.sqrt(p)
        else:
            w = tl.where(p > 0, tl.exp((2.0 - alpha).to(p.dtype) * tl.log(tl.where(p > 0, p, 1.0))), 0.0)
        sw = tl.sum(w.to(tl.float64), axis=1)
        swg = tl.sum((w * g).to(tl.float64), axis=1)
        coef = tl.where(sw > 0, swg / tl.where(sw > 0, sw, 1.0), 0.0)  # a dead row: w = 0, gradient 0
        out = w * (g - coef.to(g.dtype)[:, None]) * scale.to(g.dtype)
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)

    return forward_kernel, backward_kernel


@functools.lru_cache(maxsize=None)
def _launch_shape(n_cols: int) -> tuple[int, int, int]:
    """(rows per program, the padded row length, warps).

    About 1,024 entries per program for short rows (8 rows of 128 keys, 2 of 512: several rows per
    program, never one short row each), and 4 entries per thread up to 4,096 keys (8 at 8,192, 16
    at 16,384, at the 32-warp limit).  The solves keep a few float64 temporaries of the whole
    block in registers, and registers bound how many warps an SM keeps in flight to hide memory
    latency.  Compiled for sm_90 (ptxas -v, float32, 128 keys), 8 entries per thread need 148
    (sparsemax), 196 (1.5-entmax) and 152 (alpha-entmax) registers: two or three 4-warp programs,
    8 to 12 warps per SM; 4 entries per thread need 86, 116 and 100: two 8-warp programs, 16
    warps per SM, no spill either way (16 entries per thread spilled).  The largest rows (32
    warps, 16 entries per thread, 64 registers) spill 144 bytes of 1.5-entmax's and alpha-entmax's
    at 16,384 keys (none at 4,096).  Cached: it runs on every call.
    """
    triton = _triton()
    block_n = triton.next_power_of_2(max(n_cols, 1))
    block_r = max(1, min(64, 1024 // block_n))
    warps = max(1, min(32, block_n * block_r // (4 * 32)))
    return block_r, block_n, warps


# The check flags, one per device (and one that nobody reads, for checks "off"): a kernel clears
# its flag when its input holds NaN or +inf, and nothing else writes it, so it needs no fill and
# no reduction per call (one device-side assertion reads it; a failed check read on the host
# sets it again).  After a failed device-side assertion the CUDA context is lost anyway.
_FLAGS: dict = {}


def _flag(device: torch.device, sink: bool = False) -> torch.Tensor:
    flag = _FLAGS.get((device, sink))
    if flag is None:
        with torch.inference_mode(False):  # a flag first made under inference_mode could not be set again outside it
            flag = _FLAGS[(device, sink)] = torch.ones((), dtype=torch.uint8, device=device)
    return flag


def forward(x: torch.Tensor, mode: int, *, scale: float = 1.0, alpha: float = 1.5, n_iter: int = 30,
            flag: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the forward kernel on the rows of ``x`` (keys last, contiguous); the weights in ``x``'s dtype.

    ``flag`` (a 0-dim uint8 tensor on ``x``'s device, 1 before the call) is set to 0 when ``x``
    holds a NaN or ``+inf``: the input check, fused into the kernel's one read.  A scratch flag
    when None.
    """
    fwd, _ = _kernels()
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    p = torch.empty_like(x)  # x is contiguous: the kernel indexes both as (rows, n_cols)
    block_r, block_n, warps = _launch_shape(n_cols)
    if flag is None:
        flag = torch.ones((), dtype=torch.uint8, device=x.device)
    # Michelot needs at most n passes, Newton plus roots on the support a few; a cap, never reached
    max_iter = n_cols + 2 if mode == SPARSEMAX else 100
    fwd[(triton_cdiv(n_rows, block_r),)](x, p, flag, n_rows, n_cols, *split_scalar(scale), *split_scalar(alpha),
                                         n_iter, max_iter, BLOCK_R=block_r, BLOCK_N=block_n, MODE=mode,
                                         F64=x.dtype == torch.float64, num_warps=warps)
    LAUNCHES["forward"] += 1
    return p


def checked_forward(x: torch.Tensor, mode: int, scale: float, alpha: float, n_iter: int, name: str) -> torch.Tensor:
    """:func:`forward` and its input check, per :func:`attnopt._validation.require` (no host read off the CPU)."""
    if get_checks() == "off":
        return forward(x, mode, scale=scale, alpha=alpha, n_iter=n_iter, flag=_flag(x.device, sink=True))
    flag = _flag(x.device)
    p = forward(x, mode, scale=scale, alpha=alpha, n_iter=n_iter, flag=flag)
    try:
        require(flag, f"{name} contains NaN or +inf")
    except ValueError:
        flag.fill_(1)  # read on the host: set it again for the next call
        raise
    return p


def backward(p: torch.Tensor, g: torch.Tensor, mode: int, *, scale: float = 1.0, alpha: float = 1.5) -> torch.Tensor:
    """Launch the backward kernel: the vector-Jacobian product at the output ``p`` (contiguous) for the gradient ``g``."""
    _, bwd = _kernels()
    n_cols = p.shape[-1]
    n_rows = p.numel() // n_cols
    grads = g.contiguous()
    out = torch.empty_like(grads)
    block_r, block_n, warps = _launch_shape(n_cols)
    bwd[(triton_cdiv(n_rows, block_r),)](p, grads, out, n_rows, n_cols, *split_scalar(scale), *split_scalar(alpha),
                                         BLOCK_R=block_r, BLOCK_N=block_n, MODE=mode, F64=p.dtype == torch.float64,
                                         num_warps=warps)
    LAUNCHES["backward"] += 1
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=256)
def split_scalar(v: float) -> tuple[float, float]:
    """``v`` as float32 ``hi + lo`` (Triton passes Python floats as float32; the kernels add them in float64)."""
    hi = struct.unpack("f", struct.pack("f", v))[0]
    return hi, struct.unpack("f", struct.pack("f", v - hi))[0]


def run_rows(x: torch.Tensor, mode: int, *, scale: float = 1.0, alpha: float = 1.5, n_iter: int = 30,
         name: str = "scores") -> torch.Tensor:
    """The transform of the rows of ``x`` (keys last, contiguous) by the kernels, with autograd only when needed.

    Without a gradient to track (inference, ``torch.no_grad``) the kernel is launched directly:
    an autograd ``Function`` costs microseconds per call, which at small shapes is the call.
    """
    if x.requires_grad and torch.is_grad_enabled():
        return TritonRowFunction.apply(x, mode, scale, alpha, n_iter, name)
    return checked_forward(x, mode, scale, alpha, n_iter, name)


class TritonRowFunction(Function):
    r"""Softmax, sparsemax, 1.5-entmax or :math:`\alpha`-entmax of the rows of ``x`` by the fused kernels.

    ``forward(x, mode, scale, alpha, n_iter, name)``: ``x`` has the keys last and is contiguous, in
    any float dtype (half precision is read and written as such); NaN or ``+inf`` in it raise
    ``ValueError`` naming ``name`` (per :func:`attnopt._validation.require`: at once on the CPU, as
    a device-side assertion on a GPU).  The backward is the one-pass kernel; under
    ``create_graph=True`` it is :func:`entmax_vjp` in torch ops, differentiable again.
    """

    @staticmethod
    def forward(ctx, x, mode, scale, alpha, n_iter, name):
        p = checked_forward(x, mode, scale, alpha, n_iter, name)
        ctx.mode, ctx.scale, ctx.alpha = mode, scale, alpha
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # a double backward: torch ops, differentiable again
            alpha = {SOFTMAX: 1.0, SPARSEMAX: 2.0, ENTMAX15: 1.5}.get(ctx.mode, ctx.alpha)
            work = p if p.dtype in (torch.float32, torch.float64) else p.float()
            w = work if ctx.mode == SOFTMAX else support_weights(work, alpha)
            dx = entmax_vjp(w, grad.to(work.dtype)) * ctx.scale
            return dx.to(p.dtype), None, None, None, None, None
        return backward(p, grad, ctx.mode, scale=ctx.scale, alpha=ctx.alpha), None, None, None, None, None
