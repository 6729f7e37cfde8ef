"""Tests for attnopt.regularity: exact W1 and the Lipschitz and contraction constants of Vuckovic et al. (2020).

Every check compares against an independent computation: SciPy (linear_sum_assignment, linprog,
wasserstein_distance), POT's network simplex, finite differences, or measured ratios that the
bounds must dominate.
"""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment
from scipy.stats import wasserstein_distance

from attnopt.kernels import EmpiricalMeasure, attention_kernel, boltzmann_gibbs
from attnopt.regularity import (
    contraction_bound,
    contraction_ratio,
    dot_product_potential_constants,
    gaussian_potential_bound,
    gaussian_potential_constants,
    lipschitz_bound,
    lipschitz_ratio,
    neighbourhood_bound,
    wasserstein1,
)

from random_measures import generator, simplex

F64 = torch.float64
HSET = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


_gen = generator
_weights = simplex


def _pot_w1(a, x, b, y):
    """W1 with l1 ground cost from POT's network simplex (the reference)."""
    return ot.emd2(a.numpy(), b.numpy(), ot.dist(x.numpy(), y.numpy(), metric="cityblock"), numItermax=10**7)


# ------------------------------------------------------------------------------------------
# Exact W1 with l1 ground cost
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["auto", "emd", "linprog", "ssp"])
def test_wasserstein1_uniform_equal_size_is_an_assignment(method):
    g = _gen(8)
    x = torch.randn(3, 9, 3, generator=g, dtype=F64)
    y = torch.randn(3, 9, 3, generator=g, dtype=F64) + 0.5
    got = wasserstein1(x, y, method=method)
    for b in range(3):
        cost = torch.cdist(x[b], y[b], p=1).numpy()
        r, c = linear_sum_assignment(cost)
        assert abs(got[b].item() - cost[r, c].mean()) < 1e-10


@pytest.mark.parametrize("method,reference", [("emd", "linprog"), ("linprog", "pot"), ("ssp", "pot")])
def test_wasserstein1_general_weights_against_other_solver(method, reference):
    g = _gen(9)
    x = torch.randn(4, 7, 2, generator=g, dtype=F64)
    y = torch.randn(4, 11, 2, generator=g, dtype=F64) * 1.5
    a = _weights((4, 7), g, zeros=True)
    b = _weights((4, 11), g)
    got, plan = wasserstein1(EmpiricalMeasure(x, a), EmpiricalMeasure(y, b), method=method, return_plan=True)
    if reference == "pot":
        ref = torch.tensor([_pot_w1(a[i], x[i], b[i], y[i]) for i in range(4)], dtype=F64)
    else:
        ref = wasserstein1(EmpiricalMeasure(x, a), EmpiricalMeasure(y, b), method="linprog")
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(plan.sum(-1), a, atol=1e-12, rtol=0)
    torch.testing.assert_close(plan.sum(-2), b, atol=1e-12, rtol=0)
    assert (plan >= 0).all()


def test_wasserstein1_one_dimensional_closed_form():
    g = _gen(10)
    x = torch.randn(5, 8, 1, generator=g, dtype=F64)
    y = torch.randn(5, 13, 1, generator=g, dtype=F64)
    a, b = _weights((5, 8), g), _weights((5, 13), g)
    got = wasserstein1(EmpiricalMeasure(x, a), EmpiricalMeasure(y, b))
    for i in range(5):
        ref = wasserstein_distance(x[i, :, 0].numpy(), y[i, :, 0].numpy(), a[i].numpy(), b[i].numpy())
        assert abs(got[i].item() - ref) < 1e-12
        assert abs(got[i].item() - _pot_w1(a[i], x[i], b[i], y[i])) < 1e-10
    # Gradients of the closed form, in points and weights.
    xs = x[0].clone().requires_grad_()
    aw = a[0].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda p, w: wasserstein1(EmpiricalMeasure(p, w / w.sum()), EmpiricalMeasure(y[0], b[0])), (xs, aw))


