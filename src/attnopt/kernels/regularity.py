r"""How much attention moves measures: the 1-Wasserstein distance and Lipschitz constants (chapter 2).

Vuckovic, Baratin and Tachet des Combes (2020) measure the regularity of the attention kernel of
:mod:`attnopt.kernels` in the 1-Wasserstein distance :math:`\mathbb W_1` with :math:`\ell_1` ground
cost (:func:`wasserstein1`, exact).  Their Lipschitz and contraction constants are
:func:`contraction_bound` (Thm. 23), :func:`lipschitz_bound` (Cor. 24), :func:`neighbourhood_bound`
(Prop. 25) and :func:`gaussian_potential_bound` (Thm. 29, Cor. 30), with the ingredients of Thm. 23
for the two usual potentials from :func:`dot_product_potential_constants` and
:func:`gaussian_potential_constants`; each is to be compared with measured ratios
(:func:`lipschitz_ratio`, :func:`contraction_ratio`), which are lower bounds on the true constants.

Thm. 23 and Prop. 25 are returned in a corrected form by default (the printed constants vanish for
a constant potential, which cannot be right; see :func:`contraction_bound`), the printed form with
``as_printed=True``.  The constant of Thm. 29 is the printed formula, whose proof rests on a false
proposition (see :func:`gaussian_potential_bound`).

Conventions.  As in :mod:`attnopt.kernels`, every distance on :math:`E` is :math:`\ell_1`, Lipschitz
semi-norms of potentials are taken with respect to it and :math:`\operatorname{diam}(E)` is an
:math:`\ell_1` diameter.  The linear programs of :func:`wasserstein1` live in
``attnopt.kernels._transport``.

References:
    Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
    arXiv:2007.02876, Sec. 4, Def. 22, Props. 19–21, 25 and 28, Thm. 23, Cor. 24, Thm. 29, Cor. 30.
    Santambrogio (2015), *Optimal Transport for Applied Mathematicians*, eq. (6.2).
"""

from __future__ import annotations

import math
import sys
from typing import Callable

import torch

from ._softmatch import Similarity
from ._transport import default_lp_method, lp_distance, wasserstein1_1d
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool,
    check_choice,
    check_finite,
    check_int,
    check_number,
    check_positive,
    check_same_device,
    check_same_dtype,
    check_shape_match,
)
from . import EmpiricalMeasure, _as_measure, _attention

__all__ = [
    "contraction_bound",
    "contraction_ratio",
    "dot_product_potential_constants",
    "gaussian_potential_bound",
    "gaussian_potential_constants",
    "lipschitz_bound",
    "lipschitz_ratio",
    "neighbourhood_bound",
    "wasserstein1",
]

# exp(x) is a finite double for x up to log(max): beyond it a potential's sup overflows, its inf underflows
_LOG_MAX = math.log(sys.float_info.max)
_TOO_LARGE = " (the inputs are too large: the result overflows a double)"


# -------- the exact 1-Wasserstein distance with l1 ground cost ------------------------------


