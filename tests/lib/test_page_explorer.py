"""attnopt.page_explorer: every frame is the picture and the numbers of its state, in the order the
page's script reads them; the HTML holds labelled native controls, a live output and the default
frame as a still; the module needs neither IPython nor ipywidgets."""

from __future__ import annotations

import base64
import io
import json
import math
import subprocess
import sys

import matplotlib.patches
import numpy as np
import pytest
from PIL import Image

# the test toolchain pins beautifulsoup4; a machine without it (a rented GPU box) skips this module
# instead of failing the collection of the whole suite
BeautifulSoup = pytest.importorskip("bs4").BeautifulSoup

from attnopt.page_explorer import Choice, Frame, Slider, page_explorer

LEVELS = [0.1 * k for k in range(3, 9)]  # six grey levels, 0.3 to 0.8
SHADES = {"red": (1.0, 0.0, 0.0), "blue": (0.0, 0.0, 1.0)}


def paint(fig, level, shade, border):
    """A figure whose pixels say its state: the top half grey ``level``, the bottom half ``shade``
    (``border``: whether a black frame is drawn around the figure)."""
    fig.set_layout_engine("none")  # axes placed by hand
    top, bottom = fig.add_axes((0, 0.5, 1, 0.5)), fig.add_axes((0, 0, 1, 0.5))
    for ax in (top, bottom):
        ax.set_axis_off()
    top.add_patch(matplotlib.patches.Rectangle((0, 0), 1, 1, color=(level,) * 3))
    bottom.add_patch(matplotlib.patches.Rectangle((0, 0), 1, 1, color=SHADES[shade]))
    if border:
        fig.patches.append(matplotlib.patches.Rectangle(
            (0, 0), 1, 1, transform=fig.transFigure, fill=False, lw=4, color="black"))
    return Frame({"level": level, "square": level**2, "index": LEVELS.index(level), "shade": shade},
                 f"a grey of level {level:.1f} above a {shade} band")


def controls():
    return [Slider("level", LEVELS, label="grey level", default=LEVELS[2], format="{:.1f}"),
            Choice("shade", [("red band", "red"), ("blue band", "blue")], label="band", default="blue"),
            Choice("border", [False, True], label="border")]


@pytest.fixture(scope="module")
def explorer():
    return page_explorer(controls(), paint, label="a test explorer", figsize=(1.2, 0.8), dpi=50,
                         image_format="png", colors=16)


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(float) / 255


def page_data(explorer) -> tuple[BeautifulSoup, dict]:
    soup = BeautifulSoup(explorer.html, "html.parser")
    return soup, json.loads(soup.find("script", type="application/json").string)


def test_grid_and_order(explorer):
    assert explorer.shape == (6, 2, 2) and len(explorer.states) == 24 == len(explorer.images)
    # the last control moves fastest, as the page's script computes the index
    expected = [dict(level=lv, shade=s, border=b) for lv in LEVELS for s in ("red", "blue") for b in (False, True)]
    assert explorer.states == expected
    assert all(explorer.index(**state) == k for k, state in enumerate(expected))
    assert explorer.default == explorer.index(level=LEVELS[2], shade="blue", border=False) == 10
    assert explorer.grid == {"level": LEVELS, "shade": ["red", "blue"], "border": [False, True]}


