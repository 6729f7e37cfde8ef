"""POT's entropic-OT test problems (``test/test_bregman.py`` of POT 0.9.7.post1), run on
:func:`attnopt.transforms.sinkhorn_attention`.

Adapted from POT, the Python Optimal Transport library, https://pythonot.github.io/, file
``test/test_bregman.py`` of its 0.9.7.post1 source distribution, whose authors are Remi Flamary,
Kilian Fatras, Quang Huy Tran and Eduardo Fernandes Montesuma; MIT License, copyright (c) 2016-2023
POT contributors, reproduced in ``tests/peers/pot/LICENSE``.  The problems (data, sizes, seeds,
regularizations, tolerances) are POT's; the calls are attnopt's: ``sinkhorn_attention(-M, reg)``
returns :math:`W = P/a` for uniform marginals :math:`a_i = 1/n`, :math:`b_j = 1/m`, so the plan is
``W / n``.  POT (pinned in requirements.txt) is the reference where it is right; where it is wrong
(zero masses, costs offset by 1e6 in float32: the last two tests) the reference is an independent
float64 computation.

POT's tests that do not apply, and why:

* ``test_sinkhorn_multi_b``, ``test_sinkhorn_variants_multi_b``, ``test_sinkhorn2_variants_multi_b``,
  ``test_sinkhorn_variants_log_multib``, ``test_stabilized_vs_sinkhorn_multidim``,
  ``test_sinkhorn_stabilization``: random or Gaussian (non-uniform) marginals; attention's marginals
  are uniform over the live queries and keys.  Their batched form is kept with uniform marginals
  (``test_batched_problems_equal_one_pot_call_each``).
* ``test_barycenter*``, ``test_free_support_sinkhorn_barycenter``, ``test_wasserstein_bary_2d*``,
  ``test_convolutional_barycenter_non_square``, ``test_convergence_warning_barycenters``,
  ``test_unmix``: barycenters and unmixing, other problems than one transport plan.
* ``test_sinkhorn2_backends``, ``test_sinkhorn2_variants_dtype_device``,
  ``test_sinkhorn2_variants_device_tf``, ``test_empirical_sinkhorn_divergence*``,
  ``test_geomloss_solver``, ``test_lazy_empirical_sinkhorn``: the transport cost or divergence, or
  lazy potentials, not the plan (the gradient of ``test_sinkhorn2_gradients`` is kept, on the plan).
* ``test_sinkhorn_backends``, ``test_sinkhorn_variants_dtype_device``: NumPy/JAX/TF/CuPy backends;
  attnopt is PyTorch only (float32 and float64 are kept; devices are tests/lib/test_device_parity.py).
* ``test_not_implemented_method``, ``test_implemented_methods``: POT's ``method=`` names (attnopt's
  unknown ``grad=`` is in tests/lib/test_bad_inputs_transforms_attention.py).
* ``test_screenkhorn``: a screened approximation, not the plan.
* ``test_sinkhorn_warmstart``, ``test_empirical_sinkhorn_warmstart``,
  ``test_empirical_sinkhorn_divergence_warmstart``: attnopt has no warm start; the plan of the
  first is kept.
"""

from __future__ import annotations

import warnings
from itertools import product

import numpy as np
import ot
import pytest
import torch

import attnopt
from attnopt.transforms import sinkhorn_attention

METHODS = ["sinkhorn", "sinkhorn_log", "sinkhorn_stabilized", "sinkhorn_epsilon_scaling", "greenkhorn"]


def ours(M, reg, dtype=torch.float64, **kwargs):
    """The plan of attnopt for cost ``M``: ``W / n``, in float64 NumPy."""
    W = sinkhorn_attention(-torch.as_tensor(M, dtype=dtype), reg, **kwargs)
    return W.double().numpy() / M.shape[0]


def pot_converged(M, reg):
    n, m = M.shape
    return ot.sinkhorn(ot.unif(n), ot.unif(m), M, reg, method="sinkhorn_log", stopThr=1e-13, numItermax=20_000)


def cloud(n, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 2)
    return ot.dist(x, x)


@pytest.mark.parametrize("grad", ["unrolled", "implicit"])
def test_sinkhorn(grad):
    # POT's test_sinkhorn: n = 100, M = squared distances of a Gaussian cloud, reg = 1.
    n = 100
    M = cloud(n)
    u = ot.utils.unif(n)
    G = ours(M, 1, grad=grad)  # the default: to tol = 1e-5
    np.testing.assert_allclose(u, G.sum(1), atol=1e-05)
    np.testing.assert_allclose(u, G.sum(0), atol=1e-05)
    np.testing.assert_allclose(G, ot.sinkhorn(u, u, M, 1, stopThr=1e-10), atol=1e-05)
    # converged, both: round-off apart (the standard of issue #21)
    np.testing.assert_allclose(ours(M, 1, n_iter=5000, tol=1e-13), pot_converged(M, 1), atol=1e-12, rtol=0)
    with pytest.warns(attnopt.ConvergenceWarning):  # POT: a UserWarning for numItermax=1
        ours(M, 1, n_iter=1, grad=grad)


