r"""Attention as nonlinear Markov transport of probability measures.

This module follows the measure-theoretic model of attention of the Markov-kernel paper
("A Mathematical Theory of Attention", Vuckovic, Baratin and Tachet des Combes, 2020).  A set of
tokens :math:`X=\{x_1,\dots,x_N\}\subset E\subseteq\mathbb{R}^d` is represented by the weighted
empirical measure :math:`\mu=\sum_i w_i\,\delta_{x_i}` (:class:`EmpiricalMeasure`; uniform weights
give the measure :math:`m(X)` of the paper), and one attention layer is the composition

.. math::

    \mathbf{A}_\mu(x,\mathrm{d}z) = \Pi\big[\Psi_{G(x,\bullet)}(\mu)\,L\big](\mathrm{d}z),

of three pieces, each a function here:

* the Boltzmann-Gibbs reweighting :math:`\Psi_g(\nu)(\mathrm{d}y)=g(y)\nu(\mathrm{d}y)/\nu(g)`
  (Def. 3, :func:`boltzmann_gibbs`) and the softmatch kernel :math:`x\mapsto\Psi_{G(x,\bullet)}(\mu)`
  built from an interaction potential :math:`G=e^{a}` (Def. 4, :func:`softmatch_kernel`);
* the lookup kernel :math:`L(k,\mathrm{d}v)=\delta_{\ell(k)}(\mathrm{d}v)` that carries keys to
  values (Def. 5, :func:`lookup_kernel`);
* the moment projection :math:`\Pi(\mu)=\delta_{\mu(F)}` onto Dirac measures, which with
  :math:`F(x)=x` replaces a measure by its mean (Defs. 6-7, :func:`moment_projection`).

:func:`attention_kernel` composes them and reproduces matrix attention exactly (Prop. 9);
:func:`multihead_attention_kernel` is the mixture kernel of the paper's Appendix A (Prop. 12), and
:func:`self_attention_flow` iterates :math:`\delta_{x_i}\mapsto\delta_{x_i}\mathbf{A}_{\mu}` as an
interacting particle system.  :func:`maximum_entropy_tilt` solves the maximum-entropy problem of
Thm. 14 whose solution is a Boltzmann-Gibbs reweighting.

Regularity is measured in the 1-Wasserstein distance with :math:`\ell_1` ground cost,
:func:`wasserstein1` (exact), and the paper's Lipschitz/contraction constants are
:func:`contraction_bound` (Thm. 23), :func:`lipschitz_bound` (Cor. 24),
:func:`neighbourhood_bound` (Prop. 25) and :func:`gaussian_potential_bound` (Thm. 29 / Cor. 30),
to be compared with measured ratios (:func:`lipschitz_ratio`, :func:`contraction_ratio`).
Thm. 23 and Prop. 25 are returned in a corrected form by default (the printed constants vanish
for a constant potential, which cannot be right; see :func:`contraction_bound`), the printed
form with ``as_printed=True``.

Conventions.  Every distance on :math:`E` is the :math:`\ell_1` distance
:math:`d(x,y)=\|x-y\|_1`, as in the paper's definition of :math:`\mathbb{W}_1`, so Lipschitz
semi-norms of potentials are taken with respect to :math:`\ell_1` (their dual norm on gradients is
:math:`\ell_\infty`) and :math:`\operatorname{diam}(E)` is an :math:`\ell_1` diameter.
"""

from __future__ import annotations

import math
import sys
from typing import Callable, Union

import numpy as np
import torch

from ._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool,
    check_choice,
    check_finite,
    check_no_overflow,
    check_int,
    check_nonnegative,
    check_number,
    check_positive,
    check_probability_vector,
    check_same_device,
    check_same_dtype,
    check_shape_match,
    require,
)

__all__ = [
    "EmpiricalMeasure",
    "attention_kernel",
    "boltzmann_gibbs",
    "contraction_bound",
    "contraction_ratio",
    "dot_product_potential_constants",
    "gaussian_potential_attention",
    "gaussian_potential_bound",
    "gaussian_potential_constants",
    "lipschitz_bound",
    "lipschitz_ratio",
    "lookup_kernel",
    "maximum_entropy_tilt",
    "moment_projection",
    "multihead_attention_kernel",
    "neighbourhood_bound",
    "self_attention_flow",
    "softmatch_kernel",
    "wasserstein1",
]

