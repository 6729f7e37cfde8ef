r"""Attention as nonlinear Markov transport of probability measures (chapter 2).

Vuckovic, Baratin and Tachet des Combes (2020) model attention on measures.  A set of tokens
:math:`X=\{x_1,\dots,x_N\}\subset E\subseteq\mathbb{R}^d` is the weighted empirical measure
:math:`\mu=\sum_i w_i\,\delta_{x_i}` (:class:`EmpiricalMeasure`; uniform weights give their
:math:`m(X)`), and one attention layer is the composition (their Def. 8)

.. math::

    \mathbf{A}_\mu(x,\mathrm{d}z) = \Pi\big[\Psi_{G(x,\bullet)}(\mu)\,L\big](\mathrm{d}z),

of three pieces, each a function here:

* the Boltzmann-Gibbs reweighting :math:`\Psi_g(\nu)(\mathrm{d}y)=g(y)\nu(\mathrm{d}y)/\nu(g)`
  (Def. 3, :func:`boltzmann_gibbs`) and the softmatch kernel :math:`x\mapsto\Psi_{G(x,\bullet)}(\mu)`
  built from an interaction potential :math:`G=e^{a}` (Def. 4, :func:`softmatch_kernel`);
* the lookup kernel :math:`L(k,\mathrm{d}v)=\delta_{\ell(k)}(\mathrm{d}v)` that carries keys to
  values (Def. 5, :func:`lookup_kernel`);
* the moment projection :math:`\Pi(\mu)=\delta_{\mu(F)}` onto Dirac measures, which with
  :math:`F(x)=x` replaces a measure by its mean (Defs. 6–7, :func:`moment_projection`).

:func:`attention_kernel` composes them and reproduces matrix attention exactly (Prop. 9);
:func:`multihead_attention_kernel` is the mixture kernel of their Appendix A (Prop. 12), and
:func:`self_attention_flow` iterates :math:`\delta_{x_i}\mapsto\delta_{x_i}\mathbf{A}_{\mu}` as an
interacting particle system.  :func:`maximum_entropy_tilt` solves the maximum-entropy problem of
Thm. 14, whose solution is a Boltzmann-Gibbs reweighting.  The regularity of these maps (the
1-Wasserstein distance, the Lipschitz and contraction constants of their Secs. 5–6) is
:mod:`attnopt.kernels.regularity`.

Conventions.  Every distance on :math:`E` is the :math:`\ell_1` distance
:math:`d(x,y)=\|x-y\|_1`, as in their definition of :math:`\mathbb{W}_1`, so Lipschitz
semi-norms of potentials are taken with respect to :math:`\ell_1` (their dual norm on gradients is
:math:`\ell_\infty`) and :math:`\operatorname{diam}(E)` is an :math:`\ell_1` diameter.

References:
    Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
    arXiv:2007.02876, Defs. 3–8, Props. 9 and 12, Thm. 14.
"""

from __future__ import annotations

from typing import Callable

import torch

from ._checks import (
    layer_matrices,
    log_potential_arg,
    measure_args,
    multihead_args,
    table_arg,
    tilt_args,
)
from ._maxent import newton_tilt
from ._softmatch import Similarity, flow, softmatch_weights, weighted_sum
from .._numerics import log_or_neg_inf
from .._validation import as_float_tensor, check_bool, check_choice, check_int, check_positive, require

__all__ = [
    "EmpiricalMeasure",
    "attention_kernel",
    "boltzmann_gibbs",
    "gaussian_potential_attention",
    "lookup_kernel",
    "maximum_entropy_tilt",
    "moment_projection",
    "multihead_attention_kernel",
    "self_attention_flow",
    "softmatch_kernel",
]

# -------- empirical measures ----------------------------------------------------------------