def wasserstein1(mu, nu, *, method: str = "auto", return_plan: bool = False):
    r"""Exact 1-Wasserstein distance with :math:`\ell_1` ground cost, Sec. 4 of Vuckovic et al. (2020).

    .. math::

        \mathbb W_1(\mu,\nu)=\min_{\gamma\ge0,\ \gamma\mathbf 1=a,\ \gamma^\top\mathbf 1=b}
        \sum_{i,j}\gamma_{ij}\,\|x_i-y_j\|_1

    for :math:`\mu=\sum_i a_i\delta_{x_i}`, :math:`\nu=\sum_j b_j\delta_{y_j}` (eq. (6.2) of
    Santambrogio (2015), used in the proof of their Thm. 29).  In one dimension the closed form
    :math:`\int|F_\mu(t)-F_\nu(t)|\,\mathrm dt` is evaluated in torch (batched).  Otherwise the
    linear program is solved exactly per batch entry on the CPU in float64, and the value is
    rebuilt in torch, so that gradients are the envelope-theorem ones: :math:`\sum_j\gamma^\star_{ij}
    \partial C_{ij}` for the points and the optimal dual potentials :math:`(f,g)` for the weights.

    Args:
        mu, nu: :class:`~attnopt.kernels.EmpiricalMeasure` (or ``(..., N, d)`` point tensors,
            uniform weights) with the same ``d``; batch shapes broadcast.
        method: ``"auto"`` (closed form when ``d == 1``, else the first available of ``"emd"``,
            ``"linprog"``, ``"ssp"``), ``"1d"``, ``"emd"`` (POT's network simplex, optional
            dependency), ``"linprog"`` (SciPy's HiGHS, optional dependency) or ``"ssp"``
            (built-in successive-shortest-path solver, NumPy only, for moderate sizes).
        return_plan: also return the optimal plans ``(..., N, M)`` (not for ``"1d"``).

    Returns:
        The distances, shape ``batch``; with ``return_plan`` a tuple ``(distance, plan)``.  An empty
        batch gives an empty result; ``meta`` tensors (shapes without values) give the result's
        shape without solving.

    Raises:
        ValueError: different dimensions, batch shapes that do not broadcast, different devices,
            unknown method, ``"1d"`` with ``d > 1`` or with ``return_plan``; and as
            :class:`~attnopt.kernels.EmpiricalMeasure` for tensors of points.
        TypeError: different dtypes, ``method`` not a string, ``return_plan`` not a bool.

    Examples:
        Moving two atoms by one unit each costs one unit of mass times distance one:

        >>> x = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
        >>> y = x + torch.tensor([0.0, 1.0])
        >>> distance, plan = wasserstein1(x, y, return_plan=True)
        >>> distance, plan
        (tensor(1.), tensor([[0.5000, 0.0000],
                [0.0000, 0.5000]]))

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Sec. 4.
        Santambrogio (2015), *Optimal Transport for Applied Mathematicians*, eq. (6.2).
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
        return wasserstein1_1d(mu, nu)
    if method == "auto":
        method = default_lp_method()
    n, m, d = mu.n_atoms, nu.n_atoms, mu.dim
    x = mu.points.expand(*batch, n, d).reshape(-1, n, d)
    y = nu.points.expand(*batch, m, d).reshape(-1, m, d)
    a = mu.weights.expand(*batch, n).reshape(-1, n)
    b = nu.weights.expand(*batch, m).reshape(-1, m)
    value, plan = lp_distance(x, y, a, b, method)
    value = value.reshape(batch)
    return (value, plan.reshape(*batch, n, m)) if return_plan else value


# -------- the bounds of Secs. 5-6 -----------------------------------------------------------


def _kernel_constants(epsilon, diameter, dim, lookup_lip) -> tuple[float, float, int, float]:
    """The checked constants every bound of Thm. 23's family takes: epsilon(G), diam(E), d, K_l."""
    epsilon = check_positive(epsilon, "epsilon")
    diameter = check_positive(diameter, "diameter", allow_zero=True)
    dim = check_int(dim, "dim", 1)
    lookup_lip = check_positive(lookup_lip, "lookup_lip", allow_zero=True)
    return epsilon, diameter, dim, lookup_lip


def _sup_arg(sup, what: str) -> float:
    if sup is None:
        raise ValueError(f"sup (the supremum ||G||_inf of the potential{what}) is required for the corrected bound")
    return check_positive(sup, "sup")


