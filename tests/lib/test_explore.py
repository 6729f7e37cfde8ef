"""attnopt.explore and attnopt.widgets: each explorer's computation against an independent one, and
each explorer driven headlessly (set a control, check that what it returns and draws changes as the
maths says)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from scipy.optimize import minimize
from scipy.sparse.csgraph import connected_components
from scipy.special import logsumexp

from attnopt import explore
from attnopt.transforms import prior_softmax

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATES = torch.tensor([[-0.8, 0.05], [-0.15, 0.7], [0.75, 0.45], [0.55, -0.55], [-0.35, -0.6]], dtype=F64)
U = torch.tensor([0.30, 0.15, 0.20, 0.25, 0.10], dtype=F64)
Z = torch.tensor([0.95, 0.4], dtype=F64)


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64) * scale


# --------------------------------------------------------------------------------------------
# chapter 1
# --------------------------------------------------------------------------------------------


def scipy_exact_estimate(T, u, z, alpha):
    """h-hat of eq. (12) from the dual (9), maximized by SciPy's BFGS (no attnopt)."""
    T, u, z = (x.numpy() for x in (T, u, z))
    b = u @ T + z

    def negative_dual(lam):
        scores = np.log(u) + T @ lam
        value = lam @ b - lam @ lam / (2 * alpha) - logsumexp(scores)
        p = np.exp(scores - logsumexp(scores))
        return -value, -(b - lam / alpha - T.T @ p)

    lam = minimize(negative_dual, alpha * z, jac=True, method="BFGS", options={"gtol": 1e-12}).x
    scores = np.log(u) + T @ lam
    return np.exp(scores - logsumexp(scores)) @ T


def closed_form_18(T, u, z, alpha):
    scores = np.log(u.numpy()) + alpha * T.numpy() @ z.numpy()
    return np.exp(scores - logsumexp(scores)) @ T.numpy()


@pytest.mark.parametrize("alpha", [0.05, 1.0, 5.0])
def test_preference_view_against_scipy_and_eq_18(alpha):
    view = explore.preference_view(TEMPLATES, U, Z, alpha, alpha_grid=torch.tensor([0.3, 2.0], dtype=F64))
    assert np.allclose(view.exact.numpy(), scipy_exact_estimate(TEMPLATES, U, Z, alpha), atol=1e-7)
    assert np.allclose(view.closed_form.numpy(), closed_form_18(TEMPLATES, U, Z, alpha), atol=1e-12)
    assert torch.allclose(view.mu, U @ TEMPLATES) and torch.allclose(view.b, U @ TEMPLATES + Z)
    for a, err in zip((0.3, 2.0), view.error_curve):
        gap = np.linalg.norm(scipy_exact_estimate(TEMPLATES, U, Z, a) - closed_form_18(TEMPLATES, U, Z, a))
        assert abs(err.item() - gap) < 1e-7
    assert torch.allclose(view.exact_weights.sum(-1), torch.ones((), dtype=F64))


def test_preference_view_error_is_second_order_in_alpha():
    """The small-alpha theorem: ||h - h_alpha|| = O(alpha^2), and both estimates tend to mu."""
    grid = torch.tensor([1e-3, 2e-3], dtype=F64)
    view = explore.preference_view(TEMPLATES, U, Z, 1e-3, alpha_grid=grid)
    slope = math.log(view.error_curve[1] / view.error_curve[0]) / math.log(2.0)
    assert abs(slope - 2) < 0.01
    assert view.shift < 2e-3 * Z.norm()


def test_preference_view_batches_like_a_loop():
    u2 = torch.stack([U, torch.full((5,), 0.2, dtype=F64)])
    batched = explore.preference_view(TEMPLATES, u2, Z, 0.7)
    for i in range(2):
        single = explore.preference_view(TEMPLATES, u2[i], Z, 0.7)
        assert torch.allclose(batched.exact[i], single.exact, atol=1e-10)
        assert torch.allclose(batched.error_curve[:, i], single.error_curve, atol=1e-10)


# --------------------------------------------------------------------------------------------
# chapter 2
# --------------------------------------------------------------------------------------------