class EmpiricalMeasure:
    r"""A batch of discrete probability measures :math:`\mu=\sum_{i=1}^N w_i\,\delta_{x_i}`.

    With uniform weights this is the empirical measure :math:`m(X)=\frac1N\sum_i\delta_{x_i}` of
    Vuckovic et al. (2020), Sec. 3.1.  The leading ("batch") dimensions of ``points`` and
    ``weights`` broadcast against each other, so one support can carry many weight vectors
    (a whole Markov kernel: row :math:`i` of a stochastic matrix is a measure on the same atoms).

    Args:
        points: atoms, shape ``(..., N, d)`` with ``N >= 1``.
        weights: optional masses, shape ``(..., N)``, non-negative and summing to one along the
            last dimension; default uniform :math:`1/N`.  Converted to the dtype of ``points``.

    Raises:
        TypeError: non-floating ``points`` or ``weights``.
        ValueError: an empty measure (``N == 0`` or ``d == 0``), non-finite entries, a shape
            mismatch between ``points`` and ``weights``, negative weights or weights that do not
            sum to one.

    Examples:
        >>> mu = EmpiricalMeasure(torch.tensor([[0.0, 0.0], [2.0, 4.0]]))
        >>> mu.mean()
        tensor([1., 2.])
        >>> EmpiricalMeasure(mu.points, torch.tensor([0.75, 0.25])).mean()
        tensor([0.5000, 1.0000])

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Sec. 3.1.
    """

    __slots__ = ("points", "weights", "_uniform")

    def __init__(self, points, weights=None):
        self._setup(points, weights, "points", "weights")

    def _setup(self, points, weights, points_name: str, weights_name: str) -> None:
        """Validate and store, naming the arguments as the caller's user wrote them."""
        self.points, self.weights, self._uniform = measure_args(points, weights, points_name, weights_name)

    @classmethod
    def _named(cls, points, weights, points_name: str, weights_name: str = "weights") -> "EmpiricalMeasure":
        """The validated measure, with the error messages naming the caller's arguments."""
        self = cls.__new__(cls)
        self._setup(points, weights, points_name, weights_name)
        return self

    @classmethod
    def _trusted(cls, points: torch.Tensor, weights: torch.Tensor) -> "EmpiricalMeasure":
        """Build without validation, for measures this module has just computed (e.g. softmax rows)."""
        self = cls.__new__(cls)
        self.points = points
        self.weights = weights
        self._uniform = False
        return self

    @classmethod
    def dirac(cls, x) -> "EmpiricalMeasure":
        r"""The Dirac measures :math:`\delta_x` for ``x`` of shape ``(..., d)``."""
        x = as_float_tensor(x, "x", min_ndim=1)
        return cls._named(x.unsqueeze(-2), None, "x")

    @property
    def n_atoms(self) -> int:
        """Number of atoms ``N``."""
        return self.points.shape[-2]

    @property
    def dim(self) -> int:
        """Dimension ``d`` of the ambient space."""
        return self.points.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        """Broadcast batch shape of ``points`` and ``weights``."""
        return torch.broadcast_shapes(self.points.shape[:-2], self.weights.shape[:-1])

    @property
    def dtype(self) -> torch.dtype:
        return self.points.dtype

    @property
    def device(self) -> torch.device:
        return self.points.device

    def integrate(self, values: torch.Tensor) -> torch.Tensor:
        r""":math:`\mu(f)=\sum_i w_i f(x_i)` for ``values[..., i, :] = f(x_i)`` of shape ``(..., N, l)``."""
        return weighted_sum(self.weights, table_arg(values, self, "values", "the measure's points"))

    def mean(self) -> torch.Tensor:
        r"""The moment vector :math:`\mu(\mathrm{id})=\sum_i w_i x_i`, shape ``(..., d)``."""
        return weighted_sum(self.weights, self.points)

    def __repr__(self) -> str:
        return (
            f"EmpiricalMeasure(batch_shape={tuple(self.batch_shape)}, n_atoms={self.n_atoms}, "
            f"dim={self.dim}, dtype={self.dtype}, device={self.device})"
        )


def _as_measure(x, name: str) -> EmpiricalMeasure:
    if isinstance(x, EmpiricalMeasure):
        return x
    if isinstance(x, torch.Tensor):
        return EmpiricalMeasure._named(x, None, name)
    raise TypeError(f"{name} must be an EmpiricalMeasure or a (..., N, d) tensor of points; got {type(x).__name__}")


# -------- the three kernels and their composition, the attention kernel ---------------------


