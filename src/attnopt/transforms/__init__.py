r"""Attention weights as solutions of regularized one-sided transport problems (chapter 3).

Litman (2025) shows that the softmax weights of one query solve a one-sided entropic transport
problem; the blog note MTandHJ (2025) on that paper writes it as the minimizer over the simplex
:math:`\Delta^{m-1}` of its eq. (4),

.. math::

    J(p) = \sum_j C_j\, p_j + \varepsilon\, \Omega(p), \qquad C_j = -s_j ,

with :math:`\Omega=-H` (its eq. (13) writes the cost term as :math:`-\sum_j C_j p_j`, a sign slip:
with :math:`C_j=-s_j` the cost enters with a plus sign).  Each choice of :math:`\Omega` gives a
transform (the note's table, and Litman's "changing the regularizer"):

* :math:`\Omega(p)=\sum_j p_j\log p_j` gives :math:`\operatorname{softmax}(s/\varepsilon)`: :func:`softmax`;
* :math:`\Omega(p)=\tfrac12\|p\|^2` gives :math:`p_j=[s_j/\varepsilon-\lambda]_+`: :func:`sparsemax`;
* the Tsallis :math:`\alpha`-entropy gives
  :math:`p_j=[(\alpha-1)s_j-\lambda]_+^{1/(\alpha-1)}`: :func:`entmax`, :func:`entmax15`;
* :math:`\Omega(p)=\mathrm{KL}(p\,\|\,\pi)` gives :math:`p_j\propto \pi_j e^{s_j/\varepsilon}`:
  :func:`prior_softmax` (ALiBi is a prior, :func:`alibi_log_prior`).

:func:`one_sided_eot` solves the same problem by a generic dual bisection that uses only
:math:`\nabla\Omega`, so that every closed form above can be checked against it.
:func:`sinkhorn_attention` is the two-sided problem (both marginals fixed, the note's eq. (3)).
The thresholds, the generic solver, Sinkhorn's iterations and the autograd functions of the
transforms live in the package.s private modules (``attnopt.transforms._*``).

Conventions shared by every transform here:

* ``-inf`` scores are forbidden keys and get weight exactly 0 (and gradient 0).
* A row whose scores are all ``-inf`` has no feasible point on the simplex; we *define* its output
  to be the all-zero row (as :func:`attnopt.transforms.attention.attention_weights` does), with zero gradient.
  Nothing returns NaN, forward or backward.
* ``float16``/``bfloat16`` inputs are computed in ``float32`` and the result is cast back.
* ``+inf`` or NaN scores raise ``ValueError``.

References:
    Litman (2025), *Scaled-Dot-Product Attention as One-Sided Entropic Optimal Transport*,
    arXiv:2508.08369 (stated by content: we do not cite its numbering).  MTandHJ (2025), blog note
    on it, eqs. (1)–(5), (12)–(13) and its table of regularizers.  Martins and Astudillo (2016),
    *From Softmax to Sparsemax*.  Peters, Niculae and Martins (2019), *Sparse Sequence-to-Sequence
    Models*.  Press, Smith and Lewis (2022), *Train Short, Test Long* (ALiBi).  Cuturi (2013),
    *Sinkhorn Distances*.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .._numerics import log_or_neg_inf
from .._optional import require as optional_require
from . import _triton as K  # torch only: Triton itself is imported at first use
from ._one_sided import one_sided_plan
from ._rows import empty_result as _empty_result, from_last as _from_last, to_last as _to_last, work_dtype as _work_dtype
from ._sinkhorn import SinkhornResult
from ._thresholds import (
    EntmaxBisectFunction,
    SoftmaxFunction,
    SparseEntmaxFunction,
    bisect_iterations,
    safe_max,
    softmax_last,
)
from ._two_sided import sinkhorn_attention
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool,
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
    "SinkhornResult",
    "sinkhorn_attention",
    "softmax",
    "sparsemax",
]

_METHODS = ("auto", "newton", "sort", "triton")


# -------- the fused Triton kernels (attnopt.transforms._triton): when to take them ------------


def _use_triton(x: torch.Tensor, dim: int, method: str, name: str = "scores") -> bool:
    """Whether ``method`` sends ``x`` to the fused Triton row kernels.

    ``"triton"`` always does, and says why it cannot (Triton missing, a CPU tensor without
    ``TRITON_INTERPRET=1``, rows longer than the kernels hold); ``"auto"`` does on CUDA when Triton
    imports and a row fits on chip, and never elsewhere (without Triton, or on the CPU, every
    function runs as before).
    """
    if method not in ("auto", "triton"):
        return False
    n = x.shape[dim] if x.ndim else 1
    if method == "auto":
        return x.device.type == "cuda" and 0 < n <= K.MAX_KEYS and x.numel() > 0 and K.available()
    if not K.available():
        optional_require("triton", "method='triton'")  # raises ImportError naming the extra
    if not K.usable_on(x):
        raise ValueError(
            f"method='triton' runs on CUDA tensors, or on CPU ones under Triton's interpreter "
            f"(TRITON_INTERPRET=1 set before the first call); {name} is on {x.device.type}"
            + ("" if x.device.type != "cpu" else " and TRITON_INTERPRET is not set")
        )
    if n > K.MAX_KEYS:
        raise ValueError(f"method='triton' holds rows of at most {K.MAX_KEYS} keys on chip; {name} has "
                         f"{n} along dim={dim}: use method='auto', which sends longer rows to the torch path")
    return True


def _triton_rows(x: torch.Tensor, dim: int, mode: int, *, scale: float = 1.0, alpha: float = 1.5,
                 n_iter: int = 30, name: str = "scores") -> torch.Tensor:
    """The rows of ``x`` along ``dim`` through the fused kernels, in ``x``'s dtype (checked there)."""
    if x.numel() == 0:
        return _empty_result(x)
    last = x.ndim - 1
    z = x if dim == last else x.movedim(dim, -1)
    p = K.run_rows(z.contiguous(), mode, scale=scale, alpha=alpha, n_iter=n_iter, name=name)
    return p if dim == last else p.movedim(-1, dim)


