"""Bad and edge inputs of attnopt.transforms, attnopt.attention and the data-check switch.

Written from the contract (DESIGN.md, the docstrings): a bad argument raises TypeError (types) or
ValueError (values) naming it; an edge input gives its documented result; finite input gives a
finite, in-range output in the input's dtype; the hot paths make no host read off the CPU.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnopt
from attnopt import transforms as T
from host_reads import host_reads

NEG_INF = float("-inf")


def rand(*shape, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


# Every map from scores to weights, with the keyword arguments it needs.
MAPS = {
    "softmax": lambda s: T.softmax(s),
    "softmax_tau": lambda s: T.softmax(s, tau=0.3),
    "prior_softmax": lambda s: T.prior_softmax(s, torch.ones_like(s), tau=0.5),
    "sparsemax": lambda s: T.sparsemax(s),
    "sparsemax_sort": lambda s: T.sparsemax(s, method="sort"),
    "entmax15": lambda s: T.entmax15(s),
    "entmax15_sort": lambda s: T.entmax15(s, method="sort"),
    "entmax1.3": lambda s: T.entmax(s, 1.3, n_iter=50),
    "entmax2.5": lambda s: T.entmax(s, 2.5, n_iter=50),
    "attention_weights": lambda s: attnopt.attention_weights(s),
}


# ------------------------------------------------------------------------------------------------
# Bad arguments: the error type, and a message that names the argument
# ------------------------------------------------------------------------------------------------

x2 = torch.randn(3, 4)
BAD = [
    # (call, error type, word the message must contain)
    (lambda: T.softmax(torch.ones(3, 4, dtype=torch.int64)), TypeError, "scores"),
    (lambda: T.softmax("scores"), TypeError, "scores"),
    (lambda: T.softmax(x2, tau=0.0), ValueError, "tau"),
    (lambda: T.softmax(x2, tau=float("nan")), ValueError, "tau"),
    (lambda: T.softmax(x2, tau=float("inf")), ValueError, "tau"),
    (lambda: T.softmax(x2, tau=True), TypeError, "tau"),
    (lambda: T.softmax(x2, tau="1"), TypeError, "tau"),
    (lambda: T.softmax(x2, tau=torch.ones(2)), TypeError, "tau"),
    (lambda: T.softmax(x2, dim=2), ValueError, "dim"),
    (lambda: T.softmax(x2, dim=1.0), TypeError, "dim"),
    (lambda: T.softmax(torch.tensor([[0.0, float("nan")]])), ValueError, "scores"),
    (lambda: T.softmax(torch.tensor([[0.0, float("inf")]])), ValueError, "scores"),
    (lambda: T.sparsemax(x2, method="bogus"), ValueError, "method"),
    (lambda: T.sparsemax(x2, method=1), TypeError, "method"),
    (lambda: T.entmax15(torch.tensor([float("inf"), 0.0])), ValueError, "scores"),
    (lambda: T.entmax(x2, 0.5), ValueError, "alpha"),
    (lambda: T.entmax(x2, float("nan")), ValueError, "alpha"),
    (lambda: T.entmax(x2, float("inf")), ValueError, "alpha"),
    (lambda: T.entmax(x2, "2"), TypeError, "alpha"),
    (lambda: T.entmax(x2, 1.5, n_iter=0), ValueError, "n_iter"),
    (lambda: T.entmax(x2, 1.5, n_iter=2.5), TypeError, "n_iter"),
    (lambda: T.entmax(x2, 1.5, tol=-1.0), ValueError, "tol"),
    (lambda: T.prior_softmax(x2, -torch.ones(3, 4)), ValueError, "prior"),
    (lambda: T.prior_softmax(x2, torch.full((3, 4), float("nan"))), ValueError, "prior"),
    (lambda: T.prior_softmax(x2, torch.ones(5)), ValueError, "prior"),
    (lambda: T.prior_softmax(x2, torch.full((4,), float("inf")), log_prior=True), ValueError, "prior"),
    (lambda: T.alibi_log_prior(3, 4, float("nan")), ValueError, "slope"),
    (lambda: T.alibi_log_prior(3, 4, torch.tensor([1.0, float("inf")])), ValueError, "slope"),
    (lambda: T.alibi_log_prior(3, 4, torch.tensor([1.0, float("nan")])), ValueError, "slope"),
    (lambda: T.alibi_log_prior(3, 4, 0.0), ValueError, "slope"),
    (lambda: T.alibi_log_prior(3, 4, torch.ones(2, 2)), ValueError, "slope"),
    (lambda: T.alibi_log_prior(3, 4, torch.tensor([1, 2])), TypeError, "slope"),
    (lambda: T.alibi_log_prior(5, 3, 0.5), ValueError, "n_queries"),
    (lambda: T.alibi_log_prior(-1, 3, 0.5), ValueError, "n_queries"),
    (lambda: T.alibi_log_prior(2.0, 3, 0.5), TypeError, "n_queries"),
    (lambda: T.alibi_log_prior(2, 3, 0.5, dtype=torch.int64), TypeError, "dtype"),
    (lambda: T.alibi_log_prior(2, 3, 0.5, causal="yes"), TypeError, "causal"),
    (lambda: T.one_sided_eot(torch.tensor([0.0, NEG_INF])), ValueError, "cost"),
    (lambda: T.one_sided_eot(x2, regularizer="foo"), ValueError, "regularizer"),
    (lambda: T.one_sided_eot(x2, regularizer="kl"), ValueError, "prior"),
    (lambda: T.one_sided_eot(x2, regularizer="tsallis", alpha=1.0), ValueError, "alpha"),
    (lambda: T.one_sided_eot(x2, eps=-1.0), ValueError, "eps"),
    (lambda: T.sinkhorn_attention(torch.randn(4)), ValueError, "scores"),
    (lambda: T.sinkhorn_attention(x2, eps=0.0), ValueError, "eps"),
    (lambda: T.sinkhorn_attention(x2, grad="foo"), ValueError, "grad"),
    (lambda: T.sinkhorn_attention(x2, key_mask=torch.ones(4)), TypeError, "key_mask"),
    (lambda: T.sinkhorn_attention(x2, key_mask=torch.ones(5, dtype=torch.bool)), ValueError, "key_mask"),
    (lambda: T.sinkhorn_attention(x2, query_mask=torch.ones(2, 3, dtype=torch.bool)), ValueError, "query_mask"),
    (lambda: T.sinkhorn_attention(x2, n_iter=0), ValueError, "n_iter"),
    (lambda: T.sinkhorn_attention(x2, tol=0.0), ValueError, "tol"),
    (lambda: T.sinkhorn_attention(x2, tol="1e-5"), TypeError, "tol"),
    (lambda: T.sinkhorn_attention(x2, return_info=1), TypeError, "return_info"),
    # attention
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3, dtype=torch.float64)), TypeError, "key"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 5)), ValueError, "key"),
    (lambda: attnopt.attention_scores(torch.randn(2, 2, 3), torch.randn(3, 4, 3)), ValueError, "query"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3), bias=torch.zeros(3, 4)), ValueError, "bias"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3), bias=torch.zeros(5, 2, 4)), ValueError, "bias"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3), bias=torch.zeros(2, 4, dtype=torch.int32)), TypeError, "bias"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3), bias=torch.full((2, 4), float("inf"))), ValueError, "bias"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3), mask=torch.ones(2, 4)), TypeError, "mask"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3), mask=torch.ones(3, 4, dtype=torch.bool)), ValueError, "mask"),
    (lambda: attnopt.attention_scores(torch.randn(2, 3), torch.randn(4, 3), scale=0.0), ValueError, "scale"),
    (lambda: attnopt.attention_scores(torch.tensor([[float("nan"), 0.0]]), torch.randn(4, 2)), ValueError, "query"),
    (lambda: attnopt.attention_scores(torch.full((2, 3), 1e20), torch.full((4, 3), 1e20)), ValueError, "overflow"),
    (lambda: attnopt.attention_weights(torch.tensor([[0.0, float("inf")]])), ValueError, "scores"),
    (lambda: attnopt.scaled_dot_product_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(5, 2)), ValueError, "value"),
    (lambda: attnopt.scaled_dot_product_attention(torch.randn(2, 3), torch.randn(4, 3), torch.full((4, 2), float("nan"))), ValueError, "value"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(5, 2)), ValueError, "v"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2), alpha=0.5), ValueError, "alpha"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2), method="flash"), ValueError, "method"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2), causal="yes"), TypeError, "causal"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2),
                                               key_padding_mask=torch.ones(4)), TypeError, "key_padding_mask"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2),
                                               key_padding_mask=torch.ones(3, dtype=torch.bool)), ValueError, "key_padding_mask"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2, dtype=torch.float64)), TypeError, "v"),
    (lambda: attnopt.attention.flash_attention(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2), scale=0.0), ValueError, "scale"),
    # the switch
    (lambda: attnopt.set_checks("bogus"), ValueError, "mode"),
    (lambda: attnopt.set_checks(1), TypeError, "mode"),
]


@pytest.mark.parametrize("call, error, word", BAD, ids=[f"{i}-{w}" for i, (_, _, w) in enumerate(BAD)])
def test_bad_argument_is_named(call, error, word):
    with pytest.raises(error, match=word):
        call()


# ------------------------------------------------------------------------------------------------
# Edge inputs: documented results
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MAPS))
@pytest.mark.parametrize("shape", [(3, 0), (0, 5), (2, 0, 4)])
def test_empty_in_empty_out(name, shape):
    s = torch.zeros(shape, requires_grad=True)
    p = MAPS[name](s)
    assert p.shape == s.shape and p.dtype == s.dtype
    p.sum().backward()  # an empty batch flows through training code
    assert s.grad.shape == s.shape


def test_empty_sinkhorn_and_attention():
    assert T.sinkhorn_attention(torch.zeros(2, 0, 3)).shape == (2, 0, 3)
    assert T.one_sided_eot(torch.zeros(3, 0)).shape == (3, 0)
    out, p = attnopt.scaled_dot_product_attention(torch.randn(2, 5, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 3))
    assert out.shape == (2, 5, 3) and p.shape == (2, 5, 0)
    assert (out == 0).all()  # no key: every query is a dead row, its output the zero vector
    assert T.alibi_log_prior(0, 3, 0.5).shape == (0, 3)


@pytest.mark.parametrize("name", list(MAPS))
def test_dead_rows_are_zero_with_zero_gradient(name):
    s = rand(3, 6, seed=1)
    s[1] = NEG_INF
    s[2, ::2] = NEG_INF
    s.requires_grad_(True)
    p = MAPS[name](s)
    assert (p[1] == 0).all() and (p[2, ::2] == 0).all()
    torch.testing.assert_close(p[[0, 2]].sum(-1), torch.ones(2, dtype=s.dtype))
    (g,) = torch.autograd.grad((p * rand(3, 6, seed=2)).sum(), s)
    assert torch.isfinite(g).all() and (g[1] == 0).all() and (g[2, ::2] == 0).all()


def test_sparse_maps_are_shift_invariant_at_1e7_float32():
    # The reproducer: at 1e7 the float32 spacing is 1, so the input rounds to
    # [1e7, 1e7, 1e7, 1e7 - 3]; its sparsemax and 1.5-entmax are 1/3 on the three tied keys.
    x = torch.tensor([[1e7, 1e7 + 0.5, 1e7 - 0.25, 1e7 - 3]])
    third = torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0]])
    for f in (T.sparsemax, T.entmax15):
        for method in ("auto", "newton", "sort"):
            torch.testing.assert_close(f(x, method=method), third)


def test_small_temperature_on_large_scores_is_the_argmax_limit():
    s = torch.tensor([[3e30, 1e30, -2e30], [1.0, 5.0, 5.0]])
    p = T.softmax(s, tau=1e-10)
    torch.testing.assert_close(p, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]))
    q = T.prior_softmax(s, torch.tensor([1.0, 1.0, 1.0]), tau=1e-10)
    torch.testing.assert_close(q, p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad", ["unrolled", "implicit"])
@pytest.mark.parametrize("eps", [1e-40, 1e-20, 1e-6, 1e-3])
def test_sinkhorn_small_eps_rows_sum_to_one_and_gradients_finite(dtype, grad, eps):
    s = rand(2, 5, 4, seed=3, dtype=dtype).requires_grad_(True)
    W = T.sinkhorn_attention(s, eps=eps, n_iter=20, tol=None, grad=grad)
    torch.testing.assert_close(W.sum(-1), torch.ones(2, 5, dtype=dtype))
    assert ((W >= 0) & (W <= 1 + 4 * torch.finfo(dtype).eps)).all()  # in [0, 1] up to rounding
    (g,) = torch.autograd.grad((W * rand(2, 5, 4, seed=4, dtype=dtype)).sum(), s)
    assert torch.isfinite(g).all()


def test_alibi_causal_with_queries_aligned_to_last_keys():
    # n_queries <= n_keys: every query sees at least its own key, distance 0.
    logp = T.alibi_log_prior(2, 4, 0.5)
    assert (logp.amax(-1) == 0).all()


def test_attention_overflow_is_avoided_when_the_scores_fit():
    # |q|,|k| ~ 1e19 in float32: q.k = 1e38 * d overflows before the 1/sqrt(d) scale, but
    # scale * q.k = 1e38 * d / sqrt(d) ... use a scale that makes the scores fit: 1e-3.
    q = torch.full((1, 4), 1e19)
    k = torch.tensor([[1e19, 1e19, 1e19, 1e19], [-1e19, 1e19, 1e19, 1e19]])
    s = attnopt.attention_scores(q, k, scale=1e-3)
    assert torch.isfinite(s).all()
    torch.testing.assert_close(s.double(), (q.double() @ k.double().T) * 1e-3, rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------------------------
# The data-check switch
# ------------------------------------------------------------------------------------------------


def test_checks_modes_on_the_cpu():
    bad = torch.tensor([[0.0, float("nan")]])
    assert attnopt.get_checks() == "auto"
    with attnopt.checks("eager"):
        with pytest.raises(ValueError, match="scores"):
            T.softmax(bad)
    with attnopt.checks("async"):  # on the CPU a device assertion fails at once, as RuntimeError
        with pytest.raises(RuntimeError, match="scores"):
            T.softmax(bad)
    with attnopt.checks("off"):  # documented: nothing reads the data, NaN flows through
        assert torch.isnan(T.softmax(bad)).any()
    assert attnopt.get_checks() == "auto"  # restored


def test_checks_off_keeps_the_fast_branches_on_the_cpu():
    # "off" skips checks; it must not switch CPU solvers to their read-free branches (the
    # read-free quadrature of continuous sparsemax is tens of times slower on a CPU)
    from attnopt._validation import host_reads_allowed

    x = torch.zeros(3)
    with attnopt.checks("off"):
        assert host_reads_allowed(x)
        assert not host_reads_allowed(torch.zeros(3, device="meta"))
        torch.testing.assert_close(T.sparsemax(torch.tensor([1.0, 0.0, 0.0])), torch.tensor([1.0, 0.0, 0.0]))
    with attnopt.checks("async"):
        assert not host_reads_allowed(x)


def test_checks_are_restored_after_an_error():
    with pytest.raises(ValueError):
        with attnopt.checks("off"):
            raise ValueError("inside")
    assert attnopt.get_checks() == "auto"


META_CALLS = {
    "softmax": lambda s: T.softmax(s, tau=0.5),
    "prior_softmax": lambda s: T.prior_softmax(s, torch.ones(6, device="meta")),
    "sparsemax": lambda s: T.sparsemax(s),
    "entmax15": lambda s: T.entmax15(s),
    "entmax": lambda s: T.entmax(s, 1.7),
    "sinkhorn": lambda s: T.sinkhorn_attention(s, n_iter=3),  # tol: no test on meta
    "attention_weights": lambda s: attnopt.attention_weights(s),
    "sdpa": lambda s: attnopt.scaled_dot_product_attention(s, s, s)[0],
}


@pytest.mark.parametrize("name", list(META_CALLS))
def test_meta_tensors_give_shapes(name):
    # meta tensors have no values: no check may read them, and the result has the right shape.
    s = torch.empty(2, 5, 6, device="meta")
    out = META_CALLS[name](s)
    assert out.device.type == "meta" and out.shape[:2] == (2, 5)


# ------------------------------------------------------------------------------------------------
# No host read in the hot paths (the CPU stand-in for "no GPU synchronisation")
# ------------------------------------------------------------------------------------------------


def _fwd_bwd(f, s):
    s = s.detach().requires_grad_(True)
    out = f(s)
    out = out[0] if isinstance(out, tuple) else out
    torch.autograd.grad((out * out).sum(), s)


HOT = dict(MAPS)
HOT.update({
    "sinkhorn_unrolled": lambda s: T.sinkhorn_attention(s, eps=0.5, n_iter=12, tol=None),
    "sinkhorn_implicit": lambda s: T.sinkhorn_attention(s, eps=0.5, n_iter=12, tol=None, grad="implicit"),
    "sinkhorn_masks": lambda s: T.sinkhorn_attention(
        s, tol=None, key_mask=torch.tensor([True] * 5 + [False]), query_mask=torch.tensor([True] * 4 + [False])),
    "sdpa": lambda s: attnopt.scaled_dot_product_attention(
        s, s, s, mask=torch.ones(5, 5, dtype=torch.bool).tril(), bias=torch.zeros(5, 5, dtype=s.dtype)),
})


@pytest.mark.parametrize("name", list(HOT))
def test_hot_path_makes_no_host_read(name):
    s = rand(2, 5, 6, seed=5)[..., :5] if name == "sdpa" else rand(2, 5, 6, seed=5)
    s[0, 1, 2] = NEG_INF if name != "sdpa" else s[0, 1, 2]
    assert host_reads(_fwd_bwd, HOT[name], s) == []


# ------------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------------

finite_rows = st.integers(1, 6).flatmap(
    lambda m: st.lists(
        st.lists(st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False), min_size=m, max_size=m),
        min_size=1, max_size=4,
    )
)


@settings(max_examples=25, deadline=None)
@given(rows=finite_rows, log_scale=st.integers(-6, 30), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_finite_in_finite_in_range_out(rows, log_scale, dtype):
    s = torch.tensor(rows, dtype=dtype) * 10.0 ** (log_scale if dtype == torch.float64 else min(log_scale, 33))
    for name, f in MAPS.items():
        p = f(s)
        assert p.dtype == dtype, name
        assert torch.isfinite(p).all() and (p >= 0).all() and (p <= 1).all(), name
        torch.testing.assert_close(p.sum(-1), torch.ones(len(rows), dtype=dtype), atol=1e-5, rtol=0, msg=name)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), m=st.integers(2, 9), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_shift_invariance_up_to_the_documented_offsets(seed, m, dtype):
    # Offsets of 1e7 (float32) and 1e15 (float64): the shifted input y rounds, so the reference is
    # the float64 transform of y minus its row maximum (exact: the entries are within a factor 2).
    offset = 1e7 if dtype == torch.float32 else 1e15
    y = (rand(3, m, seed=seed) * 4 + offset).to(dtype)
    z = (y.double() - y.double().amax(-1, keepdim=True))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for name, f in MAPS.items():
        torch.testing.assert_close(f(y).double(), f(z), atol=tol, rtol=0, msg=name)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), b=st.integers(1, 3), m=st.integers(1, 7))
def test_batching_equals_looping(seed, b, m):
    s = rand(b, 2, m, seed=seed, scale=3.0)
    for name, f in MAPS.items():
        looped = torch.stack([torch.stack([f(s[i, j]) for j in range(2)]) for i in range(b)])
        torch.testing.assert_close(f(s), looped, atol=1e-12, rtol=0, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtype_is_preserved(dtype):
    s = rand(3, 7, seed=6).to(dtype)
    for name, f in MAPS.items():
        assert f(s).dtype == dtype, name
    assert T.sinkhorn_attention(s).dtype == dtype
    q = s[None]
    out, p = attnopt.scaled_dot_product_attention(q, q, q)
    assert out.dtype == dtype and p.dtype == dtype


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), dead=st.integers(0, 2))
def test_gradients_finite_through_masked_rows(seed, dead):
    s = rand(3, 5, seed=seed, scale=2.0)
    s[dead] = NEG_INF
    s[(dead + 1) % 3, seed % 5] = NEG_INF
    for name, f in list(MAPS.items()) + [("sinkhorn", lambda t: T.sinkhorn_attention(t[None])[0])]:
        t = s.clone().requires_grad_(True)
        (g,) = torch.autograd.grad((f(t) * rand(3, 5, seed=seed + 1)).sum(), t)
        assert torch.isfinite(g).all(), name
        assert (g[dead] == 0).all(), name


def test_validation_numbers():
    from attnopt._validation import check_int, check_number

    assert check_int(2**70, "seed", minimum=0) == 2**70
    assert check_number(2**70, "x") == float(2**70)
    with pytest.raises(ValueError, match="x"):
        check_number(10**400, "x")  # an int beyond float range is infinite
    assert math.isinf(check_number(10**400, "x", finite=False))