def test_wasserstein1_lp_gradients_match_finite_differences():
    g = _gen(11)
    x = torch.randn(6, 3, generator=g, dtype=F64)
    y = torch.randn(5, 3, generator=g, dtype=F64)
    a, b = _weights((6,), g), _weights((5,), g)
    xr = x.clone().requires_grad_()
    ar = a.clone().requires_grad_()
    val = wasserstein1(EmpiricalMeasure(xr, ar), EmpiricalMeasure(y, b), method="emd")
    gx, ga = torch.autograd.grad(val, (xr, ar))
    h = 1e-6
    direction_x = torch.randn(6, 3, generator=g, dtype=F64)
    direction_a = torch.randn(6, generator=g, dtype=F64)
    direction_a -= direction_a.mean()  # stay on the simplex
    ref = lambda xx, aa: _pot_w1(aa, xx, b, y)  # noqa: E731
    fd_x = (ref(x + h * direction_x, a) - ref(x - h * direction_x, a)) / (2 * h)
    fd_a = (ref(x, a + h * direction_a) - ref(x, a - h * direction_a)) / (2 * h)
    assert abs((gx * direction_x).sum().item() - fd_x) < 1e-6
    assert abs((ga * direction_a).sum().item() - fd_a) < 1e-6


def test_wasserstein1_metric_sanity_and_broadcast():
    g = _gen(12)
    x = torch.randn(4, 3, generator=g, dtype=F64)
    assert wasserstein1(x, x).item() < 1e-14
    # W1(delta_p, delta_q) = |p - q|_1, and a batch of nus against one mu broadcasts.
    p, qs = torch.randn(1, 3, generator=g, dtype=F64), torch.randn(5, 1, 3, generator=g, dtype=F64)
    torch.testing.assert_close(wasserstein1(p, qs), (qs[:, 0] - p).abs().sum(-1), atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------
# Bounds never below measured ratios (Thm. 23, Cor. 24, Prop. 25, Thm. 29)
# ------------------------------------------------------------------------------------------


def _box(gen, shape, r):
    return (2 * torch.rand(*shape, generator=gen, dtype=F64) - 1) * r


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 7), m=st.integers(2, 7), d=st.integers(1, 3),
       r=st.floats(0.2, 1.5), c=st.floats(0.1, 1.0), gaussian=st.booleans())
def test_contraction_bound_dominates_measured_ratio(seed, n, m, d, r, c, gaussian):
    g = _gen(seed)
    x, y = _box(g, (n, d), r), _box(g, (m, d), r)
    if gaussian:
        consts = gaussian_potential_constants(radius=r, dim=d)
        sim, scale = "gaussian", 1.0
    else:
        consts = dot_product_potential_constants(radius=r, dim=d)
        sim, scale = "dot", None
    ratio = contraction_ratio(x, y, values=lambda p: c * p, similarity=sim, scale=scale)
    bound = contraction_bound(**consts, dim=d, lookup_lip=c)
    assert ratio.item() <= bound
    # The sharper tau(Pi) = 1 valid for the l1 ground cost is also never violated.
    assert ratio.item() <= contraction_bound(**consts, dim=d, lookup_lip=c, projection_constant=1.0)


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 8), d=st.integers(1, 4), r=st.floats(0.2, 1.5))
def test_lipschitz_bound_dominates_query_ratios(seed, n, d, r):
    g = _gen(seed)
    keys, vals = _box(g, (n, d), r), _box(g, (n, d), r)
    lookup_lip = (torch.cdist(vals, vals, p=1) / torch.cdist(keys, keys, p=1).fill_diagonal_(float("inf"))).max().item()
    q1, q2 = _box(g, (256, d), r), _box(g, (256, d), r)
    q2 = torch.where(torch.rand(256, 1, generator=g, dtype=F64) < 0.5, q1 + 1e-3 * (q2 - q1), q2)  # near pairs too
    ratios = lipschitz_ratio(lambda q: attention_kernel(q, keys, vals)[0], q1, q2)
    consts = dot_product_potential_constants(radius=r, dim=d)
    bound = lipschitz_bound(lip_first=consts["lip_first"], epsilon=consts["epsilon"], diameter=consts["diameter"], dim=d, lookup_lip=lookup_lip)
    assert ratios.max().item() <= bound


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(3, 8), d=st.integers(1, 3), r=st.floats(0.2, 1.5))
def test_neighbourhood_bound_dominates(seed, n, d, r):
    g = _gen(seed)
    pts = _box(g, (n, d), r)
    xt = pts[:1]
    keep1 = torch.rand(n, generator=g) < 0.6
    keep2 = torch.rand(n, generator=g) < 0.6
    keep1[0] = keep2[0] = True  # both neighbourhoods contain t
    if torch.equal(keep1, keep2):
        keep2[-1] = ~keep2[-1]
    x1, x2 = pts[keep1], pts[keep2]
    diff = (attention_kernel(xt, x1)[0] - attention_kernel(xt, x2)[0]).abs().sum().item()
    w1 = wasserstein1(x1, x2).item()
    consts = dot_product_potential_constants(radius=r, dim=d)
    bound = neighbourhood_bound(lip_second=consts["lip_second"], epsilon=consts["epsilon"], sup=consts["sup"], diameter=consts["diameter"], dim=d)
    assert diff <= bound * w1 + 1e-12