@pytest.mark.parametrize("n_iter", [1, 5])
def test_convergence_warning(n_iter):
    # POT's test_convergence_warning, with uniform marginals on its cost dist0(100) / median.
    M = ot.utils.dist0(100)
    M /= np.median(M)
    with pytest.warns(attnopt.ConvergenceWarning, match=f"after {n_iter} iterations"):
        ours(M, 1.0, n_iter=n_iter, tol=1e-12)
    with warnings.catch_warnings():  # POT's warn=False: attnopt's fixed count never warns
        warnings.simplefilter("error")
        ours(M, 1.0, n_iter=n_iter, tol=None)


def test_nan_warning():
    # POT's test_nan_warning: reg = 0 gives POT a NaN warning; attnopt refuses it, naming eps.
    M = ot.utils.dist0(100)
    with pytest.raises(ValueError, match="eps"):
        ours(M, 0.0)


@pytest.mark.parametrize("method", ["sinkhorn_log", "sinkhorn", "sinkhorn_stabilized", "sinkhorn_epsilon_scaling"])
def test_sinkhorn_empty(method):
    # POT's test_sinkhorn_empty: empty marginals mean uniform ones, attention's case exactly.
    n = 100
    M = cloud(n)
    u = ot.utils.unif(n)
    G_pot = ot.sinkhorn([], [], M, 1, stopThr=1e-10, method=method)
    G = ours(M, 1)
    np.testing.assert_allclose(u, G.sum(1), atol=1e-05)
    np.testing.assert_allclose(u, G.sum(0), atol=1e-05)
    np.testing.assert_allclose(G, G_pot, atol=1e-05)


@pytest.mark.parametrize("n, method, dtype, absorb_every",
                         [(n, m, d, k) for n, m, d, k in product([100, 50], METHODS, [torch.float32, torch.float64], [1, 10])])
def test_sinkhorn_variants(n, method, dtype, absorb_every):
    # POT's test_sinkhorn_variants (n = 100), test_sinkhorn_variants_log (n = 50) and the dtypes of
    # test_sinkhorn_variants_dtype_device: every POT variant against attnopt's, at POT's atol.
    M = cloud(n)
    u = ot.utils.unif(n)
    G_pot = ot.sinkhorn(u, u, M, 1, method=method, stopThr=1e-10)
    G = ours(M, 1, dtype=dtype, absorb_every=absorb_every)
    np.testing.assert_allclose(G, G_pot, atol=1e-05)


@pytest.mark.parametrize("reg", [0.5, 1.0])
def test_batched_problems_equal_one_pot_call_each(reg):
    # The batched form of test_sinkhorn_multi_b (n = 10 there, reg = 0.1, at which its symmetric
    # cost needs 1e5 iterations in both libraries): three pairs of clouds in one call.
    n = 10
    Ms = []
    for seed in range(3):
        rng = np.random.RandomState(seed)
        Ms.append(ot.dist(rng.randn(n, 2), rng.randn(n, 2)))
    Ms = np.stack(Ms)
    W = sinkhorn_attention(-torch.as_tensor(Ms), reg, tol=1e-13, n_iter=20_000)
    for k in range(3):
        np.testing.assert_allclose(W[k].numpy() / n, pot_converged(Ms[k], reg), atol=1e-12, rtol=0)


@pytest.mark.parametrize("grad", ["unrolled", "implicit"])
def test_sinkhorn2_gradients(grad):
    # POT's test_sinkhorn2_gradients (n = 100 Gaussian points, reg = 1) differentiates its loss
    # through its torch backend; here the gradient of a fixed projection of the plan, POT's autograd
    # through its converged log-domain iterations against attnopt's two backward passes.
    n = 100
    rng = np.random.RandomState(0)
    M = ot.dist(rng.randn(n, 2), rng.randn(n, 2))
    R = torch.as_tensor(rng.randn(n, n))
    M1 = torch.tensor(M, requires_grad=True)
    a = torch.as_tensor(ot.utils.unif(n))
    P = ot.sinkhorn(a, a, M1, 1, method="sinkhorn_log", stopThr=1e-14, numItermax=10_000)
    (g_pot,) = torch.autograd.grad((P * R).sum(), M1)
    s = torch.tensor(-M, requires_grad=True)
    W = sinkhorn_attention(s, 1.0, 5000, tol=1e-14, grad=grad)
    (g,) = torch.autograd.grad((W / n * R).sum(), s)
    assert g.shape == s.shape
    torch.testing.assert_close(-g, g_pot, atol=1e-10, rtol=1e-7)


