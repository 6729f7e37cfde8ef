"""Bad and edge inputs of attnopt.explore and attnopt.widgets, written from their contracts: each bad
input raises the documented error type with a message that names the user's argument; each edge
input gives the documented result."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure

from attnopt import explore

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")

T = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=F64)
U = torch.full((3,), 1 / 3, dtype=F64)
Z = torch.tensor([0.5, 0.2], dtype=F64)
X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=F64)
S = torch.tensor([0.0, 1.0, 2.0, -1.0], dtype=F64)
IMAGE = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(0), dtype=F64)
VALUES = explore.image_value_function(IMAGE, 4)
MU = torch.tensor([0.5, 0.5], dtype=F64)
V = 0.01 * torch.eye(2, dtype=F64)
Q, K = torch.ones(4, dtype=F64), torch.eye(4, dtype=F64)
NAN = float("nan")


def nan_at(x, index=0):
    y = x.clone()
    y.view(-1)[index] = NAN
    return y


BAD = [
    # preference_view
    (lambda: explore.preference_view(T.long(), U, Z, 1.0), TypeError, "templates"),
    (lambda: explore.preference_view(nan_at(T), U, Z, 1.0), ValueError, "templates"),
    (lambda: explore.preference_view(T[:0], U[:0], Z, 1.0), ValueError, "templates"),
    (lambda: explore.preference_view(T, U.float(), Z, 1.0), TypeError, "u"),
    (lambda: explore.preference_view(T, torch.tensor([0.5, 0.6, -0.1], dtype=F64), Z, 1.0), ValueError, "u"),
    (lambda: explore.preference_view(T, torch.full((4,), 0.25, dtype=F64), Z, 1.0), ValueError, "u"),
    (lambda: explore.preference_view(T, U, torch.zeros(3, dtype=F64), 1.0), ValueError, "z"),
    (lambda: explore.preference_view(T, U, Z, 0.0), ValueError, "alpha"),
    (lambda: explore.preference_view(T, U, Z, "big"), TypeError, "alpha"),
    (lambda: explore.preference_view(T, U, Z, 1.0, alpha_grid=torch.tensor([1.0, -1.0], dtype=F64)), ValueError, "alpha_grid"),
    (lambda: explore.preference_view(T, U, Z, 1.0, alpha_grid=torch.ones(2, 2, dtype=F64)), ValueError, "alpha_grid"),
    (lambda: explore.preference_view(T, U, Z, 1.0, tol=-1.0), ValueError, "tol"),
    (lambda: explore.preference_view(T, U.expand(2, 3), Z.expand(3, 2), 1.0), ValueError, "z"),
    # particle_flow
    (lambda: explore.particle_flow(X.long(), 1.0, 2), TypeError, "x"),
    (lambda: explore.particle_flow(nan_at(X), 1.0, 2), ValueError, "x"),
    (lambda: explore.particle_flow(X[:0], 1.0, 2), ValueError, "x"),
    (lambda: explore.particle_flow(X, 0.0, 2), ValueError, "temperature"),
    (lambda: explore.particle_flow(X, 1.0, -1), ValueError, "depth"),
    (lambda: explore.particle_flow(X, 1.0, 2.0), TypeError, "depth"),
    (lambda: explore.particle_flow(X, 1.0, 2, variant="layer"), ValueError, "variant"),
    (lambda: explore.particle_flow(X, 1.0, 2, resolution=0.0), ValueError, "resolution"),
    # regularized_weights
    (lambda: explore.regularized_weights(S.long(), 1.0), TypeError, "scores"),
    (lambda: explore.regularized_weights(nan_at(S), 1.0), ValueError, "scores"),
    (lambda: explore.regularized_weights(torch.tensor([0.0, math.inf], dtype=F64), 1.0), ValueError, "scores"),
    (lambda: explore.regularized_weights(S[:0], 1.0), ValueError, "scores"),
    (lambda: explore.regularized_weights(S, -1.0), ValueError, "tau"),
    (lambda: explore.regularized_weights(S, 1.0, "hardmax"), ValueError, "regularizer"),
    (lambda: explore.regularized_weights(S, 1.0, 2), TypeError, "regularizer"),
    (lambda: explore.regularized_weights(S, 1.0, "entmax", alpha=0.5), ValueError, "alpha"),
    (lambda: explore.regularized_weights(S, 1.0, alibi_slope=-0.1), ValueError, "alibi_slope"),
    (lambda: explore.regularized_weights(S, 1.0, tau_grid=torch.zeros(3, dtype=F64)), ValueError, "tau_grid"),
    # image_value_function, density_view
    (lambda: explore.image_value_function(IMAGE.long()), TypeError, "image"),
    (lambda: explore.image_value_function(IMAGE[0]), ValueError, "image"),
    (lambda: explore.image_value_function(IMAGE[:, :0]), ValueError, "image"),
    (lambda: explore.image_value_function(nan_at(IMAGE)), ValueError, "image"),
    (lambda: explore.image_value_function(IMAGE, 1), ValueError, "n_per_axis"),
    (lambda: explore.image_value_function(IMAGE, 4.0), TypeError, "n_per_axis"),
    (lambda: explore.image_value_function(IMAGE, penalty=0.0), ValueError, "penalty"),
    (lambda: explore.density_view(IMAGE, MU, V), TypeError, "values"),
    (lambda: explore.density_view(VALUES, MU.float(), V), TypeError, "mu"),
    (lambda: explore.density_view(VALUES, torch.zeros(3, dtype=F64), torch.eye(3, dtype=F64)), ValueError, "mu"),
    (lambda: explore.density_view(VALUES, nan_at(MU), V), ValueError, "mu"),
    (lambda: explore.density_view(VALUES, MU, -V), ValueError, "covariance"),
    (lambda: explore.density_view(VALUES, MU, torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=F64)), ValueError, "covariance"),
    (lambda: explore.density_view(VALUES, MU, V, "laplace"), ValueError, "family"),
    (lambda: explore.density_view(VALUES, MU.expand(2, 2), V.expand(3, 2, 2)), ValueError, "covariance"),
    # four_views
    (lambda: explore.four_views(Q.long(), K, 1.0), TypeError, "query"),
    (lambda: explore.four_views(Q, K.float(), 1.0), TypeError, "keys"),
    (lambda: explore.four_views(Q, K[:1], 1.0), ValueError, "keys"),
    (lambda: explore.four_views(Q[:3], K, 1.0), ValueError, "keys"),
    (lambda: explore.four_views(nan_at(Q), K, 1.0), ValueError, "query"),
    (lambda: explore.four_views(Q, K, 0.0), ValueError, "tau"),
    (lambda: explore.four_views(Q, K, 1.0, regularizer="kl"), ValueError, "regularizer"),
    (lambda: explore.four_views(Q, K, 1.0, absent=4), ValueError, "absent"),
    (lambda: explore.four_views(Q, K, 1.0, absent=1.0), TypeError, "absent"),
]


@pytest.mark.parametrize("call, error, word", BAD, ids=[f"{i}-{w}" for i, (_, _, w) in enumerate(BAD)])
def test_bad_argument_is_named(call, error, word):
    with pytest.raises(error, match=word):
        call()


# --------------------------------------------------------------------------------------------
# edge inputs: documented results
# --------------------------------------------------------------------------------------------


def test_one_template_is_its_own_estimate():
    view = explore.preference_view(T[:1], torch.ones(1, dtype=F64), Z, 2.0)
    assert torch.equal(view.exact, T[0]) and torch.equal(view.closed_form, T[0])
    assert view.error == 0 and (view.error_curve == 0).all()


def test_one_particle_and_depth_zero():
    view = explore.particle_flow(X[:1], 1.0, 3)
    assert view.layers.shape == (4, 1, 2) and (view.diameters == 0).all() and (view.clusters == 1).all()
    view = explore.particle_flow(X, 1.0, 0)
    assert torch.equal(view.layers[0], X) and view.clusters.tolist() == [3]


def test_one_key_gets_all_the_weight():
    for regularizer in explore.REGULARIZERS:
        view = explore.regularized_weights(S[:1], 0.1, regularizer, alibi_slope=0.5)
        assert view.weights.tolist() == [1.0] and view.support_size == 1 and (view.support_curve == 1).all()


def test_dtype_is_preserved():
    assert explore.regularized_weights(S.float(), 1.0, "sparsemax").weights.dtype == torch.float32
    assert explore.particle_flow(X.float(), 1.0, 2).layers.dtype == torch.float32
    assert explore.preference_view(T.float(), U.float(), Z.float(), 0.5).exact.dtype == torch.float32
    assert explore.four_views(Q.float(), K.float(), 1.0).sdpa.dtype == torch.float32


def test_extreme_temperatures_stay_finite():
    hot = explore.regularized_weights(1e3 * S, 1e-3, "softmax")
    assert torch.isfinite(hot.weights).all() and hot.weights.max() == 1
    cold = explore.particle_flow(1e2 * X, 1e-3, 2)
    assert torch.isfinite(cold.layers).all()


# --------------------------------------------------------------------------------------------
# the widget layer
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def widgets():
    pytest.importorskip("ipywidgets")
    from attnopt import widgets

    return widgets


def test_widget_layer_bad_arguments_are_named(widgets):
    fig = Figure()
    preference = explore.preference_view(T, U, Z, 1.0)
    cases = [
        (lambda: widgets.Explorer([], lambda: None, lambda r, f: None), TypeError, "controls"),
        (lambda: widgets.Explorer({}, 3, lambda r, f: None), TypeError, "compute"),
        (lambda: widgets.Explorer({}, lambda: None, None), TypeError, "draw"),
        (lambda: widgets.preference_explorer(T, Z, alpha=100.0), ValueError, "alpha"),
        (lambda: widgets.preference_explorer(T, Z, favoured=3), ValueError, "favoured"),
        (lambda: widgets.preference_explorer(T, Z, mass=1.0), ValueError, "mass"),
        (lambda: widgets.preference_explorer(T[:, :1], Z), ValueError, "templates"),
        (lambda: widgets.preference_explorer(T, Z[:1]), ValueError, "z"),
        (lambda: widgets.flow_explorer(X, temperature=0.0), ValueError, "temperature"),
        (lambda: widgets.flow_explorer(X, layer=13), ValueError, "layer"),
        (lambda: widgets.flow_explorer(X, depth=0), ValueError, "depth"),
        (lambda: widgets.flow_explorer(torch.zeros(3, 3, dtype=F64)), ValueError, "x"),
        (lambda: widgets.flow_explorer(X, variant="residual"), ValueError, "variant"),
        (lambda: widgets.regularizer_explorer(S.expand(2, 4)), ValueError, "scores"),
        (lambda: widgets.regularizer_explorer(S, tau=100.0), ValueError, "tau"),
        (lambda: widgets.regularizer_explorer(S, regularizer="softplus"), ValueError, "regularizer"),
        (lambda: widgets.regularizer_explorer(S, alpha=5.0), ValueError, "alpha"),
        (lambda: widgets.regularizer_explorer(S, alibi_slope=2.0), ValueError, "alibi_slope"),
        (lambda: widgets.density_explorer(IMAGE[0]), ValueError, "image"),
        (lambda: widgets.density_explorer(IMAGE, row=1.5), ValueError, "row"),
        (lambda: widgets.density_explorer(IMAGE, sigma_column=0.0), ValueError, "sigma_column"),
        (lambda: widgets.density_explorer(IMAGE, correlation=1.0), ValueError, "correlation"),
        (lambda: widgets.density_explorer(IMAGE, family="box"), ValueError, "family"),
        (lambda: widgets.four_views_explorer(Q, K), ValueError, "queries"),
        (lambda: widgets.four_views_explorer(Q[None], K[:1]), ValueError, "keys"),
        (lambda: widgets.four_views_explorer(Q[None], K, query=1), ValueError, "query"),
        (lambda: widgets.four_views_explorer(Q[None], K, absent=9), ValueError, "absent"),
        (lambda: widgets.four_views_explorer(Q[None], K, tau=0.01), ValueError, "tau"),
        (lambda: widgets.draw_preference(preference, "figure"), TypeError, "fig"),
        (lambda: widgets.draw_preference(explore.particle_flow(X, 1.0, 1), fig), TypeError, "view"),
        (lambda: widgets.draw_preference(explore.preference_view(T.expand(2, 3, 2), U, Z, 1.0), fig), ValueError, "view"),
        (lambda: widgets.draw_flow(explore.particle_flow(X, 1.0, 2), fig, 3), ValueError, "layer"),
        (lambda: widgets.draw_flow(explore.particle_flow(X, 1.0, 2), fig, 1.0), TypeError, "layer"),
        (lambda: widgets.draw_flow(preference, fig, 0), TypeError, "view"),
        (lambda: widgets.draw_regularizer(explore.regularized_weights(S, 1.0), fig, tau=0.0), ValueError, "tau"),
        (lambda: widgets.draw_regularizer(explore.regularized_weights(S.expand(2, 4), 1.0), fig), ValueError, "view"),
        (lambda: widgets.draw_density(preference, fig), TypeError, "view"),
        (lambda: widgets.draw_density(explore.density_view(VALUES, MU.expand(2, 2), V), fig), ValueError, "view"),
        (lambda: widgets.draw_four_views(explore.four_views(Q.expand(2, 4), K, 1.0), fig), ValueError, "view"),
        (lambda: widgets.draw_four_views(None, fig), TypeError, "view"),
        (lambda: widgets.progress(range(3), total=-1), ValueError, "total"),
        (lambda: widgets.progress(range(3), total=2.5), TypeError, "total"),
        (lambda: widgets.progress(range(3), desc=3), TypeError, "desc"),
    ]
    for call, error, word in cases:
        with pytest.raises(error, match=word):
            call()


def test_an_explorer_set_names_unknown_controls(widgets):
    explorer = widgets.regularizer_explorer(S)
    with pytest.raises(ValueError, match="temperature"):
        explorer.set(temperature=1.0)
    assert explorer.values["tau"] == 1.0  # nothing moved
