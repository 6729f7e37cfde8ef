"""Bad and edge inputs of attnopt.page_explorer, written from its contract: each bad input raises the
documented error type with a message that names the user's argument; each edge input gives the
documented result."""

from __future__ import annotations

import math

import pytest
import torch

from attnopt.page_explorer import Choice, Frame, Slider, page_explorer

GRID = [0.5, 1.0, 2.0]
TAU = Slider("tau", GRID, label="strength")
KIND = Choice("kind", ["a", "b"], label="kind")


def line(fig, **values):
    fig.subplots().plot([0, 1], [0, 1])
    return Frame({"x": 1.0}, "a straight line from corner to corner")


def small(controls, draw=line, **kwargs):
    kwargs = {"label": "test", "figsize": (1.0, 0.8), "dpi": 30, **kwargs}
    return page_explorer(controls, draw, **kwargs)


BAD = [
    # Slider
    (lambda: Slider(3, GRID, label="x"), TypeError, "name"),
    (lambda: Slider("not a name", GRID, label="x"), ValueError, "name"),
    (lambda: Slider("tau", GRID, label=None), TypeError, "label"),
    (lambda: Slider("tau", GRID, label="  "), ValueError, "label"),
    (lambda: Slider("tau", "0.5, 1", label="x"), TypeError, "values"),
    (lambda: Slider("tau", 7, label="x"), TypeError, "values"),
    (lambda: Slider("tau", [1.0], label="x"), ValueError, "values"),
    (lambda: Slider("tau", [1.0, "2"], label="x"), TypeError, r"values\[1\]"),
    (lambda: Slider("tau", [1.0, math.nan], label="x"), ValueError, r"values\[1\]"),
    (lambda: Slider("tau", [2.0, 1.0], label="x"), ValueError, "values"),
    (lambda: Slider("tau", [1.0, 1.0], label="x"), ValueError, "values"),
    (lambda: Slider("tau", GRID, label="x", default=0.7), ValueError, "default"),
    (lambda: Slider("tau", GRID, label="x", default="1"), TypeError, "default"),
    (lambda: Slider("tau", GRID, label="x", format=3), TypeError, "format"),
    (lambda: Slider("tau", GRID, label="x", format="{:d}"), ValueError, "format"),
    (lambda: Slider("tau", GRID, label="x", format="{0} {1}"), ValueError, "format"),
    # Choice
    (lambda: Choice(None, ["a", "b"], label="x"), TypeError, "name"),
    (lambda: Choice("1st", ["a", "b"], label="x"), ValueError, "name"),
    (lambda: Choice("kind", "ab", label="x"), TypeError, "options"),
    (lambda: Choice("kind", ["a"], label="x"), ValueError, "options"),
    (lambda: Choice("kind", ["a", "a"], label="x"), ValueError, "options"),
    (lambda: Choice("kind", ["a", [1, 2]], label="x"), TypeError, r"options\[1\]"),
    (lambda: Choice("kind", ["a", math.inf], label="x"), TypeError, r"options\[1\]"),
    (lambda: Choice("kind", [("A", "a"), (3, "b")], label="x"), TypeError, r"options\[1\]"),
    (lambda: Choice("kind", ["a", "b"], label=""), ValueError, "label"),
    (lambda: Choice("kind", ["a", "b"], label="x", default="c"), ValueError, "default"),
    (lambda: Choice("kind", [0.0, 0.5], label="x", default=0), ValueError, "default"),
    # page_explorer
    (lambda: small(TAU), TypeError, "controls"),
    (lambda: small("tau"), TypeError, "controls"),
    (lambda: small([]), ValueError, "controls"),
    (lambda: small([TAU, "kind"]), TypeError, r"controls\[1\]"),
    (lambda: small([TAU, Slider("tau", GRID, label="again")]), ValueError, "controls"),
    (lambda: small([TAU], draw="line"), TypeError, "draw"),
    (lambda: page_explorer([TAU], line, label=3), TypeError, "label"),
    (lambda: page_explorer([TAU], line), TypeError, "label"),
    (lambda: small([TAU], figsize=(1.0,)), ValueError, "figsize"),
    (lambda: small([TAU], figsize=(1.0, -1.0)), ValueError, "figsize"),
    (lambda: page_explorer([TAU], line, label="x", dpi=5), ValueError, "dpi"),
    (lambda: page_explorer([TAU], line, label="x", dpi="high"), TypeError, "dpi"),
    (lambda: small([TAU], colors=4), ValueError, "colors"),
    (lambda: small([TAU], colors=64.0), TypeError, "colors"),
    (lambda: small([TAU], image_format="gif"), ValueError, "image_format"),
    (lambda: small([TAU], number_format=None), TypeError, "number_format"),
    (lambda: small([TAU], number_format="{:d}"), ValueError, "number_format"),
    (lambda: small([TAU], max_bytes=0), ValueError, "max_bytes"),
    (lambda: small([TAU], max_bytes=1000), ValueError, "max_bytes"),
    (lambda: small([TAU], fixed_layout="yes"), TypeError, "fixed_layout"),
    (lambda: small([TAU], shared_limits=1), TypeError, "shared_limits"),
    # what draw returns
    (lambda: small([TAU], draw=lambda fig, tau: None), TypeError, "Frame"),
    (lambda: small([TAU], draw=lambda fig, tau: Frame([1.0], "a line from corner to corner")), TypeError, "numbers"),
    (lambda: small([TAU], draw=lambda fig, tau: Frame({1: 1.0}, "a line from corner to corner")), TypeError, "numbers"),
    (lambda: small([TAU], draw=lambda fig, tau: Frame({"x": "a"}, "line")), ValueError, "alt"),
    (lambda: small([TAU], draw=lambda fig, tau: Frame({"x": [1.0]}, "a line from corner to corner")), TypeError, "'x'"),
    (lambda: small([TAU], draw=lambda fig, tau: Frame({"x": True}, "a line from corner to corner")), TypeError, "'x'"),
    (lambda: small([TAU], draw=lambda fig, tau: Frame({"x": math.nan}, "a line from corner to corner")), ValueError, "'x'"),
    (lambda: small([TAU], draw=lambda fig, tau: Frame({"x": torch.ones(2)}, "a line from corner to corner")), TypeError, "'x'"),
]