def numpy_flow(x, temperature, depth):
    xs = [x]
    for _ in range(depth):
        logits = x @ x.T / temperature
        p = np.exp(logits - logsumexp(logits, axis=1, keepdims=True))
        x = p @ x
        xs.append(x)
    return np.stack(xs)


def test_particle_flow_against_numpy_and_scipy_clusters():
    x = rand(16, 2, seed=3)
    view = explore.particle_flow(x, 0.5, 10)
    assert np.allclose(view.layers.numpy(), numpy_flow(x.numpy(), 0.5, 10), atol=1e-10)
    for layer, count in zip(view.layers.numpy(), view.clusters.tolist()):
        distance = np.linalg.norm(layer[:, None] - layer[None], axis=-1)
        linked = distance <= 1e-3 * view.diameters[0].item()
        assert count == connected_components(linked, directed=False)[0]
    diameters = [np.linalg.norm(layer[:, None] - layer[None], axis=-1).max() for layer in view.layers.numpy()]
    assert np.allclose(view.diameters.numpy(), diameters)


def test_particle_flow_contracts_and_heat_collapses():
    x = rand(24, 2, seed=4)
    cold, hot = explore.particle_flow(x, 0.1, 8), explore.particle_flow(x, 10.0, 8)
    for view in (cold, hot):  # convex combinations: the diameter never grows
        assert (view.diameters[1:] <= view.diameters[:-1] + 1e-12).all()
    assert hot.clusters[-1] == 1 and hot.diameters[-1] < 1e-6 * hot.diameters[0]
    assert cold.clusters[-1] > 1 and cold.diameters[-1] > 0.1 * cold.diameters[0]


def test_particle_flow_on_the_sphere_stays_on_it():
    view = explore.particle_flow(rand(10, 3, seed=5), 0.25, 6, variant="sphere")
    assert torch.allclose(view.layers.norm(dim=-1), torch.ones(7, 10, dtype=F64))


# --------------------------------------------------------------------------------------------
# chapter 3
# --------------------------------------------------------------------------------------------


def numpy_sparsemax(z):
    s = np.sort(z)[::-1]
    cumulative = np.cumsum(s) - 1
    k = np.arange(1, len(z) + 1)
    support = s - cumulative / k > 0
    threshold = cumulative[support][-1] / k[support][-1]
    return np.maximum(z - threshold, 0)


SCORES = rand(12, seed=6, scale=1.5)


@pytest.mark.parametrize("slope", [0.0, 0.4])
def test_regularized_weights_against_independent_formulas(slope):
    tau = 0.7
    bias = -slope * (11 - np.arange(12))
    z = (SCORES.numpy() + bias) / tau
    soft = explore.regularized_weights(SCORES, tau, "softmax", alibi_slope=slope)
    assert np.allclose(soft.bias.numpy(), bias)
    assert np.allclose(soft.weights.numpy(), np.exp(z - logsumexp(z)), atol=1e-14)
    # the ALiBi reading of the softmax: KL to the prior pi ~ exp(b / tau)
    assert torch.allclose(soft.weights, prior_softmax(SCORES, soft.bias / tau, tau, log_prior=True), atol=1e-14)
    sparse = explore.regularized_weights(SCORES, tau, "sparsemax", alibi_slope=slope)
    assert np.allclose(sparse.weights.numpy(), numpy_sparsemax(z), atol=1e-12)
    assert sparse.support_size == (numpy_sparsemax(z) > 0).sum()


def test_regularized_weights_entmax_against_the_entmax_package():
    entmax_package = pytest.importorskip("entmax")
    for alpha in (1.3, 1.5, 2.5):
        view = explore.regularized_weights(SCORES, 0.5, "entmax", alpha=alpha, alibi_slope=0.2)
        reference = entmax_package.entmax_bisect((SCORES + view.bias) / 0.5, alpha=alpha, n_iter=80)
        assert torch.allclose(view.weights, reference, atol=1e-6)
    # the two ends of the family
    at_one = explore.regularized_weights(SCORES, 0.5, "entmax", alpha=1.0).weights
    assert torch.allclose(at_one, explore.regularized_weights(SCORES, 0.5, "softmax").weights)
    at_two = explore.regularized_weights(SCORES, 0.5, "entmax", alpha=2.0).weights
    assert torch.allclose(at_two, explore.regularized_weights(SCORES, 0.5, "sparsemax").weights, atol=1e-9)