def contraction_bound(*, lip_first: float, lip_second: float, epsilon: float, diameter: float, dim: int,
                      sup: float | None = None, lookup_lip: float = 1.0, projection_constant: float | None = None,
                      as_printed: bool = False) -> float:
    r"""Wasserstein contraction bound of self-attention on a compact set, Thm. 23 of Vuckovic et al. (2020), corrected.

    For :math:`E\subset\mathbb R^d` compact, :math:`\epsilon(G)\le G\le\|G\|_\infty`, deterministic
    lookup :math:`\ell` with :math:`\|\ell\|_{\mathrm{Lip}}\le K_\ell` and :math:`\Pi` the projection
    onto Dirac measures, :math:`\mathbb W_1(\mu\mathbf A_\mu,\nu\mathbf A_\nu)\le\tau\,\mathbb W_1(\mu,\nu)`.
    They state (Thm. 23, from Props. 19–21)

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
        dim: :math:`d`, giving their :math:`\tau(\Pi)=d` (Prop. 20).
        sup: :math:`\|G\|_\infty=\sup_{E\times E}G`; required unless ``as_printed``.
        lookup_lip: :math:`K_\ell` (Prop. 21), Lipschitz constant of :math:`\ell` in :math:`\ell_1`.
        projection_constant: overrides :math:`\tau(\Pi)`; with the :math:`\ell_1` ground cost the
            value 1 is already valid (the functions :math:`x\mapsto\langle s,x\rangle`,
            :math:`s\in\{\pm1\}^d`, are 1-Lipschitz), which sharpens the bound by :math:`d`.
        as_printed: return the printed :math:`\tau_{\text{printed}}` instead (for comparison only).

    Returns:
        The bound :math:`\tau` (a float).

    Raises:
        ValueError: a constant that is negative, NaN or infinite, ``epsilon`` or ``sup`` not > 0,
            ``sup < epsilon``, ``dim < 1``, ``sup`` missing for the corrected bound, or a bound
            that overflows a double.
        TypeError: a constant that is not a real number, ``dim`` not an int, ``as_printed`` not a bool.

    Examples:
        The printed constant vanishes for a constant potential; the corrected one does not:

        >>> flat = dict(lip_first=0.0, lip_second=0.0, epsilon=1.0, diameter=2.0)
        >>> contraction_bound(**flat, dim=2, as_printed=True)
        0.0
        >>> contraction_bound(**flat, dim=2, sup=1.0)
        2.0

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
        Props. 19–21, Thm. 23.
    """
    lip_first = check_positive(lip_first, "lip_first", allow_zero=True)
    lip_second = check_positive(lip_second, "lip_second", allow_zero=True)
    epsilon, diameter, dim, lookup_lip = _kernel_constants(epsilon, diameter, dim, lookup_lip)
    tau_pi = float(dim) if projection_constant is None else check_positive(projection_constant, "projection_constant")
    if check_bool(as_printed, "as_printed"):
        bound = tau_pi * 2.0 * (lip_first + lip_second) * diameter / epsilon * lookup_lip
        return check_number(bound, "contraction_bound's printed constant", hint=_TOO_LARGE)
    sup = _sup_arg(sup, " on E x E")
    if sup < epsilon:
        raise ValueError(f"sup={sup} must be >= epsilon={epsilon} (sup G >= inf G)")
    bound = tau_pi * lookup_lip * (2.0 * lip_first * diameter + sup + 2.0 * lip_second * diameter) / epsilon
    return check_number(bound, "contraction_bound's constant", hint=_TOO_LARGE)


