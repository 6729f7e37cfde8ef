r"""The explorers' widgets: sliders over :mod:`attnopt.course.explore`, and the pictures they redraw.

An :class:`Explorer` joins three things: the controls (``ipywidgets`` sliders and menus), a
function of the controls' values that returns one of the named tuples of :mod:`attnopt.course.explore`,
and a ``draw_*`` function that draws that tuple on a Matplotlib figure.  Moving a control
recomputes and redraws: the figure is rendered to PNG and shown in an ``ipywidgets.Image``, with a
line of numbers under it, so an explorer works wherever ipywidgets does (JupyterLab, Jupyter
Notebook, Colab) and needs no interactive Matplotlib backend.

The ``draw_*`` functions are the same ones a notebook calls to show an explorer's default state as
a static figure (the book cannot run Python), so the book and the live explorer draw the same
picture.  ``ipywidgets`` is imported only when an explorer is built: importing this module, and
drawing, need only Matplotlib.

Example (in a notebook; the last line shows the explorer)::

    from attnopt.widgets import regularizer_explorer
    scores = torch.randn(12, dtype=torch.float64)
    explorer = regularizer_explorer(scores)
    explorer.set(regularizer="sparsemax", tau=0.3)  # as a slider would
    explorer
"""

from __future__ import annotations

import io
import math
import os
from typing import Callable

import matplotlib as mpl
import numpy as np
import torch
from matplotlib.figure import Figure

from . import explore
from .._optional import require
from .._validation import check_choice, check_int, check_number
from ._widgets_checks import check_view, tensor_arg
from ._widgets_controls import dropdown, int_slider, log_slider, slider
from ._widgets_drawing import convex_hull, to_numpy
from .plotting import _STYLE, PALETTE

__all__ = [
    "Explorer",
    "density_explorer",
    "draw_density",
    "draw_flow",
    "draw_four_views",
    "draw_preference",
    "draw_regularizer",
    "flow_explorer",
    "four_views_explorer",
    "preference_explorer",
    "progress",
    "regularizer_explorer",
]

#: The environment variable that silences :func:`progress` (tqdm's own; the book's runner sets it).
PROGRESS_ENV = "TQDM_DISABLE"
#: Size of an explorer's figure, in inches (the book's column).
FIGSIZE = (6.5, 3.2)
_DPI = 110


# --------------------------------------------------------------------------------------------
# Progress bars for long loops
# --------------------------------------------------------------------------------------------


