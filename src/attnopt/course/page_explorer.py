r"""An explorer on the book's page: precomputed frames behind native sliders, with no kernel.

The ipywidgets explorers of :mod:`attnopt.course.widgets` need a running Python; the published book has
none.  A *page explorer* computes every state of a small grid of controls when the notebook runs,
draws each with the same ``draw_*`` functions, and ships the pictures with the page: moving a
control swaps the picture, its alt text and the line of numbers beside it.  The page needs no
kernel and no network, only the small script ``page_explorer.js`` the book ships once in its static
files (without it, in print and in the PDF, the page shows the default state as a still).

Three pieces:

* the controls, :class:`Slider` (a numeric grid, shown as ``<input type="range">``) and
  :class:`Choice` (a few options, shown as ``<select>``), each with a ``<label>``;
* a function ``draw(fig, **values) -> Frame`` that draws one state on an empty Matplotlib figure
  and returns its key numbers and alt text (:class:`Frame`);
* :func:`page_explorer`, which draws every state of the product of the controls' grids, encodes
  each picture compactly (WebP, lossless, on a palette of a few dozen colours) and returns a
  :class:`PageExplorer`, shown in a notebook as HTML.

The HTML is a ``<div class="page-explorer">`` holding the default frame as an ``<img>``, the
controls (``hidden`` until the script wires them), an ``<output aria-live="polite">`` with the
controls' values and the key numbers, and the frames, alt texts and numbers as JSON in a
``<script type="application/json">``.  Put the cell's caption in its ``mystnb`` figure metadata:
the book wraps the output in a numbered figure.

Example (in a notebook; the last line shows the explorer)::

    from attnopt.page_explorer import (Choice, Frame, Slider,
                                       page_explorer)
    taus = [10 ** (k / 10) for k in range(-15, 11)]  # 26 values
    controls = [Slider("tau", taus, label="strength τ", default=1.0),
                Choice("regularizer", ["softmax", "sparsemax"],
                       label="regularizer")]

    def draw(fig, tau, regularizer):
        view = explore.regularized_weights(scores, tau, regularizer)
        draw_regularizer(view, fig, tau=tau)
        kept = int(view.support_size)
        return Frame({"keys kept": kept}, f"weights: {kept} keys kept")

    page_explorer(controls, draw, label="Chapter 3's explorer")
"""

from __future__ import annotations

import hashlib
import html
import io
import itertools
import json
import math
import numbers
from typing import Callable, NamedTuple, Sequence

import matplotlib as mpl
import torch
from matplotlib.figure import Figure

from .._validation import check_bool, check_choice, check_int, check_number
from .plotting import _STYLE
from .widgets import FIGSIZE, progress

__all__ = ["Choice", "Frame", "PageExplorer", "Slider", "page_explorer"]

#: The resolution of the frames: 100 dpi draws the book's 6.5-in figure 650 px wide, about the
#: column's width, with the house style's 10-pt text at 14 px.
DPI = 100
#: Colours per frame (a palette keeps a flat chart small and its text sharp).
COLORS = 64
#: The largest HTML a page explorer may weigh, in bytes.  The book's budget is 3 MB transferred
#: per page; the theme, its icons and MathJax take about 1.45 MB of it (gzip-compressed, as a static
#: host serves them), and an explorer's HTML, mostly base64 of WebP, compresses to about 76%.
MAX_BYTES = 1_900_000
_FORMATS = ("webp", "png")
_MIME = {"webp": "image/webp", "png": "image/png"}
_JSON_SCALARS = (str, int, float, bool, type(None))