def lipschitz_bound(*, lip_first: float, epsilon: float, diameter: float, dim: int, lookup_lip: float = 1.0) -> float:
    r"""Euclidean Lipschitz bound of :math:`q\mapsto\mathrm{Attention}(q,K,V)`, Cor. 24 of Vuckovic et al. (2020).

    Under the assumptions of Thm. 23, for queries in :math:`E`,

    .. math::

        \begin{aligned}
        &\|\mathrm{Att}(q_1)-\mathrm{Att}(q_2)\|_2\\
        &\quad\le d^{3/2}\,\|\ell\|_{\mathrm{Lip}}\,
        \frac{2\|G\|_{\mathrm{Lip},\infty}\operatorname{diam}(E)}{\epsilon(G)}\,\|q_1-q_2\|_2
        \end{aligned}

    (the :math:`\ell_1` estimate :math:`d\,K_\ell\,2\|G\|_{\mathrm{Lip},\infty}\operatorname{diam}(E)/\epsilon(G)`
    times :math:`\sqrt d` from :math:`\|x\|_1\le\sqrt d\|x\|_2`).

    Args:
        lip_first: :math:`\|G\|_{\mathrm{Lip},\infty}` (Lipschitz constant in the query slot, :math:`\ell_1`).
        epsilon, diameter, dim, lookup_lip: as in :func:`contraction_bound`.

    Returns:
        The constant (a float).

    Raises:
        ValueError, TypeError: as :func:`contraction_bound`.

    Examples:
        >>> lipschitz_bound(lip_first=1.0, epsilon=0.5, diameter=2.0, dim=4)
        64.0

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Cor. 24.
    """
    lip_first = check_positive(lip_first, "lip_first", allow_zero=True)
    epsilon, diameter, dim, lookup_lip = _kernel_constants(epsilon, diameter, dim, lookup_lip)
    bound = dim**1.5 * lookup_lip * 2.0 * lip_first * diameter / epsilon
    return check_number(bound, "lipschitz_bound's constant", hint=_TOO_LARGE)


def neighbourhood_bound(*, lip_second: float, epsilon: float, diameter: float, dim: int, sup: float | None = None,
                        lookup_lip: float = 1.0, as_printed: bool = False) -> float:
    r"""Constant of Prop. 25 of Vuckovic et al. (2020) (one token against two neighbourhoods), corrected.

    .. math::

        \begin{aligned}
        &\|\mathrm{Att}(x_t,X_{\mathcal N(t)})-\mathrm{Att}(x_t,X_{\hat{\mathcal N}(t)})\|_1\\
        &\quad\le C\,\mathbb W_1\big(m(X_{\mathcal N(t)}),m(X_{\hat{\mathcal N}(t)})\big).
        \end{aligned}

    The printed constant is :math:`C_{\text{printed}}=d\,K_\ell\,2\|G(x_t,\bullet)\|_{\mathrm{Lip}}
    \operatorname{diam}(E)/\epsilon(G)`, which inherits the gap of Prop. 19 (see
    :func:`contraction_bound`: it vanishes for a constant potential, while attention is then the
    mean of the neighbourhood).  The default is the corrected

    .. math::

        C = d\,K_\ell\,\frac{\|G\|_\infty + 2\|G(x_t,\bullet)\|_{\mathrm{Lip}}\operatorname{diam}(E)}{\epsilon(G)} .

    The left side is the :math:`\ell_1` distance, i.e. :math:`\mathbb W_1` between the two Dirac outputs.

    Args:
        lip_second: :math:`\|G(x_t,\bullet)\|_{\mathrm{Lip}}` (or its sup :math:`\|G\|_{\infty,\mathrm{Lip}}`).
        epsilon, diameter, dim, sup, lookup_lip, as_printed: as in :func:`contraction_bound`.

    Returns:
        The constant :math:`C` (a float).

    Raises:
        ValueError, TypeError: as :func:`contraction_bound`.

    Examples:
        >>> constants = dict(lip_second=1.0, epsilon=0.5, diameter=2.0, dim=2)
        >>> neighbourhood_bound(**constants, sup=2.0)
        24.0

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
        Props. 19 and 25.
    """
    lip_second = check_positive(lip_second, "lip_second", allow_zero=True)
    epsilon, diameter, dim, lookup_lip = _kernel_constants(epsilon, diameter, dim, lookup_lip)
    if check_bool(as_printed, "as_printed"):
        bound = dim * lookup_lip * 2.0 * lip_second * diameter / epsilon
        return check_number(bound, "neighbourhood_bound's printed constant", hint=_TOO_LARGE)
    sup = _sup_arg(sup, "")
    bound = dim * lookup_lip * (sup + 2.0 * lip_second * diameter) / epsilon
    return check_number(bound, "neighbourhood_bound's constant", hint=_TOO_LARGE)