def test_empirical_sinkhorn():
    # POT's test_empirical_sinkhorn: 10 points on a line, squared and plain Euclidean costs.
    n = 10
    X_s = np.reshape(1.0 * np.arange(n), (n, 1))
    X_t = np.reshape(1.0 * np.arange(0, n), (n, 1))
    for metric, reg in [("sqeuclidean", 1), ("sqeuclidean", 0.1), ("euclidean", 1)]:
        G_pot = ot.bregman.empirical_sinkhorn(X_s, X_t, reg, metric=metric)
        G = ours(ot.dist(X_s, X_t, metric=metric), reg)
        np.testing.assert_allclose(G.sum(1), G_pot.sum(1), atol=1e-05)
        np.testing.assert_allclose(G.sum(0), G_pot.sum(0), atol=1e-05)
        np.testing.assert_allclose(G, G_pot, atol=1e-05)


def test_sinkhorn_warmstart_plan():
    # POT's test_sinkhorn_warmstart: 10 x 20 points on a line, reg = 1 (the plan; no warm start here).
    m, n = 10, 20
    M = ot.dist((np.arange(m) * 1.0).reshape(-1, 1), (np.arange(n) * 1.0).reshape(-1, 1))
    pi_unif = ot.bregman.sinkhorn(ot.unif(m), ot.unif(n), M, 1, method="sinkhorn")
    np.testing.assert_allclose(ours(M, 1), pi_unif, atol=1e-05)
    np.testing.assert_allclose(ours(M, 1, n_iter=5000, tol=1e-13), pot_converged(M, 1), atol=1e-12, rtol=0)


def test_small_eps_tends_to_the_exact_plan_of_emd():
    # As eps -> 0 the entropic plan P tends to the unregularized one G of ot.emd (exact, network
    # simplex; here a permutation, H(G) = log 8).  Optimality of each for its problem bounds the gap
    # in cost: 0 <= <M, P> - <M, G> <= eps (H(P) - H(G)).
    rng = np.random.RandomState(1)
    x = rng.randn(8, 2)
    M = ot.dist(x, x + 0.1 * rng.randn(8, 2))
    G = ot.emd(ot.unif(8), ot.unif(8), M)
    entropy = lambda P: -(P[P > 0] * np.log(P[P > 0])).sum()
    gaps, tvs = [], []
    for eps in (1.0, 0.5, 0.2):
        P = ours(M, eps, n_iter=20_000, tol=1e-12)
        gap = (M * P).sum() - (M * G).sum()
        assert -1e-12 <= gap <= eps * (entropy(P) - entropy(G)) + 1e-12
        gaps.append(gap)
        tvs.append(0.5 * np.abs(P - G).sum())
    assert gaps[0] > gaps[1] > gaps[2] and tvs[0] > tvs[1] > tvs[2]


# ----- where POT is wrong: against an independent float64 reference ------------------------------


def test_zero_masses_are_masked_rows_and_columns():
    # Zero masses = padded queries and keys.  The reference solves the problem of the live rows and
    # columns alone (POT's log-domain Sinkhorn in float64) and puts zeros elsewhere.
    rng = np.random.RandomState(0)
    M = ot.dist(rng.randn(20, 2), rng.randn(30, 2))
    rows, cols = np.ones(20, bool), np.ones(30, bool)
    rows[[3, 7]] = False
    cols[[0, 5, 9]] = False
    ref = np.zeros_like(M)
    ref[np.ix_(rows, cols)] = pot_converged(M[np.ix_(rows, cols)], 1.0)
    W = sinkhorn_attention(-torch.as_tensor(M), 1.0, tol=1e-14, query_mask=torch.as_tensor(rows),
                           key_mask=torch.as_tensor(cols))
    np.testing.assert_allclose(W.numpy() / rows.sum(), ref, atol=1e-13, rtol=0)
    # POT's default method on the same zero masses stops with its columns far off (0.85 in l1):
    a, b = rows / rows.sum(), cols / cols.sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P = ot.sinkhorn(a, b, M, 1.0, stopThr=1e-12, numItermax=10_000)
    assert np.abs(P.sum(0) - b).sum() > 0.5


@pytest.mark.parametrize("reg", [0.1, 1.0, 10.0])
def test_costs_offset_by_1e6_in_float32(reg):
    # A constant added to every cost does not change the plan.  In float32, M + 1e6 is rounded to
    # multiples of 1/16: the reference solves that rounded problem, exactly, in float64 (the offset
    # subtracted in float64 is exact).  POT in float32 underflows its kernel.
    rng = np.random.RandomState(0)
    M32 = (ot.dist(rng.randn(20, 2), rng.randn(30, 2)) + 1e6).astype(np.float32)
    ref = pot_converged(M32.astype(np.float64) - 1e6, reg)
    G = ours(M32, reg, dtype=torch.float32, n_iter=5000)
    assert 0.5 * np.abs(G - ref).sum() < 1e-4
    u, v = ot.unif(20).astype(np.float32), ot.unif(30).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrong = {method: ot.sinkhorn(u, v, M32, reg, method=method, stopThr=1e-7, numItermax=10_000)
                 for method in ("sinkhorn", "sinkhorn_log", "sinkhorn_stabilized")}
    assert all(not np.isfinite(P).all() or 0.5 * np.abs(P - ref).sum() > 1e-3 for P in wrong.values())
