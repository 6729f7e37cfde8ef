"""Sinkhorn attention says what it solved: the tolerance mode, its warning, the marginal error it
returns, and no kernel kept without a gradient (issue #21).

The references are independent: POT's log-domain Sinkhorn in float64 run to 1e-14, and the marginal
error recomputed here from the returned weights and the masks.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import ot
import pytest
import torch

import attnopt
from attnopt.transforms import _sinkhorn as S
from attnopt.transforms import _two_sided as two_sided
from attnopt import transforms as T

F64 = torch.float64


def problem_30x70():
    """The issue's problem: 30 x 70 squared distances rescaled to a cost range of 20, eps = 1e-2."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g, dtype=F64)
    y = torch.randn(70, 2, generator=g, dtype=F64)
    C = torch.cdist(x, y) ** 2
    return 20 * (C - C.min()) / (C.max() - C.min())


@pytest.fixture(scope="module")
def pot_plan_30x70():
    C = problem_30x70().numpy()
    P = ot.sinkhorn(np.full(30, 1 / 30), np.full(70, 1 / 70), C, 1e-2, method="sinkhorn_log", stopThr=1e-14,
                    numItermax=100_000)
    assert np.abs(P.sum(0) - 1 / 70).sum() < 1e-12  # the reference itself has converged
    return P


def tv(W, P_ref):
    """Total variation between the plan W / n and a reference plan."""
    P = W.detach().double().numpy() / W.shape[-2]
    return 0.5 * np.abs(P - P_ref).sum()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_converged_plan_on_the_30x70_problem_at_eps_1e_2(dtype, pot_plan_30x70):
    s = -problem_30x70().to(dtype)
    # The old default, 20 fixed iterations, is far from the plan: the numbers.
    old = T.sinkhorn_attention(s, 1e-2, 20, tol=None, return_info=True)
    assert tv(old.weights, pot_plan_30x70) > 0.3 and old.marginal_error > 0.3
    # The default stops at 1000 iterations there, short of tol=1e-5: it says so.
    with pytest.warns(attnopt.ConvergenceWarning, match="column marginal error"):
        short = T.sinkhorn_attention(s, 1e-2, return_info=True)
    assert short.n_iter == 1000 and short.marginal_error > 1e-5
    # Given the iterations it needs, it reaches the tolerance, and the plan is within 1e-4 in TV.
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnopt.ConvergenceWarning)
        out = T.sinkhorn_attention(s, 1e-2, 5000, return_info=True)
    assert out.n_iter < 5000 and out.marginal_error <= 1e-5
    assert tv(out.weights, pot_plan_30x70) < 1e-4
    if dtype == F64:  # POT's standard: agreement to round-off once both have converged
        tight = T.sinkhorn_attention(s, 1e-2, 20_000, tol=1e-13)
        assert tv(tight, pot_plan_30x70) < 1e-10


def test_warning_names_the_error_reached():
    s = torch.randn(3, 6, 9, generator=torch.Generator().manual_seed(1), dtype=F64)
    assert issubclass(attnopt.ConvergenceWarning, RuntimeWarning)
    with pytest.warns(attnopt.ConvergenceWarning) as caught:
        out = T.sinkhorn_attention(s, 0.1, 7, return_info=True)
    message = str(caught[0].message)
    assert "after 7 iterations" in message and "tol=1e-05" in message
    named = float(re.search(r"column marginal error ([0-9.e+-]+)", message).group(1))
    assert named == pytest.approx(float(out.marginal_error.max()), rel=1e-2)
    # the fixed count never warns, and a reachable tolerance does not either
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnopt.ConvergenceWarning)
        T.sinkhorn_attention(s, 0.1, 7, tol=None)
        T.sinkhorn_attention(s, 1.0)