def gaussian_potential_bound(*, dim: int, n: int, m: int | None = None, lookup_lip: float = 1.0,
                             potential_lip: float = math.sqrt(2.0 / math.e), potential_sup: float = 1.0,
                             projection_constant: float | None = None) -> float:
    r"""Contraction constant for Gaussian-potential self-attention on :math:`E=\mathbb R^d`, Thm. 29 and Cor. 30 of Vuckovic et al. (2020).

    For :math:`G(x,y)=\exp(-\|x-y\|_2^2)`, :math:`\mu=m(X)` with :math:`|X|=N` and :math:`\nu=m(Y)`
    with :math:`|Y|=M`,

    .. math::

        \begin{aligned}
        \mathbb W_1(\mu\mathbf A_\mu,\nu\mathbf A_\nu)\le{}& 2\,\tau(\Pi)\,\tau(L)\,C\,
        \mathbb W_1(\mu,\nu),\\
        C ={}& \sqrt d\,\sqrt{\ln\min(N,M)+\tfrac1{2e}}\;\|G\|_{\mathrm{Lip}}\\
        &\quad{}+\|G\|_\infty+\sqrt d+2
        \end{aligned}

    (Cor. 30 is :math:`N=M`); :math:`C` is the constant :math:`C_N` of Prop. 28 at
    :math:`\min(N,M)`.  **This is the printed formula, not a proven bound**: Prop. 28, on which the
    theorem's proof rests, is false as stated (its proof applies a bound for probability measures
    to sums of mass :math:`N`; see the test ``test_prop28_constant_is_exceeded_for_many_tokens``
    and chapter 2 of the book).  No measurement has exceeded the Thm. 29 constant itself, but
    treat it as a conjecture.  Here :math:`\|G\|_\infty=1` and, for the :math:`\ell_1` metric on
    :math:`E\times E`,
    :math:`\|G\|_{\mathrm{Lip}}=\sup\|\nabla G\|_\infty=\sup_t 2te^{-t^2}=\sqrt{2/e}`.

    Args:
        dim: :math:`d`.
        n, m: the numbers of tokens :math:`N` and :math:`M` (default ``m = n``).
        lookup_lip: :math:`\tau(L)=K_\ell`.
        potential_lip, potential_sup: :math:`\|G\|_{\mathrm{Lip}}` and :math:`\|G\|_\infty`.
        projection_constant: :math:`\tau(\Pi)`, default their :math:`d`.

    Returns:
        The constant (a float).

    Raises:
        ValueError: ``dim``, ``n`` or ``m`` below 1; a constant that is negative, NaN or infinite.
        TypeError: ``dim``, ``n`` or ``m`` not an int; a constant that is not a real number.

    Examples:
        The constant grows like :math:`\sqrt{\ln N}` with the number of tokens:

        >>> [round(gaussian_potential_bound(dim=2, n=n), 2) for n in (8, 512)]
        [24.96, 29.95]

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*,
        Prop. 28, Thm. 29, Cor. 30.
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


def _potential_constants(lip: float, exponent: float, sup: float, r: float, dim: int) -> dict:
    out = dict(lip_first=lip, lip_second=lip, epsilon=math.exp(-exponent), sup=sup, diameter=2.0 * r * dim)
    for key, value in out.items():
        check_number(value, key, hint=_TOO_LARGE)
    return out


def dot_product_potential_constants(*, radius: float, dim: int, scale: float | None = None) -> dict:
    r"""Ingredients of Thm. 23 of Vuckovic et al. (2020) for :math:`G(x,y)=\exp(s\langle x,y\rangle)` on :math:`E=[-r,r]^d`.

    With the :math:`\ell_1` metric: :math:`|\langle x,y\rangle|\le r^2d`, so
    :math:`\epsilon(G)=e^{-sr^2d}`; :math:`\nabla_xG=s\,y\,G` gives
    :math:`\|G\|_{\mathrm{Lip},\infty}=\|G\|_{\infty,\mathrm{Lip}}=\sup\|sy\|_\infty G=s\,r\,e^{sr^2d}`;
    :math:`\|G\|_\infty=e^{sr^2d}`; and :math:`\operatorname{diam}_{\ell_1}(E)=2rd`.

    Args:
        radius: :math:`r>0`.
        dim: :math:`d`.
        scale: :math:`s`, default :math:`1/\sqrt d` (as in :func:`attnopt.kernels.softmatch_kernel`).

    Returns:
        ``dict(lip_first=..., lip_second=..., epsilon=..., sup=..., diameter=...)``, ready to be passed to
        :func:`contraction_bound` (``**``) and, without ``lip_second``, :func:`lipschitz_bound`.

    Raises:
        ValueError: ``radius`` or ``scale`` not a finite number > 0, ``dim < 1``, or
            :math:`sr^2d` so large that :math:`\|G\|_\infty` overflows a double.
        TypeError: a constant that is not a real number, ``dim`` not an int.

    Examples:
        >>> c = dot_product_potential_constants(radius=0.5, dim=2)
        >>> round(contraction_bound(**c, dim=2), 4)
        15.529

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Thm. 23.
    """
    r = check_positive(radius, "radius")
    dim = check_int(dim, "dim", 1)
    s = 1.0 / math.sqrt(dim) if scale is None else check_positive(scale, "scale")
    exponent = check_number(s * r * r * dim, "scale * radius**2 * dim", high=_LOG_MAX,
                            hint=" (sup G = exp of it overflows a double: pass a smaller radius, dim or scale)")
    return _potential_constants(s * r * math.exp(exponent), exponent, math.exp(exponent), r, dim)


def gaussian_potential_constants(*, radius: float, dim: int, scale: float = 1.0) -> dict:
    r"""Ingredients of Thm. 23 of Vuckovic et al. (2020) for :math:`G(x,y)=\exp(-s\|x-y\|_2^2)` on :math:`E=[-r,r]^d`.

    :math:`\|x-y\|_2^2\le4r^2d` gives :math:`\epsilon(G)=e^{-4sr^2d}`; :math:`\nabla_xG=-2s(x-y)G`
    gives :math:`\|G\|_{\mathrm{Lip},\infty}=\|G\|_{\infty,\mathrm{Lip}}\le\sup_t 2st\,e^{-st^2}=\sqrt{2s/e}`
    (:math:`\ell_1` metric, :math:`\ell_\infty` gradient norm); :math:`\|G\|_\infty=1`;
    :math:`\operatorname{diam}_{\ell_1}(E)=2rd`.

    Args:
        radius, dim: as in :func:`dot_product_potential_constants`.
        scale: :math:`s>0`.

    Returns:
        The keys of :func:`dot_product_potential_constants`.

    Raises:
        ValueError, TypeError: as :func:`dot_product_potential_constants` (here :math:`4sr^2d` so
            large that :math:`\epsilon(G)` underflows a double).

    Examples:
        >>> c = gaussian_potential_constants(radius=1.0, dim=2)
        >>> c["sup"], c["diameter"], round(c["lip_first"], 4)
        (1.0, 4.0, 0.8578)

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Thm. 23.
    """
    r = check_positive(radius, "radius")
    dim = check_int(dim, "dim", 1)
    s = check_positive(scale, "scale")
    exponent = check_number(4.0 * s * r * r * dim, "4 * scale * radius**2 * dim", high=_LOG_MAX,
                            hint=" (epsilon = exp of minus it underflows a double: pass a smaller radius, dim or scale)")
    return _potential_constants(math.sqrt(2.0 * s / math.e), exponent, 1.0, r, dim)


# -------- measured ratios, lower bounds on the constants ------------------------------------


def lipschitz_ratio(fn: Callable[[torch.Tensor], torch.Tensor], q1, q2, *, p: float = 2.0) -> torch.Tensor:
    r"""Empirical Lipschitz ratios :math:`\|f(q_1)-f(q_2)\|_p/\|q_1-q_2\|_p` on a batch of query pairs.

    A lower bound on the Lipschitz constant of ``fn`` (e.g. :math:`q\mapsto\mathrm{Att}(q,K,V)`,
    Cor. 24 of Vuckovic et al. (2020)); the maximum over many pairs is the usual empirical estimate.
    ``fn`` is called once on ``q1`` and once on ``q2`` (all pairs at once), so it must treat queries
    independently.

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

    Examples:
        A linear map's ratio is its gain:

        >>> q = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
        >>> lipschitz_ratio(lambda x: 3 * x, q, q + 0.5)
        tensor([3., 3.])

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Cor. 24.
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


