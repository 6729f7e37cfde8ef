r"""Attention as the approximate solution of a Fenchel dual (chapter 1).

Anonymous authors (2024) estimate the mean :math:`h` of an unknown distribution :math:`p` over
templates :math:`t_1,\dots,t_n\in\mathbb{R}^d` from a *preference* :math:`u\in\Delta^{n-1}` (with
mean :math:`\mu=\sum_i u_i t_i`) and a noisy *evidence* :math:`z` of the shift :math:`h-\mu`.  With
:math:`b=\mu+z` they solve, eq. (4),

.. math::

    \min_{p}\; \frac{\alpha}{2}\Big\lVert b-\sum_i p_i t_i\Big\rVert^2
    + \operatorname{KL}(p\,\Vert\,u),

through its Fenchel dual, eqs. (9)–(10),

.. math::

    \max_{\lambda\in\mathbb{R}^d}\; D(\lambda)=\langle\lambda,b\rangle
    -\frac{1}{2\alpha}\lVert\lambda\rVert^2
    -\log\sum_i u_i e^{\langle t_i,\lambda\rangle},

whose maximizer :math:`\lambda^*` gives the primal solution :math:`\tilde p_i\propto u_i
e^{\langle t_i,\lambda^*\rangle}` (eq. 11) and the estimate :math:`\hat h=\sum_i\tilde p_i t_i`
(eq. 12).  Replacing :math:`\lambda^*` by :math:`\alpha z` (eq. 16), exact to first order in
:math:`\alpha`, gives the *generalized attention* of eq. (18); dot-product attention, boolean masks
and T5's relative-position bias are choices of :math:`u` (eqs. 19–20).  The entropic
optimal-transport variant of their Sec. 9 (eqs. 23–25, 36–41) replaces the KL term by an entropic
transport cost to :math:`u`.  The functions below follow that order; the Newton solvers of the duals
live in ``attnopt.fenchel._solvers``.

**Shape convention.**  ``templates`` is ``(..., n, d)``.  A first argument (``z``, ``b`` or
``lam``) with as many dimensions as ``templates`` is a stack of queries ``(..., n_q, d)`` that share
the templates; with any other number of dimensions it is one vector ``(..., d)`` per template set,
its leading dimensions broadcast against those of ``templates``.  Preferences ``u`` broadcast (by
PyTorch's right-aligned rule) against the weights, ``(..., n)`` or ``(..., n_q, n)``; a preference
per template set in the query layout is therefore written ``(..., 1, n)``.  ``u=None`` is the
uniform preference.  Zeros in ``u`` remove the corresponding templates (the KL term forbids any
mass there); no gradient flows to those zero entries.  The hyper-parameters :math:`\alpha` and
:math:`\gamma` are numbers (a one-element tensor is read as a number): no gradient flows to them.

References:
    Anonymous authors (2024), *Deciphering Attention Mechanisms: Optimization and Fenchel Dual
    Solutions*, under review at TMLR, eqs. (4), (9)–(12), (16), (18)–(20), (23)–(25), (36)–(41).
"""

from __future__ import annotations

import torch

from ._checks import (
    b_arg,
    deviation_args,
    gaussian_args,
    masked_bias_arg,
    ot_family_arg,
    preference_arg,
    solver_args,
    templates_arg,
    true_preference_args,
    vector_arg,
)
from ._solvers import KLFamily, estimate, gaussian_lambda, generalized_weights, scores, solve, true_preference_weights
from .._numerics import log_or_neg_inf
from .._validation import all_finite, broadcast_shapes, check_positive, require

__all__ = [
    "dual_objective",
    "exact_estimate",
    "gaussian_dual_maximizer",
    "gaussian_estimate",
    "generalized_attention",
    "ot_attention",
    "ot_dual_objective",
    "ot_exact_estimate",
    "relative_deviation",
    "solve_dual",
    "solve_ot_dual",
    "t5_preference",
    "true_preference",
]


# -------- the closed forms: generalized attention and T5's preference (eqs. 18-20) -------------