def progress(iterable=None, *, total: int | None = None, desc: str | None = None):
    """A progress bar over ``iterable`` for a loop that runs more than a few seconds.

    ``tqdm.auto``'s bar: a widget in JupyterLab and Colab, a line of text in a terminal.  It is
    silent when the environment variable ``TQDM_DISABLE`` holds a true value (``1``, ``true``,
    ``yes``): the book's runner, ``tools/run_notebooks.py``, sets it, so that the rendered pages
    show no bar (tqdm's notebook bar ignores that variable by itself, hence this function).

    Args:
        iterable: what to loop over (``None`` for a bar updated by hand with ``update``).
        total: the number of steps, when ``iterable`` has no length.
        desc: a short label shown before the bar.

    Returns:
        A ``tqdm`` object: iterate over it as over ``iterable``.

    Raises:
        TypeError: ``total`` not an int, ``desc`` not a string.
        ValueError: ``total < 0``.
        ImportError: ``tqdm`` is not installed (``pip install "attnopt[notebook]"``).

    Example:
        >>> # the bar itself goes to stderr
        >>> [k * k for k in progress(range(4), desc="squares")]
        [0, 1, 4, 9]
    """
    if total is not None:
        total = check_int(total, "total", minimum=0)
    if desc is not None and not isinstance(desc, str):
        raise TypeError(f"desc must be a string; got {type(desc).__name__}")
    tqdm = require("tqdm.auto", "attnopt.widgets.progress").tqdm

    silent = os.environ.get(PROGRESS_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return tqdm(iterable, total=total, desc=desc, disable=silent)


# --------------------------------------------------------------------------------------------
# The explorer: controls -> compute -> draw
# --------------------------------------------------------------------------------------------


class Explorer:
    r"""Controls, a computation and a picture, wired so that moving a control redraws.

    Args:
        controls: a dict from the names of ``compute``'s keyword arguments to ``ipywidgets``
            controls (anything with a ``value`` trait).
        compute: ``compute(**values)`` returns what ``draw`` draws.
        draw: ``draw(result, fig, **values)`` draws on an empty Matplotlib figure.
        describe: ``describe(result, **values)`` returns a line of HTML under the figure.
        figsize: the figure's size in inches.

    Attributes:
        controls: the controls, by name.
        result: what ``compute`` returned for the current values.
        figure: the figure drawn for them (a :class:`matplotlib.figure.Figure`).
        image: the ``ipywidgets.Image`` that shows it (PNG bytes in ``image.value``).
        readout: the ``ipywidgets.HTML`` line under it.
        widget: the whole explorer, an ``ipywidgets.VBox``.

    Raises:
        TypeError: ``controls`` not a dict of controls, or ``compute``, ``draw`` or ``describe``
            not callable.
        ImportError: ``ipywidgets`` is not installed (``pip install "attnopt[notebook]"``).
    """

    def __init__(self, controls: dict, compute: Callable, draw: Callable, *, describe: Callable | None = None,
                 figsize: tuple[float, float] = FIGSIZE):
        widgets = require("ipywidgets", "attnopt.widgets.Explorer")

        if not isinstance(controls, dict) or not all(hasattr(c, "observe") and hasattr(c, "value") for c in controls.values()):
            raise TypeError("controls must be a dict from argument names to ipywidgets controls")
        for name, fn in (("compute", compute), ("draw", draw), ("describe", describe)):
            if not callable(fn) and (fn is not None or name != "describe"):
                raise TypeError(f"{name} must be callable; got {type(fn).__name__}")
        self.controls = dict(controls)
        self._compute, self._draw, self._describe = compute, draw, describe
        self._figsize = figsize
        self.result = self.figure = None
        self.image = widgets.Image(format="png", layout=widgets.Layout(width="100%", max_width=f"{figsize[0] * _DPI:.0f}px"))
        self.readout = widgets.HTML()
        boxes = [widgets.HBox(list(self.controls.values())[i:i + 2]) for i in range(0, len(self.controls), 2)]
        self.widget = widgets.VBox([*boxes, self.image, self.readout])
        self._holding = False
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self.update()

    @property
    def values(self) -> dict:
        """The controls' current values, by name."""
        return {name: control.value for name, control in self.controls.items()}

    def set(self, **values) -> "Explorer":
        """Move several controls at once (one redraw), as a reader would; returns the explorer.

        Raises:
            ValueError: a name that is not one of the controls.
        """
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"no control named {sorted(unknown)}; the controls are {sorted(self.controls)}")
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        self.update()
        return self

    def _changed(self, _change) -> None:
        if not self._holding:
            self.update()

    def update(self) -> None:
        """Recompute for the current values and redraw."""
        values = self.values
        self.result = self._compute(**values)
        with mpl.rc_context(_STYLE):
            fig = Figure(figsize=self._figsize, layout="constrained")
            self._draw(self.result, fig, **values)
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=_DPI)
        self.figure = fig
        self.image.value = buffer.getvalue()
        self.readout.value = self._describe(self.result, **values) if self._describe else ""

    def _repr_mimebundle_(self, **kwargs):  # the explorer shows as its widget in a notebook
        return self.widget._repr_mimebundle_(**kwargs)


# --------------------------------------------------------------------------------------------
# Chapter 1: alpha and the preference
# --------------------------------------------------------------------------------------------