def contraction_ratio(x, y, *, x_weights=None, y_weights=None, values: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      similarity: Similarity = "dot", scale: float | None = None, method: str = "auto") -> torch.Tensor:
    r"""Measured ratio :math:`\mathbb W_1(\mu\mathbf A_\mu,\nu\mathbf A_\nu)/\mathbb W_1(\mu,\nu)`, Def. 22 of Vuckovic et al. (2020).

    For :math:`\mu=\sum_iw_i\delta_{x_i}`, :math:`\nu=\sum_ju_j\delta_{y_j}`: self-attention
    transports the atoms to :math:`\mathrm{Att}(x_i)` keeping their masses, and both distances are
    computed exactly with :func:`wasserstein1`.  Every such ratio is a lower bound on the
    contraction coefficient :math:`\tau(\mathbf A)` bounded in Thm. 23 and Thm. 29.

    Args:
        x, y: ``(..., N, d)`` and ``(..., M, d)`` particles.
        x_weights, y_weights: optional masses (default uniform).
        values: lookup function :math:`\ell` (default identity).
        similarity, scale: as in :func:`attnopt.kernels.softmatch_kernel`.
        method: passed to :func:`wasserstein1`.

    Returns:
        The ratios, shape ``batch`` (``nan`` where :math:`\mu=\nu`: the ratio 0/0 is undefined there).

    Raises:
        ValueError, TypeError: as :class:`~attnopt.kernels.EmpiricalMeasure`,
            :func:`attnopt.kernels.attention_kernel` and :func:`wasserstein1`, with ``x``, ``y`` and
            their weights named as given.

    Examples:
        A measured ratio stays below the constant of Thm. 29:

        >>> x, y = torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0], [3.0]])
        >>> ratio = contraction_ratio(x, y, similarity="gaussian")
        >>> bound = gaussian_potential_bound(dim=1, n=2)
        >>> round(ratio.item(), 4), bool(ratio <= bound)
        (1.2686, True)

    References:
        Vuckovic, Baratin and Tachet des Combes (2020), *A Mathematical Theory of Attention*, Def. 22,
        Thms. 23 and 29.
    """
    mu, nu = EmpiricalMeasure._named(x, x_weights, "x", "x_weights"), EmpiricalMeasure._named(y, y_weights, "y", "y_weights")
    check_same_dtype(nu.points, "y", mu.points, "x")
    check_same_device(nu.points, "y", mu.points, "x")
    ax, _ = _attention(mu.points, mu, values, similarity, scale, ("x", "x", "values"))
    ay, _ = _attention(nu.points, nu, values, similarity, scale, ("y", "y", "values"))
    num = wasserstein1(EmpiricalMeasure(ax, mu.weights), EmpiricalMeasure(ay, nu.weights), method=method)
    den = wasserstein1(mu, nu, method=method)
    return num / den