def boltzmann_gibbs(nu: EmpiricalMeasure, potential=None, *, log_potential=None) -> EmpiricalMeasure:
    r"""Boltzmann-Gibbs transformation :math:`\Psi_g(\nu)(\mathrm{d}x) = g(x)\,\nu(\mathrm{d}x)/\nu(g)`, Def. 3 of Vuckovic et al. (2020).

    For :math:`\nu=\sum_i w_i\delta_{x_i}` the result keeps the atoms and reweights them,
    :math:`w_i' = w_i g(x_i)/\sum_j w_j g(x_j)`; the computation is done in log space (a softmax of
    :math:`\log w_i + \log g(x_i)`), so ``log_potential`` may hold values whose exponential would
    overflow.

    Args:
        nu: the measure :math:`\nu`.
        potential: :math:`g\ge0` as values at the atoms, shape ``(..., N)``, or a callable mapping
            ``points (..., N, d)`` to ``(..., N)``.  Exactly one of ``potential`` and
            ``log_potential`` must be given.
        log_potential: :math:`\log g` in the same two forms (``-inf`` allowed: :math:`g=0`).

    Returns:
        :math:`\Psi_g(\nu)`, an :class:`EmpiricalMeasure` on the atoms of ``nu``.

    Raises:
        ValueError: both or neither potential given; negative, NaN or ``+inf`` potential values
            (``g`` maps into :math:`[0,\infty)`), NaN or ``+inf`` in ``log_potential``; a shape that
            does not match or broadcast with ``nu``; a potential on another device; or
            :math:`\nu(g)=0` (the potential vanishes on the support of :math:`\nu`, so
            :math:`\Psi_g(\nu)` is undefined).
        TypeError: ``nu`` not a measure or tensor; a potential that is not a floating tensor, or in
            another dtype than ``nu``.

    Examples:
        Doubling the potential on one of three equally weighted atoms doubles its share:

        >>> nu = EmpiricalMeasure(torch.tensor([[0.0], [1.0], [2.0]]))
        >>> boltzmann_gibbs(nu, torch.tensor([1.0, 1.0, 2.0])).weights
        tensor([0.2500, 0.2500, 0.5000])

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Def. 3.
    """
    nu = _as_measure(nu, "nu")
    logits = log_potential_arg(nu, potential, log_potential) + log_or_neg_inf(nu.weights)
    require((logits > float("-inf")).any(dim=-1).all(), "nu(g) = 0: the potential vanishes on the whole support of nu")
    return EmpiricalMeasure._trusted(nu.points, torch.softmax(logits, dim=-1))


def softmatch_kernel(queries, mu, *, similarity: Similarity = "dot", scale: float | None = None) -> torch.Tensor:
    r"""Softmatch kernel :math:`x\mapsto\Psi_{G(x,\bullet)}(\mu)` at the given queries, Def. 4 of Vuckovic et al. (2020).

    With interaction potential :math:`G(x,y)=e^{a(x,y)}` and :math:`\mu=\sum_j w_j\delta_{k_j}`,

    .. math::

        \Psi_{G(q_i,\bullet)}(\mu) = \sum_j P_{ij}\,\delta_{k_j},\qquad
        P_{ij} = \frac{w_j\,e^{a(q_i,k_j)}}{\sum_l w_l\,e^{a(q_i,k_l)}} .

    With uniform :math:`w` this is :math:`\operatorname{softmax}_j a(q_i,k_j)` (their Sec. 3.1).  The
    left action of the kernel on a query measure :math:`\sum_i u_i\delta_{q_i}` is ``u @ P``.  The
    similarities are formed without intermediate overflow (the scale is applied to a factor before
    the product when it shrinks; the Gaussian one in coordinates centred at the keys' mean).

    Args:
        queries: ``(..., M, d)`` query points :math:`q_i`.
        mu: the key measure (an :class:`EmpiricalMeasure`, or a ``(..., N, d)`` tensor of keys
            taken with uniform weights).  A key of weight zero is masked out.
        similarity: :math:`a`: ``"dot"`` for :math:`a(q,k)=s\langle q,k\rangle` (default
            :math:`s=1/\sqrt d`), ``"gaussian"`` for :math:`a(q,k)=-s\|q-k\|_2^2` (default
            :math:`s=1`, the potential of Thm. 29), or a callable ``(queries, keys) -> (..., M, N)``
            (``-inf`` allowed: :math:`G=0`).
        scale: :math:`s` for the two named similarities.

    Returns:
        The row-stochastic matrix :math:`P`, shape ``(..., M, N)``; row :math:`i` holds the weights
        of :math:`\Psi_{G(q_i,\bullet)}(\mu)` on the atoms of ``mu``.  No query (``M = 0``) gives
        an empty ``(..., 0, N)`` matrix.

    Raises:
        ValueError: no key (``N = 0``: a measure needs an atom), NaN or infinite entries, shapes
            that do not match or broadcast, tensors on different devices, ``scale`` not a finite
            number > 0, an unknown similarity, similarities beyond the dtype's range (pass float64
            or smaller inputs), a callable similarity that is NaN, ``+inf`` or ``-inf`` on every key.
        TypeError: non-float or mixed-dtype tensors, ``scale`` not a real number.

    Examples:
        >>> q = torch.tensor([[1.0, 0.0]])
        >>> keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> softmatch_kernel(q, keys, scale=1.0)
        tensor([[0.7311, 0.2689]])

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Def. 4,
        Sec. 3.1.
    """
    mu = _as_measure(mu, "mu")
    return softmatch_weights(queries, mu, similarity, scale, "queries", "mu")


