"""attnopt.transforms against independent references: the generic one-sided solver, the `entmax`
package, POT's Sinkhorn, finite differences (gradcheck) and properties (hypothesis)."""

import math

import entmax as entmax_pkg
import mpmath  # a dependency of torch (through sympy)
import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnopt
from attnopt import transforms as T
from attnopt.transforms._sinkhorn import rows_to_attention, sinkhorn_plan
from attnopt.transforms._thresholds import safe_max, threshold_newton, threshold_sort

NEG_INF = float("-inf")
ALPHAS = [1.25, 1.5, 2.0, 3.0]


def rand(*shape, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def with_masks(x):
    """Copy of x with a few -inf entries and one all -inf row."""
    x = x.clone()
    x[0, 1] = NEG_INF
    x[0, 3] = NEG_INF
    x[1] = NEG_INF
    return x


# One entry per transform: (function of scores, reference from the generic solver at eps).
def closed_forms():
    return {
        "softmax": (lambda s: T.softmax(s, tau=0.7), lambda s: T.one_sided_eot(-s, 0.7, "entropy")),
        "sparsemax": (lambda s: T.sparsemax(s / 0.7), lambda s: T.one_sided_eot(-s, 0.7, "l2")),
        "entmax15": (lambda s: T.entmax15(s / 0.7), lambda s: T.one_sided_eot(-s, 0.7, "tsallis", alpha=1.5)),
        "entmax1.3": (lambda s: T.entmax(s / 0.7, 1.3, n_iter=60), lambda s: T.one_sided_eot(-s, 0.7, "tsallis", alpha=1.3)),
        "entmax2.5": (lambda s: T.entmax(s / 0.7, 2.5, n_iter=60), lambda s: T.one_sided_eot(-s, 0.7, "tsallis", alpha=2.5)),
    }


TRANSFORMS = {
    "softmax": lambda s, dim=-1: T.softmax(s, dim=dim),
    "sparsemax": lambda s, dim=-1: T.sparsemax(s, dim=dim),
    "sparsemax_sort": lambda s, dim=-1: T.sparsemax(s, dim=dim, method="sort"),
    "entmax15": lambda s, dim=-1: T.entmax15(s, dim=dim),
    "entmax15_sort": lambda s, dim=-1: T.entmax15(s, dim=dim, method="sort"),
    "entmax1.25": lambda s, dim=-1: T.entmax(s, 1.25, dim=dim),
    "entmax3": lambda s, dim=-1: T.entmax(s, 3.0, dim=dim, n_iter=60),
}


# ---------------------------------------------------------------- closed forms vs generic solver


@pytest.mark.parametrize("name", list(closed_forms()))
def test_closed_form_matches_generic_solver(name):
    f, ref = closed_forms()[name]
    s = with_masks(rand(5, 9, seed=1, scale=2.0))
    assert torch.allclose(f(s), ref(s), atol=1e-9, rtol=0)


def test_prior_softmax_matches_generic_kl_solver():
    s = with_masks(rand(5, 9, seed=2))
    prior = torch.rand(5, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    prior[2, 4] = 0.0  # a zero prior forbids that key
    p = T.prior_softmax(s, prior, tau=0.6)
    assert torch.allclose(p, T.one_sided_eot(-s, 0.6, "kl", prior=prior), atol=1e-10, rtol=0)
    assert p[2, 4] == 0


def test_generic_solver_accepts_a_callable_gradient():
    s = rand(4, 6, seed=4)
    p = T.one_sided_eot(-s, 1.0, lambda q: q)  # omega' = p, i.e. the l2 regularizer
    assert torch.allclose(p, T.sparsemax(s), atol=1e-10)


def test_generic_solver_implicit_gradient():
    c = rand(2, 4, seed=5).requires_grad_()
    for reg in ["entropy", "l2", "tsallis"]:
        assert torch.autograd.gradcheck(lambda z: T.one_sided_eot(z, 0.8, reg, n_iter=55), (c,), fast_mode=True)


def test_alibi_prior_is_alibi_bias():
    s = rand(2, 5, 7, seed=6)
    logp = T.alibi_log_prior(5, 7, torch.tensor([0.5, 0.25], dtype=torch.float64))
    i = torch.arange(5, dtype=torch.float64)[:, None] + 2
    j = torch.arange(7, dtype=torch.float64)[None, :]
    bias = -torch.tensor([0.5, 0.25], dtype=torch.float64)[:, None, None] * (i - j)
    bias = bias.masked_fill(j > i, NEG_INF)
    assert torch.allclose(T.prior_softmax(s, logp, log_prior=True), torch.softmax(s + bias, -1), atol=1e-12)


# ---------------------------------------------------------------- vs the entmax package


@pytest.mark.parametrize("method", ["sort", "newton"])
@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0])
def test_sparsemax_and_entmax15_match_entmax_package(method, scale):
    x = rand(64, 33, seed=7, scale=scale)
    assert torch.allclose(T.sparsemax(x, method=method), entmax_pkg.sparsemax(x, dim=-1), atol=1e-12)
    assert torch.allclose(T.entmax15(x, method=method), entmax_pkg.entmax15(x, dim=-1), atol=1e-12)


