"""Checked once at the door (issue 29): a composite checks its user's tensors once and calls engines.

A data check (NaN, ``+inf``, a negative weight, an overflow) goes through
:func:`attnopt._validation.require`, which in ``"async"`` mode becomes one ``torch._assert_async``:
so the number of those calls is the number of data checks a call makes, on any device.  ``explore.four_views`` used to make 21 of them for one query and its keys (the
query three times, the keys three times, its own softmax output three times...), because it
called the public functions of the four views on tensors it had checked or built itself.
"""

from __future__ import annotations

import torch
from host_reads import host_reads

import attnopt
from attnopt.explore import four_views, preference_view
from attnopt.fenchel import generalized_attention
from attnopt.kernels import attention_kernel, self_attention_flow
from attnopt.transforms import softmax

F64 = torch.float64


def data_checks_each(*calls) -> list[int]:
    """The data checks each of ``calls`` (functions of no argument) makes: its calls of
    ``torch._assert_async`` in mode "async", counted by a wrapper (the profiler would count the same
    ATen calls, at a thousand times the cost on a solver's many small ops)."""
    original, counts = torch._assert_async, [0] * len(calls)
    current = [0]

    def counting(*args, **kwargs):
        counts[current[0]] += 1
        return original(*args, **kwargs)

    torch._assert_async = counting
    try:
        with attnopt.checks("async"):
            for i, call in enumerate(calls):
                current[0] = i
                call()
    finally:
        torch._assert_async = original
    return counts


def data_checks(fn, *args, **kwargs) -> int:
    return data_checks_each(lambda: fn(*args, **kwargs))[0]


def query_and_keys(batch=(), m=6, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, d, generator=g, dtype=F64), torch.randn(*batch, m, d, generator=g, dtype=F64)


def test_the_counter_counts_data_checks():
    """One public function on one tensor makes one data check (its scores are finite); a second
    explicit check is counted as a second."""
    scores = torch.randn(3, 5, dtype=F64)
    assert data_checks_each(lambda: softmax(scores), lambda: None, lambda: (softmax(scores), softmax(scores))) == [1, 0, 2]


def test_four_views_checks_its_inputs_once():
    """Five data checks, whatever the batch, the regularizer or the absent key: the query and the
    keys are finite (two), and the scores of each of the three score-forming paths do not overflow
    (the scaled dot products of SDPA, the Fenchel view's alpha<q, t_i>, the kernel view's logits)."""
    cases = [(batch, regularizer, absent) for batch in ((), (3,), (2, 2))
             for regularizer in ("entropy", "sparsemax", "tsallis") for absent in (None, 1)]
    counts = data_checks_each(*(
        (lambda b=b, r=r, a=a: four_views(*query_and_keys(b), 0.8, regularizer=r, absent=a)) for b, r, a in cases))
    assert counts == [5] * len(cases), list(zip(cases, counts))


def test_four_views_reads_nothing_back():
    q, K = query_and_keys((2,))
    assert host_reads(four_views, q, K, 0.5, absent=0) == []


def test_four_views_still_agrees_with_the_public_functions():
    """The engines it calls compute what the public functions compute (to the last bits)."""
    from attnopt.continuous import moment_match
    from attnopt.transforms import one_sided_eot

    q, K = query_and_keys((3,), m=7, d=5, seed=4)
    tau, d = 0.6, 5
    views = four_views(q, K, tau, regularizer="sparsemax", absent=2)
    scores = (K @ q.unsqueeze(-1)).squeeze(-1) / d ** 0.5
    u = torch.ones(7, dtype=F64)
    u[2] = 0
    u = u / u.sum()
    torch.testing.assert_close(views.sdpa, softmax(scores, tau), rtol=0, atol=1e-15)
    torch.testing.assert_close(views.fenchel, generalized_attention(q, K, u, 1 / (tau * d ** 0.5))[1], rtol=0, atol=1e-15)
    kernel = attention_kernel(q.unsqueeze(-2), K, key_weights=u.expand(3, 7), scale=1 / (tau * d ** 0.5))[1]
    torch.testing.assert_close(views.kernel, kernel.squeeze(-2), rtol=0, atol=1e-15)
    torch.testing.assert_close(views.transport, one_sided_eot(-scores, tau, "sparsemax"), rtol=0, atol=1e-15)
    mean, variance = moment_match(views.sdpa, torch.linspace(0, 1, 7, dtype=F64).unsqueeze(-1))
    torch.testing.assert_close(views.mean, mean.squeeze(-1), rtol=0, atol=1e-15)
    torch.testing.assert_close(views.variance, variance.squeeze(-1).squeeze(-1), rtol=0, atol=1e-15)