def draw_preference(view: explore.PreferenceView, fig: Figure) -> None:
    r"""Draw a :class:`~attnopt.course.explore.PreferenceView` of templates in the plane on ``fig``.

    Left: the templates (area proportional to :math:`u_i`) and their convex hull, the evidence
    :math:`z` as an arrow from :math:`\mu` to :math:`b`, the exact estimate :math:`\hat h` and
    generalized attention :math:`\hat h_\alpha`.  Right: :math:`\lVert\hat h-\hat h_\alpha\rVert`
    against :math:`\alpha`, with the current :math:`\alpha` marked.

    Args:
        view: from :func:`attnopt.course.explore.preference_view`, unbatched, with ``d = 2``.
        fig: an empty figure.

    Raises:
        TypeError: ``view`` not a ``PreferenceView``, ``fig`` not a Figure.
        ValueError: a batched view, or templates not in the plane.
    """
    check_view(view, explore.PreferenceView, fig, "templates", 2,
               "one set of templates in the plane, shape (n, 2)", plane=True)
    T, u = to_numpy(view.templates), to_numpy(view.u)
    mu, b, exact, closed = (to_numpy(x) for x in (view.mu, view.b, view.exact, view.closed_form))
    left, right = fig.subplots(1, 2, width_ratios=[1.15, 1])
    hull = convex_hull(T)
    left.fill(hull[:, 0], hull[:, 1], color="#eeeeee", zorder=0)
    left.scatter(T[:, 0], T[:, 1], s=30 + 500 * u, color=PALETTE["orange"], zorder=3, label="templates $t_i$")
    left.annotate("", xy=b, xytext=mu, arrowprops=dict(arrowstyle="-|>", color=PALETTE["blue"], lw=1.6))
    left.plot(*mu, "o", color=PALETTE["blue"], ms=5, label=r"$\mu$; arrow $z$")
    left.plot(*b, "D", color=PALETTE["blue"], ms=5, label=r"$b=\mu+z$")
    left.plot(*exact, "s", color=PALETTE["vermillion"], ms=10, mfc="none", mew=2, zorder=5, label=r"exact $\hat h$")
    left.plot(*closed, "s", color=PALETTE["purple"], ms=5, zorder=6, label=r"closed form $\hat h_\alpha$")
    left.set_aspect("equal", adjustable="datalim")
    left.set_title(rf"$\alpha={view.alpha:.3g}$")
    left.legend(loc="upper left", bbox_to_anchor=(0.0, -0.02), ncols=2, handlelength=1.0, columnspacing=0.8)
    left.set_axis_off()
    grid, curve = to_numpy(view.alpha_grid), to_numpy(view.error_curve)
    right.loglog(grid, curve, "-", color=PALETTE["vermillion"], lw=1.8)
    right.loglog([view.alpha], [float(view.error)], "o", color="black", ms=6)
    right.set_xlabel(r"reliability $\alpha$")
    right.set_title(r"error $\|\hat h-\hat h_\alpha\|$")


def _preference(n: int, favoured: int, mass: float, like: torch.Tensor) -> torch.Tensor:
    u = torch.full((n,), (1.0 - mass) / (n - 1), dtype=like.dtype, device=like.device)
    u[favoured] = mass
    return u


def preference_explorer(templates, z, *, alpha: float = 1.0, favoured: int = 0, mass: float | None = None) -> Explorer:
    r"""Chapter 1's explorer: move :math:`\alpha` and the preference, watch :math:`\hat h` against (18).

    The preference puts ``mass`` on the ``favoured`` template and shares the rest equally; the
    picture is :func:`draw_preference` of :func:`attnopt.course.explore.preference_view`.

    Args:
        templates: ``(n, 2)``, ``n >= 2``, finite.
        z: the evidence, ``(2,)``.
        alpha: the initial reliability, in :math:`[10^{-2}, 10]`.
        favoured: the index of the favoured template.
        mass: its preference weight in :math:`[0.05, 0.95]` (default :math:`1/n`: uniform).

    Returns:
        An :class:`Explorer` with controls ``alpha``, ``favoured`` and ``mass``.

    Raises:
        TypeError, ValueError: as :func:`attnopt.course.explore.preference_view`, and for an initial
            value outside its control's range.
    """
    T = tensor_arg(templates, "templates", "(n, 2) with n >= 2", min_rows=2, columns=2)
    n = T.shape[0]
    favoured = check_int(favoured, "favoured", minimum=0, maximum=n - 1)
    mass = check_number(1.0 / n if mass is None else mass, "mass", low=0.05, high=0.95)
    controls = {
        "alpha": log_slider(alpha, "alpha", 1e-2, 10.0, "reliability α"),
        "favoured": dropdown([(f"t{i + 1}", i) for i in range(n)], favoured, "favoured template"),
        "mass": slider(mass, "mass", 0.05, 0.95, 0.01, "its preference"),
    }

    def compute(alpha, favoured, mass):
        return explore.preference_view(T, _preference(n, favoured, mass, T), z, alpha)

    def draw(view, fig, **_):
        draw_preference(view, fig)

    def describe(view, **_):
        return (f"error ‖ĥ − ĥ<sub>α</sub>‖ = {float(view.error):.3g}, "
                f"shift ‖ĥ − μ‖ = {float(view.shift):.3g}, ratio {float(view.error / view.shift):.3g}")

    return Explorer(controls, compute, draw, describe=describe)