@pytest.mark.parametrize("power", [1, 2])
@pytest.mark.parametrize("max_steps", [1, 3, 12])
@pytest.mark.parametrize("mode", ["auto", "async"])
def test_newton_threshold_is_exact_with_retired_rows_and_fallback(power, max_steps, mode):
    # Many rows at mixed scales (supports from 1 to dense), some with -inf keys and a dead row:
    # rows settle after different numbers of passes, so retirement is exercised (mode "auto" on the
    # CPU; "async" runs the read-free passes every other device runs); max_steps=1 leaves most rows
    # unsettled, so the sorting fallback must finish them.  Reference: sorting.
    g = torch.Generator().manual_seed(power * 100 + max_steps)
    scale = torch.logspace(-2, 1.5, 2000, dtype=torch.float64).unsqueeze(-1)
    x = torch.randn(2000, 96, generator=g, dtype=torch.float64) * scale + 1e3  # offset: shift invariance
    x[::7, ::5] = NEG_INF
    x[11] = NEG_INF
    x[12] = 0.0  # ties: a uniform row
    top = safe_max(x)
    with attnopt.checks(mode):
        delta = threshold_newton(x, top, power, torch.empty_like(x), max_steps=max_steps)  # relative to top
    reference = power * threshold_sort((x - top) / power, power)
    live = torch.isfinite(x).any(dim=-1)
    torch.testing.assert_close(delta[live], reference[live], atol=1e-12, rtol=0)
    p = torch.clamp(((x - top) - delta) / power, min=0) ** power
    torch.testing.assert_close(p[live].sum(-1), torch.ones(int(live.sum()), dtype=x.dtype), atol=1e-12, rtol=0)
    assert (p[~live] == 0).all()


@pytest.mark.parametrize("alpha", ALPHAS)
def test_entmax_matches_entmax_bisect(alpha):
    x = rand(32, 20, seed=8, scale=2.0)
    ref = entmax_pkg.entmax_bisect(x, alpha=alpha, dim=-1, n_iter=100)
    assert torch.allclose(T.entmax(x, alpha, n_iter=60), ref, atol=1e-10)
    assert torch.allclose(T.entmax(x, alpha), ref, atol=1e-10)  # the default iterates to working precision


def test_entmax_special_cases():
    x = rand(8, 11, seed=9)
    assert torch.allclose(T.entmax(x, 1.0), torch.softmax(x, -1), atol=1e-14)
    assert torch.allclose(T.entmax(x, 1.0 + 1e-7), torch.softmax(x, -1), atol=1e-14)
    assert torch.allclose(T.entmax(x, 2.0), T.sparsemax(x), atol=1e-12)
    assert torch.allclose(T.entmax(x, 1.5), T.entmax15(x), atol=1e-12)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 3.0])
def test_entmax_honours_n_iter_and_tol(alpha):
    x = rand(64, 50, seed=10, scale=3.0)
    exact = entmax_pkg.entmax_bisect(x, alpha=alpha, dim=-1, n_iter=200)
    errs = [(T.entmax(x, alpha, n_iter=k) - exact).abs().max().item() for k in (1, 3, 60)]
    assert errs[0] > errs[2] and errs[1] > errs[2] and errs[2] < 1e-10
    assert errs[0] > 1e-4
    loose = (T.entmax(x, alpha, tol=0.5) - exact).abs().max().item()  # a single iteration
    tight = (T.entmax(x, alpha, tol=1e-12) - exact).abs().max().item()
    assert tight < loose and tight < 1e-9