@HSET
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 8), m=st.integers(2, 8), d=st.integers(1, 3), spread=st.floats(0.1, 4.0))
def test_gaussian_potential_bound_dominates_on_unbounded_space(seed, n, m, d, spread):
    g = _gen(seed)
    x = torch.randn(n, d, generator=g, dtype=F64) * spread
    y = x[: min(n, m)] + 0.3 * torch.randn(min(n, m), d, generator=g, dtype=F64) if m <= n else torch.randn(m, d, generator=g, dtype=F64) * spread
    ratio = contraction_ratio(x, y, similarity="gaussian", scale=1.0).item()
    assert ratio <= gaussian_potential_bound(dim=d, n=n, m=y.shape[0])


def test_printed_theorem_23_fails_for_a_nearly_constant_potential():
    # Counterexample to Thm. 23 / Prop. 25 as printed: on a tiny box G = exp(<x, y>/sqrt(d)) is
    # almost constant, so attention is almost the mean, and translating the tokens translates the
    # output by the same amount (ratio ~ 1), while the printed constant is O(r^2).
    r, d = 0.05, 1
    x = torch.tensor([[-r], [-r / 2]], dtype=F64)
    y = x + r / 2
    ratio = contraction_ratio(x, y).item()
    consts = dot_product_potential_constants(radius=r, dim=d)
    printed = contraction_bound(**consts, dim=d, as_printed=True)
    assert ratio > 0.9 > 10 * printed
    assert ratio <= contraction_bound(**consts, dim=d)
    xt = x[:1]
    diff = (attention_kernel(xt, x)[0] - attention_kernel(xt, torch.cat([xt, y[1:]]))[0]).abs().sum().item()
    w1 = wasserstein1(x, torch.cat([xt, y[1:]])).item()
    nb = dict(lip_second=consts["lip_second"], epsilon=consts["epsilon"], diameter=consts["diameter"], dim=d)
    assert diff > neighbourhood_bound(**nb, as_printed=True) * w1
    assert diff <= neighbourhood_bound(**nb, sup=consts["sup"]) * w1


def test_gaussian_potential_bound_on_a_sensitive_configuration():
    # A regular simplex with squared edge ln(N-1): each query splits its mass evenly between
    # itself and the rest, where the softmatch weights are most sensitive to a dilation.
    n = 6
    base = torch.eye(n, dtype=F64) - 1.0 / n
    base = base / torch.cdist(base[:1], base[1:2]).item() * math.sqrt(math.log(n - 1))
    ratio = contraction_ratio(base, base * 1.01, similarity="gaussian").item()
    assert ratio > 1.0  # a genuine expansion: dilating the cloud moves attention outputs more
    assert ratio <= gaussian_potential_bound(dim=n, n=n)


@pytest.mark.parametrize("n", [10, 10**6])
def test_prop28_constant_is_exceeded_for_many_tokens(n):
    # mu = (1/N) delta_0 + (1-1/N) delta_t in 1-D, nu moves the heavy atom to t + h, and the query
    # sits at 0; with t^2 = ln(N-1) the softmatch splits its mass evenly.  In closed form
    # W1(Psi(mu), Psi(nu)) = |s' - s| t + s' h with s = c / (1 + c), c = (N-1) exp(-t^2), which
    # grows like (ln N)/2 times W1(mu, nu), faster than the sqrt(ln N) bracket of Prop. 28.
    t, h = math.sqrt(math.log(n - 1)), 1e-4
    w = torch.tensor([1 / n, 1 - 1 / n], dtype=F64)
    mu = EmpiricalMeasure(torch.tensor([[0.0], [t]], dtype=F64), w)
    nu = EmpiricalMeasure(torch.tensor([[0.0], [t + h]], dtype=F64), w)
    gauss = lambda p: torch.exp(-p[..., 0] ** 2)  # noqa: E731  G(0, y)
    got = wasserstein1(boltzmann_gibbs(mu, gauss), boltzmann_gibbs(nu, gauss)).item()
    mass = lambda z: (n - 1) * math.exp(-(z**2)) / (1 + (n - 1) * math.exp(-(z**2)))  # noqa: E731
    assert got == pytest.approx(abs(mass(t + h) - mass(t)) * t + mass(t + h) * h, rel=1e-9)
    ratio = got / wasserstein1(mu, nu).item()
    bracket = math.sqrt(math.log(n) + 1 / (2 * math.e)) * math.sqrt(2 / math.e) + 1 + 1 + 2  # d = 1
    assert (ratio > bracket) == (n == 10**6)