# -------- shared plumbing (the normalized dimension last, in a working dtype): ._rows -------


def _prepare(scores, dim: int, name: str = "scores", *, check: bool = True) -> tuple[torch.Tensor, int]:
    x = as_float_tensor(scores, name, min_ndim=1)
    if check:  # the Triton kernels check in their own read instead
        check_finite(x, name, allow_neg_inf=True)
    return x, check_dim(dim, x.ndim)


# -------- softmax and prior softmax: the entropic regularizers -------------------------------


def softmax(scores: torch.Tensor, tau: float = 1.0, dim: int = -1, *, method: str = "auto") -> torch.Tensor:
    r"""Softmax at temperature :math:`\tau`, the entropic one-sided transport plan of Litman (2025).

    .. math::

        p_j = \frac{\exp(s_j/\tau)}{\sum_l \exp(s_l/\tau)}
            = \arg\min_{p\in\Delta} \; -\langle s, p\rangle + \tau \sum_j p_j \log p_j ,

    eq. (1) and the result (5), (12) of MTandHJ (2025) (cost :math:`C_j=-s_j`,
    :math:`\varepsilon=\tau`); the "forward problem" of Litman (2025).

    Args:
        scores: any shape; ``-inf`` marks a forbidden key.
        tau: temperature :math:`\tau > 0` (the entropic regularization strength).
        dim: dimension that is normalized.
        method: ``"auto"`` (the fused Triton kernel on CUDA when Triton imports and a row has at
            most ``attnopt.transforms._triton.MAX_KEYS`` keys, else ``"torch"``), ``"torch"``
            (``torch.softmax`` and a fix of the all-``-inf`` rows) or ``"triton"`` (the kernel:
            one read and one write per pass, the input check and the dead rows fused into it; the
            speed of ``torch.softmax``, which alone would give NaN on a dead row and needs extra
            passes to fix and check it).

    Returns:
        Weights of the shape and dtype of ``scores``; an all-``-inf`` row gives an all-zero row.

    Raises:
        TypeError: ``scores`` not a floating tensor, ``dim`` not an int.
        ValueError: ``tau <= 0``, ``dim`` out of range, NaN or ``+inf`` scores, unknown ``method``,
            ``method="triton"`` on a CPU tensor without ``TRITON_INTERPRET=1`` or on too long rows.
        ImportError: ``method="triton"`` without Triton installed.

    Examples:
        >>> softmax(torch.tensor([1.0, 2.0, float("-inf")]), tau=0.5)
        tensor([0.1192, 0.8808, 0.0000])

    References:
        Litman (2025), *Scaled-Dot-Product Attention as One-Sided Entropic Optimal Transport*, the
        forward-pass theorem.  MTandHJ (2025), blog note on it, eqs. (1), (4)–(5), (12).
    """
    x = as_float_tensor(scores, "scores", min_ndim=1)
    d = check_dim(dim, x.ndim)
    tau = check_positive(tau, "tau")
    check_choice(method, "method", ("auto", "torch", "triton"))
    if _use_triton(x, d, method):
        return _triton_rows(x, d, 0, scale=1.0 / tau)  # mode 0: softmax
    check_finite(x, "scores", allow_neg_inf=True)
    if x.numel() == 0:
        return _empty_result(x)
    return _from_last(softmax_last(_to_last(x, d), tau), d, x)