@pytest.mark.parametrize("call, error, word", BAD, ids=[f"{i}-{w}" for i, (_, _, w) in enumerate(BAD)])
def test_bad_argument_is_named(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_a_state_the_grid_does_not_hold_is_named():
    explorer = small([TAU, KIND])
    with pytest.raises(ValueError, match="tau"):
        explorer.index(tau=0.7, kind="a")
    with pytest.raises(ValueError, match="kind"):
        explorer.index(tau=1.0, kind="c")
    with pytest.raises(ValueError, match="values"):
        explorer.index(tau=1.0)


# --------------------------------------------------------------------------------------------
# edge inputs: documented results
# --------------------------------------------------------------------------------------------


def test_one_control_of_two_values():
    explorer = small([Slider("x", [0.0, 1.0], label="x")])
    assert explorer.shape == (2,) and len(explorer.images) == 2 and explorer.default == 0


def test_choice_with_texts_and_mixed_values():
    c = Choice("m", [("none", None), ("on", True), 0.5], label="m", default=True)
    assert c.values == [None, True, 0.5] and c.text == ["none", "on", "0.5"] and c.default_index == 1


def test_numbers_may_be_tensors_and_are_written_as_json_scalars():
    def draw(fig, tau):
        fig.subplots().plot([0, 1], [0, tau])
        return Frame({"count": torch.tensor(3), "size": torch.tensor(tau, dtype=torch.float64), "what": "line"},
                     "a line that rises by tau")

    explorer = small([TAU], draw=draw)
    assert [f.numbers for f in explorer.frames] == [{"count": 3, "size": t, "what": "line"} for t in GRID]
    assert all(type(f.numbers["count"]) is int and type(f.numbers["size"]) is float for f in explorer.frames)


def test_save_page_explorer_for_a_theory_page(tmp_path, monkeypatch):
    """attnopt.book.save_page_explorer: bad inputs named; outside the book nothing is written; in it,
    the HTML is the explorer's and the still is its default frame, pixel for pixel."""
    import io

    import numpy as np
    from PIL import Image

    from attnopt import book

    def slope(fig, tau, kind):
        fig.subplots().plot([0, 1], [0, tau], "-" if kind == "a" else "o")
        return Frame({"tau": tau}, f"a line of slope {tau} drawn as {kind}")

    controls = [Slider("tau", GRID, label="strength", default=1.0), KIND]
    explorer = small(controls, slope)
    with pytest.raises(TypeError, match="explorer"):
        book.save_page_explorer("<div></div>", "ch0-demo")
    for name in ("../escape", "", "a.html"):
        with pytest.raises(ValueError, match="name"):
            book.save_page_explorer(explorer, name)
    monkeypatch.delenv(book.FIGURES_ENV, raising=False)
    assert book.save_page_explorer(explorer, "ch0-demo") is None
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(book.FIGURES_ENV, str(tmp_path))
    path = book.save_page_explorer(explorer, "ch0-demo")
    assert path == tmp_path / "ch0-demo.html"
    assert path.read_text(encoding="utf-8").strip() == explorer.html
    still = np.asarray(Image.open(tmp_path / "ch0-demo.png").convert("RGB"))
    default = np.asarray(Image.open(io.BytesIO(explorer.images[explorer.default])).convert("RGB"))
    assert explorer.default == 2 and still.shape == default.shape and (still == default).all()
    first = np.asarray(Image.open(io.BytesIO(explorer.images[0])).convert("RGB"))
    assert (still != first).any()  # the default state, not the first