def test_public_functions_check_each_input_once():
    """The door itself: each user tensor's checks run once (no public function calls another public
    function on a tensor it has checked)."""
    q, K = query_and_keys()
    u = torch.full((6,), 1 / 6, dtype=F64)
    # z and templates finite, their scores do not overflow (3); u finite, non-negative, summing to
    # one (3 more); attention_kernel: queries and keys finite, the logits do not overflow
    assert data_checks_each(lambda: generalized_attention(q, K, None, 0.5), lambda: generalized_attention(q, K, u, 0.5),
                            lambda: attention_kernel(q.unsqueeze(-2), K)) == [3, 6, 3]


def test_preference_view_checks_its_inputs_once():
    """Nine data checks (it made 24): templates, u and z finite, u non-negative and summing to one,
    the grid of reliabilities finite, and the overflow guards of its three score-forming calls (the
    dual solve, the exact weights, the closed-form weights)."""
    g = torch.Generator().manual_seed(3)
    T, z = torch.randn(2, 5, 3, generator=g, dtype=F64), torch.randn(2, 3, generator=g, dtype=F64)
    u = torch.full((5,), 0.2, dtype=F64)
    assert data_checks(preference_view, T, u, z, 0.7) == 9


def test_a_layer_of_the_flow_adds_one_check():
    """A layer's queries, keys and values are built from checked tensors: the only check a layer adds
    is its logits' overflow guard (a layer added four before: its queries, keys and values checked
    again, and the guard)."""
    x = torch.randn(2, 6, 3, dtype=F64)
    w = torch.randn(3, 3, dtype=F64) * 0.5  # one matrix shared by the layers
    for kwargs in ({}, dict(w_q=w, w_k=w, w_v=w, residual=True), dict(weights=torch.full((6,), 1 / 6, dtype=F64))):
        one, five = data_checks_each(lambda: self_attention_flow(x, 1, **kwargs), lambda: self_attention_flow(x, 5, **kwargs))
        assert five - one == 4, (sorted(kwargs), one, five)


def test_density_view_checks_its_inputs_once():
    """Five data checks (it made 14, calling continuous_density and continuous_softmax/sparsemax on
    what it had checked): mu finite; the covariance finite (twice: once as an argument, once more
    inside check_spd, which a caller cannot skip yet), symmetric and positive definite."""
    from attnopt.explore import density_view, image_value_function

    values = image_value_function(torch.rand(3, 28, 28, dtype=F64), 6)
    mu, V = torch.tensor([[0.4, 0.6], [0.5, 0.5]], dtype=F64), torch.eye(2, dtype=F64) * 0.02
    counts = data_checks_each(lambda: density_view(values, mu, V), lambda: density_view(values, mu, V, "truncated_paraboloid"))
    assert counts == [5, 5]


def test_particle_flow_checks_its_particles_once():
    """particle_flow checks x once (finite) and then runs the flow's engine: its data checks are the
    public flow's minus that flow's own check of x (it called self_attention_flow, which checked x
    a second time), and its layers are the public flow's bit for bit."""
    from attnopt.explore import particle_flow

    x = torch.randn(2, 7, 3, dtype=F64)
    for variant, kwargs in (("attention", {}), ("sphere", dict(residual=True, normalize="sphere"))):
        start = x if variant == "attention" else x / x.norm(dim=-1, keepdim=True)
        ours, public = data_checks_each(lambda: particle_flow(x, 0.5, 4, variant=variant),
                                        lambda: self_attention_flow(start, 4, scale=2.0, **kwargs))
        assert ours == public, (variant, ours, public)  # x once, one guard per layer, the last layer once
        view = particle_flow(x, 0.5, 4, variant=variant)
        assert torch.equal(view.layers, self_attention_flow(start, 4, scale=2.0, **kwargs)), variant