# ---------------------------------------------------------------- custom backward


@pytest.mark.parametrize("name", ["sparsemax", "sparsemax_sort", "entmax15", "entmax15_sort"])
def test_gradcheck_sparse_transforms(name):
    x = rand(4, 7, seed=11).requires_grad_()
    assert torch.autograd.gradcheck(TRANSFORMS[name], (x,))


@pytest.mark.parametrize("alpha", ALPHAS)
def test_gradcheck_entmax(alpha):
    x = rand(4, 7, seed=12).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: T.entmax(z, alpha, n_iter=60), (x,))


def test_gradcheck_other_dim_and_masks():
    x = with_masks(rand(5, 6, seed=13)).t().contiguous().requires_grad_()
    for f in (T.sparsemax, T.entmax15, lambda z, dim: T.entmax(z, 1.7, dim=dim, n_iter=60)):
        assert torch.autograd.gradcheck(lambda z: f(z, dim=0), (x,))


def test_gradcheck_softmax_family():
    x = rand(3, 6, seed=14).requires_grad_()
    prior = torch.rand(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: T.softmax(z, tau=0.5), (x,))
    assert torch.autograd.gradcheck(lambda z, q: T.prior_softmax(z, q, tau=0.5), (x, prior))


# ---------------------------------------------------------------- exact on every row (issue 21)
#
# The reference solves the threshold on the input converted exactly to float64: the support by
# sorting, then the threshold on that support from correctly rounded sums (math.fsum) in a form
# that does not cancel.  Rows of up to 10^6 keys, nearly flat rows and huge offsets are where the
# cumulative sums and the closed-form root of the library used to lose digits.