# --------------------------------------------------------------------------------------------
# Chapter 2: temperature and depth
# --------------------------------------------------------------------------------------------


def draw_flow(view: explore.FlowView, fig: Figure, layer: int) -> None:
    r"""Draw a :class:`~attnopt.course.explore.FlowView` of particles in the plane at one layer on ``fig``.

    Left: the particles at ``layer`` (blue) over the initial cloud (grey).  Right: the cloud's
    diameter layer after layer, with ``layer`` marked.

    Args:
        view: from :func:`attnopt.course.explore.particle_flow`, unbatched, with ``d = 2``.
        fig: an empty figure.
        layer: the layer to show, ``0 <= layer <= depth``.

    Raises:
        TypeError: ``view`` not a ``FlowView``, ``fig`` not a Figure, ``layer`` not an int.
        ValueError: a batched view, particles not in the plane, ``layer`` out of range.
    """
    check_view(view, explore.FlowView, fig, "layers", 3,
               "one cloud in the plane, layers of shape (L + 1, N, 2)", plane=True)
    depth = view.layers.shape[0] - 1
    layer = check_int(layer, "layer", minimum=0, maximum=depth)
    xs = to_numpy(view.layers)
    left, right = fig.subplots(1, 2)
    lim = 1.1 * np.abs(xs[0]).max()
    left.scatter(xs[0][:, 0], xs[0][:, 1], s=10, color="#bbbbbb", label="layer 0")
    left.scatter(xs[layer][:, 0], xs[layer][:, 1], s=18, color=PALETTE["blue"], label=f"layer {layer}")
    left.set(xlim=(-lim, lim), ylim=(-lim, lim), xticks=[], yticks=[], aspect="equal")
    left.set_title(f"layer {layer}: {int(view.clusters[layer])} cluster(s)")
    # relative to the initial diameter, floored at 1e-12 (round-off of a collapsed cloud)
    relative = np.maximum(to_numpy(view.diameters) / float(view.diameters[0]), 1e-12)
    right.semilogy(range(depth + 1), relative, "o-", ms=3, color=PALETTE["blue"])
    right.semilogy([layer], [relative[layer]], "o", color="black", ms=7)
    right.set(xlabel="layer $h$", ylim=(3e-13, 3.0))
    right.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    right.set_title("diameter / initial diameter")


def flow_explorer(x, *, temperature: float = 1.0, layer: int = 3, variant: str = "attention", depth: int = 12) -> Explorer:
    r"""Chapter 2's explorer: move the temperature and the depth, watch the particle cloud contract.

    The flow is :func:`attnopt.course.explore.particle_flow` up to ``depth`` layers, computed once per
    temperature and variant; the layer slider only picks the layer drawn by :func:`draw_flow`.

    Args:
        x: the initial particles, ``(N, 2)``.
        temperature: the initial temperature, in :math:`[0.05, 20]`.
        layer: the initial layer shown, ``0 <= layer <= depth``.
        variant: ``"attention"`` or ``"sphere"`` (residual, projected on the unit circle).
        depth: the number of layers computed, ``1 <= depth <= 64``.

    Returns:
        An :class:`Explorer` with controls ``temperature``, ``layer`` and ``variant``.

    Raises:
        TypeError, ValueError: as :func:`attnopt.course.explore.particle_flow`, for particles not in the
            plane, and for an initial value outside its control's range.
    """
    x = tensor_arg(x, "x", "(N, 2) (particles in the plane)", columns=2)
    depth = check_int(depth, "depth", minimum=1, maximum=64)
    layer = check_int(layer, "layer", minimum=0, maximum=depth)
    variant = check_choice(variant, "variant", ("attention", "sphere"))
    controls = {
        "temperature": log_slider(temperature, "temperature", 0.05, 20.0, "temperature τ"),
        "layer": int_slider(layer, depth, "layer"),
        "variant": dropdown([("attention only", "attention"), ("residual, on the circle", "sphere")], variant,
                            "variant"),
    }
    flows = {}  # one flow per (temperature, variant): moving the layer slider recomputes nothing

    def compute(temperature, layer, variant):
        key = (temperature, variant)
        if key not in flows:
            flows.clear()
            flows[key] = explore.particle_flow(x, temperature, depth, variant=variant)
        return flows[key]

    def draw(view, fig, layer, **_):
        draw_flow(view, fig, layer)

    def describe(view, layer, **_):
        ratio = float(view.diameters[layer] / view.diameters[0])
        return f"layer {layer}: diameter {ratio:.3g} × the initial one, {int(view.clusters[layer])} cluster(s)"

    return Explorer(controls, compute, draw, describe=describe)