def test_regularized_weights_support_curve():
    grid = torch.logspace(-1.5, 1, 21, dtype=F64)
    view = explore.regularized_weights(SCORES, 1.0, "sparsemax", tau_grid=grid)
    for tau, size in zip(grid.tolist(), view.support_curve.tolist()):
        assert size == (numpy_sparsemax(SCORES.numpy() / tau) > 0).sum()
    assert (view.support_curve[1:] >= view.support_curve[:-1]).all()  # support grows with tau
    assert view.support_curve[0] == 1 and view.support_curve[-1] > 1  # argmax alone at tiny tau
    softmax_curve = explore.regularized_weights(SCORES, 1.0, "softmax", tau_grid=grid).support_curve
    assert (softmax_curve == 12).all()


def test_alibi_moves_weight_to_recent_keys():
    flat = torch.zeros(12, dtype=F64)
    weights = [explore.regularized_weights(flat, 1.0, "softmax", alibi_slope=m).weights for m in (0.0, 0.3, 1.0)]
    assert torch.allclose(weights[0], torch.full((12,), 1 / 12, dtype=F64))
    assert weights[0][-1] < weights[1][-1] < weights[2][-1]
    assert (weights[2][1:] > weights[2][:-1]).all()


# --------------------------------------------------------------------------------------------
# chapter 4
# --------------------------------------------------------------------------------------------


def two_discs(size=48):
    """A red disc at (0.3, 0.3) and a blue one at (0.7, 0.7) on black, (row, column)."""
    centres = (torch.arange(size, dtype=F64) + 0.5) / size
    rows, cols = torch.meshgrid(centres, centres, indexing="ij")
    image = torch.zeros(3, size, size, dtype=F64)
    image[0] = (((rows - 0.3) ** 2 + (cols - 0.3) ** 2) < 0.12**2).to(F64)
    image[2] = (((rows - 0.7) ** 2 + (cols - 0.7) ** 2) < 0.12**2).to(F64)
    return image


@pytest.fixture(scope="module")
def disc_values():
    return explore.image_value_function(two_discs(), 14)


def test_density_view_against_closed_forms(disc_values):
    mu = torch.tensor([0.45, 0.55], dtype=F64)
    Sigma = torch.tensor([[0.02, 0.006], [0.006, 0.01]], dtype=F64)
    t = disc_values.locations.numpy() - mu.numpy()
    quad = np.einsum("li,ij,lj->l", t, np.linalg.inv(Sigma.numpy()), t)
    det = np.linalg.det(Sigma.numpy())
    gauss = explore.density_view(disc_values, mu, Sigma)
    expected = np.exp(-quad / 2) / (2 * np.pi * np.sqrt(det))
    assert np.allclose(gauss.density.numpy().reshape(-1), expected)
    assert gauss.support.all() and abs(gauss.mass.item() - 1) < 0.01
    # The truncated paraboloid of the same covariance V has the scale S = k V with
    # V = -lambda S / 3 (Theorem 1) and, eq. (3.15) for D = 2, -lambda = (pi sqrt(det S))^(-1/2):
    # solved for k by SciPy; its support is an ellipse of area pi * (-2 lambda) * sqrt(det S).
    from scipy.optimize import brentq

    k = brentq(lambda k: k * (np.pi * k * np.sqrt(det)) ** -0.5 / 3 - 1, 1e-6, 1e6)
    minus_lam = (np.pi * k * np.sqrt(det)) ** -0.5
    tp = explore.density_view(disc_values, mu, Sigma, "truncated_paraboloid")
    assert np.allclose(tp.density.numpy().reshape(-1), np.maximum(minus_lam - quad / (2 * k), 0))
    area = np.pi * 2 * minus_lam * k * np.sqrt(det)
    assert abs(tp.support.double().mean().item() - area) < 0.01
    assert abs(tp.mass.item() - 1) < 0.01