def lookup_kernel(mu: EmpiricalMeasure, table) -> EmpiricalMeasure:
    r"""Push a measure through a lookup kernel :math:`L(k,\mathrm{d}v)=\delta_{\ell(k)}(\mathrm{d}v)`, Def. 5 of Vuckovic et al. (2020).

    :math:`\mu L = \sum_j w_j\,\delta_{\ell(k_j)}`.  The lookup table :math:`k_j\mapsto v_j` of
    their Prop. 9 is given as the tensor of values aligned with the atoms; a lookup *function*
    :math:`\ell` (e.g. the value projection :math:`x\mapsto xW^V` of the Transformer, their
    Sec. 3.2) is given as a callable on the atoms.

    Args:
        mu: measure on keys.
        table: values ``(..., N, d_v)`` whose leading dimensions broadcast with ``mu.points``'s,
            or a callable ``points (..., N, d) -> (..., N, d_v)``.

    Returns:
        :math:`\mu L`, an :class:`EmpiricalMeasure` with the same weights on the looked-up atoms.

    Raises:
        ValueError: a table with another number of atoms, NaN or infinite values, batch shapes
            that do not broadcast, another device.
        TypeError: a table that is not a floating tensor, or in another dtype than ``mu``.

    Examples:
        >>> points = torch.tensor([[0.0], [1.0]])
        >>> mu = EmpiricalMeasure(points, torch.tensor([0.25, 0.75]))
        >>> lookup_kernel(mu, torch.tensor([[10.0], [20.0]])).mean()
        tensor([17.5000])

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Def. 5,
        Prop. 9.
    """
    mu = _as_measure(mu, "mu")
    if callable(table):
        values = table_arg(table(mu.points), mu, "table(points)", "mu")
    else:
        values = table_arg(table, mu, "table", "mu")
    return EmpiricalMeasure._trusted(values, mu.weights)