def _check_name(name, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a string; got {type(name).__name__}")
    if not name.isidentifier():
        raise ValueError(f"{what} must be a Python identifier (a keyword argument of draw); got {name!r}")
    return name


def _check_label(label, what: str) -> str:
    if not isinstance(label, str):
        raise TypeError(f"{what} must be a string; got {type(label).__name__}")
    if not label.strip():
        raise ValueError(f"{what} must be a non-empty string")
    return label


class Slider:
    r"""A numeric control: a slider over a grid of values (``<input type="range">`` on the page).

    The slider moves by one grid point per arrow key; the page shows ``format.format(value)``
    beside it.  A grid of at least 20 values reads as continuous; a log-spaced grid
    (:math:`10^{k/10}`) suits a temperature.

    Args:
        name: the keyword argument of ``draw`` it sets (a Python identifier).
        values: the grid, strictly increasing finite numbers (at least 2).
        label: what the page's ``<label>`` says (e.g. ``"strength τ"``).
        default: the initial value, one of ``values`` (default the first).
        format: how the page writes a value (a ``str.format`` pattern).

    Raises:
        TypeError: ``name``, ``label`` or ``format`` not a string, ``values`` not a sequence of
            numbers.
        ValueError: ``name`` not an identifier, fewer than 2 values, values not finite or not
            strictly increasing, ``default`` not one of them, a ``format`` that cannot write them.

    Example:
        >>> Slider("tau", [0.1, 1.0, 10.0], label="τ", default=1.0).text
        ['0.1', '1', '10']
    """

    kind = "slider"

    def __init__(self, name: str, values: Sequence[float], *, label: str, default: float | None = None,
                 format: str = "{:.3g}"):
        self.name = _check_name(name, "name")
        self.label = _check_label(label, "label")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise TypeError(f"values must be a sequence of numbers; got {type(values).__name__}")
        grid = [check_number(v, f"values[{i}]") for i, v in enumerate(values)]
        if len(grid) < 2:
            raise ValueError(f"values must hold at least 2 numbers (a slider needs a range); got {len(grid)}")
        if any(b <= a for a, b in zip(grid, grid[1:])):
            raise ValueError("values must be strictly increasing")
        self.values = grid
        if not isinstance(format, str):
            raise TypeError(f"format must be a string such as '{{:.3g}}'; got {type(format).__name__}")
        try:
            self.text = [format.format(v) for v in grid]
        except (ValueError, IndexError, KeyError) as err:
            raise ValueError(f"format must write one number, such as '{{:.3g}}'; got {format!r} ({err})") from None
        self.default_index = 0 if default is None else self.position(default, "default")

    def position(self, value, name: str | None = None) -> int:
        """The index of ``value`` on the grid (``ValueError`` naming ``name`` if it is not there)."""
        name = name or self.name
        value = check_number(value, name)
        if value not in self.values:
            raise ValueError(f"{name} must be one of {self.text}; got {value!r}")
        return self.values.index(value)

    def __repr__(self) -> str:
        return f"Slider({self.name!r}, {len(self.values)} values from {self.text[0]} to {self.text[-1]})"


class Choice:
    r"""A discrete control: a few options (a ``<select>`` menu on the page).

    Args:
        name: the keyword argument of ``draw`` it sets (a Python identifier).
        options: the values ``draw`` receives (strings, numbers, bools or ``None``), or pairs
            ``(text, value)`` to show ``text`` for ``value``; at least 2, distinct.
        label: what the page's ``<label>`` says.
        default: the initial value, one of the options' values (default the first).

    Raises:
        TypeError: ``name`` or ``label`` not a string, ``options`` not a sequence, an option's
            value not a string, number, bool or ``None``, or its text not a string.
        ValueError: ``name`` not an identifier, fewer than 2 options, two options with one value,
            ``default`` not one of them.

    Example:
        >>> options = [("softmax (entropy)", "softmax"), "sparsemax"]
        >>> c = Choice("regularizer", options, label="Ω")
        >>> c.values, c.text
        (['softmax', 'sparsemax'], ['softmax (entropy)', 'sparsemax'])
    """

    kind = "choice"

    def __init__(self, name: str, options: Sequence, *, label: str, default=None):
        self.name = _check_name(name, "name")
        self.label = _check_label(label, "label")
        if isinstance(options, (str, bytes)) or not hasattr(options, "__len__"):
            raise TypeError(f"options must be a sequence of values or (text, value) pairs; got {type(options).__name__}")
        values, text = [], []
        for i, option in enumerate(options):
            shown, value = option if isinstance(option, tuple) and len(option) == 2 else (None, option)
            if not isinstance(value, _JSON_SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
                raise TypeError(f"options[{i}] must be a string, a finite number, a bool or None; got {value!r}")
            if shown is None:
                shown = value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)
            text.append(_check_label(shown, f"options[{i}]'s text"))
            values.append(value)
        if len(values) < 2:
            raise ValueError(f"options must hold at least 2 choices; got {len(values)}")
        if len({json.dumps(v) for v in values}) != len(values):
            raise ValueError("options must have distinct values")
        self.values, self.text = values, text
        self.default_index = 0 if default is None else self.position(default, "default")

    def position(self, value, name: str | None = None) -> int:
        """The index of the option whose value is ``value`` (``ValueError`` naming ``name`` if none)."""
        for i, v in enumerate(self.values):
            if type(v) is type(value) and v == value:
                return i
        raise ValueError(f"{name or self.name} must be one of the options' values {self.values}; got {value!r}")

    def __repr__(self) -> str:
        return f"Choice({self.name!r}, {self.text})"


class Frame(NamedTuple):
    """What ``draw`` returns for one state, besides the picture it drew.

    Attributes:
        numbers: the key numbers shown beside the figure, by label (``{"keys kept": 5}``): ints,
            floats (written with the explorer's ``number_format``), strings, or one-element
            tensors.
        alt: the alt text of this state's picture: what it shows, in words.
    """

    numbers: dict
    alt: str


def _number(value, where: str):
    """A number of a :class:`Frame` as a JSON scalar (int, float or str)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{where} must be a number; got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} must be an int, a float or a string; got {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        return int(value)
    return check_number(value, where)


def _check_frame(frame, state: str) -> Frame:
    if not isinstance(frame, tuple) or len(frame) != 2:
        raise TypeError(f"draw must return a Frame(numbers, alt); got {type(frame).__name__} for {state}")
    numbers_, alt = frame
    if not isinstance(numbers_, dict) or not all(isinstance(k, str) for k in numbers_):
        raise TypeError(f"draw's Frame.numbers must be a dict from labels (strings) to numbers, for {state}")
    if not isinstance(alt, str) or len(alt.strip()) < 15:
        raise ValueError(f"draw's Frame.alt must describe the picture in words (15 characters or more), for {state}")
    return Frame({k: _number(v, f"draw's number {k!r} for {state}") for k, v in numbers_.items()}, alt.strip())


def _encode(fig: Figure, dpi: float, colors: int, image_format: str) -> bytes:
    """The figure as compact image bytes: a PNG from Matplotlib, put on a palette, then WebP or PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    image = image.quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    if image_format == "webp":
        image.save(out, format="WEBP", lossless=True, method=6)
    else:
        image.save(out, format="PNG", optimize=True)
    return out.getvalue()


class PageExplorer:
    r"""The frames of a page explorer and its HTML (made by :func:`page_explorer`).

    Attributes:
        controls: the controls, in order (the frames are in the order of their product, the last
            control moving fastest).
        shape: the number of values of each control.
        states: the values of the controls in each frame (a list of dicts).
        frames: what ``draw`` returned for each state (:class:`Frame`, numbers as JSON scalars).
        readouts: the line of text the page shows for each state (values, then numbers).
        images: the encoded pictures, one per state (bytes).
        default: the index of the default state.
        html: the HTML of the explorer; ``nbytes`` its size in bytes (UTF-8).
    """

    def __init__(self, controls, states, frames, readouts, images, default, html_text, image_format):
        self.controls, self.states, self.frames = list(controls), states, frames
        self.readouts, self.images, self.default = readouts, images, default
        self.shape = tuple(len(c.values) for c in self.controls)
        self.html, self.image_format = html_text, image_format
        self.nbytes = len(html_text.encode("utf-8"))

    @property
    def grid(self) -> dict:
        """The values of each control, by name (what a test needs to know the state a page shows)."""
        return {c.name: list(c.values) for c in self.controls}

    def index(self, **values) -> int:
        """The index of the frame for these values of the controls (every control named).

        Raises:
            ValueError: a control not named, a name that is no control, or a value not on its grid.
        """
        names = [c.name for c in self.controls]
        if set(values) != set(names):
            raise ValueError(f"values must name every control {names}; got {sorted(values)}")
        index = 0
        for control in self.controls:
            index = index * len(control.values) + control.position(values[control.name])
        return index

    def show(self) -> None:
        """Display the explorer in a notebook (IPython's ``display``)."""
        from IPython.display import HTML, display

        display(HTML(self.html))

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return (f"PageExplorer({len(self.states)} frames over {', '.join(c.name for c in self.controls)}; "
                f"{self.nbytes / 1e6:.2f} MB)")


def page_explorer(controls: Sequence[Slider | Choice], draw: Callable[..., Frame], *, label: str,
                  figsize: tuple[float, float] = FIGSIZE, dpi: float = DPI, colors: int = COLORS,
                  image_format: str = "webp", number_format: str = "{:.3g}",
                  max_bytes: int = MAX_BYTES, fixed_layout: bool = True,
                  shared_limits: bool = True) -> PageExplorer:
    r"""Draw every state of a grid of controls and make the explorer the book's page can move.

    For each state :math:`(v_1,\dots,v_k)` of the product of the controls' grids, ``draw`` is
    called on an empty figure of size ``figsize`` in the book's style (``draw(fig, **values)``);
    it draws with the library's ``draw_*`` functions and returns a :class:`Frame` of key numbers
    and alt text.  The pictures are saved at ``dpi``, put on a palette of ``colors`` colours and
    encoded as lossless WebP (or PNG); the page swaps them as the reader moves a control, so the
    numbers and pictures on the page are the library's, and nothing is computed in the browser.

    Args:
        controls: one or more :class:`Slider` and :class:`Choice`, with distinct names.
        draw: ``draw(fig, **values) -> Frame``.
        label: what the explorer is, for assistive technology (the group's ``aria-label``).
        figsize: the figure's size in inches (default the explorers' 6.5 x 3.2).
        dpi: the frames' resolution (default 100: 650 px for the book's column).
        colors: colours in each frame's palette, 8 to 256.
        image_format: ``"webp"`` (smaller) or ``"png"``.
        number_format: how floats among the numbers are written (``str.format``).
        max_bytes: the most the HTML may weigh; a finer grid must be coarsened.
        fixed_layout: keep the axes in place as the sliders move: Matplotlib's constrained
            layout is computed once per combination of choices, at the sliders' defaults, and
            the other frames of that combination reuse it (the axes do not jump under the
            reader's eyes, and drawing is about twice as fast).  A frame that draws a different
            number of axes gets its own layout.  ``False``: every frame its own layout.
        shared_limits: every frame of a combination of choices shares its axes' limits, so that
            moving a slider never rescales an axis (it looked like a zoom).  Each state is drawn
            once without rendering to read its limits; axis :math:`k` of every frame is then
            given :math:`[\min_s a_{k,s}, \max_s b_{k,s}]` over the states :math:`s` of its
            combination (kept reversed where the default frame's axis is).  Colourbars keep their
            own, and a state that draws other axes is left as drawn.  ``False``: each frame's own
            limits.

    Returns:
        A :class:`PageExplorer`; a notebook shows it as its HTML.

    Raises:
        TypeError: ``controls`` not a sequence of Slider/Choice, ``draw`` not callable, ``label``
            or ``number_format`` not a string, ``dpi``, ``colors``, ``max_bytes`` or
            ``fixed_layout`` or ``shared_limits`` of the wrong type, or ``draw`` returning something other than a
            :class:`Frame`.
        ValueError: no control, two controls with one name, ``figsize`` not two positive
            numbers, ``dpi`` not in [30, 300], ``colors`` out of range, an unknown
            ``image_format``, or an HTML heavier than ``max_bytes``.

    Example:
        >>> import numpy as np
        >>> def draw(fig, slope, kind):
        ...     x = np.linspace(0, 1, 5)
        ...     fig.subplots().plot(x, slope * x, kind)
        ...     alt = f"a line of slope {slope} drawn with {kind!r}"
        ...     return Frame({"slope": slope}, alt)
        >>> controls = [
        ...     Slider("slope", [0.5, 1.0, 2.0], label="m", default=1.0),
        ...     Choice("kind", ["-", "o"], label="style")]
        >>> explorer = page_explorer(controls, draw, label="a line",
        ...                          figsize=(2, 1.5), dpi=40)
        >>> explorer.shape, explorer.default
        ((3, 2), 2)
        >>> explorer.readouts[explorer.default]
        'm = 1, style: - — slope: 1'
    """
    if isinstance(controls, (Slider, Choice)) or not isinstance(controls, (list, tuple)):
        raise TypeError(f"controls must be a list of Slider and Choice; got {type(controls).__name__}")
    if not controls:
        raise ValueError("controls must hold at least one Slider or Choice")
    for i, control in enumerate(controls):
        if not isinstance(control, (Slider, Choice)):
            raise TypeError(f"controls[{i}] must be a Slider or a Choice; got {type(control).__name__}")
    names = [c.name for c in controls]
    if len(set(names)) != len(names):
        raise ValueError(f"controls must have distinct names; got {names}")
    if not callable(draw):
        raise TypeError(f"draw must be callable, draw(fig, **values) -> Frame; got {type(draw).__name__}")
    label = _check_label(label, "label")
    if not isinstance(figsize, (tuple, list)) or len(figsize) != 2:
        raise ValueError(f"figsize must be (width, height) in inches; got {figsize!r}")
    figsize = (check_number(figsize[0], "figsize", low=0, low_open=True),
               check_number(figsize[1], "figsize", low=0, low_open=True))
    dpi = check_number(dpi, "dpi", low=30, high=300)
    colors = check_int(colors, "colors", minimum=8, maximum=256)
    image_format = check_choice(image_format, "image_format", _FORMATS)
    if not isinstance(number_format, str):
        raise TypeError(f"number_format must be a string such as '{{:.3g}}'; got {type(number_format).__name__}")
    max_bytes = check_int(max_bytes, "max_bytes", minimum=1)
    fixed_layout = check_bool(fixed_layout, "fixed_layout")
    shared_limits = check_bool(shared_limits, "shared_limits")

    shape = [len(c.values) for c in controls]
    states, frames, readouts, images = [], [], [], []
    style = {**_STYLE, "savefig.bbox": "standard"}  # every frame the same size: no tight crop
    limits = _shared_limits(controls, draw, figsize, style) if shared_limits else {}
    layouts: dict[tuple, list] = {}  # per combination of choices: the axes' places at the sliders' defaults
    for indices in progress(_drawing_order(controls), desc="frames"):
        values = {c.name: c.values[i] for c, i in zip(controls, indices)}
        where = ", ".join(f"{k}={v!r}" for k, v in values.items())
        choices = tuple(i for c, i in zip(controls, indices) if c.kind == "choice")
        places = layouts.get(choices) if fixed_layout else None
        with mpl.rc_context(style):
            fig = Figure(figsize=figsize, layout=None if places else "constrained")
            frame = _check_frame(draw(fig, **values), where)
            _apply_limits(fig, limits.get(choices))
            if places and len(places) == len(fig.axes):
                for ax, box in zip(fig.axes, places):
                    ax.set_position(box)
            elif places:  # this state drew other axes: a layout of its own
                fig.set_layout_engine("constrained")
            images.append(_encode(fig, dpi, colors, image_format))
            if not places:
                layouts[choices] = [ax.get_position() for ax in fig.axes]
        states.append(values)
        frames.append(frame)
        readouts.append(_readout(controls, indices, frame, number_format))
    order = sorted(range(len(states)), key=lambda k: _flat(controls, states[k]))
    states, frames, readouts, images = ([seq[k] for k in order] for seq in (states, frames, readouts, images))
    default = 0
    for control in controls:
        default = default * len(control.values) + control.default_index
    html_text = _html(controls, shape, frames, readouts, images, default, label, image_format)
    explorer = PageExplorer(controls, states, frames, readouts, images, default, html_text, image_format)
    if explorer.nbytes > max_bytes:
        raise ValueError(f"the explorer's HTML weighs {explorer.nbytes / 1e6:.2f} MB, over max_bytes = "
                         f"{max_bytes / 1e6:.2f} MB: use fewer values in controls, or a smaller dpi")
    return explorer


def _data_axes(fig) -> list:
    """The figure's axes that hold data: all but colourbars (whose limits follow their mappable)."""
    return [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is None]


def _shared_limits(controls, draw, figsize, style) -> dict[tuple, list]:
    """Per combination of choices: each data axis's (xlim, ylim) spanning every state of the sliders.

    Each state is drawn once on a figure that is never rendered (reading the limits autoscales
    them; nothing is rasterized).  A combination whose states draw different numbers of axes gets
    no shared limits: its axes do not correspond from frame to frame."""
    spans: dict[tuple, list | None] = {}
    for indices in _drawing_order(controls):
        values = {c.name: c.values[i] for c, i in zip(controls, indices)}
        choices = tuple(i for c, i in zip(controls, indices) if c.kind == "choice")
        with mpl.rc_context(style):
            fig = Figure(figsize=figsize)
            draw(fig, **values)
            seen = [(ax.get_xlim(), ax.get_ylim()) for ax in _data_axes(fig)]
        if choices not in spans:  # the first state drawn is at the sliders' defaults
            spans[choices] = seen
            continue
        known = spans[choices]
        if known is None or len(known) != len(seen):
            spans[choices] = None
            continue
        spans[choices] = [(_span(kx, x), _span(ky, y)) for (kx, ky), (x, y) in zip(known, seen)]
    return {k: v for k, v in spans.items() if v is not None}


def _span(known: tuple, new: tuple) -> tuple:
    """The smallest interval holding both, in ``known``'s orientation (a reversed axis stays so)."""
    lo, hi = min(*known, *new), max(*known, *new)
    return (hi, lo) if known[0] > known[1] else (lo, hi)


def _apply_limits(fig, limits) -> None:
    axes = _data_axes(fig)
    if not limits or len(limits) != len(axes):
        return
    for ax, (xlim, ylim) in zip(axes, limits):
        # An axes of fixed aspect that adjusts its data limits (``adjustable="datalim"``) widens one
        # of them to keep the aspect; with autoscaling off matplotlib logs "Ignoring fixed y limits
        # ..." into the page's output for each frame.  Such an axes keeps autoscaling on (its
        # pending autoscale is applied first, by reading the limits), so nothing is logged and the
        # frame is drawn as it would be anyway.
        keeps_aspect = ax.get_aspect() != "auto" and ax.get_adjustable() == "datalim"
        auto = None if keeps_aspect else False
        ax.get_xlim(), ax.get_ylim()
        ax.set_xlim(xlim, auto=auto)
        ax.set_ylim(ylim, auto=auto)


def _drawing_order(controls) -> list[tuple]:
    """Every state's indices, each combination of choices first at the sliders' defaults (the
    state whose layout the others of that combination keep)."""
    grid = list(itertools.product(*(range(len(c.values)) for c in controls)))
    at_defaults = [all(i == c.default_index for c, i in zip(controls, s) if c.kind == "slider") for s in grid]
    return [s for s, first in zip(grid, at_defaults) if first] + [s for s, first in zip(grid, at_defaults) if not first]


def _flat(controls, values: dict) -> int:
    """The index of a state in the product of the grids, the last control moving fastest."""
    index = 0
    for control in controls:
        index = index * len(control.values) + control.position(values[control.name])
    return index


def _format(value, number_format: str) -> str:
    if isinstance(value, float):
        try:
            return number_format.format(value)
        except (ValueError, IndexError, KeyError) as err:
            raise ValueError(f"number_format must write one number, such as '{{:.3g}}'; got {number_format!r}") from err
    return str(value)


def _readout(controls, indices, frame: Frame, number_format: str) -> str:
    """The line the page shows: ``tau = 1, regularizer: softmax — keys kept: 5; largest: 0.41``."""
    values = ", ".join(f"{c.label} = {c.text[i]}" if c.kind == "slider" else f"{c.label}: {c.text[i]}"
                       for c, i in zip(controls, indices))
    shown = "; ".join(f"{k}: {_format(v, number_format)}" for k, v in frame.numbers.items())
    return f"{values} — {shown}" if shown else values


def _data_uri(image: bytes, image_format: str) -> str:
    import base64

    return f"data:{_MIME[image_format]};base64,{base64.b64encode(image).decode('ascii')}"


def _html(controls, shape, frames, readouts, images, default, label, image_format) -> str:
    """The explorer's HTML (see the module's docstring)."""
    uris = [_data_uri(b, image_format) for b in images]
    data = {
        "controls": [{"name": c.name, "kind": c.kind, "values": c.values, "text": c.text} for c in controls],
        "shape": shape,
        "default": default,
        "frames": [{"image": u, "alt": f.alt, "numbers": f.numbers, "readout": r}
                   for u, f, r in zip(uris, frames, readouts)],
    }
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    uid = "pe-" + hashlib.sha1(payload.encode("utf-8")).hexdigest()[:10]
    esc = html.escape
    from PIL import Image

    width, height = Image.open(io.BytesIO(images[default])).size
    rows = []
    for c in controls:
        cid = f"{uid}-{c.name}"
        i = c.default_index
        if c.kind == "slider":
            field = (f'<input type="range" id="{cid}" name="{c.name}" min="0" max="{len(c.values) - 1}" step="1" '
                     f'value="{i}" aria-valuetext="{esc(c.text[i])}">'
                     f'<output class="page-explorer-value" for="{cid}">{esc(c.text[i])}</output>')
        else:
            options = "".join(f'<option value="{j}"{" selected" if j == i else ""}>{esc(t)}</option>'
                              for j, t in enumerate(c.text))
            field = f'<select id="{cid}" name="{c.name}">{options}</select>'
        rows.append(f'<div class="page-explorer-control page-explorer-{c.kind}">'
                    f'<label for="{cid}">{esc(c.label)}</label>{field}</div>')
    frame = frames[default]
    return (
        f'<div class="page-explorer" id="{uid}" role="group" aria-label="{esc(label)}">'
        f'<div class="page-explorer-controls" hidden>{"".join(rows)}</div>'
        f'<img class="page-explorer-frame" src="{uris[default]}" alt="{esc(frame.alt)}" '
        f'width="{width}" height="{height}">'
        f'<output class="page-explorer-readout" aria-live="polite">{esc(readouts[default])}</output>'
        f'<script type="application/json" class="page-explorer-data">{payload}</script>'
        "</div>"
    )