def test_context_vector_is_the_colour_under_the_density(disc_values):
    """On the red disc the context is red, on the blue one blue; c = B E_p[psi] agrees with the
    pixel rule up to the ridge fit."""
    Sigma = 0.004 * torch.eye(2, dtype=F64)
    for centre, channel in (((0.3, 0.3), 0), ((0.7, 0.7), 2)):
        for family in ("gaussian", "truncated_paraboloid"):
            view = explore.density_view(disc_values, torch.tensor(centre, dtype=F64), Sigma, family)
            assert view.context.argmax() == channel and view.context[channel] > 0.7
            assert (view.context - view.pixel_context).abs().max() < 0.1
    constant = explore.image_value_function(torch.full((2, 20, 20), 0.25, dtype=F64), 6)
    view = explore.density_view(constant, torch.tensor([0.5, 0.5], dtype=F64), 0.01 * torch.eye(2, dtype=F64))
    assert torch.allclose(view.context, torch.full((2,), 0.25, dtype=F64), atol=2e-3)


def test_density_view_batches_like_a_loop(disc_values):
    mus = torch.tensor([[0.3, 0.3], [0.6, 0.5]], dtype=F64)
    Sigma = torch.tensor([[0.01, 0.0], [0.0, 0.02]], dtype=F64)
    batched = explore.density_view(disc_values, mus, Sigma, "truncated_paraboloid")
    for i in range(2):
        single = explore.density_view(disc_values, mus[i], Sigma, "truncated_paraboloid")
        assert torch.allclose(batched.density[i], single.density)
        assert torch.allclose(batched.context[i], single.context, atol=1e-10)


# --------------------------------------------------------------------------------------------
# chapter 5
# --------------------------------------------------------------------------------------------

Q, K = rand(8, seed=7), rand(10, 8, seed=8)


def test_four_views_coincide_and_part_as_the_problem_changes():
    scores = (K @ Q).numpy() / math.sqrt(8) / 0.8
    sdpa = np.exp(scores - logsumexp(scores))
    views = explore.four_views(Q, K, 0.8)
    assert np.allclose(views.sdpa.numpy(), sdpa, atol=1e-15)
    assert views.gaps.max() < 1e-12
    locations = np.linspace(0, 1, 10)
    assert np.isclose(views.mean.item(), sdpa @ locations)
    assert np.isclose(views.variance.item(), sdpa @ (locations - sdpa @ locations) ** 2)

    absent = explore.four_views(Q, K, 0.8, absent=3)
    renormalized = np.delete(sdpa, 3) / np.delete(sdpa, 3).sum()
    for field in ("fenchel", "kernel"):
        weights = getattr(absent, field).numpy()
        assert weights[3] == 0 and np.allclose(np.delete(weights, 3), renormalized, atol=1e-12)
    assert absent.gaps[2] < 1e-12  # the transport view did not change

    sparse = explore.four_views(Q, K, 0.8, regularizer="sparsemax")
    assert np.allclose(sparse.transport.numpy(), numpy_sparsemax(scores), atol=1e-9)
    assert sparse.gaps[:2].max() < 1e-12 and sparse.gaps[2] > 0.01


# --------------------------------------------------------------------------------------------
# the widgets, driven without a browser
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def widgets():
    pytest.importorskip("ipywidgets")
    from attnopt import widgets

    return widgets


def test_preference_explorer_follows_its_controls(widgets):
    explorer = widgets.preference_explorer(TEMPLATES, Z, alpha=1.0)
    assert torch.allclose(explorer.result.u, torch.full((5,), 0.2, dtype=F64))
    first_png, first_error = explorer.image.value, explorer.result.error
    explorer.controls["alpha"].value = 0.1  # what the slider does
    assert explorer.result.alpha == pytest.approx(0.1) and explorer.image.value != first_png
    assert explorer.result.error < 0.05 * first_error  # O(alpha^2): a tenth of alpha, far less error
    explorer.set(favoured=2, mass=0.6)
    assert torch.allclose(explorer.result.u, torch.tensor([0.1, 0.1, 0.6, 0.1, 0.1], dtype=F64))
    direct = explore.preference_view(TEMPLATES, explorer.result.u, Z, explorer.result.alpha)
    assert torch.allclose(explorer.result.exact, direct.exact)
    assert "error" in explorer.readout.value
    with pytest.raises(ValueError, match="beta"):
        explorer.set(beta=1.0)