Similarity = Union[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


# --------------------------------------------------------------------------------------------
# Empirical measures
# --------------------------------------------------------------------------------------------


class EmpiricalMeasure:
    r"""A batch of discrete probability measures :math:`\mu=\sum_{i=1}^N w_i\,\delta_{x_i}`.

    With uniform weights this is the empirical measure :math:`m(X)=\frac1N\sum_i\delta_{x_i}` of
    the Markov-kernel paper (Sec. 3.1).  The leading ("batch") dimensions of ``points`` and
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

    Example:
        >>> mu = EmpiricalMeasure(torch.tensor([[0.0, 0.0], [2.0, 4.0]]))
        >>> mu.mean()
        tensor([1., 2.])
    """

    __slots__ = ("points", "weights", "_uniform")

    def __init__(self, points, weights=None):
        self._setup(points, weights, "points", "weights")

    def _setup(self, points, weights, points_name: str, weights_name: str) -> None:
        """Validate and store, naming the arguments as the caller's user wrote them."""
        points = as_float_tensor(points, points_name, min_ndim=2)
        if points.shape[-2] == 0:
            raise ValueError(
                f"{points_name} must hold at least one atom (shape (..., N, d) with N >= 1): a probability "
                f"measure needs one; got {tuple(points.shape)}"
            )
        if points.shape[-1] == 0:
            raise ValueError(f"{points_name} must have dimension d >= 1 (shape (..., N, d)); got {tuple(points.shape)}")
        if weights is None:
            n = points.shape[-2]
            weights = torch.full(points.shape[:-1], 1.0 / n, dtype=points.dtype, device=points.device)
            self._uniform = True
        else:
            self._uniform = False
            weights = as_float_tensor(weights, weights_name, min_ndim=1, like=points)
            check_same_device(weights, weights_name, points, points_name)
            weights = weights.to(points.dtype)
            check_shape_match(points, points_name, weights, weights_name, [(-2, -1)])
            broadcast_shapes(**{f"the batch dimensions of {points_name}": points.shape[:-2],
                                f"the batch dimensions of {weights_name}": weights.shape[:-1]})
            check_finite(weights, weights_name)
            check_probability_vector(weights, weights_name)
        check_finite(points, points_name)
        self.points = points
        self.weights = weights

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
        values = _table(values, self, "values", "the measure's points")
        return _weighted_sum(self.weights, values)

    def mean(self) -> torch.Tensor:
        r"""The moment vector :math:`\mu(\mathrm{id})=\sum_i w_i x_i`, shape ``(..., d)``."""
        return _weighted_sum(self.weights, self.points)

    def __repr__(self) -> str:
        return (
            f"EmpiricalMeasure(batch_shape={tuple(self.batch_shape)}, n_atoms={self.n_atoms}, "
            f"dim={self.dim}, dtype={self.dtype}, device={self.device})"
        )


def _weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``sum_i w[..., i] * values[..., i, :]`` without materialising a broadcast copy of ``values``.

    When ``values`` has a singleton dimension just before the atoms (one support shared by the
    rows of a kernel), the sum is a plain matrix product.
    """
    if values.ndim >= 3 and values.shape[-3] == 1 and weights.ndim >= 2:
        return torch.matmul(weights, values.squeeze(-3))
    return torch.matmul(weights.unsqueeze(-2), values).squeeze(-2)


def _as_measure(x, name: str) -> EmpiricalMeasure:
    if isinstance(x, EmpiricalMeasure):
        return x
    if isinstance(x, torch.Tensor):
        return EmpiricalMeasure._named(x, None, name)
    raise TypeError(f"{name} must be an EmpiricalMeasure or a (..., N, d) tensor of points; got {type(x).__name__}")


def _log_weights(w: torch.Tensor) -> torch.Tensor:
    """``log w`` with ``log 0 = -inf`` and no NaN gradient at the zeros (a zero weight masks an atom)."""
    pos = w > 0
    return torch.where(pos, torch.log(torch.where(pos, w, torch.ones_like(w))), torch.full_like(w, float("-inf")))


def _table(values, mu: EmpiricalMeasure, name: str, mu_name: str) -> torch.Tensor:
    """Validate values ``(..., N, l)`` attached to the atoms of ``mu`` (a lookup table, a function's values)."""
    values = as_float_tensor(values, name, min_ndim=2, like=mu.points)
    check_same_dtype(values, name, mu.points, mu_name)
    check_same_device(values, name, mu.points, mu_name)
    check_shape_match(values, name, mu.points, mu_name, [(-2, -2)])
    broadcast_shapes(**{f"the batch dimensions of {name}": values.shape[:-2],
                        f"the batch dimensions of {mu_name}": mu.batch_shape})
    check_finite(values, name)
    return values


# --------------------------------------------------------------------------------------------
# Boltzmann-Gibbs transformation, softmatch, lookup, moment projection, attention kernel
# --------------------------------------------------------------------------------------------


def boltzmann_gibbs(nu: EmpiricalMeasure, potential=None, *, log_potential=None) -> EmpiricalMeasure:
    r"""Boltzmann-Gibbs transformation :math:`\Psi_g(\nu)(\mathrm{d}x) = g(x)\,\nu(\mathrm{d}x)/\nu(g)`.

    Def. 3 of the Markov-kernel paper.  For :math:`\nu=\sum_i w_i\delta_{x_i}` the result keeps the
    atoms and reweights them, :math:`w_i' = w_i g(x_i)/\sum_j w_j g(x_j)`; the computation is done
    in log space (a softmax of :math:`\log w_i + \log g(x_i)`), so ``log_potential`` may hold
    values whose exponential would overflow.

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
    """
    nu = _as_measure(nu, "nu")
    if (potential is None) == (log_potential is None):
        raise ValueError("give exactly one of potential and log_potential")
    name = "potential" if potential is not None else "log_potential"
    given = potential if potential is not None else log_potential
    values = given(nu.points) if callable(given) else given
    values = as_float_tensor(values, name, min_ndim=1, like=nu.points)
    check_same_dtype(values, name, nu.points, "nu's points")
    check_same_device(values, name, nu.points, "nu's points")
    check_shape_match(values, name, nu.weights, "nu.weights", [(-1, -1)])
    broadcast_shapes(**{f"the batch dimensions of {name}": values.shape[:-1], "the batch dimensions of nu": nu.batch_shape})
    if potential is not None:
        check_finite(values, name)
        check_nonnegative(values, name, what=" (g: E -> [0, inf))")
        logits = _log_weights(values)
    else:
        check_finite(values, name, allow_neg_inf=True)
        logits = values
    logits = logits + _log_weights(nu.weights)
    require((logits > float("-inf")).any(dim=-1).all(), "nu(g) = 0: the potential vanishes on the whole support of nu")
    return EmpiricalMeasure._trusted(nu.points, torch.softmax(logits, dim=-1))


def _similarity_logits(queries: torch.Tensor, keys: torch.Tensor, similarity: Similarity, scale, q_name: str,
                       k_name: str) -> torch.Tensor:
    """Log-potential matrix a(q_i, k_j), shape (..., M, N), finite (or -inf from a callable)."""
    if callable(similarity):
        name = "similarity(queries, keys)"
        out = as_float_tensor(similarity(queries, keys), name, min_ndim=2)
        check_same_dtype(out, name, queries, q_name)
        check_same_device(out, name, queries, q_name)
        if out.shape[-2:] != (queries.shape[-2], keys.shape[-2]):
            raise ValueError(f"{name} must have shape (..., {queries.shape[-2]}, {keys.shape[-2]}); got {tuple(out.shape)}")
        check_finite(out, name, allow_neg_inf=True)
        return out
    if not isinstance(similarity, str):
        raise TypeError(f"similarity must be 'dot', 'gaussian' or a callable; got {type(similarity).__name__}")
    if similarity == "dot":
        s = 1.0 / math.sqrt(queries.shape[-1]) if scale is None else check_positive(scale, "scale")
        # no intermediate overflow: a shrinking s scales both factors by sqrt(s) before the product (as
        # PyTorch's reference SDPA does; s itself may be below the smallest float32), a growing one the product
        root = math.sqrt(s)
        logits = (queries * root) @ (keys * root).mT if s < 1.0 else s * (queries @ keys.mT)
        what = f"scale * <{q_name}, {k_name}>"
    elif similarity == "gaussian":
        s = 1.0 if scale is None else check_positive(scale, "scale")
        # -s|q - k|^2 = s(2<q, k> - |k|^2) - s|q|^2; the last term is constant along a row of the kernel and
        # cancels in the normalisation, so it is dropped (exactly).  Both sides are first moved by the keys'
        # mean (which leaves |q - k| unchanged and the kernel exactly the same, so it is detached): far from
        # the origin |q - k|^2 would otherwise be lost to cancellation against |q|^2 and |k|^2.  sqrt(s)
        # scales both factors before the product.
        centre = keys.detach().mean(dim=-2, keepdim=True)
        root = math.sqrt(s)
        qc, kc = (queries - centre) * root, (keys - centre) * root
        logits = 2.0 * (qc @ kc.mT) - kc.pow(2).sum(-1).unsqueeze(-2)
        what = f"scale * |{q_name} - {k_name}|^2"
    else:
        raise ValueError(f"similarity must be 'dot', 'gaussian' or a callable; got {similarity!r}")
    check_no_overflow(logits, f"the similarities {what}", f"{q_name}, {k_name} or scale")
    return logits


def _softmatch(queries, mu: EmpiricalMeasure, similarity: Similarity, scale, q_name: str, k_name: str) -> torch.Tensor:
    """The softmatch matrix, the arguments named as the caller's user wrote them."""
    queries = as_float_tensor(queries, q_name, min_ndim=2, like=mu.points)
    check_same_dtype(queries, q_name, mu.points, k_name)
    check_same_device(queries, q_name, mu.points, k_name)
    if not callable(similarity):
        check_shape_match(queries, q_name, mu.points, k_name, [(-1, -1)])
    broadcast_shapes(**{f"the batch dimensions of {q_name}": queries.shape[:-2],
                        f"the batch dimensions of {k_name}": mu.batch_shape})
    check_finite(queries, q_name)
    logits = _similarity_logits(queries, mu.points, similarity, scale, q_name, k_name)
    if not mu._uniform:  # uniform weights shift every logit of a row equally: no effect
        logits = logits + _log_weights(mu.weights).unsqueeze(-2)
    if callable(similarity) or not mu._uniform:
        # a named similarity is finite and some weight positive: only a callable can leave a row empty
        require(
            (logits > float("-inf")).any(dim=-1).all(),
            "similarity(queries, keys) is -inf on every key of positive weight for some query: "
            "Psi_G(mu) needs mu(G(q, .)) > 0",
        )
    return torch.softmax(logits, dim=-1)


def softmatch_kernel(queries, mu, *, similarity: Similarity = "dot", scale: float | None = None) -> torch.Tensor:
    r"""Softmatch kernel :math:`x\mapsto\Psi_{G(x,\bullet)}(\mu)` at the given query points.

    Def. 4 of the Markov-kernel paper, with interaction potential :math:`G(x,y)=e^{a(x,y)}`: for
    :math:`\mu=\sum_j w_j\delta_{k_j}`,

    .. math::

        \Psi_{G(q_i,\bullet)}(\mu) = \sum_j P_{ij}\,\delta_{k_j},\qquad
        P_{ij} = \frac{w_j\,e^{a(q_i,k_j)}}{\sum_l w_l\,e^{a(q_i,k_l)}} .

    With uniform :math:`w` this is :math:`\operatorname{softmax}_j a(q_i,k_j)` (Sec. 3.1).  The
    left action of the kernel on a query measure :math:`\sum_i u_i\delta_{q_i}` is ``u @ P``.

    The similarities are formed without intermediate overflow (the scale is applied to a factor
    before the product when it shrinks; the Gaussian one in coordinates centred at the keys'
    mean, so that translating queries and keys together changes nothing).

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
    """
    mu = _as_measure(mu, "mu")
    return _softmatch(queries, mu, similarity, scale, "queries", "mu")


def lookup_kernel(mu: EmpiricalMeasure, table) -> EmpiricalMeasure:
    r"""Push a measure through a deterministic lookup kernel :math:`L(k,\mathrm{d}v)=\delta_{\ell(k)}(\mathrm{d}v)`.

    Def. 5 of the Markov-kernel paper: :math:`\mu L = \sum_j w_j\,\delta_{\ell(k_j)}`.  The lookup
    table :math:`k_j\mapsto v_j` of Prop. 9 is given as the tensor of values aligned with the atoms;
    a lookup *function* :math:`\ell` (e.g. the value projection :math:`x\mapsto xW^V` of the
    Transformer, Sec. 3.2) is given as a callable on the atoms.

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
    """
    mu = _as_measure(mu, "mu")
    if callable(table):
        values = _table(table(mu.points), mu, "table(points)", "mu")
    else:
        values = _table(table, mu, "table", "mu")
    return EmpiricalMeasure._trusted(values, mu.weights)


def moment_projection(mu: EmpiricalMeasure, feature_map: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    r"""Moment projection :math:`\Pi_{\mathcal F}(\mu)=\nu_{\mu(F)}` onto a moment subspace.

    Defs. 6-7 (eq. (2)) of the Markov-kernel paper.  The measure is summarised by its moment vector
    :math:`\mu(F)=\sum_i w_i F(x_i)`; with :math:`F(x)=x` and :math:`\mathcal F=\mathcal P_\delta(E)`
    (the case used by attention) the projection is the Dirac mass :math:`\delta_{\mu(F)}` at the
    mean, identified with the point :math:`\mu(F)` through :math:`x\leftrightarrow\delta_x`.

    Args:
        mu: the measure.
        feature_map: :math:`F` as a callable ``points (..., N, d) -> (..., N, l)``; default identity.

    Returns:
        The moment vector :math:`\mu(F)`, shape ``(..., l)`` (``(..., d)`` by default); wrap it with
        :meth:`EmpiricalMeasure.dirac` for the Dirac measure itself.
    """
    mu = _as_measure(mu, "mu")
    if feature_map is None:
        return mu.mean()
    return _weighted_sum(mu.weights, _table(feature_map(mu.points), mu, "feature_map(points)", "mu"))


def attention_kernel(
    queries,
    keys,
    values=None,
    *,
    key_weights=None,
    similarity: Similarity = "dot",
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Attention kernel :math:`\mathbf A_\mu(q,\cdot)=\Pi[\Psi_{G(q,\bullet)}(\mu)L]` applied to Dirac queries.

    Def. 8 of the Markov-kernel paper, evaluated literally as the composition of
    :func:`softmatch_kernel`, :func:`lookup_kernel` and :func:`moment_projection`.  Prop. 9: with
    :math:`\mu=m(K)`, :math:`G=e^{a}` and the lookup table :math:`k_j\mapsto v_j`,

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
    kernel = _softmatch(queries, mu, similarity, scale, q_name, k_name)
    # One measure per query, all on the same atoms: points (..., 1, N, d), weights (..., M, N).
    rows = EmpiricalMeasure._trusted(mu.points.unsqueeze(-3), kernel)
    if values is None:
        table = rows.points
    elif callable(values):
        table = _table(values(rows.points), rows, f"{v_name}(keys)", k_name)
    else:
        table = _table(values, mu, v_name, k_name).unsqueeze(-3)
    return moment_projection(EmpiricalMeasure._trusted(table, rows.weights)), kernel


def gaussian_potential_attention(queries, keys, values=None, *, key_weights=None, scale: float = 1.0):
    r"""Attention with the Gaussian interaction potential :math:`G(q,k)=\exp(-s\|q-k\|_2^2)`.

    The potential of Sec. 6.3 (Prop. 28, Thm. 29) of the Markov-kernel paper, for which attention
    is Lipschitz on all of :math:`\mathbb R^d`, unlike dot-product attention:

    .. math::

        y_i = \sum_j \frac{w_j\,e^{-s\|q_i-k_j\|_2^2}}{\sum_l w_l\,e^{-s\|q_i-k_l\|_2^2}}\, v_j .

    Args:
        queries, keys, values, key_weights: as in :func:`attention_kernel`.
        scale: :math:`s>0`; Thm. 29 is stated for :math:`s=1`.

    Returns:
        ``(output, kernel)`` as in :func:`attention_kernel`.
    """
    return attention_kernel(queries, keys, values, key_weights=key_weights, similarity="gaussian", scale=scale)


def multihead_attention_kernel(
    queries,
    keys,
    values,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    *,
    key_weights=None,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Multi-head attention as the projected mixture kernel of the paper's Appendix A.

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
    """
    queries = as_float_tensor(queries, "queries", min_ndim=2)
    tensors = {"queries": queries}
    for name, x, ndim in (("keys", keys, 2), ("values", values, 2), ("w_q", w_q, 3), ("w_k", w_k, 3), ("w_v", w_v, 3),
                          ("w_o", w_o, 3)):
        x = as_float_tensor(x, name, min_ndim=ndim, like=queries)
        check_same_dtype(x, name, queries, "queries")
        check_same_device(x, name, queries, "queries")
        if ndim == 3 and x.ndim != 3:
            raise ValueError(f"{name} must have shape (H, d_in, d_out); got {tuple(x.shape)}")
        tensors[name] = x
    keys, values = tensors["keys"], tensors["values"]
    ws = {name: tensors[name] for name in ("w_q", "w_k", "w_v", "w_o")}
    heads = ws["w_q"].shape[0]
    if heads == 0:
        raise ValueError("w_q must hold at least one head (shape (H, d, d_h) with H >= 1): the mixture over heads needs one")
    for name in ("w_k", "w_v", "w_o"):
        check_shape_match(ws["w_q"], "w_q", ws[name], name, [(0, 0)])
    check_shape_match(ws["w_q"], "w_q", ws["w_k"], "w_k", [(2, 2)])
    check_shape_match(queries, "queries", ws["w_q"], "w_q", [(-1, 1)])
    check_shape_match(keys, "keys", ws["w_k"], "w_k", [(-1, 1)])
    check_shape_match(values, "values", ws["w_v"], "w_v", [(-1, 1)])
    check_shape_match(values, "values", keys, "keys", [(-2, -2)])
    check_shape_match(ws["w_v"], "w_v", ws["w_o"], "w_o", [(2, 1)])
    for name, x in tensors.items():
        check_finite(x, name)
    # Per-head projections, heads as a batch dimension: (..., H, M, d_h).
    q = torch.matmul(queries.unsqueeze(-3), ws["w_q"])
    k = torch.matmul(keys.unsqueeze(-3), ws["w_k"])
    v = torch.matmul(values.unsqueeze(-3), ws["w_v"])
    kw = None if key_weights is None else as_float_tensor(key_weights, "key_weights", min_ndim=1, like=queries).unsqueeze(-2)
    mu = EmpiricalMeasure._named(k, kw, "keys @ w_k", "key_weights")
    y, _ = _attention(q, mu, v, "dot", scale, ("queries @ w_q", "keys @ w_k", "values @ w_v"))  # (..., H, M, d_v)
    # Mixture (1/H) sum_h delta_{H y^h W^O_h}: atoms indexed by h, shape (..., M, H, d_out).
    atoms = heads * torch.matmul(y, ws["w_o"]).movedim(-3, -2)
    uniform = torch.full(atoms.shape[:-1], 1.0 / heads, dtype=atoms.dtype, device=atoms.device)
    return moment_projection(EmpiricalMeasure._trusted(atoms, uniform))


def self_attention_flow(
    x,
    depth: int,
    *,
    w_q=None,
    w_k=None,
    w_v=None,
    weights=None,
    similarity: Similarity = "dot",
    scale: float | None = None,
    residual: bool = False,
    step_size: float = 1.0,
    normalize: str | None = None,
) -> torch.Tensor:
    r"""Iterate self-attention as an interacting particle system (Sec. 3.1, Sec. 6.2).

    With :math:`\mu^h=\sum_i w_i\delta_{x^h_i}` the particles move by nonlinear Markov transport
    :math:`\delta_{x^{h+1}_i}=\delta_{x^h_i}\mathbf A^h_{\mu^h}`, i.e.

    .. math::

        x^{h+1}_i = N\!\Big(x^h_i\,[\,\text{if residual}\,] + \eta\sum_j
        \frac{w_j e^{a(x^h_iW^Q_h,\;x^h_jW^K_h)}}{\sum_l w_l e^{a(x^h_iW^Q_h,\;x^h_lW^K_h)}}\,x^h_jW^V_h\Big),

    where :math:`N` is an optional normalisation.  Shared matrices give the weight-tied
    ("Universal Transformer") recurrence of Sec. 6.2, whose fixed point Prop. 26 discusses.

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
    """
    x = as_float_tensor(x, "x", min_ndim=2)
    depth = check_int(depth, "depth", 0)
    check_choice(normalize, "normalize", (None, "layer", "sphere"))
    residual = check_bool(residual, "residual")
    step_size = check_positive(step_size, "step_size")
    d = x.shape[-1]

    def per_layer(w, name, square):
        if w is None:
            return None
        w = as_float_tensor(w, name, like=x)
        check_same_dtype(w, name, x, "x")
        check_same_device(w, name, x, "x")
        check_finite(w, name)
        if w.ndim == 2:
            w = w.unsqueeze(0).expand(max(depth, 1), *w.shape)
        elif w.ndim != 3 or w.shape[0] != depth:
            raise ValueError(f"{name} must have shape (d, d') or (depth={depth}, d, d'); got {tuple(w.shape)}")
        if w.shape[1] != d or (square and w.shape[2] != d):
            want = f"(.., {d}, {d})" if square else f"(.., {d}, d')"
            raise ValueError(f"{name} must map R^{d} to R^{d if square else 'd'}' (shape {want}); got {tuple(w.shape)}")
        return w

    wq, wk, wv = per_layer(w_q, "w_q", False), per_layer(w_k, "w_k", False), per_layer(w_v, "w_v", True)
    if (wq is None) != (wk is None) and (wq if wq is not None else wk).shape[2] != d:
        raise ValueError("when only one of w_q, w_k is given it must be square (the other is the identity)")
    if x.shape[-2] == 0:
        return torch.stack([x] * (depth + 1))
    mu_w = EmpiricalMeasure._named(x, weights, "x", "weights").weights  # also checks x
    layers = [x]
    for h in range(depth):  # layers are sequential; everything inside a layer is batched
        q = x if wq is None else x @ wq[h]
        k = x if wk is None else x @ wk[h]
        v = x if wv is None else x @ wv[h]
        names = tuple(f"the {what} of layer {h + 1}" for what in ("queries", "keys", "values"))
        mu = EmpiricalMeasure._named(k, None if weights is None else mu_w, names[1], "weights")
        out, _ = _attention(q, mu, v, similarity, scale, names)
        out = step_size * out
        x = x + out if residual else out
        if normalize == "layer":
            x = torch.nn.functional.layer_norm(x, (d,))
        elif normalize == "sphere":
            x = x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        layers.append(x)
    return torch.stack(layers)


# --------------------------------------------------------------------------------------------
# Maximum entropy (Thm. 14)
# --------------------------------------------------------------------------------------------


def maximum_entropy_tilt(
    nu: EmpiricalMeasure,
    statistics,
    target,
    *,
    max_iter: int = 100,
    tol: float | None = None,
) -> tuple[EmpiricalMeasure, torch.Tensor]:
    r"""Solve the maximum-entropy problem of Thm. 14: the exponential tilt of :math:`\nu` with given moments.

    Among measures :math:`\mu\ll\nu` with :math:`\mu(k)=f`, the relative entropy
    :math:`H_\nu(\mu)=-\mathrm{KL}(\mu\|\nu)` is maximised by the Boltzmann-Gibbs reweighting
    :math:`\mu^*=\Psi_{G}(\nu)` with :math:`G(y)=\exp\langle\lambda,k(y)\rangle` (Thm. 14 of the
    Markov-kernel paper).  :math:`\lambda` minimises the convex dual

    .. math::

        \lambda\mapsto\log\nu\big(e^{\langle\lambda,k\rangle}\big)-\langle\lambda,f\rangle ,

    whose gradient is :math:`\Psi_G(\nu)(k)-f` and Hessian the covariance of :math:`k` under
    :math:`\Psi_G(\nu)`; it is solved by Newton's method with a batched backtracking line search.

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

    An empty batch, no statistic (``l = 0``: the answer is :math:`\nu`) or ``meta`` tensors (shapes
    without values) return at once, without iterating.

    Raises:
        ValueError: when the moment condition is not met to ``tol`` (for instance a target outside
            the relative interior of the convex hull of the statistics, where no tilt attains it);
            shapes that do not match or broadcast; NaN or infinite entries; tensors on different
            devices; ``max_iter < 0``; ``tol`` not a finite number > 0.
        TypeError: non-float or mixed-dtype tensors, ``max_iter`` not an int.
    """
    nu = _as_measure(nu, "nu")
    k = as_float_tensor(statistics, "statistics", min_ndim=2, like=nu.points)
    f = as_float_tensor(target, "target", min_ndim=1, like=nu.points)
    for name, x in (("statistics", k), ("target", f)):
        check_same_dtype(x, name, nu.points, "nu's points")
        check_same_device(x, name, nu.points, "nu's points")
    check_shape_match(k, "statistics", nu.weights, "nu.weights", [(-2, -1)])
    check_shape_match(k, "statistics", f, "target", [(-1, -1)])
    batch = broadcast_shapes(**{"the batch dimensions of statistics": k.shape[:-2],
                                "the batch dimensions of target": f.shape[:-1], "the batch dimensions of nu": nu.batch_shape})
    max_iter = check_int(max_iter, "max_iter", 0)
    tol = (1e-10 if k.dtype == torch.float64 else 1e-5) if tol is None else check_positive(tol, "tol")
    check_finite(k, "statistics")
    check_finite(f, "target")
    logw = _log_weights(nu.weights)
    lam = torch.zeros(*batch, k.shape[-1], dtype=k.dtype, device=k.device)
    steps = 0.5 ** torch.arange(0, 30, dtype=k.dtype, device=k.device)  # candidate step sizes
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)

    def dual(lmb):  # (..., l) -> (...)
        return torch.logsumexp(logw + (k @ lmb.unsqueeze(-1)).squeeze(-1), dim=-1) - (lmb * f).sum(-1)

    if k.device.type == "meta" or lam.numel() == 0:  # nothing to iterate on: the result's shapes
        max_iter = 0
    for _ in range(max_iter):
        p = torch.softmax(logw + (k @ lam.unsqueeze(-1)).squeeze(-1), dim=-1)
        mean = (p.unsqueeze(-1) * k).sum(-2)
        grad = mean - f
        if grad.abs().max() <= tol:
            break
        centred = k - mean.unsqueeze(-2)
        hess = (p.unsqueeze(-1) * centred).transpose(-2, -1) @ centred
        ridge = 1e-12 * hess.diagonal(dim1=-2, dim2=-1).amax(-1).clamp_min(1.0)
        direction = -torch.linalg.solve(hess + ridge[..., None, None] * eye, grad.unsqueeze(-1)).squeeze(-1)
        # Armijo backtracking, all candidate steps at once: (S, ..., l).
        cand = lam.unsqueeze(0) + steps.view(-1, *([1] * lam.ndim)) * direction.unsqueeze(0)
        vals, current = dual(cand), dual(lam)
        # Near the solution the decrease of a Newton step is below the rounding error of the dual's
        # value, and an exact Armijo test would reject every step: allow a few ulps of slack.
        slack = 8 * torch.finfo(k.dtype).eps * (1 + current.abs())
        ok = vals <= (current + slack).unsqueeze(0) + 1e-4 * steps.view(-1, *([1] * (lam.ndim - 1))) * (grad * direction).sum(-1)
        first = torch.where(ok.any(0), ok.int().argmax(0), torch.full_like(ok[0], steps.numel() - 1, dtype=torch.long))
        lam = torch.gather(cand, 0, first.view(1, *first.shape, 1).expand(1, *lam.shape)).squeeze(0)
    p = torch.softmax(logw + (k @ lam.unsqueeze(-1)).squeeze(-1), dim=-1)
    if k.device.type == "meta" or lam.numel() == 0:
        return EmpiricalMeasure._trusted(nu.points, p), lam
    resid = ((p.unsqueeze(-1) * k).sum(-2) - f).abs().max().item()
    if not resid <= tol:
        raise ValueError(
            f"maximum-entropy tilt did not reach the target moments (residual {resid:.3g} > tol {tol:.3g}); "
            "the target may lie outside the relative interior of the convex hull of the statistics"
        )
    points = nu.points
    return EmpiricalMeasure._trusted(points, p), lam


# --------------------------------------------------------------------------------------------
# Exact 1-Wasserstein distance with l1 ground cost
# --------------------------------------------------------------------------------------------


def _ssp_transport(a: np.ndarray, b: np.ndarray, cost: np.ndarray):
    """Exact transport by successive shortest paths (dense Dijkstra on reduced costs).

    Returns the plan and dual potentials ``(f, g)`` with ``f_i + g_j <= C_ij``.  Pure NumPy; each
    Dijkstra is O((n+m)^2) with vectorised relaxations, so this is for moderate sizes.
    """
    n, m = cost.shape
    plan = np.zeros((n, m))
    excess, deficit = a.copy(), b.copy()
    ps, pt = np.zeros(n), np.zeros(m)  # reduced cost of i -> j is C_ij + ps_i - pt_j >= 0
    tol = 1e-14
    while excess.max() > tol and deficit.max() > tol:
        rc = cost + ps[:, None] - pt[None, :]
        ds = np.where(excess > tol, 0.0, np.inf)
        dt = np.full(m, np.inf)
        pred_t = np.full(m, -1)
        pred_s = np.full(n, -1)
        done_s = np.zeros(n, bool)
        done_t = np.zeros(m, bool)
        sink, dist = -1, np.inf
        while True:
            cs = np.where(done_s, np.inf, ds)
            ct = np.where(done_t, np.inf, dt)
            i, j = int(cs.argmin()), int(ct.argmin())
            if cs[i] == np.inf and ct[j] == np.inf:
                break
            if cs[i] <= ct[j]:
                done_s[i] = True
                cand = ds[i] + np.maximum(rc[i], 0.0)
                upd = (cand < dt) & ~done_t
                dt[upd] = cand[upd]
                pred_t[upd] = i
            else:
                done_t[j] = True
                if deficit[j] > tol:
                    sink, dist = j, dt[j]
                    break
                cand = dt[j] + np.maximum(-rc[:, j], 0.0)
                upd = (plan[:, j] > 0) & (cand < ds) & ~done_s
                ds[upd] = cand[upd]
                pred_s[upd] = j
        if sink < 0:
            break
        ps += np.where(done_s, np.minimum(ds, dist), dist)
        pt += np.where(done_t, np.minimum(dt, dist), dist)
        # Trace the path back from the sink, find the bottleneck, augment.
        path = []  # (i, j, forward?)
        j = sink
        while True:
            i = pred_t[j]
            path.append((i, j, True))
            if pred_s[i] < 0:
                root = i
                break
            j = pred_s[i]
            path.append((i, j, False))
        delta = min(excess[root], deficit[sink], min((plan[i, j] for i, j, fw in path if not fw), default=np.inf))
        for i, j, fw in path:
            plan[i, j] = plan[i, j] + delta if fw else max(plan[i, j] - delta, 0.0)
        excess[root] = 0.0 if excess[root] <= delta else excess[root] - delta
        deficit[sink] = 0.0 if deficit[sink] <= delta else deficit[sink] - delta
    return plan, -ps, pt


def _l1_cost(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise l1 distances ``(..., N, M)`` (direct differences: ``torch.cdist(p=1)`` is slow on CPU)."""
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1)


def _transport_numpy(a: np.ndarray, b: np.ndarray, cost: np.ndarray, method: str):
    """Optimal plan and dual potentials for one pair, by the chosen exact solver."""
    a = a / a.sum()
    b = b / b.sum()
    n, m = cost.shape
    ia, jb = np.flatnonzero(a > 0), np.flatnonzero(b > 0)
    c = cost[np.ix_(ia, jb)]
    ar, br = a[ia] / a[ia].sum(), b[jb] / b[jb].sum()
    if method == "emd":
        import ot

        plan_r, log = ot.emd(ar, br, c, numItermax=max(100_000, 50 * c.size), log=True)
        if log.get("result_code", 1) != 1:
            raise RuntimeError(f"POT's network simplex did not converge: {log.get('warning')}")
        g = np.asarray(log["v"])
    elif method == "linprog":
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        nr, mr = c.shape
        rows = np.concatenate([np.repeat(np.arange(nr), mr), nr + np.tile(np.arange(mr), nr)])
        cols = np.concatenate([np.arange(nr * mr), np.arange(nr * mr)])
        a_eq = coo_matrix((np.ones(2 * nr * mr), (rows, cols)), shape=(nr + mr, nr * mr)).tocsr()
        res = linprog(c.ravel(), A_eq=a_eq, b_eq=np.concatenate([ar, br]), bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"linprog failed: {res.message}")
        plan_r = res.x.reshape(nr, mr)
        g = res.eqlin.marginals[nr:]
    elif method == "ssp":
        plan_r, _, g = _ssp_transport(ar, br, c)
    else:  # pragma: no cover - guarded by the caller
        raise ValueError(method)
    # Canonical dual potentials on all atoms (c-transforms), so that zero-mass atoms get the
    # tightest admissible value: f_i = min_j C_ij - g_j, g_j = min_i C_ij - f_i.
    g_full = np.full(m, 0.0)
    g_full[jb] = g
    f_full = (cost[:, jb] - g[None, :]).min(axis=1)
    g_full = (cost - f_full[:, None]).min(axis=0)
    plan = np.zeros((n, m))
    plan[np.ix_(ia, jb)] = plan_r
    return plan, f_full, g_full


def _default_lp_method() -> str:
    try:
        import ot  # noqa: F401

        return "emd"
    except ImportError:
        pass
    try:
        import scipy.optimize  # noqa: F401

        return "linprog"
    except ImportError:
        return "ssp"


def _wasserstein1_1d(mu: EmpiricalMeasure, nu: EmpiricalMeasure) -> torch.Tensor:
    r"""Closed form :math:`\int|F_\mu-F_\nu|` on the line, batched and differentiable."""
    batch = torch.broadcast_shapes(mu.batch_shape, nu.batch_shape)
    x = mu.points[..., 0].expand(*batch, mu.n_atoms)
    y = nu.points[..., 0].expand(*batch, nu.n_atoms)
    a = mu.weights.expand(*batch, mu.n_atoms)
    b = nu.weights.expand(*batch, nu.n_atoms)
    z = torch.cat([x, y], dim=-1)
    w = torch.cat([a, -b], dim=-1)
    z_sorted, order = torch.sort(z, dim=-1)
    cdf_gap = torch.cumsum(torch.gather(w, -1, order), dim=-1)[..., :-1]
    return (cdf_gap.abs() * torch.diff(z_sorted, dim=-1)).sum(-1)


def wasserstein1(mu, nu, *, method: str = "auto", return_plan: bool = False):
    r"""Exact 1-Wasserstein distance with :math:`\ell_1` ground cost between discrete measures.

    The distance of Sec. 4 of the Markov-kernel paper,

    .. math::

        \mathbb W_1(\mu,\nu)=\min_{\gamma\ge0,\ \gamma\mathbf 1=a,\ \gamma^\top\mathbf 1=b}
        \sum_{i,j}\gamma_{ij}\,\|x_i-y_j\|_1 ,

    for :math:`\mu=\sum_i a_i\delta_{x_i}`, :math:`\nu=\sum_j b_j\delta_{y_j}` (Santambrogio's
    eq. (6.2), used in the proof of Thm. 29).  In one dimension the closed form
    :math:`\int|F_\mu(t)-F_\nu(t)|\,\mathrm dt` is evaluated in torch (batched).  Otherwise the
    linear program is solved exactly per batch entry on the CPU in float64, and the value is
    rebuilt in torch as :math:`\sum\gamma^\star_{ij}C_{ij}+\langle f,a\rangle+\langle g,b\rangle`
    terms, so that gradients are the envelope-theorem ones: :math:`\sum_j\gamma^\star_{ij}\partial
    C_{ij}` for the points and the optimal dual potentials :math:`(f,g)` for the weights.

    Args:
        mu, nu: :class:`EmpiricalMeasure` (or ``(..., N, d)`` point tensors, uniform weights) with
            the same ``d``; batch shapes broadcast.
        method: ``"auto"`` (closed form when ``d == 1``, else the first available of ``"emd"``,
            ``"linprog"``, ``"ssp"``), ``"1d"``, ``"emd"`` (POT's network simplex, optional
            dependency), ``"linprog"`` (SciPy's HiGHS, optional dependency) or ``"ssp"``
            (built-in successive-shortest-path solver, NumPy only, for moderate sizes).
        return_plan: also return the optimal plans ``(..., N, M)`` (not for ``"1d"``).

    Returns:
        The distances, shape ``batch``; with ``return_plan`` a tuple ``(distance, plan)``.

    An empty batch gives an empty result; ``meta`` tensors (shapes without values) give the
    result's shape without solving.

    Raises:
        ValueError: different dimensions, batch shapes that do not broadcast, different devices,
            unknown method, ``"1d"`` with ``d > 1`` or with ``return_plan``; and as
            :class:`EmpiricalMeasure` for tensors of points.
        TypeError: different dtypes, ``method`` not a string, ``return_plan`` not a bool.
    """
    mu, nu = _as_measure(mu, "mu"), _as_measure(nu, "nu")
    check_same_dtype(nu.points, "nu", mu.points, "mu")
    check_same_device(nu.points, "nu", mu.points, "mu")
    check_shape_match(mu.points, "mu.points", nu.points, "nu.points", [(-1, -1)])
    check_choice(method, "method", ("auto", "1d", "emd", "linprog", "ssp"))
    return_plan = check_bool(return_plan, "return_plan")
    batch = broadcast_shapes(**{"the batch dimensions of mu": mu.batch_shape, "the batch dimensions of nu": nu.batch_shape})
    if method == "1d" and mu.dim != 1:
        raise ValueError(f"method='1d' needs d == 1; got d = {mu.dim}")
    if method == "1d" or (method == "auto" and mu.dim == 1 and not return_plan):
        if return_plan:
            raise ValueError("method='1d' does not build a plan; use an LP method with return_plan=True")
        return _wasserstein1_1d(mu, nu)
    if method == "auto":
        method = _default_lp_method()
    n, m, d = mu.n_atoms, nu.n_atoms, mu.dim
    x = mu.points.expand(*batch, n, d).reshape(-1, n, d)
    y = nu.points.expand(*batch, m, d).reshape(-1, m, d)
    a = mu.weights.expand(*batch, n).reshape(-1, n)
    b = nu.weights.expand(*batch, m).reshape(-1, m)
    cost = _l1_cost(x, y)
    if cost.device.type == "meta" or cost.shape[0] == 0:  # no values, or no pair: nothing to solve
        plan = torch.zeros_like(cost)
        value = (plan * cost).sum((-2, -1)).reshape(batch)
        return (value, plan.reshape(*batch, n, m)) if return_plan else value
    c_np = cost.detach().to("cpu", torch.float64).numpy()
    a_np = a.detach().to("cpu", torch.float64).numpy()
    b_np = b.detach().to("cpu", torch.float64).numpy()
    plans, fs, gs = [], [], []
    for t in range(c_np.shape[0]):  # one exact LP per pair (solver iterations, not a hot path)
        plan, f, g = _transport_numpy(a_np[t], b_np[t], c_np[t], method)
        plans.append(plan)
        fs.append(f)
        gs.append(g)
    like = dict(dtype=cost.dtype, device=cost.device)
    plan = torch.as_tensor(np.stack(plans), **like)
    value = (plan * cost).sum((-2, -1))
    if a.requires_grad or b.requires_grad:
        f = torch.as_tensor(np.stack(fs), **like)
        g = torch.as_tensor(np.stack(gs), **like)
        value = value + (f * (a - a.detach())).sum(-1) + (g * (b - b.detach())).sum(-1)
    value = value.reshape(batch)
    if return_plan:
        return value, plan.reshape(*batch, n, m)
    return value


# --------------------------------------------------------------------------------------------
# Regularity bounds (Sec. 5, Sec. 6) and measured ratios
# --------------------------------------------------------------------------------------------


# exp(x) is a finite double for x up to log(max): beyond it a potential's sup overflows, its inf underflows
_LOG_MAX = math.log(sys.float_info.max)
_TOO_LARGE = " (the inputs are too large: the result overflows a double)"


def contraction_bound(
    *,
    lip_first: float,
    lip_second: float,
    epsilon: float,
    diameter: float,
    dim: int,
    sup: float | None = None,
    lookup_lip: float = 1.0,
    projection_constant: float | None = None,
    as_printed: bool = False,
) -> float:
    r"""Wasserstein contraction bound of self-attention on a compact set (Thm. 23, corrected).

    For :math:`E\subset\mathbb R^d` compact, :math:`\epsilon(G)\le G\le\|G\|_\infty`, deterministic
    lookup :math:`\ell` with :math:`\|\ell\|_{\mathrm{Lip}}\le K_\ell` and :math:`\Pi` the projection
    onto Dirac measures, :math:`\mathbb W_1(\mu\mathbf A_\mu,\nu\mathbf A_\nu)\le\tau\,\mathbb W_1(\mu,\nu)`.
    The paper states (Thm. 23, from Props. 19-21)

    .. math::

        \tau_{\text{printed}} = d\cdot\frac{2\,(\|G\|_{\mathrm{Lip},\infty}+\|G\|_{\infty,\mathrm{Lip}})
        \operatorname{diam}(E)}{\epsilon(G)}\cdot K_\ell ,

    which is **not** a valid bound: for a constant potential it is 0, yet then
    :math:`\mu\mathbf A_\mu=\delta_{\text{mean}(\mu)}` moves whenever the mean does.  The gap is in the
    second inequality of Prop. 19, whose proof bounds :math:`|\mu(Gf)-\nu(Gf)|` by
    :math:`\|f\|_\infty|\mu(G)-\nu(G)|`; the Kantorovich bound with
    :math:`\|Gf\|_{\mathrm{Lip}}\le\|G\|_\infty+\|f\|_\infty\|G\|_{\mathrm{Lip}}` gives instead
    :math:`\mathbb W_1(\Psi_{G(x,\bullet)}(\mu),\Psi_{G(x,\bullet)}(\nu))\le
    (\|G\|_\infty+2\|G\|_{\infty,\mathrm{Lip}}\operatorname{diam}E)\,\mathbb W_1(\mu,\nu)/\epsilon(G)`.
    With it the proof of Thm. 23 goes through and yields the default returned here,

    .. math::

        \tau = d\,K_\ell\,\frac{2\|G\|_{\mathrm{Lip},\infty}\operatorname{diam}(E)
        + \|G\|_\infty + 2\|G\|_{\infty,\mathrm{Lip}}\operatorname{diam}(E)}{\epsilon(G)}

    (:math:`\tau(\Pi)=d`).

    Args:
        lip_first: :math:`\|G\|_{\mathrm{Lip},\infty}=\sup_y\|G(\bullet,y)\|_{\mathrm{Lip}}` (query slot).
        lip_second: :math:`\|G\|_{\infty,\mathrm{Lip}}=\sup_x\|G(x,\bullet)\|_{\mathrm{Lip}}` (key slot).
        epsilon: :math:`\epsilon(G)=\inf_{E\times E}G>0`.
        diameter: :math:`\operatorname{diam}(E)` in :math:`\ell_1`.
        dim: :math:`d`, giving the paper's :math:`\tau(\Pi)=d` (Prop. 20).
        sup: :math:`\|G\|_\infty=\sup_{E\times E}G`; required unless ``as_printed``.
        lookup_lip: :math:`K_\ell` (Prop. 21), Lipschitz constant of :math:`\ell` in :math:`\ell_1`.
        projection_constant: overrides :math:`\tau(\Pi)`; with the :math:`\ell_1` ground cost the
            value 1 is already valid (the functions :math:`x\mapsto\langle s,x\rangle`,
            :math:`s\in\{\pm1\}^d`, are 1-Lipschitz), which sharpens the bound by :math:`d`.
        as_printed: return the paper's :math:`\tau_{\text{printed}}` instead (for comparison only).

    Returns:
        The bound :math:`\tau` (a float).

    Raises:
        ValueError: a constant that is negative, NaN or infinite, ``epsilon`` or ``sup`` not > 0,
            ``sup < epsilon``, ``dim < 1``, ``sup`` missing for the corrected bound, or a bound
            that overflows a double.
        TypeError: a constant that is not a real number, ``dim`` not an int, ``as_printed`` not a bool.
    """
    lip_first = check_positive(lip_first, "lip_first", allow_zero=True)
    lip_second = check_positive(lip_second, "lip_second", allow_zero=True)
    epsilon = check_positive(epsilon, "epsilon")
    diameter = check_positive(diameter, "diameter", allow_zero=True)
    dim = check_int(dim, "dim", 1)
    lookup_lip = check_positive(lookup_lip, "lookup_lip", allow_zero=True)
    tau_pi = float(dim) if projection_constant is None else check_positive(projection_constant, "projection_constant")
    if check_bool(as_printed, "as_printed"):
        bound = tau_pi * 2.0 * (lip_first + lip_second) * diameter / epsilon * lookup_lip
        return check_number(bound, "contraction_bound's printed constant", hint=_TOO_LARGE)
    if sup is None:
        raise ValueError("sup (the supremum ||G||_inf of the potential on E x E) is required for the corrected bound")
    sup = check_positive(sup, "sup")
    if sup < epsilon:
        raise ValueError(f"sup={sup} must be >= epsilon={epsilon} (sup G >= inf G)")
    bound = tau_pi * lookup_lip * (2.0 * lip_first * diameter + sup + 2.0 * lip_second * diameter) / epsilon
    return check_number(bound, "contraction_bound's constant", hint=_TOO_LARGE)


def lipschitz_bound(
    *,
    lip_first: float,
    epsilon: float,
    diameter: float,
    dim: int,
    lookup_lip: float = 1.0,
) -> float:
    r"""Euclidean Lipschitz bound of :math:`q\mapsto\mathrm{Attention}(q,K,V)` (Cor. 24).

    Under the assumptions of Thm. 23, for queries in :math:`E`,

    .. math::

        \|\mathrm{Att}(q_1)-\mathrm{Att}(q_2)\|_2\le d^{3/2}\,\|\ell\|_{\mathrm{Lip}}\,
        \frac{2\|G\|_{\mathrm{Lip},\infty}\operatorname{diam}(E)}{\epsilon(G)}\,\|q_1-q_2\|_2 ,

    (the :math:`\ell_1` estimate :math:`d\,K_\ell\,2\|G\|_{\mathrm{Lip},\infty}\operatorname{diam}(E)/\epsilon(G)`
    times :math:`\sqrt d` from :math:`\|x\|_1\le\sqrt d\|x\|_2`).

    Args:
        lip_first: :math:`\|G\|_{\mathrm{Lip},\infty}` (Lipschitz constant in the query slot, :math:`\ell_1`).
        epsilon: :math:`\epsilon(G)`.
        diameter: :math:`\ell_1` diameter of :math:`E`.
        dim: :math:`d`.
        lookup_lip: :math:`\|\ell\|_{\mathrm{Lip}}` (:math:`\ell_1`).

    Returns:
        The constant (a float).
    """
    lip_first = check_positive(lip_first, "lip_first", allow_zero=True)
    epsilon = check_positive(epsilon, "epsilon")
    diameter = check_positive(diameter, "diameter", allow_zero=True)
    dim = check_int(dim, "dim", 1)
    lookup_lip = check_positive(lookup_lip, "lookup_lip", allow_zero=True)
    bound = dim**1.5 * lookup_lip * 2.0 * lip_first * diameter / epsilon
    return check_number(bound, "lipschitz_bound's constant", hint=_TOO_LARGE)


def neighbourhood_bound(
    *,
    lip_second: float,
    epsilon: float,
    diameter: float,
    dim: int,
    sup: float | None = None,
    lookup_lip: float = 1.0,
    as_printed: bool = False,
) -> float:
    r"""Constant of Prop. 25 (attention of one token against two neighbourhoods), corrected.

    .. math::

        \|\mathrm{Att}(x_t,X_{\mathcal N(t)})-\mathrm{Att}(x_t,X_{\hat{\mathcal N}(t)})\|_1
        \le C\,\mathbb W_1\big(m(X_{\mathcal N(t)}),m(X_{\hat{\mathcal N}(t)})\big).

    The paper's constant is :math:`C_{\text{printed}}=d\,K_\ell\,2\|G(x_t,\bullet)\|_{\mathrm{Lip}}
    \operatorname{diam}(E)/\epsilon(G)`, which inherits the gap of Prop. 19 (see
    :func:`contraction_bound`: it vanishes for a constant potential, while attention is then the
    mean of the neighbourhood).  The default is the corrected

    .. math::

        C = d\,K_\ell\,\frac{\|G\|_\infty + 2\|G(x_t,\bullet)\|_{\mathrm{Lip}}\operatorname{diam}(E)}{\epsilon(G)} .

    The left side is the :math:`\ell_1` distance, i.e. :math:`\mathbb W_1` between the two Dirac outputs.

    Args:
        lip_second: :math:`\|G(x_t,\bullet)\|_{\mathrm{Lip}}` (or its sup :math:`\|G\|_{\infty,\mathrm{Lip}}`).
        epsilon, diameter, dim, sup, lookup_lip, as_printed: as in :func:`contraction_bound`.
    """
    lip_second = check_positive(lip_second, "lip_second", allow_zero=True)
    epsilon = check_positive(epsilon, "epsilon")
    diameter = check_positive(diameter, "diameter", allow_zero=True)
    dim = check_int(dim, "dim", 1)
    lookup_lip = check_positive(lookup_lip, "lookup_lip", allow_zero=True)
    if check_bool(as_printed, "as_printed"):
        bound = dim * lookup_lip * 2.0 * lip_second * diameter / epsilon
        return check_number(bound, "neighbourhood_bound's printed constant", hint=_TOO_LARGE)
    if sup is None:
        raise ValueError("sup (the supremum ||G||_inf of the potential) is required for the corrected bound")
    sup = check_positive(sup, "sup")
    bound = dim * lookup_lip * (sup + 2.0 * lip_second * diameter) / epsilon
    return check_number(bound, "neighbourhood_bound's constant", hint=_TOO_LARGE)


def gaussian_potential_bound(
    *,
    dim: int,
    n: int,
    m: int | None = None,
    lookup_lip: float = 1.0,
    potential_lip: float = math.sqrt(2.0 / math.e),
    potential_sup: float = 1.0,
    projection_constant: float | None = None,
) -> float:
    r"""Contraction bound for Gaussian-potential self-attention on :math:`E=\mathbb R^d` (Thm. 29, Cor. 30).

    For :math:`G(x,y)=\exp(-\|x-y\|_2^2)`, :math:`\mu=m(X)` with :math:`|X|=N` and :math:`\nu=m(Y)`
    with :math:`|Y|=M`,

    .. math::

        \begin{aligned}
        \mathbb W_1(\mu\mathbf A_\mu,\nu\mathbf A_\nu)\le{}& 2\,\tau(\Pi)\,\tau(L)\,C\,
        \mathbb W_1(\mu,\nu),\\
        C ={}& \sqrt d\,\sqrt{\ln\min(N,M)+\tfrac1{2e}}\;\|G\|_{\mathrm{Lip}}+\|G\|_\infty+\sqrt d+2
        \end{aligned}

    (Cor. 30 is :math:`N=M`); the bracket is the constant of Prop. 28.  **This is the printed
    formula, not a proven bound**: Prop. 28, on which the theorem's proof rests, is false as
    stated (its proof applies a bound for probability measures to sums of mass :math:`N`; see the
    test ``test_prop28_constant_is_exceeded_for_many_tokens`` and chapter 2 of the book).  No measurement has exceeded
    the Thm. 29 constant itself, but treat it as a conjecture.  Here
    :math:`\|G\|_\infty=1` and, for the :math:`\ell_1` metric on :math:`E\times E`,
    :math:`\|G\|_{\mathrm{Lip}}=\sup\|\nabla G\|_\infty=\sup_t 2te^{-t^2}=\sqrt{2/e}`.

    Args:
        dim: :math:`d`.
        n, m: the numbers of tokens :math:`N` and :math:`M` (default ``m = n``).
        lookup_lip: :math:`\tau(L)=K_\ell`.
        potential_lip, potential_sup: :math:`\|G\|_{\mathrm{Lip}}` and :math:`\|G\|_\infty`.
        projection_constant: :math:`\tau(\Pi)`, default the paper's :math:`d`.

    Returns:
        The bound (a float).
    """
    dim = check_int(dim, "dim", 1)
    n = check_int(n, "n", 1)
    m = n if m is None else check_int(m, "m", 1)
    lookup_lip = check_positive(lookup_lip, "lookup_lip", allow_zero=True)
    potential_lip = check_positive(potential_lip, "potential_lip", allow_zero=True)
    potential_sup = check_positive(potential_sup, "potential_sup", allow_zero=True)
    tau_pi = float(dim) if projection_constant is None else check_positive(projection_constant, "projection_constant")
    root_d = math.sqrt(dim)
    bracket = root_d * math.sqrt(math.log(min(n, m)) + 1.0 / (2.0 * math.e)) * potential_lip + potential_sup + root_d + 2.0
    return check_number(2.0 * tau_pi * lookup_lip * bracket, "gaussian_potential_bound's constant", hint=_TOO_LARGE)


def dot_product_potential_constants(*, radius: float, dim: int, scale: float | None = None) -> dict:
    r"""Ingredients of Thm. 23 for :math:`G(x,y)=\exp(s\langle x,y\rangle)` on the box :math:`E=[-r,r]^d`.

    With the :math:`\ell_1` metric: :math:`|\langle x,y\rangle|\le r^2d`, so
    :math:`\epsilon(G)=e^{-sr^2d}`; :math:`\nabla_xG=s\,y\,G` gives
    :math:`\|G\|_{\mathrm{Lip},\infty}=\|G\|_{\infty,\mathrm{Lip}}=\sup\|sy\|_\infty G=s\,r\,e^{sr^2d}`;
    :math:`\|G\|_\infty=e^{sr^2d}`; and :math:`\operatorname{diam}_{\ell_1}(E)=2rd`.

    Args:
        radius: :math:`r>0`.
        dim: :math:`d`.
        scale: :math:`s`, default :math:`1/\sqrt d` (as in :func:`softmatch_kernel`).

    Returns:
        ``dict(lip_first=..., lip_second=..., epsilon=..., sup=..., diameter=...)``, ready to be passed to
        :func:`contraction_bound` (``**``) and, without ``lip_second``, :func:`lipschitz_bound`.
    """
    r = check_positive(radius, "radius")
    dim = check_int(dim, "dim", 1)
    s = 1.0 / math.sqrt(dim) if scale is None else check_positive(scale, "scale")
    exponent = check_number(s * r * r * dim, "scale * radius**2 * dim", high=_LOG_MAX,
                            hint=" (sup G = exp of it overflows a double: pass a smaller radius, dim or scale)")
    lip = s * r * math.exp(exponent)
    out = dict(lip_first=lip, lip_second=lip, epsilon=math.exp(-exponent), sup=math.exp(exponent), diameter=2.0 * r * dim)
    for key, value in out.items():
        check_number(value, key, hint=_TOO_LARGE)
    return out


def gaussian_potential_constants(*, radius: float, dim: int, scale: float = 1.0) -> dict:
    r"""Ingredients of Thm. 23 for :math:`G(x,y)=\exp(-s\|x-y\|_2^2)` on the box :math:`E=[-r,r]^d`.

    :math:`\|x-y\|_2^2\le4r^2d` gives :math:`\epsilon(G)=e^{-4sr^2d}`; :math:`\nabla_xG=-2s(x-y)G`
    gives :math:`\|G\|_{\mathrm{Lip},\infty}=\|G\|_{\infty,\mathrm{Lip}}\le\sup_t 2st\,e^{-st^2}=\sqrt{2s/e}`
    (:math:`\ell_1` metric, :math:`\ell_\infty` gradient norm); :math:`\|G\|_\infty=1`;
    :math:`\operatorname{diam}_{\ell_1}(E)=2rd`.  Returns the same keys as
    :func:`dot_product_potential_constants`.
    """
    r = check_positive(radius, "radius")
    dim = check_int(dim, "dim", 1)
    s = check_positive(scale, "scale")
    exponent = check_number(4.0 * s * r * r * dim, "4 * scale * radius**2 * dim", high=_LOG_MAX,
                            hint=" (epsilon = exp of minus it underflows a double: pass a smaller radius, dim or scale)")
    lip = math.sqrt(2.0 * s / math.e)
    out = dict(lip_first=lip, lip_second=lip, epsilon=math.exp(-exponent), sup=1.0, diameter=2.0 * r * dim)
    for key, value in out.items():
        check_number(value, key, hint=_TOO_LARGE)
    return out


def lipschitz_ratio(fn: Callable[[torch.Tensor], torch.Tensor], q1, q2, *, p: float = 2.0) -> torch.Tensor:
    r"""Empirical Lipschitz ratios :math:`\|f(q_1)-f(q_2)\|_p/\|q_1-q_2\|_p` on a batch of query pairs.

    A lower bound on the Lipschitz constant of ``fn`` (e.g. :math:`q\mapsto\mathrm{Att}(q,K,V)`,
    Cor. 24); the maximum over many pairs is the usual empirical estimate.  ``fn`` is called once
    on ``q1`` and once on ``q2`` (all pairs at once), so it must treat queries independently.

    Args:
        fn: maps ``(..., P, d)`` queries to ``(..., P, d_out)`` outputs.
        q1, q2: ``(..., P, d)`` pairs.
        p: the norm on inputs and outputs.

    Returns:
        ``(..., P)`` ratios; a pair with :math:`q_1=q_2` gets 0.

    Raises:
        ValueError: ``q1`` and ``q2`` of different shapes or devices, NaN or infinite entries (also
            in ``fn``'s outputs), outputs whose leading shape does not broadcast with the pairs', ``p``
            not a finite number > 0.
        TypeError: ``fn`` not callable, non-float or mixed-dtype tensors.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable mapping queries to outputs; got {type(fn).__name__}")
    q1 = as_float_tensor(q1, "q1", min_ndim=1)
    q2 = as_float_tensor(q2, "q2", min_ndim=1, like=q1)
    check_same_dtype(q2, "q2", q1, "q1")
    check_same_device(q2, "q2", q1, "q1")
    if q1.shape != q2.shape:
        raise ValueError(f"q1 and q2 must have the same shape; got {tuple(q1.shape)} and {tuple(q2.shape)}")
    p = check_positive(p, "p")
    check_finite(q1, "q1")
    check_finite(q2, "q2")
    outputs = []
    for name, q in (("fn(q1)", q1), ("fn(q2)", q2)):
        out = as_float_tensor(fn(q), name, min_ndim=1)
        broadcast_shapes(**{f"the leading dimensions of {name}": out.shape[:-1], "the pairs": q.shape[:-1]})
        check_finite(out, name)
        outputs.append(out)
    check_same_dtype(outputs[1], "fn(q2)", outputs[0], "fn(q1)")
    num = torch.linalg.vector_norm(outputs[0] - outputs[1], ord=p, dim=-1)
    den = torch.linalg.vector_norm(q1 - q2, ord=p, dim=-1)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def contraction_ratio(
    x,
    y,
    *,
    x_weights=None,
    y_weights=None,
    values: Callable[[torch.Tensor], torch.Tensor] | None = None,
    similarity: Similarity = "dot",
    scale: float | None = None,
    method: str = "auto",
) -> torch.Tensor:
    r"""Measured ratio :math:`\mathbb W_1(\mu\mathbf A_\mu,\nu\mathbf A_\nu)/\mathbb W_1(\mu,\nu)` (Def. 22).

    For :math:`\mu=\sum_iw_i\delta_{x_i}`, :math:`\nu=\sum_ju_j\delta_{y_j}`: self-attention
    transports the atoms to :math:`\mathrm{Att}(x_i)` keeping their masses, and both distances are
    computed exactly with :func:`wasserstein1`.  Every such ratio is a lower bound on the
    contraction coefficient :math:`\tau(\mathbf A)` bounded in Thm. 23 and Thm. 29.

    Args:
        x, y: ``(..., N, d)`` and ``(..., M, d)`` particles.
        x_weights, y_weights: optional masses (default uniform).
        values: lookup function :math:`\ell` (default identity).
        similarity, scale: as in :func:`softmatch_kernel`.
        method: passed to :func:`wasserstein1`.

    Returns:
        The ratios, shape ``batch`` (``nan`` where :math:`\mu=\nu`: the ratio 0/0 is undefined there).

    Raises:
        ValueError, TypeError: as :class:`EmpiricalMeasure`, :func:`attention_kernel` and
            :func:`wasserstein1`, with ``x``, ``y`` and their weights named as given.
    """
    mu, nu = EmpiricalMeasure._named(x, x_weights, "x", "x_weights"), EmpiricalMeasure._named(y, y_weights, "y", "y_weights")
    check_same_dtype(nu.points, "y", mu.points, "x")
    check_same_device(nu.points, "y", mu.points, "x")
    ax, _ = _attention(mu.points, mu, values, similarity, scale, ("x", "x", "values"))
    ay, _ = _attention(nu.points, nu, values, similarity, scale, ("y", "y", "values"))
    num = wasserstein1(EmpiricalMeasure(ax, mu.weights), EmpiricalMeasure(ay, nu.weights), method=method)
    den = wasserstein1(mu, nu, method=method)
    return num / den
