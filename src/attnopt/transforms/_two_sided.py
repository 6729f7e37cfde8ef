"""Two-sided (Sinkhorn) attention: the public entry :func:`attnopt.transforms.sinkhorn_attention`,
re-exported by :mod:`attnopt.transforms` (its iterations and autograd functions are the engine
``._sinkhorn``)."""

from __future__ import annotations

import math
import warnings

import torch

from .._numerics import ConvergenceWarning
from .._validation import (
    as_float_tensor,
    check_bool,
    check_bool_mask,
    check_choice,
    check_finite,
    check_int,
    check_positive,
    require,
)
from ._rows import empty_result as _empty_result, work_dtype as _work_dtype
from ._sinkhorn import (
    SinkhornImplicitFunction,
    SinkhornResult,
    SinkhornUnrolledFunction,
    column_error,
    rows_to_attention,
    sinkhorn_plan,
)
from ._thresholds import safe_max

__all__ = ["sinkhorn_attention"]


def sinkhorn_attention(scores: torch.Tensor, eps: float = 1.0, n_iter: int = 1000, *, tol: float | None = 1e-5,
                       key_mask: torch.Tensor | None = None, query_mask: torch.Tensor | None = None,
                       grad: str = "unrolled", absorb_every: int = 10, return_info: bool = False):
    r"""Two-sided (doubly stochastic) attention: the entropic OT plan between queries and keys.

    .. math::

        \begin{aligned}
        P^\star &= \arg\min_{P\in U(a,b)} \sum_{ij} C_{ij}P_{ij} - \varepsilon H(P),\\
        C_{ij} &= -s_{ij}, \qquad W_{ij} = P^\star_{ij}/a_i ,
        \end{aligned}

    eq. (3) of MTandHJ (2025) (the entropic problem whose one-sided special case, eq. (4), is
    softmax), with uniform marginals :math:`a_i = 1/n`, :math:`b_j = 1/m` over the live queries and
    keys: the attention of Sander et al. (2022).  The solution is
    :math:`P^\star = \mathrm{diag}(e^{f})\,e^{s/\varepsilon}\,\mathrm{diag}(e^{g})`, computed by
    Sinkhorn iterations (Cuturi, 2013, Alg. 1) in the log domain.  Each ends with the row update,
    so every live row of :math:`W` sums to exactly 1; the columns reach :math:`n/m` only at
    convergence (:math:`W` is then doubly stochastic when :math:`n=m`).  What is solved is stated
    by the column marginal error of the returned plan :math:`P_{ij}=a_iW_{ij}`,

    .. math::

        e(P) = \sum_j \Bigl|\sum_i P_{ij} - b_j\Bigr| ,

    (its rows are exact), an :math:`\ell_1` distance between probability vectors, at most 2.

    * By default (``tol=1e-5``) the iterations stop once :math:`e(P)\le` ``tol`` for every problem
      of the batch, tested every 10 iterations (one host read each); if ``n_iter`` iterations do
      not get there, a warning (``attnopt.ConvergenceWarning``, a ``RuntimeWarning``) names
      the error reached.  The number needed grows as :math:`\varepsilon` shrinks relative to the
      range of the scores, and varies widely between problems: on 180 draws of
      :math:`32\times32` standard-normal scores, 10 iterations at :math:`\varepsilon=1` on
      every draw, and at :math:`\varepsilon=0.1` between 100 and 11,300 (median about 1,000;
      the tail is long).  Chapter 3's Sinkhorn page gives the ranges against the score range.
    * With ``tol=None`` exactly ``n_iter`` iterations run, with no convergence test and no host
      read: the mode for a GPU's hot path and for the unrolled gradient of a fixed computation.

    Args:
        scores: ``(..., n_queries, n_keys)``; ``-inf`` entries get zero mass.
        eps: entropic regularization :math:`\varepsilon>0` (the temperature).
        n_iter: the largest number of Sinkhorn iterations (with ``tol``), or the exact number
            (``tol=None``).
        tol: the column marginal error :math:`e(P)` to reach, or ``None`` for a fixed count.
        key_mask: boolean ``(..., n_keys)``, ``True`` = real key; padding keys get zero mass and
            are excluded from the marginal (:math:`b_j = 1/m_{\text{valid}}`).
        query_mask: boolean ``(..., n_queries)``, ``True`` = real query; padded queries get all-zero
            rows.  Rows (columns) whose scores are all ``-inf`` are treated as padded too.
        grad: ``"unrolled"`` (the exact gradient of the iterations run, as autograd would give
            it, from a hand-written reverse pass that touches only vectors per iteration and forms
            the kernel's adjoint once per re-exponentiation; it keeps one kernel per
            ``absorb_every`` iterations) or ``"implicit"`` (implicit differentiation at the fixed
            point, keeping the plan only; exact only at convergence).  Both are differentiable
            once: a second derivative raises ``RuntimeError``.  Without a gradient to compute
            (``torch.no_grad()``, or scores that do not require one) no kernel is kept.
        absorb_every: iterations between re-exponentiations of the stabilized kernel (1 = plain
            log-domain iteration, most robust for very small ``eps``).
        return_info: also return the marginal error and the number of iterations run.

    Returns:
        Attention weights :math:`W` shaped like ``scores``, in its dtype; with ``return_info=True``
        a :class:`SinkhornResult` ``(weights, marginal_error, n_iter)``, ``marginal_error`` being
        :math:`e(P)` per problem, shaped ``scores.shape[:-2]``.  Empty scores give an empty result.

    Raises:
        TypeError: ``scores`` not floating, masks not boolean tensors.
        ValueError: NaN or ``+inf`` scores, ``eps <= 0``, ``tol <= 0``, ``n_iter < 1``, unknown
            ``grad``, masks that do not fit.

    Examples:
        A square :math:`W` is doubly stochastic to the tolerance:

        >>> scores = torch.randn(4, 4)
        >>> out = sinkhorn_attention(scores, eps=1.0, return_info=True)
        >>> ones = torch.ones(4)
        >>> torch.allclose(out.weights.sum(-1), ones)
        True
        >>> torch.allclose(out.weights.sum(-2), ones, atol=1e-4)
        True
        >>> bool(out.marginal_error <= 1e-5)
        True

        At a small ``eps`` many more iterations are needed; the old default, 20 fixed
        iterations, leaves the columns off by 2%:

        >>> s = torch.tensor([[2.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
        >>> out = sinkhorn_attention(s, eps=0.1, return_info=True)
        >>> out.n_iter, bool(out.marginal_error <= 1e-5)
        (300, True)
        >>> fixed = sinkhorn_attention(s, eps=0.1, n_iter=20, tol=None,
        ...                            return_info=True)
        >>> round(float(fixed.marginal_error), 3)
        0.023

    References:
        MTandHJ (2025), blog note on Litman (2025), eqs. (3)–(4).  Cuturi (2013), *Sinkhorn
        Distances*, Alg. 1.  Sander et al. (2022), *Sinkformers: Transformers with Doubly
        Stochastic Attention*.
    """
    x = as_float_tensor(scores, "scores", min_ndim=2)
    check_finite(x, "scores", allow_neg_inf=True)
    eps = check_positive(eps, "eps")
    n_iter = check_int(n_iter, "n_iter")
    if tol is not None:
        tol = check_positive(tol, "tol")
    absorb_every = check_int(absorb_every, "absorb_every")
    check_choice(grad, "grad", ("unrolled", "implicit"))
    return_info = check_bool(return_info, "return_info")
    n_queries, n_keys = x.shape[-2:]
    if key_mask is not None:
        check_bool_mask(key_mask, "key_mask", x.shape[:-2] + (n_keys,), device=x.device, meaning="True = real key")
    if query_mask is not None:
        check_bool_mask(query_mask, "query_mask", x.shape[:-2] + (n_queries,), device=x.device, meaning="True = real query")
    if x.numel() == 0:
        W = _empty_result(x)
        return SinkhornResult(W, x.new_zeros(x.shape[:-2], dtype=_work_dtype(x)), 0) if return_info else W
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
    M = (M - safe_max(M).detach()) / eps  # the plan does not depend on the shift: detach is exact
    a = rows.to(M.dtype)
    a = a / a.sum(dim=-1, keepdim=True).clamp(min=1)
    b = cols.to(M.dtype)
    b = b / b.sum(dim=-1, keepdim=True).clamp(min=1)
    info: list[int] = []
    if M.device.type == "meta":  # no values to test: run the n_iter iterations
        tol = None
    if not (torch.is_grad_enabled() and M.requires_grad):  # no gradient: keep no kernel
        W = rows_to_attention(sinkhorn_plan(M, a, b, n_iter, absorb_every, tol=tol, info=info), a)
    elif grad == "implicit":
        W = SinkhornImplicitFunction.apply(M, a, b, n_iter, absorb_every, tol, info)
    else:
        f0 = -safe_max(M).squeeze(-1)
        W = rows_to_attention(SinkhornUnrolledFunction.apply(M, f0, a, b, n_iter, absorb_every, tol, info), a)
    error = None
    if tol is not None or return_info:
        error = column_error(W.detach() * a.unsqueeze(-1), b)
    if tol is not None:
        reached = float(error.max())  # the tolerance mode reads the host (tol=None never does)
        if not reached <= tol:
            warnings.warn(f"sinkhorn_attention did not converge: column marginal error {reached:.3g} after "
                          f"{info[0]} iterations (tol={tol:g}, eps={eps:g}); raise n_iter or eps, or pass "
                          f"tol=None for a fixed count", ConvergenceWarning, stacklevel=2)
    W = W.to(x.dtype)
    return SinkhornResult(W, error, info[0]) if return_info else W