def test_flow_explorer_recomputes_only_for_a_new_flow(widgets):
    explorer = widgets.flow_explorer(rand(20, 2, seed=9), temperature=0.2, layer=0, depth=8)
    flow = explorer.result
    explorer.controls["layer"].value = 8
    assert explorer.result is flow  # the layer slider only picks the layer drawn
    assert "diameter" in explorer.readout.value
    explorer.controls["temperature"].value = 10.0
    assert explorer.result is not flow
    assert explorer.result.diameters[-1] < flow.diameters[-1]  # hotter contracts faster
    explorer.set(variant="sphere")
    assert torch.allclose(explorer.result.layers[-1].norm(dim=-1), torch.ones(20, dtype=F64))


def test_regularizer_explorer_follows_its_controls(widgets):
    explorer = widgets.regularizer_explorer(SCORES, tau=1.0, regularizer="softmax")
    assert explorer.result.support_size == 12 and explorer.controls["alpha"].disabled
    explorer.controls["regularizer"].value = "sparsemax"
    assert explorer.result.support_size < 12
    explorer.set(regularizer="entmax", alpha=1.5)
    assert not explorer.controls["alpha"].disabled
    entmax_support = explorer.result.support_size
    explorer.controls["alpha"].value = 2.5  # a sparser member of the family
    assert explorer.result.support_size <= entmax_support
    last = explorer.result.weights[-1]
    explorer.controls["alibi_slope"].value = 1.0
    assert explorer.result.weights[-1] > last


def test_density_explorer_follows_its_controls(widgets):
    explorer = widgets.density_explorer(two_discs(), row=0.3, column=0.3, sigma_row=0.05, sigma_column=0.05)
    assert explorer.result.context.argmax() == 0  # on the red disc
    explorer.set(row=0.7, column=0.7)
    assert explorer.result.context.argmax() == 2  # on the blue one
    assert explorer.result.support.all()
    explorer.controls["family"].value = "truncated_paraboloid"
    assert not explorer.result.support.all()
    narrow = explorer.result.support.sum()
    explorer.controls["sigma_row"].value = 0.2
    assert explorer.result.support.sum() > narrow


def test_four_views_explorer_follows_its_controls(widgets):
    explorer = widgets.four_views_explorer(rand(3, 8, seed=10), K)
    assert explorer.result.gaps.max() < 1e-12
    explorer.controls["absent"].value = 0
    assert explorer.result.fenchel[0] == 0 and explorer.result.gaps[0] > 0
    explorer.set(absent=None, regularizer="tsallis")
    assert explorer.result.gaps[:2].max() < 1e-12 and explorer.result.gaps[2] > 0
    before = explorer.result.sdpa
    explorer.controls["query"].value = 2
    assert not torch.allclose(explorer.result.sdpa, before)


def test_draw_functions_draw_the_static_figures(widgets):
    for draw, view, kwargs in (
        (widgets.draw_preference, explore.preference_view(TEMPLATES, U, Z, 1.0), {}),
        (widgets.draw_flow, explore.particle_flow(rand(8, 2), 1.0, 3), {"layer": 2}),
        (widgets.draw_regularizer, explore.regularized_weights(SCORES, 1.0, alibi_slope=0.5), {"tau": 1.0}),
        (widgets.draw_four_views, explore.four_views(Q, K, 1.0), {}),
    ):
        fig = Figure(figsize=widgets.FIGSIZE)
        draw(view, fig, **kwargs)
        assert fig.axes and all(ax.has_data() for ax in fig.axes)


def test_progress_is_silent_when_the_book_runs(widgets, monkeypatch):
    pytest.importorskip("tqdm")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    bar = widgets.progress(range(5), desc="steps")
    assert not bar.disable and list(bar) == [0, 1, 2, 3, 4] and bar.total == 5
    for value in ("1", "true", "YES"):
        monkeypatch.setenv("TQDM_DISABLE", value)
        bar = widgets.progress(iter(range(3)), total=3)
        assert bar.disable and list(bar) == [0, 1, 2]
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert not widgets.progress(range(2)).disable