@pytest.mark.parametrize("tol", [None, 1e-5])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_returned_error_equals_the_marginal_error_recomputed_from_the_weights(tol, dtype):
    g = torch.Generator().manual_seed(2)
    s = torch.randn(2, 3, 5, 7, generator=g, dtype=F64)
    key_mask = torch.rand(2, 3, 7, generator=g) > 0.3
    key_mask[..., 0] = True
    query_mask = torch.rand(2, 3, 5, generator=g) > 0.2
    query_mask[..., 0] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", attnopt.ConvergenceWarning)
        out = T.sinkhorn_attention(s.to(dtype), 0.3, 15, tol=tol, key_mask=key_mask, query_mask=query_mask,
                                   return_info=True)
    # independently: a_i = 1 / #live queries, b_j = 1 / #live keys, P = a W
    a = query_mask.double() / query_mask.sum(-1, keepdim=True)
    b = key_mask.double() / key_mask.sum(-1, keepdim=True)
    P = out.weights.double() * a.unsqueeze(-1)
    expected = (P.sum(-2) - b).abs().sum(-1)
    assert out.marginal_error.shape == (2, 3) and out.marginal_error.dtype == dtype
    atol = 1e-12 if dtype == F64 else 2e-6
    torch.testing.assert_close(out.marginal_error.double(), expected, atol=atol, rtol=1e-3)
    assert (expected > 1e-6).any() if tol is None else True  # 15 fixed iterations leave an error


def test_tolerance_mode_is_the_fixed_count_it_ran():
    s = torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(3), dtype=F64, requires_grad=True)
    out = T.sinkhorn_attention(s, 0.5, return_info=True)
    assert out.n_iter % S.CHECK_EVERY == 0 and out.marginal_error.max() <= 1e-5
    fixed = T.sinkhorn_attention(s, 0.5, out.n_iter, tol=None)
    fixed_before = T.sinkhorn_attention(s, 0.5, out.n_iter - S.CHECK_EVERY, tol=None, return_info=True)
    assert torch.equal(out.weights, fixed)
    assert fixed_before.marginal_error.max() > 1e-5  # it stopped at the first test that passed
    w = torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(4), dtype=F64)
    (g_tol,) = torch.autograd.grad((out.weights * w).sum(), s)
    (g_fixed,) = torch.autograd.grad((fixed * w).sum(), s)
    torch.testing.assert_close(g_tol, g_fixed, atol=0, rtol=0)


def _spy_on_records(monkeypatch):
    calls = []
    original = S.sinkhorn_plan

    def spy(*args, **kwargs):
        calls.append(kwargs.get("record") is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(S, "sinkhorn_plan", spy)
    monkeypatch.setattr(two_sided, "sinkhorn_plan", spy)  # sinkhorn_attention calls it from there
    return calls


def _saved_by_autograd(fn):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        out = fn()
    return out, saved


@pytest.mark.parametrize("grad", ["unrolled", "implicit"])
@pytest.mark.parametrize("tol", [None, 1e-5])
def test_no_kernel_is_kept_without_a_gradient(monkeypatch, grad, tol):
    calls = _spy_on_records(monkeypatch)
    s = torch.randn(2, 16, 12, generator=torch.Generator().manual_seed(5), dtype=F64)
    kernel_shape = (2, 16, 12)
    with torch.no_grad():
        sg = s.clone().requires_grad_(True)
        W, saved = _saved_by_autograd(lambda: T.sinkhorn_attention(sg, 0.5, 40, tol=tol, grad=grad))
    assert W.grad_fn is None and saved == [] and calls == [False]
    calls.clear()
    W, saved = _saved_by_autograd(lambda: T.sinkhorn_attention(s, 0.5, 40, tol=tol, grad=grad))  # no requires_grad
    assert W.grad_fn is None and saved == [] and calls == [False]
    calls.clear()
    # with a gradient: the unrolled pass keeps its kernels (one per absorb_every iterations), the
    # implicit one the plan
    W, saved = _saved_by_autograd(lambda: T.sinkhorn_attention(s.clone().requires_grad_(True), 0.5, 40, tol=tol,
                                                               grad=grad))
    assert W.grad_fn is not None
    assert sum(shape == kernel_shape for shape in saved) >= (1 if grad == "implicit" else 2)
    assert calls == [grad == "unrolled"]


@pytest.mark.parametrize("grad", ["unrolled", "implicit"])
def test_second_derivative_is_refused(grad):
    s = torch.randn(5, 6, generator=torch.Generator().manual_seed(6), dtype=F64, requires_grad=True)
    W = T.sinkhorn_attention(s, 0.5, grad=grad)
    (g,) = torch.autograd.grad((W * W).sum(), s, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(g.sum(), s, allow_unused=True)