# --------------------------------------------------------------------------------------------
# Chapter 3: the regularizer, tau and ALiBi
# --------------------------------------------------------------------------------------------

_REGULARIZER_LABELS = {"softmax": "softmax", "sparsemax": "sparsemax", "entmax": "α-entmax"}


def draw_regularizer(view: explore.RegularizerView, fig: Figure, *, tau: float | None = None) -> None:
    r"""Draw a :class:`~attnopt.course.explore.RegularizerView` of one query on ``fig``.

    Left: the weights over the key positions (crosses at weight exactly zero) and, when ALiBi is
    on, its bias.  Right: the support size against :math:`\tau`, with ``tau`` marked.

    Args:
        view: from :func:`attnopt.course.explore.regularized_weights`, unbatched.
        fig: an empty figure.
        tau: the strength to mark on the support curve (``None``: no mark).

    Raises:
        TypeError: ``view`` not a ``RegularizerView``, ``fig`` not a Figure, ``tau`` not a number.
        ValueError: a batched view (its ``weights`` not of shape ``(n,)``), ``tau`` not > 0.
    """
    check_view(view, explore.RegularizerView, fig, "weights", 1, "one query's weights, shape (n,)")
    if tau is not None:
        tau = check_number(tau, "tau", low=0.0, low_open=True)
    p, bias = to_numpy(view.weights), to_numpy(view.bias)
    n = len(p)
    keys = np.arange(n)
    left, right = fig.subplots(1, 2, width_ratios=[1.3, 1])
    left.bar(keys, p, color=PALETTE["blue"], label="weight $p_j$")
    zero = keys[p == 0]
    left.plot(zero, np.zeros(len(zero)), "x", color="0.25", ms=7, mew=1.5, label="weight 0")
    # the top fifth of the panel is kept for the legend: no bar (a weight is at most 1) reaches it
    left.set(xlabel="key position $j$ (query at the last)", ylim=(0, 1.32), yticks=[0, 0.25, 0.5, 0.75, 1])
    left.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    left.set_title(f"{int(view.support_size)} of {n} keys kept")
    if np.any(bias != 0):
        twin = left.twinx()
        twin.plot(keys, bias, "--", color=PALETTE["vermillion"], lw=1.5)
        twin.set_ylabel("ALiBi bias $b_j$", color=PALETTE["vermillion"])
        twin.spines["right"].set_visible(True)
    left.legend(loc="upper left", handlelength=1.0, ncols=2, columnspacing=0.8)
    grid, curve = to_numpy(view.tau_grid), to_numpy(view.support_curve)
    right.semilogx(grid, curve, "-", color=PALETTE["blue"], lw=1.8, drawstyle="steps-mid")
    if tau is not None:
        right.semilogx([tau], [int(view.support_size)], "o", color="black", ms=6)
    right.set(xlabel=r"strength $\tau$", ylim=(0, n + 0.5))
    right.set_title("keys with weight > 0")