def prior_softmax(scores: torch.Tensor, prior: torch.Tensor, tau: float = 1.0, dim: int = -1, *,
                  log_prior: bool = False) -> torch.Tensor:
    r"""Softmax regularized towards a prior :math:`\pi` by :math:`\tau\,\mathrm{KL}(p\,\|\,\pi)`.

    .. math::

        p_j = \frac{\pi_j \exp(s_j/\tau)}{\sum_l \pi_l \exp(s_l/\tau)}
            = \arg\min_{p\in\Delta} \; -\langle s, p\rangle + \tau\,\mathrm{KL}(p\,\|\,\pi),

    the "PriorSoftmax" row of the table of MTandHJ (2025) (the table drops the factor :math:`\tau` in
    front of the KL; with it, the stated minimizer is exact).  ALiBi is the special case of a
    log-prior that is linear in the query-key distance, :math:`\log\pi_{ij} = -m\,|i-j|/\tau`; see
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

    Examples:
        Equal scores give the prior itself, normalized:

        >>> prior_softmax(torch.zeros(3), torch.tensor([1.0, 1.0, 2.0]))
        tensor([0.2500, 0.2500, 0.5000])

    References:
        MTandHJ (2025), blog note on Litman (2025), eq. (13) and the PriorSoftmax row of its table.
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
        log_pi = log_or_neg_inf(prior.to(_work_dtype(x)))  # no 0 * inf = NaN in the prior's gradient
    if 0 in shape:
        return _empty_result(torch.broadcast_to(x, shape))
    # Shift the scores by their row maximum before dividing: a small tau would overflow s / tau.
    z = x.to(_work_dtype(x))
    z = (z - safe_max(z.movedim(d, -1)).movedim(-1, d).detach()) / tau + log_pi
    d = check_dim(dim, z.ndim)
    return _from_last(SoftmaxFunction.apply(_to_last(z, d)), d, x)


def alibi_log_prior(n_queries: int, n_keys: int, slope, *, causal: bool = True, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    r"""ALiBi of Press, Smith and Lewis (2022) as a log-prior over query-key distances, for :func:`prior_softmax`.

    .. math::

        \log \pi_{ij} = \begin{cases} -m\,(i' - j) & j \le i',\\ -\infty & j > i', \end{cases}
        \qquad\text{or}\qquad \log \pi_{ij} = -m\,|i'-j|

    when causal or not, with :math:`i' = i + n_{\text{keys}} - n_{\text{queries}}` (queries aligned
    with the last keys).  ``prior_softmax(s, alibi_log_prior(...), log_prior=True)`` equals the
    ALiBi attention ``softmax(s + b)`` at :math:`\tau=1`; at other temperatures pass
    ``log_prior / tau`` (Litman (2025) names ALiBi as a prior-type regularizer :math:`\Omega`).

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

    Examples:
        >>> alibi_log_prior(2, 3, 0.5)
        tensor([[-0.5000, -0.0000,    -inf],
                [-1.0000, -0.5000, -0.0000]])

    References:
        Press, Smith and Lewis (2022), *Train Short, Test Long: Attention with Linear Biases Enables
        Input Length Extrapolation*, Sec. 3.  Litman (2025), the closing discussion of regularizers.
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


# -------- sparsemax, 1.5-entmax and alpha-entmax: the Tsallis regularizers -------------------


def _sparse_entmax(scores, dim: int, method: str, power: int) -> torch.Tensor:
    x, d = _prepare(scores, dim, check=False)
    check_choice(method, "method", _METHODS)
    if _use_triton(x, d, method):
        return _triton_rows(x, d, power)  # mode 1: sparsemax, 2: 1.5-entmax
    check_finite(x, "scores", allow_neg_inf=True)
    if method == "auto":
        # On CPU a full sort costs far more than a handful of Newton passes (which read the host to
        # retire settled rows, free there); on GPUs sorting is cheap and never synchronises.
        method = "newton" if host_reads_allowed(x) else "sort"
    if x.numel() == 0:
        return _empty_result(x)
    return _from_last(SparseEntmaxFunction.apply(_to_last(x, d), power, method), d, x)


def sparsemax(scores: torch.Tensor, dim: int = -1, *, method: str = "auto") -> torch.Tensor:
    r"""Sparsemax of Martins and Astudillo (2016), the Euclidean projection of the scores onto the simplex.

    .. math::

        \begin{gathered}
        p = \arg\min_{p\in\Delta}\; -\langle s, p\rangle + \tfrac12\|p\|_2^2 ,\\
        p_j = [s_j - \lambda]_+ \quad\text{with } \lambda \text{ such that } \textstyle\sum_j p_j = 1,
        \end{gathered}

    the "Sparsemax" row of the table of MTandHJ (2025) (its threshold, written :math:`\tau` there, is
    :math:`\lambda` here).  Exact: the threshold is found by sorting (``method="sort"``) or by
    Michelot/Newton passes with two certificates, the support and the residual
    :math:`\sum_jp_j-1`, and a sorting fallback (``method="newton"``, several times faster on
    CPU), or by a fused Triton kernel that runs Michelot's passes on each row in registers (one
    read, one write; ``method="triton"``, see ``attnopt.transforms._triton``); ``"auto"`` picks
    Triton on CUDA (when it imports and a row has at most 16,384 keys), Newton on CPU, sort
    elsewhere.  Both end with one solve on the support
    from sums accumulated in float64 and apply the threshold in two parts, so that rows sum to 1
    within a few units of the dtype's last place at any length (:math:`10^6` keys tested) and
    offset.  Backward is closed form: :math:`\partial p/\partial s = \mathrm{diag}(m) - m m^\top/|S|`
    with :math:`m` the support indicator.

    Args:
        scores: any shape; ``-inf`` entries get weight 0; an all-``-inf`` row gives zeros.
        dim: dimension that is normalized.
        method: ``"auto"``, ``"sort"``, ``"newton"`` or ``"triton"``.

    Returns:
        Sparse weights shaped and typed like ``scores``.

    Raises:
        TypeError: ``scores`` not floating, ``dim`` not an int, ``method`` not a string.
        ValueError: ``dim`` out of range, NaN/``+inf`` scores, unknown ``method``,
            ``method="triton"`` on a CPU tensor without ``TRITON_INTERPRET=1`` or on too long rows.
        ImportError: ``method="triton"`` without Triton installed.

    Examples:
        >>> sparsemax(torch.tensor([2.0, 1.5, 0.0]))
        tensor([0.7500, 0.2500, 0.0000])

    References:
        Martins and Astudillo (2016), *From Softmax to Sparsemax*, eq. (2), Prop. 1 and Algorithm 1.
        MTandHJ (2025), blog note on Litman (2025), the Sparsemax row of its table.
    """
    return _sparse_entmax(scores, dim, method, power=1)


def entmax15(scores: torch.Tensor, dim: int = -1, *, method: str = "auto") -> torch.Tensor:
    r"""1.5-entmax of Peters, Niculae and Martins (2019), the Tsallis-regularized transport plan with :math:`\alpha=3/2`.

    .. math::

        \begin{gathered}
        p = \arg\min_{p\in\Delta}\; -\langle s, p\rangle
        + \tfrac{4}{3}\big(\textstyle\sum_j p_j^{3/2} - 1\big),\\
        p_j = \big[\tfrac{s_j}{2} - \lambda\big]_+^{2} \quad\text{with } \lambda \text{ such that }
        \textstyle\sum_j p_j = 1,
        \end{gathered}

    the :math:`\alpha`-entmax case of Litman's (2025) "changing :math:`\Omega(p)`" (see :func:`entmax`
    for general :math:`\alpha`).  Exact (sort, Newton with certificate, or the fused Triton kernel,
    as in :func:`sparsemax`; the kernel takes Newton steps from below and the closed-form root on
    the support after each, certified by the support or the residual);
    backward :math:`\partial p/\partial s = \mathrm{diag}(\sqrt p) - \sqrt p\sqrt p^\top/\sum_j\sqrt{p_j}`.

    Args:
        scores, dim, method: as in :func:`sparsemax`.

    Returns:
        Sparse weights shaped and typed like ``scores``, smoother than sparsemax's.

    Raises:
        TypeError, ValueError: as :func:`sparsemax`.

    Examples:
        >>> entmax15(torch.tensor([2.0, 1.5, 0.0]))
        tensor([0.6740, 0.3260, 0.0000])

    References:
        Peters, Niculae and Martins (2019), *Sparse Sequence-to-Sequence Models* (1.5-entmax and its
        exact sort-based algorithm).  Litman (2025), the closing discussion of regularizers.
    """
    return _sparse_entmax(scores, dim, method, power=2)


def entmax(scores: torch.Tensor, alpha: float, dim: int = -1, n_iter: int | None = None, tol: float | None = None, *,
           method: str = "auto") -> torch.Tensor:
    r""":math:`\alpha`-entmax of Peters, Niculae and Martins (2019) for any :math:`\alpha\ge 1`.

    .. math::

        \begin{aligned}
        p_j &= \big[(\alpha-1)s_j - \lambda\big]_+^{1/(\alpha-1)},\qquad \textstyle\sum_j p_j=1,\\
        p &= \arg\min_{p\in\Delta}\; -\langle s,p\rangle
        + \frac{\sum_j p_j^\alpha - 1}{\alpha(\alpha-1)} ,
        \end{aligned}

    the Tsallis (1988) family that Litman (2025) obtains by "changing the regularizer
    :math:`\Omega(p)`": :math:`\alpha\to 1` is :func:`softmax` (used when
    :math:`|\alpha-1|\le 10^{-6}`), :math:`\alpha=2` is :func:`sparsemax`, :math:`\alpha=1.5` is
    :func:`entmax15`.  The threshold is refined for a fixed number of iterations with no host
    synchronization (Newton from below for :math:`\alpha\le2`, bisection on
    :math:`\log(-\lambda)` above), by default to the working precision, and the result is
    normalized to sum to one.  The default matters for large :math:`\alpha`: near the edge of
    the support :math:`p_j = r_j^{1/(\alpha-1)}` turns an error :math:`\epsilon` in the threshold
    into :math:`\epsilon^{1/(\alpha-1)}` (a threshold to :math:`10^{-6}` gave weights off by
    :math:`10^{-2}` at :math:`\alpha=5`).  Backward is closed form,
    :math:`\partial p/\partial s = \mathrm{diag}(w) - w w^\top/\sum_j w_j` with
    :math:`w = p^{2-\alpha}` on the support, written in differentiable operations (second
    derivatives are exact too).

    Args:
        scores: any shape; ``-inf`` entries get weight 0; an all-``-inf`` row gives zeros.
        alpha: :math:`\alpha\ge1`.
        dim: dimension that is normalized.
        n_iter: number of refinement iterations; by default what ``tol`` needs: with ``tol=None``
            30 Newton steps for :math:`\alpha\le2` and, above, the bisection steps that resolve
            :math:`\log(-\lambda)` (an interval of width :math:`W=(\alpha-1)\log n` for
            :math:`n` keys) to a quarter of the dtype's epsilon; with a ``tol``,
            :math:`\lceil\log_2(1/\mathrm{tol})\rceil` (:math:`\alpha\le2`) or
            :math:`\lceil\log_2(W/\mathrm{tol})\rceil` steps.
        tol: target accuracy on the threshold (relative for :math:`\alpha>2`), used only when
            ``n_iter`` is None; None (the default) means the working precision.
        method: ``"auto"`` (``"triton"`` on CUDA when Triton imports and a row has at most
            16,384 keys, else ``"bisect"``), ``"bisect"`` (the torch path) or ``"triton"`` (the
            same iteration in a fused kernel, each row in registers, stopping early once the
            threshold stops moving; ``n_iter`` is then the most it takes, by default the count
            that resolves the threshold to float64 precision whatever the dtype).

    Returns:
        Weights shaped and typed like ``scores``.

    Raises:
        TypeError: ``scores`` not floating, ``alpha`` or ``tol`` not a real number, ``n_iter`` not an int.
        ValueError: ``alpha < 1``, ``tol <= 0``, ``n_iter < 1``, ``dim`` out of range, unknown
            ``method``, ``method="triton"`` on a CPU tensor without ``TRITON_INTERPRET=1`` or on
            too long rows.
        ImportError: ``method="triton"`` without Triton installed.

    Examples:
        :math:`\alpha=1.5` is :func:`entmax15`, computed by bisection instead of sorting:

        >>> s = torch.tensor([2.0, 1.5, 0.0])
        >>> torch.allclose(entmax(s, 1.5), entmax15(s), atol=1e-6)
        True

    References:
        Peters, Niculae and Martins (2019), *Sparse Sequence-to-Sequence Models* (:math:`\alpha`-entmax
        and its bisection).  Tsallis (1988), *Possible Generalization of Boltzmann-Gibbs
        Statistics*.  Litman (2025), the closing discussion of regularizers.
    """
    x, d = _prepare(scores, dim, check=False)
    alpha = check_number(alpha, "alpha", low=1.0, hint=" (alpha=1 is softmax)")
    if tol is not None:
        tol = check_positive(tol, "tol")
    check_choice(method, "method", ("auto", "bisect", "triton"))
    # On an H200 (2026-11-28) the kernel agreed with the bisection only to 2e-8 in float64 for
    # alpha = 1.3 (1e-16 under the interpreter): until that is understood, "auto" keeps float64
    # on the bisection; float32 and half precision, whose resolution is far coarser, take the kernel
    triton = _use_triton(x, d, method) and not (method == "auto" and x.dtype == torch.float64)
    if n_iter is None:
        # The kernel's passes are in registers and stop once the threshold stops moving: it can
        # afford to resolve the threshold to float64 precision whatever the dtype (near the
        # support's edge, for alpha > 2, float32's resolution left weights off by 0.5 at alpha = 5)
        work = torch.float64 if triton else _work_dtype(x)
        n_iter = bisect_iterations(alpha, x.shape[d] if x.ndim else 1, work, tol)
    n_iter = check_int(n_iter, "n_iter")
    if triton:
        if alpha - 1.0 <= 1e-6:
            return _triton_rows(x, d, 0)  # softmax
        return _triton_rows(x, d, 3 if alpha <= 2.0 else 4, alpha=alpha, n_iter=n_iter)
    check_finite(x, "scores", allow_neg_inf=True)
    if x.numel() == 0:
        return _empty_result(x)
    y = _to_last(x, d)
    if alpha - 1.0 <= 1e-6:
        return _from_last(SoftmaxFunction.apply(y), d, x)
    return _from_last(EntmaxBisectFunction.apply(y, alpha, n_iter), d, x)


# -------- the generic one-sided problem (the reference solver) -------------------------------


def one_sided_eot(cost: torch.Tensor, eps: float = 1.0, regularizer: str | Callable = "entropy", *, alpha: float = 1.5,
                  prior: torch.Tensor | None = None, n_iter: int = 60, dim: int = -1) -> torch.Tensor:
    r"""Solve the regularized one-sided transport problem by a generic method.

    .. math::

        p^\star = \arg\min_{p\in\Delta^{m-1}}\; \sum_j C_j p_j + \varepsilon\,\Omega(p),

    eq. (4) of MTandHJ (2025) (the "forward problem" of Litman (2025)) with :math:`-H` replaced by a
    separable strictly convex :math:`\Omega(p)=\sum_j \omega_j(p_j)` (the note's eq. (13)).  The
    solver uses only :math:`\omega'`: it bisects on the multiplier :math:`\lambda` of
    :math:`\sum_j p_j=1` and, inside, inverts the stationarity condition
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
        TypeError: ``cost`` not floating, ``n_iter`` not an int, ``regularizer`` neither a string nor
            a callable.
        ValueError: ``eps <= 0``, unknown regularizer, ``alpha <= 1`` for Tsallis, missing prior.

    Examples:
        The entropic problem is solved by softmax:

        >>> C = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)
        >>> torch.allclose(one_sided_eot(C, 0.5), softmax(-C, tau=0.5))
        True

    References:
        MTandHJ (2025), blog note on Litman (2025), eqs. (4) and (13).  Litman (2025), the forward
        problem.
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
    return one_sided_plan(work, eps, regularizer, alpha, n_iter, active, log_prior).movedim(-1, d).to(c.dtype)