def exact_sparse(x: torch.Tensor, power: int) -> torch.Tensor:
    """Sparsemax (power 1) or 1.5-entmax (power 2) of each row of x, in float64, by an exact solve."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for i, row in enumerate(x.double().reshape(-1, x.shape[-1]).numpy()):
        live = np.isfinite(row)
        if not live.any():
            continue
        z = (row[live] - row[live].max()) / power  # exact: float64 differences of nearby numbers
        zs = np.sort(z)[::-1]
        k = _support_size(zs, power)
        lam = _threshold_on(zs[:k], power)
        p = np.clip(z - lam, 0, None) ** power
        out.reshape(-1, x.shape[-1])[i, torch.from_numpy(live)] = torch.from_numpy(p)
    return out


def _threshold_on(zs, power):
    k = len(zs)
    if power == 1:
        return (math.fsum(zs) - 1) / k
    mean = math.fsum(zs) / k
    m2 = math.fsum((zs - mean) ** 2)  # centred: no cancellation of two nearly equal sums
    return mean - math.sqrt(max(1 - m2, 0.0) / k)


def _support_size(zs, power):
    # The largest k whose threshold lies below the k-th largest score (Martins and Astudillo's
    # condition, and its 1.5-entmax analogue); the cumulative sums only guide the search, and the
    # few candidates around their answer are checked with exact sums.
    k_all = np.arange(1, len(zs) + 1)
    if power == 1:
        lam = (np.cumsum(zs) - 1) / k_all
    else:
        mean = np.cumsum(zs) / k_all
        lam = mean - np.sqrt(np.clip(1 / k_all - (np.cumsum(zs * zs) / k_all - mean * mean), 0, None))
    k = int(np.nonzero(zs > lam)[0].max()) + 1
    for cand in range(min(len(zs), k + 1), max(1, k - 1) - 1, -1):
        if zs[cand - 1] > _threshold_on(zs[:cand], power):
            return cand
    return k


SPREADS = {
    "constant": lambda g, n: torch.zeros(n, dtype=torch.float64),
    "nearly flat": lambda g, n: 1e-7 * torch.randn(n, generator=g, dtype=torch.float64),
    "tiny noise": lambda g, n: 1e-4 * torch.randn(n, generator=g, dtype=torch.float64),
    "ramp": lambda g, n: torch.linspace(0, 1, n, dtype=torch.float64),
    "steep ramp": lambda g, n: torch.linspace(-50, 50, n, dtype=torch.float64),
    "huge offset": lambda g, n: 1e6 + 1e-2 * torch.randn(n, generator=g, dtype=torch.float64),
    "ties": lambda g, n: torch.randint(0, 3, (n,), generator=g).double(),
    "normal": lambda g, n: 3 * torch.randn(n, generator=g, dtype=torch.float64),
}
SPARSE_CALLS = {
    "sparsemax": (1, lambda s: T.sparsemax(s)),
    "sparsemax newton": (1, lambda s: T.sparsemax(s, method="newton")),
    "sparsemax sort": (1, lambda s: T.sparsemax(s, method="sort")),
    "sparsemax newton, read-free": (1, lambda s: _read_free(T.sparsemax, s, method="newton")),
    "entmax15": (2, lambda s: T.entmax15(s)),
    "entmax15 newton": (2, lambda s: T.entmax15(s, method="newton")),
    "entmax15 sort": (2, lambda s: T.entmax15(s, method="sort")),
    "entmax15 newton, read-free": (2, lambda s: _read_free(T.entmax15, s, method="newton")),
    "entmax alpha=2": (1, lambda s: T.entmax(s, 2.0)),
    "entmax alpha=1.5": (2, lambda s: T.entmax(s, 1.5)),
}
EXACT_TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _read_free(f, s, **kw):
    with attnopt.checks("async"):  # the branch every device but the CPU runs
        return f(s, **kw)


def assert_exact(p, x, power, ref=None):
    """Rows sum to 1 (dead rows to 0) and the weights are the exact ones, both within EXACT_TOL."""
    tol = EXACT_TOL[x.dtype]
    ref = exact_sparse(x, power) if ref is None else ref
    live = torch.isfinite(x).any(dim=-1).double()
    total = p.double().sum(dim=-1)
    assert (total - live).abs().max().item() <= tol, (total - live).abs().max().item()
    l1 = (p.double() - ref).abs().sum(dim=-1)  # the total variation distance, times 2
    assert l1.max().item() <= tol, l1.max().item()


@settings(max_examples=60, deadline=None)
@given(n=st.one_of(st.integers(1, 40), st.integers(41, 3000)), spread=st.sampled_from(list(SPREADS)),
       dtype=st.sampled_from([torch.float32, torch.float64]), call=st.sampled_from(list(SPARSE_CALLS)),
       seed=st.integers(0, 10_000), masked=st.booleans())
def test_sparse_transforms_exact_on_every_row(n, spread, dtype, call, seed, masked):
    g = torch.Generator().manual_seed(seed)
    x = torch.stack([SPREADS[spread](g, n), SPREADS["normal"](g, n)]).to(dtype)
    if masked and n > 1:
        x[:, ::3] = NEG_INF  # -inf keys, and with n <= 3 rows with a single live key
    power, f = SPARSE_CALLS[call]
    assert_exact(f(x), x, power)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_transforms_exact_on_rows_of_a_million(dtype):
    # The issue's reproducer (300,000 equal scores: entmax15's Newton path summed to 1.065) and a
    # row of 10^6 keys near 1e6 with tiny noise (in float32: ties a third of the row wide at
    # spacing 1/16) and a forbidden key, so no dense-row shortcut applies.
    g = torch.Generator().manual_seed(21)
    equal = torch.zeros(1, 300_000, dtype=dtype)
    noisy = (1e6 + 1e-2 * torch.randn(1, 10**6, generator=g, dtype=torch.float64)).to(dtype)
    noisy[0, 17] = NEG_INF
    for x in (equal, noisy):
        refs = {power: exact_sparse(x, power) for power in (1, 2)}
        for call in ("sparsemax", "sparsemax sort", "entmax15", "entmax15 sort", "entmax alpha=1.5"):
            power, f = SPARSE_CALLS[call]
            assert_exact(f(x), x, power, refs[power])


def test_residual_certificate_catches_a_threshold_off_in_its_last_digits(monkeypatch):
    # The support certificate cannot see a threshold on the right support that is slightly wrong;
    # the sum of the weights can.  Spoil the threshold the Newton passes return (flags left as
    # they are): the result must still be exact (those rows are sorted again).  Two spoils: a
    # relative 1e-6 (the support stays right) and a threshold pushed above every score (no
    # support at all, which must not pass for a dead row).
    from attnopt.transforms import _thresholds as TT

    true_newton = TT.threshold_newton
    x = torch.zeros(2, 5000, dtype=torch.float64)
    x[1, ::2] = -1.0
    for spoil in (lambda d: d * (1 + 1e-6), lambda d: d.abs() + 1):
        monkeypatch.setattr(TT, "threshold_newton", lambda *a, **k: (spoil(true_newton(*a, **k)[0]),) + true_newton(*a, **k)[1:])
        for power, f in ((2, T.entmax15), (1, T.sparsemax)):
            assert_exact(f(x, method="newton"), x, power)
            delta, _, bad, _, _ = TT.threshold_newton(x, torch.zeros(2, 1, dtype=x.dtype), power, torch.empty_like(x), fallback=False)
            p = torch.clamp((x - delta) / power, min=0) ** power
            missed = (p.sum(-1) - 1).abs() > 1e-9  # what only the residual certificate catches:
            assert (~bad).any() and missed[~bad].all()  # rows the support certificate passed


# alpha-entmax against a reference at 40 digits (mpmath): bisection on the threshold of the
# exactly represented input.  Near the edge of the support p_j = r_j^(1/(alpha-1)) amplifies any
# rounding of r_j = y_j - lambda; the tolerance adds that first-order float64 floor (8 eps of
# |y_j| + |lambda|, relative to r_j) to 1e-6, so a test row cannot fail on rounding alone.


def entmax_reference(x: torch.Tensor, alpha: float):
    mpmath.mp.dps = 40
    am1 = mpmath.mpf(alpha) - 1
    a = 1 / am1
    p_out, floor = torch.zeros(x.shape, dtype=torch.float64), torch.zeros(x.shape, dtype=torch.float64)
    for i, row in enumerate(x.tolist()):
        idx = [j for j, v in enumerate(row) if math.isfinite(v)]
        if not idx:
            continue
        top = max(mpmath.mpf(row[j]) for j in idx)
        y = {j: (mpmath.mpf(row[j]) - top) * am1 for j in idx}
        lo, hi = mpmath.mpf(-1), mpmath.mpf(0)
        for _ in range(140):
            mid = (lo + hi) / 2
            if sum((v - mid) ** a for v in y.values() if v > mid) >= 1:
                lo = mid
            else:
                hi = mid
        lam = (lo + hi) / 2
        for j, v in y.items():
            if v > lam:
                r = v - lam
                p_out[i, j] = float(r**a)
                floor[i, j] = float(a * r**a * 8 * 2.0**-52 * (abs(v) + abs(lam)) / r)
    return p_out, floor


@pytest.mark.parametrize("alpha", [1.01, 1.1, 1.3, 1.5, 1.8, 2.0, 2.25, 3.0, 5.0, 7.5, 10.0])
def test_entmax_default_is_accurate_for_every_alpha(alpha):
    g = torch.Generator().manual_seed(int(alpha * 100))
    x = torch.randn(10, 9, generator=g, dtype=torch.float64) * 2
    x[0] *= 1e-3  # nearly flat: the threshold is tiny for a large alpha
    x[1] = torch.round(x[1])  # ties
    x[2, ::2] = NEG_INF
    x[3] = NEG_INF
    ref, floor = entmax_reference(x, alpha)
    err = (T.entmax(x, alpha) - ref).abs()
    assert (err <= 1e-6 + floor).all(), (err - floor).max().item()


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 2.25, 3.0, 5.0, 7.5, 10.0])
def test_gradcheck_entmax_default_settings(alpha):
    x = rand(4, 7, seed=12, scale=2.0).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: T.entmax(z, alpha), (x,))


# ---------------------------------------------------------------- second derivatives (issue 21)


def double_backward_cases():
    prior = torch.rand(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) + 0.1
    cases = {
        "softmax": lambda z: T.softmax(z, tau=0.7),
        "prior_softmax": lambda z: T.prior_softmax(z, prior, tau=0.7),
        "sparsemax newton": lambda z: T.sparsemax(z, method="newton"),
        "sparsemax sort": lambda z: T.sparsemax(z, method="sort"),
        "entmax15 newton": lambda z: T.entmax15(z, method="newton"),
        "entmax15 sort": lambda z: T.entmax15(z, method="sort"),
    }
    for alpha in (1.25, 1.5, 2.0, 2.25, 3.0, 5.0):
        cases[f"entmax {alpha}"] = lambda z, alpha=alpha: T.entmax(z, alpha)
    for reg in ("entropy", "l2", "tsallis", "kl"):  # (a nested bisection: a quarter of the keys, fast mode)
        cases[f"one_sided_eot {reg}"] = lambda z, reg=reg: T.one_sided_eot(
            -z[:2, :3], 0.8, reg, prior=prior[:2, :3] if reg == "kl" else None, n_iter=50)
    return cases


@pytest.mark.parametrize("name", list(double_backward_cases()))
def test_second_derivatives(name):
    # Every autograd Function of the transforms (Sinkhorn's aside) has a backward written in
    # differentiable torch ops, so its double backward is exact: gradgradcheck against finite
    # differences of the backward, with a forbidden key in one row.
    x = rand(3, 6, seed=3, scale=1.5)
    x[0, 2] = NEG_INF
    fast = name.startswith("one_sided_eot")
    assert torch.autograd.gradgradcheck(double_backward_cases()[name], (x.requires_grad_(),), fast_mode=fast)


# ---------------------------------------------------------------- properties (hypothesis)


rows = st.integers(1, 4)
cols = st.integers(1, 12)


@settings(max_examples=25, deadline=None)
@given(n=rows, m=cols, seed=st.integers(0, 10_000), scale=st.sampled_from([0.1, 1.0, 5.0]), c=st.floats(-50, 50))
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_properties(name, n, m, seed, scale, c):
    f = TRANSFORMS[name]
    x = rand(n, m, seed=seed, scale=scale)
    p = f(x)
    assert (p >= 0).all() and torch.allclose(p.sum(-1), torch.ones(n, dtype=x.dtype), atol=1e-9)
    assert torch.allclose(f(x + c), p, atol=1e-7)  # invariance to a constant shift
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(seed))
    assert torch.allclose(f(x[:, perm]), p[:, perm], atol=1e-12)  # permutation equivariance
    looped = torch.stack([f(x[i]) for i in range(n)])
    assert torch.allclose(looped, p, atol=1e-12)  # batched = looped
    assert torch.allclose(f(x.t().contiguous(), dim=0).t(), p, atol=1e-12)  # any dim


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 12), seed=st.integers(0, 10_000), data=st.data())
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_masked_entries_get_zero(name, m, seed, data):
    f = TRANSFORMS[name]
    x = rand(3, m, seed=seed, scale=2.0)
    masked = torch.tensor(data.draw(st.lists(st.booleans(), min_size=m, max_size=m)))
    x[0, masked] = NEG_INF
    x[2] = NEG_INF
    p = f(x)
    assert not p.isnan().any()
    assert (p[0, masked] == 0).all() and (p[2] == 0).all()
    if not masked.all():
        assert torch.allclose(p[0].sum(), torch.tensor(1.0, dtype=x.dtype))
        assert torch.allclose(p[0, ~masked], f(x[0, ~masked]), atol=1e-12)  # = transform of the rest


@pytest.mark.parametrize("name", list(TRANSFORMS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_and_dead_rows_give_no_nan(name, dtype):
    f = TRANSFORMS[name]
    x = with_masks(rand(4, 16, seed=15, scale=3.0)).to(dtype).requires_grad_()
    p = f(x)
    assert p.dtype == dtype and not p.isnan().any()
    (p.float() * torch.randn(p.shape)).sum().backward()
    assert not x.grad.isnan().any() and (x.grad[1] == 0).all() and (p[1] == 0).all()
    ref = f(x.detach().double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(p.double(), ref, atol=tol)


def test_all_inf_row_is_zero_for_every_transform():
    x = torch.full((2, 5), NEG_INF, dtype=torch.float64)
    for f in list(TRANSFORMS.values()) + [lambda s: T.prior_softmax(s, torch.ones(5, dtype=torch.float64))]:
        assert (f(x) == 0).all()


# ---------------------------------------------------------------- bad input


def test_bad_input_errors():
    x = rand(3, 4)
    with pytest.raises(ValueError, match="alpha"):
        T.entmax(x, 0.5)
    with pytest.raises(TypeError, match="alpha"):
        T.entmax(x, "1.5")
    with pytest.raises(ValueError, match="tau"):
        T.softmax(x, tau=0.0)
    with pytest.raises(ValueError, match="tau"):
        T.prior_softmax(x, torch.ones(4, dtype=x.dtype), tau=-1.0)
    with pytest.raises(ValueError, match="eps"):
        T.one_sided_eot(x, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        T.sinkhorn_attention(x, eps=-1.0)
    for f in (T.softmax, T.sparsemax, T.entmax15):
        with pytest.raises(ValueError, match="dim"):
            f(x, dim=2)
    with pytest.raises(ValueError, match="dim"):
        T.entmax(x, 1.5, dim=-3)
    with pytest.raises(ValueError, match="tol"):
        T.entmax(x, 1.5, tol=0.0)
    with pytest.raises(ValueError, match="n_iter"):
        T.entmax(x, 1.5, n_iter=0)
    with pytest.raises(TypeError, match="scores"):
        T.sparsemax(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="scores"):
        T.sparsemax(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="prior"):
        T.prior_softmax(x, -torch.ones(4, dtype=x.dtype))
    with pytest.raises(ValueError, match="regularizer"):
        T.one_sided_eot(x, 1.0, "huber")
    with pytest.raises(ValueError, match="prior"):
        T.one_sided_eot(x, 1.0, "kl")
    with pytest.raises(ValueError, match="grad"):
        T.sinkhorn_attention(x, 1.0, grad="magic")
    with pytest.raises(TypeError, match="key_mask"):
        T.sinkhorn_attention(x, 1.0, key_mask=torch.ones(4))
    with pytest.raises(ValueError, match="method"):
        T.sparsemax(x, method="heap")


# ---------------------------------------------------------------- Sinkhorn


def uniform(n, dtype=torch.float64):
    return torch.full((n,), 1.0 / n, dtype=dtype)


@pytest.mark.parametrize("absorb_every", [1, 10])
def test_sinkhorn_matches_pot(absorb_every):
    s = rand(3, 6, 6, seed=16, scale=2.0)
    km = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 1]], dtype=torch.bool)
    W = T.sinkhorn_attention(s, 0.5, 400, tol=None, key_mask=km, absorb_every=absorb_every)
    for b in range(3):
        keep = km[b]
        P = ot.sinkhorn(uniform(6), uniform(int(keep.sum())), -s[b][:, keep], 0.5, numItermax=20_000, stopThr=1e-15)
        assert torch.allclose(W[b][:, keep], 6 * P, atol=1e-9)
        assert (W[b][:, ~keep] == 0).all()


def test_sinkhorn_is_doubly_stochastic_and_batched():
    s = rand(2, 4, 8, 8, seed=17, scale=3.0)
    W = T.sinkhorn_attention(s, 1.0, 300, tol=None)
    ones = torch.ones(2, 4, 8, dtype=s.dtype)
    assert torch.allclose(W.sum(-1), ones, atol=1e-12) and torch.allclose(W.sum(-2), ones, atol=1e-8)
    looped = torch.stack([torch.stack([T.sinkhorn_attention(s[i, j], 1.0, 300, tol=None) for j in range(4)]) for i in range(2)])
    assert torch.allclose(looped, W, atol=1e-12)


def test_sinkhorn_query_mask_and_neg_inf_scores():
    s = rand(5, 5, seed=18)
    qm = torch.tensor([True, True, True, False, True])
    s[0, 2] = NEG_INF
    W = T.sinkhorn_attention(s, 0.8, 500, tol=None, query_mask=qm, key_mask=torch.tensor([True] * 4 + [False]))
    assert not W.isnan().any() and (W[3] == 0).all() and (W[:, 4] == 0).all() and W[0, 2] == 0
    assert torch.allclose(W[qm].sum(-1), torch.ones(4, dtype=s.dtype), atol=1e-12)
    assert torch.allclose(W.sum(-2)[:4], torch.ones(4, dtype=s.dtype), atol=1e-8)


def test_sinkhorn_single_query_is_uniform():
    s = rand(1, 7, seed=19)  # one source: U(a, b) = {a b^T}, whatever the scores
    W = T.sinkhorn_attention(s, 0.5, 50, tol=None)
    assert torch.allclose(W, torch.full_like(W, 1 / 7), atol=1e-12)  # one source: P = a b^T


@pytest.mark.parametrize("masked", [False, True])
def test_sinkhorn_implicit_gradient_matches_unrolled_and_finite_differences(masked):
    s = rand(2, 4, 5, seed=20, scale=1.5).requires_grad_()
    km = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0]], dtype=torch.bool) if masked else None
    g = rand(2, 4, 5, seed=21)
    grads = {}
    for mode in ("unrolled", "implicit"):
        W = T.sinkhorn_attention(s, 0.7, 400, tol=None, key_mask=km, grad=mode)
        (grads[mode],) = torch.autograd.grad((W * g).sum(), s)
    assert torch.allclose(grads["implicit"], grads["unrolled"], atol=1e-10)
    assert torch.autograd.gradcheck(lambda z: T.sinkhorn_attention(z, 0.7, 300, tol=None, key_mask=km, grad="implicit"), (s,), fast_mode=True)


@pytest.mark.parametrize("absorb_every, n_iter", [(10, 10), (3, 10), (1, 7), (4, 13)])
def test_sinkhorn_hand_unrolled_backward_equals_autograd_through_the_iterations(absorb_every, n_iter):
    # The hand-written reverse pass must give autograd's gradient through the very same iterations
    # (several kernel re-exponentiations, -inf scores, a padded query), and gradcheck must hold.
    s = rand(3, 6, 7, seed=31, scale=1.5)
    s[0, 1, 2] = NEG_INF
    qm = torch.ones(3, 6, dtype=torch.bool)
    qm[0, 3] = False
    g = rand(3, 6, 7, seed=32)
    grads = []
    for hand in (True, False):
        z = s.clone().requires_grad_()
        if hand:
            W = T.sinkhorn_attention(z, 0.8, n_iter, tol=None, query_mask=qm, absorb_every=absorb_every)
        else:  # the plan by plain autograd, on the inputs sinkhorn_attention builds
            live = torch.isfinite(z) & qm.unsqueeze(-1)
            M = torch.where(live, z / 0.8, torch.full_like(z, NEG_INF))
            a = qm.to(z.dtype) / qm.sum(-1, keepdim=True)
            b = torch.full((3, 7), 1 / 7, dtype=z.dtype)
            W = rows_to_attention(sinkhorn_plan(M, a, b, n_iter, absorb_every), a)
        (grad,) = torch.autograd.grad((W * g).sum(), z)
        grads.append(grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-14, rtol=1e-12)
    x = rand(2, 4, 5, seed=33).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: T.sinkhorn_attention(z, 0.8, n_iter, tol=None, absorb_every=absorb_every), (x,))


def test_sinkhorn_low_precision_no_nan():
    s = with_masks(rand(4, 6, seed=22)).to(torch.bfloat16).requires_grad_()
    for mode in ("unrolled", "implicit"):
        W = T.sinkhorn_attention(s, 1.0, 20, tol=None, grad=mode)
        (W.float() * torch.randn(W.shape)).sum().backward()
        assert W.dtype == torch.bfloat16 and not W.isnan().any() and not s.grad.isnan().any()


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x = with_masks(rand(16, 40, seed=23, dtype=torch.float32))
    for name, f in TRANSFORMS.items():
        assert torch.allclose(f(x.cuda()).cpu(), f(x), atol=1e-5), name
    s = rand(2, 8, 8, seed=24, dtype=torch.float32)
    assert torch.allclose(T.sinkhorn_attention(s.cuda(), 1.0, 30, tol=None).cpu(), T.sinkhorn_attention(s, 1.0, 30, tol=None), atol=1e-5)