def regularizer_explorer(scores, *, tau: float = 1.0, regularizer: str = "entmax", alpha: float = 1.5,
                         alibi_slope: float = 0.0) -> Explorer:
    r"""Chapter 3's explorer: move :math:`\tau`, the regularizer and ALiBi, watch weights and support.

    Args:
        scores: one query's scores over ``n`` keys, ``(n,)``; the query is at the last position.
        tau: the initial strength, in :math:`[10^{-1.5}, 10]`.
        regularizer: ``"softmax"``, ``"sparsemax"`` or ``"entmax"``.
        alpha: the initial order of :math:`\alpha`-entmax, in :math:`[1, 3]`.
        alibi_slope: the initial ALiBi slope, in :math:`[0, 1]`.

    Returns:
        An :class:`Explorer` with controls ``tau``, ``regularizer``, ``alpha`` and ``alibi_slope``.

    Raises:
        TypeError, ValueError: as :func:`attnopt.course.explore.regularized_weights`, for scores that are
            not one query's, and for an initial value outside its control's range.
    """
    s = tensor_arg(scores, "scores", "(n,) (one query's scores)", ndim=1)
    regularizer = check_choice(regularizer, "regularizer", explore.REGULARIZERS)
    controls = {
        "tau": log_slider(tau, "tau", 10**-1.5, 10.0, "strength τ"),
        "regularizer": dropdown([(v, k) for k, v in _REGULARIZER_LABELS.items()], regularizer, "regularizer"),
        "alpha": slider(alpha, "alpha", 1.0, 3.0, 0.05, "entmax α"),
        "alibi_slope": slider(alibi_slope, "alibi_slope", 0.0, 1.0, 0.05, "ALiBi slope m"),
    }

    def sync_alpha(change=None):
        controls["alpha"].disabled = controls["regularizer"].value != "entmax"

    controls["regularizer"].observe(sync_alpha, names="value")
    sync_alpha()

    def compute(tau, regularizer, alpha, alibi_slope):
        return explore.regularized_weights(s, tau, regularizer, alpha=alpha, alibi_slope=alibi_slope)

    def draw(view, fig, tau, **_):
        draw_regularizer(view, fig, tau=tau)

    def describe(view, **_):
        p = view.weights
        return f"{int(view.support_size)} of {len(p)} keys kept; largest weight {float(p.max()):.3f} on key {int(p.argmax())}"

    return Explorer(controls, compute, draw, describe=describe)


# --------------------------------------------------------------------------------------------
# Chapter 4: a density over an image
# --------------------------------------------------------------------------------------------

_FAMILY_LABELS = {"gaussian": "Gaussian (continuous softmax)", "truncated_paraboloid": "truncated paraboloid (sparsemax)"}


def _covariance(sigma_row: float, sigma_column: float, correlation: float, like: torch.Tensor) -> torch.Tensor:
    off = correlation * sigma_row * sigma_column
    return torch.tensor([[sigma_row**2, off], [off, sigma_column**2]], dtype=like.dtype, device=like.device)


def draw_density(view: explore.DensityView, fig: Figure) -> None:
    r"""Draw a :class:`~attnopt.course.explore.DensityView` over its image on ``fig``.

    Left: the image, the density's contours and the boundary of its support (for a truncated
    paraboloid).  Right: the context vector :math:`c=B\,\mathbb E_p[\psi]` channel by channel
    (bars) against the pixel rule (diamonds), and the colour it stands for when the image has
    three channels.

    Args:
        view: from :func:`attnopt.course.explore.density_view`, unbatched.
        fig: an empty figure.

    Raises:
        TypeError: ``view`` not a ``DensityView``, ``fig`` not a Figure.
        ValueError: a batched view (its ``density`` not of shape ``(H, W)``).
    """
    check_view(view, explore.DensityView, fig, "density", 2, "one density, shape (H, W)")
    image, density = to_numpy(view.image), to_numpy(view.density)
    channels = image.shape[0]
    left, right = fig.subplots(1, 2, width_ratios=[1.1, 1])
    shown = np.clip(image.transpose(1, 2, 0), 0, 1) if channels == 3 else image.mean(0)
    extent = (0, 1, 1, 0)  # columns left to right, rows downwards, as the image is stored
    left.imshow(shown, extent=extent, cmap=None if channels == 3 else "gray")
    height, width = density.shape
    rows, cols = (np.arange(height) + 0.5) / height, (np.arange(width) + 0.5) / width
    top = density.max()
    if top > 0:
        levels = top * np.array([0.1, 0.3, 0.5, 0.7, 0.9])
        left.contour(cols, rows, density, levels=levels, colors="white", linewidths=1.0)
    if not view.support.all() and view.support.any():
        left.contour(cols, rows, to_numpy(view.support).astype(float), levels=[0.5], colors=PALETTE["orange"],
                     linewidths=2.0)
    left.set(xticks=[], yticks=[])
    left.set_title(f"density: {100 * float(view.support.float().mean()):.0f}% of pixels")
    context, pixels = to_numpy(view.context), to_numpy(view.pixel_context)
    names = ["R", "G", "B"] if channels == 3 else [f"{i + 1}" for i in range(channels)]
    colours = [PALETTE["vermillion"], PALETTE["green"], PALETTE["blue"]] if channels == 3 else [PALETTE["blue"]] * channels
    x = np.arange(channels)
    right.bar(x, context, color=colours, alpha=0.8, label=r"$c=B\,\mathbb{E}_p[\psi]$")
    right.plot(x, pixels, "D", color="black", ms=6, label="pixel rule")
    right.set_xticks(x, names)
    # the top third is kept for the legend and the colour swatch: no bar or marker reaches it
    right.set_ylim(0, 1.5 * max(1.0, float(np.max(np.r_[context, pixels]))))
    right.legend(loc="upper right")
    right.set_title("context vector")
    if channels == 3:
        swatch = right.inset_axes([0.04, 0.78, 0.16, 0.18])
        swatch.imshow(np.clip(context, 0, 1)[None, None, :])
        swatch.set(xticks=[], yticks=[])