def generalized_attention(z, templates, u=None, alpha=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Generalized attention, eq. (18) of Anonymous authors (2024).

    .. math::

        \begin{aligned}
        \hat h&=\sum_{i=1}^n p_i t_i,\\
        p_i&=\frac{u_i\,e^{\alpha\langle t_i,z\rangle}}{\sum_j u_j\,e^{\alpha\langle t_j,z\rangle}}
        =\operatorname{softmax}_i\big(\log u_i+\alpha\langle t_i,z\rangle\big),
        \end{aligned}

    the estimate of eq. (12) with :math:`\lambda^*` replaced by its small-:math:`\alpha`
    approximation :math:`\alpha z` (eq. 16).

    **Mapping to scaled dot-product attention.**  PyTorch's
    ``scaled_dot_product_attention(q, k, v, attn_mask=B, scale=sigma)`` computes
    :math:`\operatorname{softmax}(\sigma\,qk^\top+B)\,v` (``sigma`` defaults to :math:`1/\sqrt d`).
    With ``z = q``, ``templates = k``, ``alpha = sigma`` and

    * ``u = None`` (uniform :math:`u_i=1/n`, eq. 18 with the constant :math:`\log(1/n)` cancelling):
      ``weights`` equals the SDPA weights without a mask;
    * ``u`` uniform on the keys a boolean mask allows and ``0`` elsewhere: SDPA with that mask;
    * ``u = t5_preference(B, mask)`` (:math:`u\propto e^{B}` on the allowed keys, eq. 19):
      SDPA with the additive float mask ``B`` (``-inf`` where masked), i.e. eq. (20);

    then ``weights @ v`` is SDPA's output, and ``h`` is SDPA's output with ``v = k``.  Only the
    product :math:`\alpha\langle t_i,z\rangle` enters the weights, so ``(z=sigma*q, alpha=1)`` gives
    the same weights; the BERT reading of their Sec. 8 takes :math:`\alpha=1`,
    :math:`t_i=x_i/\sqrt{d'}`, :math:`z=K^\top Qx_k`.

    Args:
        z: evidence, ``(..., d)`` or ``(..., n_q, d)`` (see the module's shape convention).
        templates: ``(..., n, d)``.
        u: preference, broadcastable to the weights ``(..., n)`` / ``(..., n_q, n)``; non-negative,
            summing to one; ``None`` for uniform.  Zeros mask templates.
        alpha: :math:`\alpha>0`, the reliability of the evidence.

    Returns:
        ``(h, weights)``: ``(..., [n_q,] d)`` and ``(..., [n_q,] n)``.  No query (``n_q = 0``) or an
        empty batch gives empty results of these shapes.

    Raises:
        ValueError: ``alpha`` not a finite number > 0; NaN/inf inputs; no template (``n = 0``: there
            is no preference over an empty set, so problem (4) has no solution); shape mismatch or
            shapes that do not broadcast; tensors on different devices; ``u`` negative or not
            summing to one; scores :math:`\alpha\langle t_i,z\rangle` beyond the dtype's range
            (pass float64 or smaller inputs).
        TypeError: non-float inputs, mixed dtypes, ``alpha`` not a real number.

    Examples:
        >>> T = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> h, w = generalized_attention(torch.tensor([2.0, 0.0]), T, alpha=0.5)
        >>> w
        tensor([0.7311, 0.2689])

        With ``u = None`` and ``alpha = 1 / sqrt(d)`` the weights are those of SDPA:

        >>> q, k = torch.randn(3, 8), torch.randn(5, 8)
        >>> _, w = generalized_attention(q, k, alpha=8**-0.5)
        >>> torch.allclose(w, torch.softmax(q @ k.T / 8**0.5, dim=-1))
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (12), (16), (18)–(20).
    """
    T = templates_arg(templates)
    zq, single = vector_arg(z, "z", T)
    alpha = check_positive(alpha, "alpha")
    uq = preference_arg(u, T, single)
    if uq is not None:
        weights_shape = torch.broadcast_shapes(zq.shape[:-2], T.shape[:-2]) + (zq.shape[-2], T.shape[-2])
        broadcast_shapes(**{"the weights of z and templates": weights_shape, "u": uq.shape})
    weights = generalized_weights(zq, T, alpha, None if uq is None else log_or_neg_inf(uq), "z")
    return estimate(weights, T, single)


def t5_preference(position_bias, mask=None) -> torch.Tensor:
    r"""T5's relative-position bias and word mask as a preference, eq. (19) of Anonymous authors (2024).

    .. math::

        u_i=\begin{cases}0 & \text{word } i \text{ masked}\\ e^{B_i}/Z & \text{otherwise,}\end{cases}
        \qquad Z=\sum_{i\ \text{unmasked}}e^{B_i},

    so that :func:`generalized_attention` with this :math:`u` and :math:`\alpha=1` is eq. (20): the
    bias and the mask are added to the scores before the softmax.

    Args:
        position_bias: ``(..., n)`` scores :math:`B` (e.g. T5's bucketed relative-position bias,
            ``(..., n_q, n)``); ``-inf`` entries count as masked.
        mask: optional boolean tensor broadcastable to ``position_bias``; ``True`` marks a word that
            may be attended to (PyTorch's SDPA convention).

    Returns:
        :math:`u`, the broadcast shape, summing to one over the last dimension.  An empty batch gives
        an empty result.

    Raises:
        TypeError: ``mask`` not boolean, ``position_bias`` not floating.
        ValueError: NaN or ``+inf`` in the bias; no word (last dimension 0) or a row with every word
            masked (no preference exists over no word); shapes that do not broadcast; ``mask`` on
            another device.

    Examples:
        >>> bias = torch.tensor([0.0, 1.0, 2.0])
        >>> t5_preference(bias, torch.tensor([True, True, False]))
        tensor([0.2689, 0.7311, 0.0000])

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (19)–(20).
        Raffel et al. (2020), *Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer*, Sec. 2.1 (relative position embeddings).
    """
    return torch.softmax(masked_bias_arg(position_bias, mask), dim=-1)


# -------- the dual (9) and its exact maximizer -------------------------------------------------


def dual_objective(lam, b, templates, u=None, alpha=1.0) -> torch.Tensor:
    r"""The Fenchel dual objective of eq. (9) of Anonymous authors (2024), for a discrete preference.

    .. math::

        D(\lambda)=\langle\lambda,b\rangle-\frac{1}{2\alpha}\lVert\lambda\rVert^2
        -\log\sum_{i=1}^n u_i\,e^{\langle t_i,\lambda\rangle},\qquad b=\mu+z,

    the log moment generating function of eq. (10) evaluated for :math:`u=\sum_i u_i\delta_{t_i}`.

    Args:
        lam: dual variable :math:`\lambda`, ``(..., d)`` or ``(..., n_q, d)``.
        b, templates, u, alpha: as in :func:`solve_dual` (``b`` broadcastable to ``lam``).

    Returns:
        :math:`D(\lambda)`, shape ``(...)`` or ``(..., n_q)``.

    Raises:
        ValueError, TypeError: as :func:`generalized_attention`; also a value :math:`D(\lambda)`
            beyond the dtype's range.

    Examples:
        The maximizer of :func:`solve_dual` beats any other :math:`\lambda`:

        >>> T, b = torch.eye(3, 2), torch.tensor([0.5, 0.2])
        >>> lam = solve_dual(b, T, alpha=0.5)
        >>> best = dual_objective(lam, b, T, alpha=0.5)
        >>> bool(best > dual_objective(0.5 * b, b, T, alpha=0.5))
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (9)–(10).
    """
    T = templates_arg(templates)
    lq, single = vector_arg(lam, "lam", T)
    bq = b_arg(b, T, single, lq, "lam")
    alpha = check_positive(alpha, "alpha")
    uq = preference_arg(u, T, single)
    s = scores(lq, T, None, "lam")
    if uq is not None:
        broadcast_shapes(**{"the scores <lam, t_i>": s.shape, "u": uq.shape})
    val = (lq * bq).sum(-1) - (lq * lq).sum(-1) / (2 * alpha) - KLFamily(uq).value(s)
    require(all_finite(val), f"D(lam) overflows {val.dtype}: lam or b are too large for this dtype")
    return val.squeeze(-1) if single else val


def solve_dual(b, templates, u=None, alpha=1.0, tol=1e-10, max_iter=100, *, method="auto") -> torch.Tensor:
    r"""The exact maximizer :math:`\lambda^*` of the dual (9) of Anonymous authors (2024).

    Solves :math:`\nabla D(\lambda)=b-\lambda/\alpha-\sum_i p_i(\lambda)\,t_i=0`,
    :math:`p(\lambda)=\operatorname{softmax}(\log u+T\lambda)`, by Newton's method with a
    backtracking line search on :math:`\lVert\nabla D\rVert^2` (globally convergent: :math:`-D` is
    :math:`1/\alpha`-strongly convex), from the approximation :math:`\lambda_0=\alpha z` of eq. (16).
    By stationarity :math:`\lambda^*=\alpha z+\alpha\,T^\top(u-\tilde p)` lies in the span of the
    templates, so ``method="gram"`` iterates on :math:`c` in :math:`\lambda=\alpha b+T^\top c`
    (:math:`n\times n` systems from the Gram matrix) and ``"span"`` on :math:`v` in
    :math:`\lambda=\alpha b+Q_Tv`, :math:`T^\top=Q_TR` (:math:`\min(n,d)` unknowns); ``"auto"``
    takes ``"gram"`` when :math:`n\le d`, else ``"span"``; ``"dense"`` is the textbook iteration on
    :math:`\lambda` (:math:`d\times d` systems), kept as a reference.  All three agree to ``tol``;
    one host synchronisation per iteration (the convergence test), none per element.

    Gradients with respect to ``b``, ``templates`` and ``u`` are those of the implicit function
    theorem, :math:`d\lambda^*=(I/\alpha+T^\top ST)^{-1}\,d(\nabla D)|_{\lambda^*}` with
    :math:`S=\operatorname{diag}\tilde p-\tilde p\tilde p^\top` (first order only).

    Args:
        b: :math:`b=\mu+z`, ``(..., d)`` or ``(..., n_q, d)``.
        templates, u, alpha: as in :func:`generalized_attention`.
        tol: stop when every :math:`\lVert\nabla D(\lambda)\rVert_2\le` ``tol`` (raised to the
            rounding floor :math:`\varepsilon(\lVert b\rVert+\max_i\lVert t_i\rVert)(32+4\alpha
            \max_i\lVert t_i\rVert^2)` of the dtype when below it, which happens in float32 or for
            large templates).
        max_iter: Newton iterations before giving up.
        method: ``"auto"``, ``"gram"``, ``"span"`` or ``"dense"``.

    Returns:
        :math:`\lambda^*`, same layout as ``b`` (broadcast against ``templates`` and ``u``).  An
        empty batch (or ``d = 0``) returns an empty result without iterating; so do ``meta``
        tensors (which have shapes but no values), returning the result's shape.

    Raises:
        ValueError: as :func:`generalized_attention`; ``tol`` not a finite number > 0,
            ``max_iter < 1``, an unknown ``method``; ``b``, ``templates`` or ``alpha`` so large that
            no iterate can be certified in this dtype.
        TypeError: as :func:`generalized_attention`; ``max_iter`` not an int, ``method`` not a string.
        RuntimeError: no convergence within ``max_iter`` iterations.

    Examples:
        At the maximizer the gradient :math:`b-\lambda/\alpha-T^\top\tilde p` vanishes:

        >>> T = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
        >>> b = torch.tensor([0.5, 0.2])
        >>> lam = solve_dual(b, T, alpha=0.5)
        >>> p = torch.softmax(T @ lam, dim=-1)
        >>> torch.allclose(b - lam / 0.5 - p @ T, torch.zeros(2), atol=1e-6)
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (9), (11), (16).
        Nocedal and Wright (2006), *Numerical Optimization*, Sec. 3.1 (backtracking line search).
    """
    T = templates_arg(templates)
    bq, single = vector_arg(b, "b", T)
    alpha, tol, max_iter = solver_args(alpha, tol, max_iter)
    uq = preference_arg(u, T, single)
    if uq is not None:
        broadcast_shapes(**{"b's batch dimensions": bq.shape[:-1], "templates' batch dimensions": T.shape[:-2] + (1,),
                            "u's batch dimensions": uq.shape[:-1]})
    lam = solve(bq, T, KLFamily(uq), alpha, tol, max_iter, method, "solve_dual")
    return lam.squeeze(-2) if single else lam


def exact_estimate(b, templates, u=None, alpha=1.0, tol=1e-10, max_iter=100) -> torch.Tensor:
    r"""The exact estimate :math:`\hat h` of eq. (12) of Anonymous authors (2024).

    .. math::

        \hat h=\sum_i t_i\,\frac{u_i e^{\langle t_i,\lambda^*\rangle}}
        {\sum_j u_j e^{\langle t_j,\lambda^*\rangle}},
        \qquad \lambda^*=\arg\max D ,

    with :math:`\lambda^*` the maximizer of the dual (eq. 9) from :func:`solve_dual`: the mean of
    the minimizer :math:`\tilde p` (eq. 11) of problem (4).  Compare with
    :func:`generalized_attention` at ``z = b - mu``: the two agree to :math:`O(\alpha^2)`.

    Args:
        b: :math:`b=\mu+z`, ``(..., d)`` or ``(..., n_q, d)``.
        templates, u, alpha, tol, max_iter: as in :func:`solve_dual`.

    Returns:
        :math:`\hat h`, same layout as ``b``.

    Raises:
        ValueError, TypeError, RuntimeError: as :func:`solve_dual`.

    Examples:
        For a small :math:`\alpha` generalized attention is close to the exact estimate:

        >>> T = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
        >>> z = torch.tensor([0.5, 0.2])
        >>> b = T.mean(0) + z
        >>> h_attention, _ = generalized_attention(z, T, alpha=0.01)
        >>> h_exact = exact_estimate(b, T, alpha=0.01)
        >>> torch.allclose(h_exact, h_attention, atol=1e-4)
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (9), (11)–(12).
    """
    lam = solve_dual(b, templates, u, alpha, tol, max_iter)
    return generalized_attention(lam, templates, u, 1.0)[0]


def relative_deviation(lam_star, approx) -> torch.Tensor:
    r"""Relative deviation :math:`\lVert\lambda^*-\hat\lambda\rVert/\lVert\lambda^*\rVert`, Fig. 4 of Anonymous authors (2024).

    Their Fig. 4 measures how far the approximation :math:`\hat\lambda=\alpha z` (eq. 16) is from the
    exact maximizer :math:`\lambda^*` of (9) in BERT and T5.  A zero :math:`\lambda^*` gives ``inf``
    (``0`` if ``approx`` is zero too, and for ``d = 0``).  Both vectors are divided by their largest
    entry before the norms, so that no square overflows.

    Args:
        lam_star: :math:`\lambda^*`, ``(..., d)``.
        approx: :math:`\hat\lambda`, broadcastable to ``lam_star``.

    Returns:
        ``(...)`` relative deviations.

    Raises:
        ValueError, TypeError: NaN, mismatched shapes or dtypes.

    Examples:
        >>> lam_star, approx = torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0])
        >>> relative_deviation(lam_star, approx)
        tensor(0.2000)

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eq. (16) and Fig. 4.
    """
    lam_star, approx = deviation_args(lam_star, approx)
    if lam_star.shape[-1] == 0:
        return lam_star.new_zeros(lam_star.shape[:-1])
    scale = torch.maximum(lam_star.detach().abs().amax(-1), approx.detach().abs().amax(-1))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    diff = (lam_star / scale - approx / scale).norm(dim=-1)
    return torch.where(diff == 0, torch.zeros_like(diff), diff / (lam_star / scale).norm(dim=-1))


# -------- a Gaussian preference (Sec. 5, eq. 15): the dual in closed form ----------------------


def gaussian_dual_maximizer(mu, b, alpha, *, cov=None) -> torch.Tensor:
    r"""Closed-form dual maximizer for a Gaussian preference, Sec. 5 and eq. (15) of Anonymous authors (2024).

    For :math:`u=\mathcal N(\mu,\Sigma)` the log-MGF is exactly quadratic, so eq. (15) is exact:

    .. math::

        \lambda^*=\alpha\,(I_d+\alpha\Sigma)^{-1}(b-\mu),

    which for :math:`\Sigma=I_d` (the default, Sec. 5) is :math:`\frac{\alpha}{1+\alpha}(b-\mu)`.

    Args:
        mu: :math:`\mu`, ``(..., d)``.
        b: :math:`b`, broadcastable to ``mu``.
        alpha: :math:`\alpha>0`.
        cov: optional symmetric positive semi-definite :math:`\Sigma`, ``(..., d, d)``.

    Returns:
        :math:`\lambda^*`, ``(..., d)`` (the broadcast of ``mu``, ``b`` and ``cov``'s batch).

    Raises:
        ValueError: ``alpha`` not a finite number > 0; NaN or infinite entries; shapes that do not
            match or broadcast; tensors on different devices; ``cov`` not symmetric positive
            semi-definite (e.g. :math:`-I`, which is no covariance).
        TypeError: non-float inputs or mixed dtypes; ``alpha`` not a real number.

    Examples:
        With :math:`\Sigma=2I` and :math:`\alpha=1`, :math:`\lambda^*=(b-\mu)/3`:

        >>> b = torch.tensor([3.0, 6.0])
        >>> gaussian_dual_maximizer(torch.zeros(2), b, 1.0, cov=2 * torch.eye(2))
        tensor([1., 2.])

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, Sec. 5 and eq. (15).
    """
    mu, b, alpha, cov = gaussian_args(mu, b, alpha, cov)
    return gaussian_lambda(mu, b, alpha, cov)


def gaussian_estimate(mu, b, alpha, *, cov=None) -> torch.Tensor:
    r"""Closed-form estimate for a Gaussian preference, Sec. 5 of Anonymous authors (2024).

    With :math:`u=\mathcal N(\mu,I_d)` the minimizer of (4) is :math:`\mathcal N(\mu+\lambda^*,I_d)`
    and

    .. math::

        \hat h=\mu+\lambda^*=\frac{1}{1+\alpha}\,\mu+\frac{\alpha}{1+\alpha}\,b ;

    with a covariance :math:`\Sigma` (eq. 15, exact for Gaussians) :math:`\hat h=\mu+\Sigma\lambda^*`,
    :math:`\lambda^*=\alpha(I+\alpha\Sigma)^{-1}(b-\mu)`.

    Args:
        mu, b, alpha, cov: as in :func:`gaussian_dual_maximizer` (``cov=None`` means :math:`I_d`).

    Returns:
        :math:`\hat h`, ``(..., d)``; without ``cov`` the convex combination above, computed as
        such (no overflow for any finite ``mu`` and ``b``).

    Raises:
        ValueError, TypeError: as :func:`gaussian_dual_maximizer`.

    Examples:
        The estimate moves from the preference's mean towards :math:`b` as :math:`\alpha` grows:

        >>> mu, b = torch.zeros(2), torch.tensor([1.0, 2.0])
        >>> [round(gaussian_estimate(mu, b, a)[1].item(), 2) for a in (0.25, 3)]
        [0.4, 1.5]

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, Sec. 5 and eq. (15).
    """
    mu, b, alpha, cov = gaussian_args(mu, b, alpha, cov)
    if cov is None:
        return mu * (1.0 / (1.0 + alpha)) + b * (alpha / (1.0 + alpha))
    lam = gaussian_lambda(mu, b, alpha, cov)
    return mu + (cov @ lam.unsqueeze(-1)).squeeze(-1)


# -------- the entropic optimal-transport variant (Sec. 9, Appendix D) --------------------------


def true_preference(u, cost, gamma) -> torch.Tensor:
    r"""The true preference :math:`\tilde u`, eq. (40) and Prop. 1 of Anonymous authors (2024).

    :math:`\tilde u` minimizes :math:`p\mapsto\mathcal W_\gamma(p,u;M)` (eq. 23): each unit of
    preference mass at :math:`t_j` spreads over the templates with a Gibbs kernel,

    .. math::

        \tilde u_i=\sum_j u_j\,\frac{e^{-M_{ij}/\gamma}}{\sum_{l}e^{-M_{lj}/\gamma}},

    and :math:`\tilde u\to u` as :math:`\gamma\to0` when :math:`M_{jj}<M_{ij}` for :math:`i\ne j`.
    ``cost[..., i, j]`` is :math:`M(t_i,t_j)`, :math:`t_i` the template that receives mass and
    :math:`t_j` the one where the preference puts it; their symmetric :math:`M` makes the order
    immaterial.

    Args:
        u: preference ``(..., N)`` over all templates (zeros allowed).
        cost: :math:`M`, ``(..., N, N)``; finite or ``+inf``.
        gamma: :math:`\gamma>0`, the entropic regularization.

    Returns:
        :math:`\tilde u`, ``(..., N)``.

    Raises:
        ValueError, TypeError: bad ``gamma``, NaN, ``u`` not a probability vector, bad shapes.

    Examples:
        A small :math:`\gamma` keeps the preference nearly where it is:

        >>> C = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
        >>> true_preference(torch.tensor([1.0, 0.0]), C, 0.2)
        tensor([0.9933, 0.0067])

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (23), (40) and Prop. 1.
    """
    u, m, gamma = true_preference_args(u, cost, gamma)
    return true_preference_weights(u, m, gamma)


def ot_attention(z, templates, u=None, cost=None, alpha=1.0, gamma=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Optimal-transport attention, eq. (25) of Anonymous authors (2024).

    The small-:math:`\alpha`, small-:math:`\alpha/\gamma` solution of problem (24) (KL replaced by
    the entropic OT cost :math:`\mathcal W_\gamma(p,u;M)`, eq. 23):

    .. math::

        \begin{aligned}
        p_i&=\sum_{j} u_j\,\frac{e^{(\alpha\langle t_i,z\rangle-M_{ij})/\gamma}}{Z_j},\qquad
        \hat h=\sum_i p_i t_i ,\\
        Z_j&=\sum_{l}e^{(\alpha\langle t_l,z\rangle-M_{lj})/\gamma}.
        \end{aligned}

    A template with :math:`u_i=0` still receives weight if it is cheap to reach from preferred
    ones.  As :math:`\alpha\to0` the weights tend to :func:`true_preference`.

    Args:
        z: evidence, ``(..., d)`` or ``(..., n_q, d)``.
        templates: all templates :math:`\mathcal A`, ``(..., N, d)``.
        u: preference over them (``None`` = uniform), zeros allowed.
        cost: :math:`M`, ``(..., N, N)`` (``cost[..., i, j] = M(t_i, t_j)``), finite or ``+inf``.
        alpha: :math:`\alpha>0`.
        gamma: :math:`\gamma>0`.

    Returns:
        ``(h, weights)`` of shapes ``(..., [n_q,] d)`` and ``(..., [n_q,] N)``.

    Raises:
        ValueError, TypeError: as :func:`generalized_attention`, plus a bad ``cost`` (NaN or
            ``-inf`` entries, a column that is ``+inf`` everywhere, a wrong shape) or ``gamma``.

    Examples:
        As :math:`\alpha\to0` the weights are the true preference:

        >>> T, C = torch.eye(3, 2), 1.0 - torch.eye(3)
        >>> u = torch.tensor([1.0, 0.0, 0.0])
        >>> _, w = ot_attention(torch.ones(2), T, u, C, alpha=1e-6, gamma=0.5)
        >>> torch.allclose(w, true_preference(u, C, 0.5), atol=1e-5)
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (23)–(25).
    """
    T = templates_arg(templates)
    zq, single = vector_arg(z, "z", T)
    alpha = check_positive(alpha, "alpha")
    family = ot_family_arg(u, cost, gamma, T, zq, single, "z")
    weights = family.probs(scores(zq, T, alpha, "z"))
    return estimate(weights, T, single)


def ot_dual_objective(lam, b, templates, u=None, cost=None, alpha=1.0, gamma=1.0) -> torch.Tensor:
    r"""Dual objective of the OT problem (24), eqs. (36) and (39) of Anonymous authors (2024).

    .. math::

        \begin{aligned}
        D_\gamma(\lambda)&=\langle\lambda,b\rangle-\frac{1}{2\alpha}\lVert\lambda\rVert^2\\
        &\quad{}-\gamma\Big(H(u)
        +\sum_j u_j\log\sum_i e^{(\langle t_i,\lambda\rangle-M_{ij})/\gamma}\Big),
        \end{aligned}

    with :math:`b=\tilde\mu+z`; the constant :math:`\gamma H(u)` (dropped in eq. 39) is kept so that
    the value equals the primal optimum (strong duality).

    Args:
        lam, b, templates, u: as :func:`dual_objective` (``templates`` are all of :math:`\mathcal A`).
        cost, alpha, gamma: as :func:`ot_attention`.

    Returns:
        ``(...)`` or ``(..., n_q)`` values.

    Raises:
        ValueError, TypeError: as :func:`ot_attention`.

    Examples:
        >>> T, C = torch.eye(3, 2), 1.0 - torch.eye(3)
        >>> b = torch.tensor([0.5, 0.2])
        >>> lam = solve_ot_dual(b, T, cost=C, gamma=0.5)
        >>> d_star = ot_dual_objective(lam, b, T, cost=C, gamma=0.5)
        >>> bool(d_star >= ot_dual_objective(b, b, T, cost=C, gamma=0.5))
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (36), (39).
    """
    T = templates_arg(templates)
    lq, single = vector_arg(lam, "lam", T)
    bq = b_arg(b, T, single, lq, "lam")
    alpha = check_positive(alpha, "alpha")
    family = ot_family_arg(u, cost, gamma, T, lq, single, "lam")
    val = (lq * bq).sum(-1) - (lq * lq).sum(-1) / (2 * alpha) - family.value(scores(lq, T, None, "lam"))
    require(all_finite(val), f"D(lam) overflows {val.dtype}: lam or b are too large for this dtype")
    return val.squeeze(-1) if single else val


def solve_ot_dual(b, templates, u=None, cost=None, alpha=1.0, gamma=1.0, tol=1e-10, max_iter=100, *, method="auto"):
    r"""Exact maximizer of the OT dual (39) of Anonymous authors (2024).

    Same Newton solver as :func:`solve_dual`, with :math:`p(\lambda)=\sum_j u_j\,
    \operatorname{softmax}_i((\langle t_i,\lambda\rangle-M_{ij})/\gamma)` (eq. 37) and Hessian
    :math:`T^\top\gamma^{-1}\big(\operatorname{diag}p-\sum_j u_j q_jq_j^\top\big)T`; stationarity
    again puts :math:`\lambda^*-\alpha b` in the span of the templates.  Its Hessian is a sum of
    :math:`n` covariance matrices, not one, so the Gram form of :func:`solve_dual` does not apply:
    ``"auto"`` means ``"span"`` here, and ``method="gram"`` is an error.

    Args:
        b: :math:`b=\tilde\mu+z`, ``(..., d)`` or ``(..., n_q, d)``.
        templates, u, cost, alpha, gamma: as :func:`ot_attention`.
        tol, max_iter: as :func:`solve_dual`.
        method: ``"auto"`` (= ``"span"``), ``"span"`` or ``"dense"``.

    Returns:
        :math:`\lambda^*`, same layout as ``b``.

    Raises:
        ValueError, TypeError, RuntimeError: as :func:`solve_dual` and :func:`ot_attention`.

    Examples:
        >>> T, C = torch.eye(3, 2), 1.0 - torch.eye(3)
        >>> b = torch.tensor([0.5, 0.2])
        >>> lam = solve_ot_dual(b, T, cost=C, gamma=0.5, method="span")
        >>> dense = solve_ot_dual(b, T, cost=C, gamma=0.5, method="dense")
        >>> torch.allclose(lam, dense, atol=1e-5)
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (37), (39).
    """
    T = templates_arg(templates)
    bq, single = vector_arg(b, "b", T)
    alpha, tol, max_iter = solver_args(alpha, tol, max_iter)
    family = ot_family_arg(u, cost, gamma, T, bq, single, "b")
    lam = solve(bq, T, family, alpha, tol, max_iter, method, "solve_ot_dual")
    return lam.squeeze(-2) if single else lam


def ot_exact_estimate(z, templates, u=None, cost=None, alpha=1.0, gamma=1.0, tol=1e-10, max_iter=100):
    r"""Exact solution of the OT problem (24) via its dual (39), eqs. (38)–(41) of Anonymous authors (2024).

    With :math:`b=\tilde\mu+z` (:math:`\tilde\mu` the mean of :func:`true_preference`, eq. 41) and
    :math:`\lambda^*` from :func:`solve_ot_dual`,

    .. math::

        p^*_i=\sum_j u_j\,\frac{e^{(\langle t_i,\lambda^*\rangle-M_{ij})/\gamma}}
        {\sum_l e^{(\langle t_l,\lambda^*\rangle-M_{lj})/\gamma}},\qquad \hat h=\sum_i p^*_i t_i ;

    :func:`ot_attention` is this with :math:`\lambda^*\approx\alpha z`.

    Args:
        z, templates, u, cost, alpha, gamma: as :func:`ot_attention`.
        tol, max_iter: as :func:`solve_dual`.

    Returns:
        ``(h, weights)`` as :func:`ot_attention`.

    Raises:
        ValueError, TypeError, RuntimeError: as :func:`solve_ot_dual`.

    Examples:
        >>> T, C = torch.eye(3, 2), 1.0 - torch.eye(3)
        >>> z = torch.tensor([0.5, 0.2])
        >>> _, w_exact = ot_exact_estimate(z, T, cost=C, alpha=0.01, gamma=0.5)
        >>> _, w = ot_attention(z, T, cost=C, alpha=0.01, gamma=0.5)
        >>> torch.allclose(w_exact, w, atol=1e-3)
        True

    References:
        Anonymous authors (2024), *Deciphering Attention Mechanisms*, eqs. (38)–(41).
    """
    T = templates_arg(templates)
    zq, single = vector_arg(z, "z", T)
    alpha, tol, max_iter = solver_args(alpha, tol, max_iter)
    family = ot_family_arg(u, cost, gamma, T, zq, single, "z")
    bq = zq + family.prior(zq) @ T
    lam = solve(bq, T, family, alpha, tol, max_iter, "auto", "ot_exact_estimate")
    weights = family.probs(lam @ T.mT)
    return estimate(weights, T, single)