def test_each_picture_is_its_state(explorer):
    sizes = set()
    for state, image in zip(explorer.states, explorer.images):
        p = pixels(image)
        sizes.add(p.shape)
        h, w, _ = p.shape
        top, bottom = p[h // 4, w // 2], p[3 * h // 4, w // 2]
        # a palette of 16 colours keeps flat colours within one 8-bit step
        assert np.allclose(top, state["level"], atol=2 / 255), (state, top)
        assert np.allclose(bottom, SHADES[state["shade"]], atol=2 / 255), (state, bottom)
        corner = p[1, w // 2]
        assert (corner.max() < 0.15) == state["border"], (state, corner)
    assert sizes == {(40, 60, 3)}  # 1.2 x 0.8 in at 50 dpi, every frame alike (no tight crop)


def test_numbers_and_readouts_are_the_state_functions(explorer):
    _, data = page_data(explorer)
    assert data["shape"] == [6, 2, 2] and data["default"] == 10 and len(data["frames"]) == 24
    for state, frame in zip(explorer.states, data["frames"]):
        level = state["level"]
        assert frame["numbers"] == {"level": level, "square": level**2, "index": LEVELS.index(level),
                                    "shade": state["shade"]}
        assert frame["alt"] == f"a grey of level {level:.1f} above a {state['shade']} band"
        band = "red band" if state["shade"] == "red" else "blue band"
        assert frame["readout"] == (
            f"grey level = {level:.1f}, band: {band}, border: {state['border']} — "
            f"level: {level:.3g}; square: {level ** 2:.3g}; index: {LEVELS.index(level)}; shade: {state['shade']}")
    for image, frame in zip(explorer.images, data["frames"]):
        assert frame["image"] == "data:image/png;base64," + base64.b64encode(image).decode()


def test_html_is_labelled_native_controls_over_a_still(explorer):
    soup, data = page_data(explorer)
    root = soup.find("div", class_="page-explorer")
    assert root["role"] == "group" and root["aria-label"] == "a test explorer"
    img = root.find("img", class_="page-explorer-frame")
    default = data["frames"][explorer.default]
    assert img["src"] == default["image"] and img["alt"] == default["alt"]
    assert (int(img["width"]), int(img["height"])) == (60, 40)
    panel = root.find(class_="page-explorer-controls")
    assert panel.has_attr("hidden")  # until the page's script wires it: a still without it
    slider = panel.find("input", type="range")
    assert (slider["min"], slider["max"], slider["step"], slider["value"]) == ("0", "5", "1", "2")
    assert slider["aria-valuetext"] == "0.5" and slider["name"] == "level"
    assert panel.find("label", attrs={"for": slider["id"]}).text == "grey level"
    assert panel.find("output", attrs={"for": slider["id"]}).text == "0.5"
    selects = panel.find_all("select")
    assert [s["name"] for s in selects] == ["shade", "border"]
    assert [o.text for o in selects[0].find_all("option")] == ["red band", "blue band"]
    assert selects[0].find("option", selected=True)["value"] == "1"
    assert all(panel.find("label", attrs={"for": s["id"]}) for s in selects)
    readout = root.find("output", class_="page-explorer-readout")
    assert readout["aria-live"] == "polite" and readout.text == explorer.readouts[explorer.default]
    assert explorer.nbytes == len(explorer.html.encode())


def test_script_data_cannot_close_its_tag():
    def draw(fig, x):
        fig.subplots().plot([0, 1], [0, x])
        return Frame({"html": "</script><b>"}, "a line whose number is markup")

    explorer = page_explorer([Slider("x", [1.0, 2.0], label="x")], draw, label="t", figsize=(1, 1), dpi=30)
    assert explorer.html.count("</script>") == 1
    _, data = page_data(explorer)
    assert data["frames"][0]["numbers"]["html"] == "</script><b>"


def test_fixed_layout_draws_what_a_layout_per_frame_draws():
    """Axes whose layout does not depend on the slider: keeping the default's layout changes no pixel."""

    def draw(fig, slope, title):
        ax = fig.subplots()
        ax.plot([0, 1], [0, slope])
        ax.set(ylim=(0, 2), title=title, xlabel="x")
        return Frame({"slope": slope}, f"a line of slope {slope}")

    grid = [Slider("slope", [0.5, 1.0, 1.5], label="slope", default=1.0), Choice("title", ["one", "two"], label="t")]
    fixed = page_explorer(grid, draw, label="t", figsize=(2, 1.5), dpi=40)
    free = page_explorer(grid, draw, label="t", figsize=(2, 1.5), dpi=40, fixed_layout=False)
    assert fixed.states == free.states
    for a, b in zip(fixed.images, free.images):
        assert np.array_equal(pixels(a), pixels(b))


def test_a_frame_with_other_axes_gets_its_own_layout():
    def draw(fig, n):
        for ax in np.atleast_1d(fig.subplots(1, int(n))):
            ax.plot([0, 1], [0, 1])
        return Frame({"panels": int(n)}, f"{int(n)} panels with a line each")

    explorer = page_explorer([Slider("n", [1.0, 2.0, 3.0], label="panels")], draw, label="t", figsize=(3, 1), dpi=40)
    assert [f.numbers["panels"] for f in explorer.frames] == [1, 2, 3]


def test_webp_frames_are_smaller_and_decode():
    def draw(fig, x):
        ax = fig.subplots()
        ax.plot(np.linspace(0, 1, 50), np.sin(6 * x * np.linspace(0, 1, 50)))
        ax.set_title(f"x = {x}")
        return Frame({"x": x}, f"a sine wave of frequency {x}")

    grid = [Slider("x", [1.0, 2.0], label="x")]
    webp = page_explorer(grid, draw, label="t", figsize=(3, 2), dpi=60)
    png = page_explorer(grid, draw, label="t", figsize=(3, 2), dpi=60, image_format="png")
    assert webp.image_format == "webp" and '"data:image/webp;base64,' in webp.html
    for a, b in zip(webp.images, png.images):
        assert len(a) < len(b)
        assert np.array_equal(pixels(a), pixels(b))  # both lossless, on one palette
    assert math.isclose(webp.nbytes, len(webp.html.encode()))


def test_importing_needs_neither_ipython_nor_ipywidgets():
    code = ("import sys, attnopt.page_explorer; "
            "print(sorted(m for m in ('IPython', 'ipywidgets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _red_rows(data: bytes) -> set:
    """The pixel rows where a pure-red line is drawn."""
    rgb = pixels(data)
    red = (rgb[..., 0] > 0.9) & (rgb[..., 1] < 0.2) & (rgb[..., 2] < 0.2)
    return set(np.nonzero(red.any(axis=1))[0].tolist())


def _slope_draw(fig, slope, mark):
    """A line of slope ``slope`` (autoscaled y axis, reversed when ``mark`` is "flip") and a red
    horizontal line at y = 0.5, whose pixel row shows where y = 0.5 is in the frame."""
    ax = fig.subplots()
    ax.plot([0, 1], [0, slope], color="black")
    ax.axhline(0.5, color=(1.0, 0.0, 0.0), lw=2)
    if mark == "flip":
        ax.invert_yaxis()
    return Frame({"slope": slope}, f"a line of slope {slope}, a red line at one half")


def test_shared_limits_keep_every_axis_still_as_the_slider_moves():
    """Autoscaled, y = 0.5 sits on another row in every frame (the axis rescales: a zoom); with
    shared limits it sits on one row in all of them, and the steepest line still fits."""
    grid = [Slider("slope", [1.0, 2.0, 4.0], label="slope", default=1.0), Choice("mark", ["up", "flip"], label="m")]
    kwargs = dict(label="t", figsize=(2, 2), dpi=50, image_format="png")
    free = page_explorer(grid, _slope_draw, shared_limits=False, **kwargs)
    fixed = page_explorer(grid, _slope_draw, **kwargs)
    for mark in ("up", "flip"):
        rows_free = [frozenset(_red_rows(free.images[free.index(slope=s, mark=mark)])) for s in (1.0, 2.0, 4.0)]
        rows_fixed = [frozenset(_red_rows(fixed.images[fixed.index(slope=s, mark=mark)])) for s in (1.0, 2.0, 4.0)]
        assert len(set(rows_free)) == 3, "the test's premise: without shared limits the red line moves"
        assert len(set(rows_fixed)) == 1 and rows_fixed[0], f"{mark}: the red line moved with shared limits"
    # the shared y range holds every state's data: [0, 4] plus matplotlib's margins, flipped or not
    up = np.mean(sorted(_red_rows(fixed.images[fixed.index(slope=1.0, mark="up")])))
    flip = np.mean(sorted(_red_rows(fixed.images[fixed.index(slope=1.0, mark="flip")])))
    assert up > flip, "y = 0.5 is low on the upright axis and high on the reversed one"


def test_shared_limits_leave_a_colorbar_and_other_axes_alone():
    """A colourbar's axis follows its image (no shared span is computed for it); a combination whose
    states draw different numbers of panels gets no shared limits at all."""
    from attnopt.page_explorer import _shared_limits

    def draw(fig, scale, panels):
        n = int(panels) if scale < 3 else 1  # panels="2": 2, 2, then 1 panel as the slider moves
        axes = np.atleast_1d(fig.subplots(1, n))
        image = axes[0].imshow(scale * np.arange(6.0).reshape(2, 3))
        fig.colorbar(image, ax=axes[0])
        return Frame({"scale": scale}, f"an image scaled by {scale}, {n} panels")

    grid = [Slider("scale", [1.0, 2.0, 3.0], label="s"), Choice("panels", ["1", "2"], label="p")]
    spans = _shared_limits(grid, draw, (4, 2), {})
    assert list(spans) == [(0,)], "only the combination whose states all draw one panel is shared"
    (xlim, ylim), = spans[(0,)]  # one data axis: the image's, not the colourbar's
    assert xlim == (-0.5, 2.5) and ylim == (1.5, -0.5)  # imshow's extent, its y axis reversed


def test_shared_limits_on_an_axes_of_fixed_aspect_log_nothing(caplog):
    """An equal-aspect axes that adjusts its data limits (chapter 1's Gaussian panels) keeps the
    aspect; fixing both limits made matplotlib log "Ignoring fixed y limits ..." for every frame,
    and that log reached the page as a stderr output under the explorer."""
    def draw(fig, slope):
        ax = fig.add_subplot()
        ax.plot([0, 1], [0, slope])
        ax.set_aspect("equal", adjustable="datalim")
        return Frame({"slope": slope}, f"a line of slope {slope} at equal aspect")

    grid = [Slider("slope", [0.5, 1.0, 2.0], label="slope", default=1.0)]
    with caplog.at_level("WARNING", logger="matplotlib"):
        explorer = page_explorer(grid, draw, label="t", figsize=(2, 2), dpi=50, image_format="png")
    assert len(explorer.images) == 3
    assert not [r for r in caplog.records if "Ignoring fixed" in r.getMessage()], caplog.text