def density_explorer(image, *, row: float = 0.5, column: float = 0.5, sigma_row: float = 0.15,
                     sigma_column: float = 0.15, correlation: float = 0.0, family: str = "gaussian",
                     n_per_axis: int = 14) -> Explorer:
    r"""Chapter 4's explorer: move :math:`\mu`, :math:`\Sigma` and the family over an image.

    :math:`\mu` is (``row``, ``column``) in the unit square and the covariance
    :math:`V=\begin{pmatrix}\sigma_r^2&\rho\sigma_r\sigma_c\\\rho\sigma_r\sigma_c&\sigma_c^2\end{pmatrix}`
    (the same spread for both families);
    the image's value function is fitted once (:func:`attnopt.course.explore.image_value_function`), the
    picture is :func:`draw_density` of :func:`attnopt.course.explore.density_view`.

    Args:
        image: ``(C, H, W)``.
        row, column: the initial location, in :math:`[0, 1]`.
        sigma_row, sigma_column: the initial standard deviations, in :math:`[0.03, 0.5]`.
        correlation: the initial :math:`\rho`, in :math:`[-0.9, 0.9]`.
        family: ``"gaussian"`` or ``"truncated_paraboloid"``.
        n_per_axis: RBF centres per axis of the value function.

    Returns:
        An :class:`Explorer` with controls ``row``, ``column``, ``sigma_row``, ``sigma_column``,
        ``correlation`` and ``family``.

    Raises:
        TypeError, ValueError: as :func:`attnopt.course.explore.image_value_function`, and for an initial
            value outside its control's range.
    """
    values = explore.image_value_function(image, n_per_axis)
    family = check_choice(family, "family", tuple(_FAMILY_LABELS))
    controls = {
        "row": slider(row, "row", 0.0, 1.0, 0.01, "μ row"),
        "column": slider(column, "column", 0.0, 1.0, 0.01, "μ column"),
        "sigma_row": slider(sigma_row, "sigma_row", 0.03, 0.5, 0.01, "σ row"),
        "sigma_column": slider(sigma_column, "sigma_column", 0.03, 0.5, 0.01, "σ column"),
        "correlation": slider(correlation, "correlation", -0.9, 0.9, 0.05, "correlation ρ"),
        "family": dropdown([(v, k) for k, v in _FAMILY_LABELS.items()], family, "family"),
    }
    like = values.image

    def compute(row, column, sigma_row, sigma_column, correlation, family):
        mu = torch.tensor([row, column], dtype=like.dtype, device=like.device)
        return explore.density_view(values, mu, _covariance(sigma_row, sigma_column, correlation, like), family)

    def draw(view, fig, **_):
        draw_density(view, fig)

    def describe(view, **_):
        c = ", ".join(f"{v:.2f}" for v in view.context.tolist())
        return (f"context vector ({c}); mass on the image {float(view.mass):.2f}; "
                f"support {100 * float(view.support.float().mean()):.0f}% of the pixels")

    return Explorer(controls, compute, draw, describe=describe)


# --------------------------------------------------------------------------------------------
# Chapter 5: four views of one query
# --------------------------------------------------------------------------------------------

_VIEW_STYLE = (
    ("Fenchel dual (ch. 1)", "fenchel", "o", PALETTE["vermillion"]),
    ("Markov kernel (ch. 2)", "kernel", "s", PALETTE["green"]),
    ("transport (ch. 3)", "transport", "^", PALETTE["purple"]),
)