def moment_projection(mu: EmpiricalMeasure, feature_map: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    r"""Moment projection :math:`\Pi_{\mathcal F}(\mu)=\nu_{\mu(F)}`, Defs. 6–7 and eq. (2) of Vuckovic et al. (2020).

    The measure is summarised by its moment vector :math:`\mu(F)=\sum_i w_i F(x_i)`; with
    :math:`F(x)=x` and :math:`\mathcal F=\mathcal P_\delta(E)` (the case used by attention) the
    projection is the Dirac mass :math:`\delta_{\mu(F)}` at the mean, identified with the point
    :math:`\mu(F)` through :math:`x\leftrightarrow\delta_x`.

    Args:
        mu: the measure.
        feature_map: :math:`F` as a callable ``points (..., N, d) -> (..., N, l)``; default identity.

    Returns:
        The moment vector :math:`\mu(F)`, shape ``(..., l)`` (``(..., d)`` by default); wrap it with
        :meth:`EmpiricalMeasure.dirac` for the Dirac measure itself.

    Raises:
        ValueError, TypeError: as :class:`EmpiricalMeasure` for a tensor of points; values of
            ``feature_map`` that are not a finite floating ``(..., N, l)`` tensor.

    Examples:
        The second moment of :math:`\frac14\delta_0+\frac34\delta_1`:

        >>> points = torch.tensor([[0.0], [1.0]])
        >>> mu = EmpiricalMeasure(points, torch.tensor([0.25, 0.75]))
        >>> moment_projection(mu, lambda x: x**2)
        tensor([0.7500])

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
        Defs. 6–7 and eq. (2).
    """
    mu = _as_measure(mu, "mu")
    if feature_map is None:
        return mu.mean()
    return weighted_sum(mu.weights, table_arg(feature_map(mu.points), mu, "feature_map(points)", "mu"))


def attention_kernel(
    queries,
    keys,
    values=None,
    *,
    key_weights=None,
    similarity: Similarity = "dot",
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Attention kernel :math:`\mathbf A_\mu(q,\cdot)=\Pi[\Psi_{G(q,\bullet)}(\mu)L]` at Dirac queries, Def. 8 of Vuckovic et al. (2020).

    Evaluated literally as the composition of :func:`softmatch_kernel`, :func:`lookup_kernel` and
    :func:`moment_projection`.  Their Prop. 9: with :math:`\mu=m(K)`, :math:`G=e^{a}` and the lookup
    table :math:`k_j\mapsto v_j`,

    .. math::

        \delta_{q_i}\mathbf A_{m(K)} = \delta_{y_i},\qquad
        y_i = \sum_j \frac{e^{a(q_i,k_j)}}{\sum_l e^{a(q_i,k_l)}}\,v_j ,

    which is matrix attention; a non-uniform key measure gives weights
    :math:`\propto w_j e^{a(q_i,k_j)}`.

    Args:
        queries: ``(..., M, d)``.
        keys: ``(..., N, d)`` (the atoms of :math:`\mu`), or an :class:`EmpiricalMeasure`.
        values: ``(..., N, d_v)`` lookup table, a callable lookup function :math:`\ell`, or ``None``
            for :math:`\ell=\mathrm{id}` (values = keys, self-attention).
        key_weights: optional ``(..., N)`` weights of :math:`\mu` (when ``keys`` is a tensor).
        similarity, scale: as in :func:`softmatch_kernel`.

    Returns:
        ``(output, kernel)``: the points :math:`y_i`, shape ``(..., M, d_v)``, and the softmatch
        matrix :math:`P`, shape ``(..., M, N)``; no query (``M = 0``) gives empty results.

    Raises:
        ValueError: no key (``N = 0``: the key measure needs an atom, and attention over no key
            has no value), and as :func:`softmatch_kernel` and :func:`lookup_kernel`, the
            arguments named as given here.
        TypeError: as :func:`softmatch_kernel` and :func:`lookup_kernel`.

    Examples:
        Prop. 9: the kernel is scaled dot-product attention.

        >>> q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 3)
        >>> y, P = attention_kernel(q, k, v)
        >>> sdpa = torch.softmax(q @ k.T / 8**0.5, dim=-1) @ v
        >>> torch.allclose(y, sdpa, atol=1e-6)
        True

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Def. 8,
        Prop. 9.
    """
    if isinstance(keys, EmpiricalMeasure):
        if key_weights is not None:
            raise ValueError("give key_weights only with a tensor of keys, not with an EmpiricalMeasure")
        mu = keys
    else:
        mu = EmpiricalMeasure._named(keys, key_weights, "keys", "key_weights")
    return _attention(queries, mu, values, similarity, scale, ("queries", "keys", "values"))


def _attention(queries, mu: EmpiricalMeasure, values, similarity: Similarity, scale,
               names: tuple[str, str, str]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention_kernel` on a checked key measure, the arguments named ``names`` in messages."""
    q_name, k_name, v_name = names
    kernel = softmatch_weights(queries, mu, similarity, scale, q_name, k_name)
    # One measure per query, all on the same atoms: points (..., 1, N, d), weights (..., M, N).
    rows = EmpiricalMeasure._trusted(mu.points.unsqueeze(-3), kernel)
    if values is None:
        table = rows.points
    elif callable(values):
        table = table_arg(values(rows.points), rows, f"{v_name}(keys)", k_name)
    else:
        table = table_arg(values, mu, v_name, k_name).unsqueeze(-3)
    return moment_projection(EmpiricalMeasure._trusted(table, rows.weights)), kernel


def gaussian_potential_attention(queries, keys, values=None, *, key_weights=None, scale: float = 1.0):
    r"""Attention with the Gaussian interaction potential :math:`G(q,k)=\exp(-s\|q-k\|_2^2)`.

    The potential of Sec. 6.3 (Prop. 28, Thm. 29) of Vuckovic et al. (2020), for which attention
    is Lipschitz on all of :math:`\mathbb R^d`, unlike dot-product attention:

    .. math::

        y_i = \sum_j \frac{w_j\,e^{-s\|q_i-k_j\|_2^2}}{\sum_l w_l\,e^{-s\|q_i-k_l\|_2^2}}\, v_j .

    Args:
        queries, keys, values, key_weights: as in :func:`attention_kernel`.
        scale: :math:`s>0`; Thm. 29 is stated for :math:`s=1`.

    Returns:
        ``(output, kernel)`` as in :func:`attention_kernel`.

    Raises:
        ValueError, TypeError: as :func:`attention_kernel`.

    Examples:
        A query halfway between two keys weighs them equally:

        >>> k = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
        >>> y, P = gaussian_potential_attention(torch.tensor([[1.0, 0.0]]), k)
        >>> P
        tensor([[0.5000, 0.5000]])

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
        Sec. 6.3, Thm. 29.
    """
    return attention_kernel(queries, keys, values, key_weights=key_weights, similarity="gaussian", scale=scale)


def multihead_attention_kernel(queries, keys, values, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor,
                               w_o: torch.Tensor, *, key_weights=None, scale: float | None = None) -> torch.Tensor:
    r"""Multi-head attention as the projected mixture kernel of Appendix A of Vuckovic et al. (2020).

    Head :math:`h` is the attention kernel :math:`\mathbf A^h` with
    :math:`a(x,y)=s\langle xW^Q_h, yW^K_h\rangle` and lookup :math:`L(k_j,\mathrm d v)=\delta_{v_jW^V_h}`;
    the output map is :math:`\mathbf O^h(z,\mathrm dy)=\delta_{H\,zW^O_h}`; the multi-head kernel is
    :math:`\mathbf M=\Pi\circ\frac1H\sum_h\mathbf A^h\mathbf O^h` (Prop. 12).  Its value at
    :math:`q_i` is the mean of the mixture :math:`\frac1H\sum_h\delta_{H y^h_i W^O_h}`,

    .. math::

        \mathbf M_\mu(q_i,\cdot) = \delta_{\sum_h y_i^h W^O_h},

    i.e. concatenating the heads and multiplying by :math:`W^O`.

    Args:
        queries: ``(..., M, d)``; keys ``(..., N, d)``; values ``(..., N, d)``.
        w_q, w_k: ``(H, d, d_h)``; w_v: ``(H, d, d_v)``; w_o: ``(H, d_v, d_out)`` (row-vector
            convention: a token :math:`x` is projected to :math:`xW`).
        key_weights: optional ``(..., N)`` weights of the key measure.
        scale: :math:`s`, default :math:`1/\sqrt{d_h}`.

    Returns:
        ``(..., M, d_out)``.

    Raises:
        ValueError: no head (``H = 0``: the mixture needs one) or no key; shapes that do not
            match; NaN or infinite entries, or projections or similarities beyond the dtype's
            range (named ``queries @ w_q`` etc.); tensors on different devices.
        TypeError: non-float or mixed-dtype tensors.

    Examples:
        One head with identity projections is single-head attention:

        >>> x, eye = torch.randn(5, 4), torch.eye(4).unsqueeze(0)
        >>> out = multihead_attention_kernel(x, x, x, eye, eye, eye, eye)
        >>> torch.allclose(out, attention_kernel(x, x, x)[0], atol=1e-6)
        True

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
        Prop. 12 and Appendix A.
    """
    tensors = multihead_args(queries, keys, values, w_q, w_k, w_v, w_o)
    heads = tensors["w_q"].shape[0]
    # Per-head projections, heads as a batch dimension: (..., H, M, d_h).
    q = torch.matmul(tensors["queries"].unsqueeze(-3), tensors["w_q"])
    k = torch.matmul(tensors["keys"].unsqueeze(-3), tensors["w_k"])
    v = torch.matmul(tensors["values"].unsqueeze(-3), tensors["w_v"])
    kw = None if key_weights is None else as_float_tensor(key_weights, "key_weights", min_ndim=1,
                                                          like=tensors["queries"]).unsqueeze(-2)
    mu = EmpiricalMeasure._named(k, kw, "keys @ w_k", "key_weights")
    y, _ = _attention(q, mu, v, "dot", scale, ("queries @ w_q", "keys @ w_k", "values @ w_v"))  # (..., H, M, d_v)
    # Mixture (1/H) sum_h delta_{H y^h W^O_h}: atoms indexed by h, shape (..., M, H, d_out).
    atoms = heads * torch.matmul(y, tensors["w_o"]).movedim(-3, -2)
    uniform = torch.full(atoms.shape[:-1], 1.0 / heads, dtype=atoms.dtype, device=atoms.device)
    return moment_projection(EmpiricalMeasure._trusted(atoms, uniform))


def self_attention_flow(x, depth: int, *, w_q=None, w_k=None, w_v=None, weights=None, similarity: Similarity = "dot",
                        scale: float | None = None, residual: bool = False, step_size: float = 1.0,
                        normalize: str | None = None) -> torch.Tensor:
    r"""Iterate self-attention as an interacting particle system, Secs. 3.1 and 6.2 of Vuckovic et al. (2020).

    With :math:`\mu^h=\sum_i w_i\delta_{x^h_i}` the particles move by nonlinear Markov transport
    :math:`\delta_{x^{h+1}_i}=\delta_{x^h_i}\mathbf A^h_{\mu^h}`, i.e.

    .. math::

        x^{h+1}_i = N\!\Big(x^h_i\,[\,\text{if residual}\,] + \eta\sum_j
        \frac{w_j e^{a(x^h_iW^Q_h,\;x^h_jW^K_h)}}{\sum_l w_l e^{a(x^h_iW^Q_h,\;x^h_lW^K_h)}}\,x^h_jW^V_h\Big),

    where :math:`N` is an optional normalisation.  Shared matrices give the weight-tied
    ("Universal Transformer") recurrence of their Sec. 6.2, whose fixed point Prop. 26 discusses.

    Args:
        x: initial particles ``(..., N, d)``.
        depth: number of layers :math:`L\ge0`.
        w_q, w_k: ``(d, d')`` shared or ``(depth, d, d')`` per layer; ``None`` = identity.
        w_v: ``(d, d)`` or ``(depth, d, d)``; ``None`` = identity (the lookup :math:`\ell=\mathrm{id}`).
        weights: optional ``(..., N)`` masses :math:`w_i` of the particles (default uniform).
        similarity, scale: as in :func:`softmatch_kernel`.
        residual: add the attention output to the particles instead of replacing them.
        step_size: :math:`\eta`, multiplies the attention output.
        normalize: ``None``, ``"layer"`` (layer normalisation without affine parameters) or
            ``"sphere"`` (project each particle onto the unit :math:`\ell_2` sphere).

    Returns:
        All layers' particles, shape ``(depth + 1, ..., N, d)`` (index 0 is ``x``).  No particle
        (``N = 0``) has nothing to attend to and nothing to move: the result is ``x`` repeated.

    Raises:
        ValueError: ``depth < 0``, an unknown ``normalize``, ``step_size`` not a finite number > 0,
            matrices of the wrong shape, NaN or infinite entries (also a layer whose particles
            overflow, named "the keys of layer h"), tensors on different devices.
        TypeError: ``depth`` not an int, ``residual`` not a bool, non-float or mixed-dtype tensors.

    Examples:
        Without a residual, attention averages: the particles contract towards their mean.

        >>> layers = self_attention_flow(torch.randn(6, 2), depth=5)
        >>> layers.shape
        torch.Size([6, 6, 2])
        >>> bool(layers[-1].std(0).sum() < layers[0].std(0).sum())
        True

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
        Secs. 3.1 and 6.2, Prop. 26.
    """
    x = as_float_tensor(x, "x", min_ndim=2)
    depth = check_int(depth, "depth", 0)
    check_choice(normalize, "normalize", (None, "layer", "sphere"))
    residual = check_bool(residual, "residual")
    step_size = check_positive(step_size, "step_size")
    d = x.shape[-1]
    wq, wk = layer_matrices(w_q, "w_q", x, depth, False), layer_matrices(w_k, "w_k", x, depth, False)
    wv = layer_matrices(w_v, "w_v", x, depth, True)
    if (wq is None) != (wk is None) and (wq if wq is not None else wk).shape[2] != d:
        raise ValueError("when only one of w_q, w_k is given it must be square (the other is the identity)")
    if x.shape[-2] == 0:
        return torch.stack([x] * (depth + 1))
    mu_w = EmpiricalMeasure._named(x, weights, "x", "weights").weights  # also checks x
    return flow(x, depth, wq, wk, wv, None if weights is None else mu_w, similarity, scale, residual, step_size,
                normalize)


# -------- maximum entropy (Thm. 14) ---------------------------------------------------------


def maximum_entropy_tilt(nu: EmpiricalMeasure, statistics, target, *, max_iter: int = 100,
                         tol: float | None = None) -> tuple[EmpiricalMeasure, torch.Tensor]:
    r"""The exponential tilt of :math:`\nu` with given moments, the maximum-entropy solution of Thm. 14 of Vuckovic et al. (2020).

    Among measures :math:`\mu\ll\nu` with :math:`\mu(k)=f`, the relative entropy
    :math:`H_\nu(\mu)=-\mathrm{KL}(\mu\|\nu)` is maximised by the Boltzmann-Gibbs reweighting
    :math:`\mu^*=\Psi_{G}(\nu)` with :math:`G(y)=\exp\langle\lambda,k(y)\rangle`.  :math:`\lambda`
    minimises the convex dual

    .. math::

        \lambda\mapsto\log\nu\big(e^{\langle\lambda,k\rangle}\big)-\langle\lambda,f\rangle ,

    whose gradient is :math:`\Psi_G(\nu)(k)-f` and Hessian the covariance of :math:`k` under
    :math:`\Psi_G(\nu)`; it is solved by Newton's method with a batched backtracking line search
    (``attnopt.kernels._maxent``).

    Args:
        nu: base measure :math:`\nu` on ``N`` atoms.
        statistics: :math:`k(x,y_j)` at the atoms, shape ``(..., N, l)`` (one query :math:`x` per
            batch entry).
        target: the moment vector :math:`f(x)`, shape ``(..., l)``.
        max_iter: Newton iterations.
        tol: tolerance on :math:`\|\Psi_G(\nu)(k)-f\|_\infty`; default ``1e-10`` (float64) or
            ``1e-5`` (lower precision).

    Returns:
        ``(mu_star, lam)``: the maximiser :math:`\Psi_G(\nu)` and :math:`\lambda`, shape ``(..., l)``.
        An empty batch, no statistic (``l = 0``: the answer is :math:`\nu`) or ``meta`` tensors
        (shapes without values) return at once, without iterating.

    Raises:
        ValueError: when the moment condition is not met to ``tol`` (for instance a target outside
            the relative interior of the convex hull of the statistics, where no tilt attains it);
            shapes that do not match or broadcast; NaN or infinite entries; tensors on different
            devices; ``max_iter < 0``; ``tol`` not a finite number > 0.
        TypeError: non-float or mixed-dtype tensors, ``max_iter`` not an int.

    Examples:
        The measure on :math:`\{0,1,2\}` of largest entropy with mean 1.5:

        >>> atoms = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
        >>> target = torch.tensor([1.5], dtype=torch.float64)
        >>> nu = EmpiricalMeasure(atoms)
        >>> mu, lam = maximum_entropy_tilt(nu, atoms, target)
        >>> mu.mean()
        tensor([1.5000], dtype=torch.float64)

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Thm. 14.
    """
    nu = _as_measure(nu, "nu")
    k, f, batch, max_iter, tol = tilt_args(nu, statistics, target, max_iter, tol)
    logw = log_or_neg_inf(nu.weights)
    lam = torch.zeros(*batch, k.shape[-1], dtype=k.dtype, device=k.device)
    nothing_to_solve = k.device.type == "meta" or lam.numel() == 0  # the result's shapes, at once
    if not nothing_to_solve:
        lam = newton_tilt(logw, k, f, lam, max_iter, tol)
    p = torch.softmax(logw + (k @ lam.unsqueeze(-1)).squeeze(-1), dim=-1)
    if nothing_to_solve:
        return EmpiricalMeasure._trusted(nu.points, p), lam
    resid = ((p.unsqueeze(-1) * k).sum(-2) - f).abs().max().item()
    if not resid <= tol:
        raise ValueError(
            f"maximum-entropy tilt did not reach the target moments (residual {resid:.3g} > tol {tol:.3g}); "
            "the target may lie outside the relative interior of the convex hull of the statistics"
        )
    return EmpiricalMeasure._trusted(nu.points, p), lam