def test_bound_formulas():
    # The formulas as printed in the paper, evaluated here independently.
    common = dict(lip_first=0.5, lip_second=0.25, epsilon=0.1, diameter=3.0, dim=2, lookup_lip=2.0)
    assert contraction_bound(**common, as_printed=True) == pytest.approx(2 * 2 * 0.75 * 3 / 0.1 * 2)
    assert contraction_bound(**common, sup=1.5) == pytest.approx(2 * 2 * (2 * 0.5 * 3 + 1.5 + 2 * 0.25 * 3) / 0.1)
    assert lipschitz_bound(lip_first=0.5, epsilon=0.1, diameter=3.0, dim=4, lookup_lip=2.0) == pytest.approx(8 * 2 * 2 * 0.5 * 3 / 0.1)
    assert neighbourhood_bound(lip_second=0.5, epsilon=0.1, diameter=3.0, dim=4, as_printed=True) == pytest.approx(4 * 2 * 0.5 * 3 / 0.1)
    assert neighbourhood_bound(lip_second=0.5, epsilon=0.1, diameter=3.0, dim=4, sup=2.0) == pytest.approx(4 * (2.0 + 2 * 0.5 * 3) / 0.1)
    expected = 2 * 3 * 1.0 * (math.sqrt(3) * math.sqrt(math.log(5) + 1 / (2 * math.e)) * math.sqrt(2 / math.e) + 1 + math.sqrt(3) + 2)
    assert gaussian_potential_bound(dim=3, n=5, m=9) == pytest.approx(expected)
    # ||G||_Lip of the Gaussian potential in the l1 metric: max over t of 2 t exp(-t^2).
    t = np.linspace(0, 5, 200001)
    assert gaussian_potential_constants(radius=1.0, dim=1)["lip_first"] == pytest.approx((2 * t * np.exp(-(t**2))).max(), rel=1e-8)


def test_lipschitz_ratio_of_linear_map_is_its_gain():
    g = _gen(14)
    q1, q2 = torch.randn(100, 3, generator=g, dtype=F64), torch.randn(100, 3, generator=g, dtype=F64)
    torch.testing.assert_close(lipschitz_ratio(lambda q: 3.0 * q, q1, q2), torch.full((100,), 3.0, dtype=F64))
    assert lipschitz_ratio(lambda q: q, q1, q1).eq(0).all()


# ------------------------------------------------------------------------------------------
def test_potential_constants_refuse_an_overflowing_exponent():
    dot_product_potential_constants(radius=10.0, dim=4, scale=1.0)  # s r^2 d = 400: exp(400) is a double
    with pytest.raises(ValueError, match="radius"):
        dot_product_potential_constants(radius=20.0, dim=4, scale=1.0)  # exp(1600) is not
    with pytest.raises(ValueError, match="radius"):
        gaussian_potential_constants(radius=10.0, dim=4, scale=1.0)  # exp(-1600) underflows to 0



def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="do not match"):
        wasserstein1(torch.randn(3, 2), torch.randn(3, 3))
    with pytest.raises(ValueError, match="method"):
        wasserstein1(torch.randn(3, 2), torch.randn(3, 2), method="sinkhorn")
    with pytest.raises(ValueError, match="epsilon"):
        contraction_bound(lip_first=1.0, lip_second=1.0, epsilon=0.0, diameter=1.0, dim=2, sup=1.0)
    with pytest.raises(ValueError, match="sup"):
        contraction_bound(lip_first=1.0, lip_second=1.0, epsilon=0.5, diameter=1.0, dim=2)
    with pytest.raises(ValueError, match="dim"):
        gaussian_potential_bound(dim=0, n=3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    g = _gen(15)
    x, y = torch.randn(2, 6, 3, generator=g, dtype=F64), torch.randn(2, 5, 3, generator=g, dtype=F64)
    torch.testing.assert_close(wasserstein1(x.cuda(), y.cuda()).cpu(), wasserstein1(x, y), atol=1e-12, rtol=0)