def draw_four_views(view: explore.FourViews, fig: Figure) -> None:
    r"""Draw a :class:`~attnopt.course.explore.FourViews` of one query on ``fig``.

    The SDPA weights as bars, the weights of the three discrete views as markers on them, and the
    moment-matched Gaussian of the continuous view (chapter 4) as a curve, per unit of key index,
    on a y axis fixed at [0, 1.1] (a narrow Gaussian's peak is cut off rather than rescaling it).

    Args:
        view: from :func:`attnopt.course.explore.four_views`, unbatched.
        fig: an empty figure.

    Raises:
        TypeError: ``view`` not a ``FourViews``, ``fig`` not a Figure.
        ValueError: a batched view (its ``sdpa`` not of shape ``(m,)``).
    """
    check_view(view, explore.FourViews, fig, "sdpa", 1, "one query's weights, shape (m,)")
    m = view.sdpa.shape[0]
    keys = np.arange(1, m + 1)
    ax = fig.subplots()
    ax.bar(keys, to_numpy(view.sdpa), color=PALETTE["blue"], alpha=0.3, label="SDPA")
    for shift, (label, field, marker, colour) in zip((-0.22, 0.0, 0.22), _VIEW_STYLE):
        ax.plot(keys + shift, to_numpy(getattr(view, field)), marker, color=colour, ms=6, label=label)
    t = np.linspace(-0.1, 1.1, 300)
    mean, var = float(view.mean), float(view.variance)
    if var > 0:
        density = np.exp(-0.5 * (t - mean) ** 2 / var) / math.sqrt(2 * math.pi * var)
        ax.plot(1 + t * (m - 1), density / (m - 1), color=PALETTE["sky"], lw=2, label="Gaussian (ch. 4)")
    ax.set(xlabel="key $j$", ylabel="weight $p_j$", xticks=keys, xlim=(0.3, m + 0.7))
    # one scale whatever the state (weights are at most 1): a narrow Gaussian's peak is cut at the
    # top rather than rescaling the axis from frame to frame
    ax.set_ylim(0, 1.1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), handlelength=1.2)
    gap = float(view.gaps.max())
    ax.set_title(f"largest difference from SDPA: {gap:.0e}")


def four_views_explorer(queries, keys, *, tau: float = 1.0, query: int = 0, regularizer: str = "entropy",
                        absent: int | None = None) -> Explorer:
    r"""Chapter 5's explorer: one query, four views; change one view's problem and watch it part.

    Args:
        queries: ``(n_q, d)``; the explorer shows one of them at a time.
        keys: ``(m, d)``.
        tau: the initial temperature, in :math:`[0.1, 10]`.
        query: the initial query's index.
        regularizer: the transport view's ``"entropy"``, ``"sparsemax"`` or ``"tsallis"``.
        absent: the index of a key absent from the preference (chapters 1 and 2), or ``None``.

    Returns:
        An :class:`Explorer` with controls ``tau``, ``query``, ``regularizer`` and ``absent``.

    Raises:
        TypeError, ValueError: as :func:`attnopt.course.explore.four_views`, for ``queries`` or ``keys``
            of the wrong shape, and for an initial value outside its control's range.
    """
    Q = tensor_arg(queries, "queries", "(n_q, d) with n_q >= 1", min_rows=1)
    K = tensor_arg(keys, "keys", "(m, d) with m >= 2", min_rows=2)
    m = K.shape[0]
    query = check_int(query, "query", minimum=0, maximum=Q.shape[0] - 1)
    regularizer = check_choice(regularizer, "regularizer", explore.TRANSPORT_REGULARIZERS)
    if absent is not None:
        absent = check_int(absent, "absent", minimum=0, maximum=m - 1)
    labels = {"entropy": "entropy (softmax)", "sparsemax": "squared norm (sparsemax)", "tsallis": "Tsallis 1.5 (entmax)"}
    controls = {
        "tau": log_slider(tau, "tau", 0.1, 10.0, "temperature τ"),
        "query": int_slider(query, Q.shape[0] - 1, "query"),
        "regularizer": dropdown([(v, k) for k, v in labels.items()], regularizer, "transport regularizer"),
        "absent": dropdown([("none", None)] + [(f"key {j + 1}", j) for j in range(m)], absent,
                           "key absent from u"),
    }

    def compute(tau, query, regularizer, absent):
        return explore.four_views(Q[query], K, tau, regularizer=regularizer, absent=absent)

    def draw(view, fig, **_):
        draw_four_views(view, fig)

    def describe(view, **_):
        gaps = ", ".join(f"{label.split(' (')[0]} {float(g):.1e}" for (label, *_), g in zip(_VIEW_STYLE, view.gaps))
        return f"largest difference from SDPA: {gaps}"

    return Explorer(controls, compute, draw, describe=describe)
