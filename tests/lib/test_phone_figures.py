"""Phone variants of the book's figures (issue 27, item 3): ``plotting.stacked_for_phone`` lays a
figure out for a phone and puts it back exactly, and ``book.save_figure`` writes the variant when,
and only when, a phone would show the desk figure's text under 8.5 px.

What is compared is independent of the code under test: the PNG bytes Matplotlib draws (the figure
after the block must be drawn as it would have been without it), the panels' positions in the saved
variant read back from the figure, and the pixel sizes of the files."""

import hashlib
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from attnopt import book  # noqa: E402
from attnopt.course.plotting import (PHONE_MIN_TEXT_PX, PHONE_WIDTH_IN, phone_text_px,  # noqa: E402
                                     stacked_for_phone, use_book_style)

use_book_style()


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return hashlib.sha1(buffer.getvalue()).hexdigest()


def _settled(fig) -> str:
    """The figure as a later draw shows it (constrained layout with colour bars settles on the second)."""
    _png(fig)
    return _png(fig)


def _figure(kind: str):
    """The shapes of the book's figures: shared axes, a colour bar, a figure legend, a legend to the
    right of its panel, a twin axis (two panels 3.25 inches wide: one to a row on a phone), and
    small multiples with a hidden slot (panels 2.2 inches wide: two to a row)."""
    if kind == "small_multiples":
        fig, axes = plt.subplots(2, 3, figsize=(6.5, 4.6), sharex=True, sharey=True, constrained_layout=True)
        axes[-1, -1].set_visible(False)
        axes = axes.ravel()[:5]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(6.5, 2.6), sharey=kind == "sharey", constrained_layout=True)
    for i, ax in enumerate(axes):
        ax.plot(np.arange(5), np.arange(5) * (i + 1), label=f"line {i}")
        ax.set_xlabel("x")
    if kind == "colorbar":
        fig.colorbar(axes[1].imshow(np.eye(3)), ax=axes[1], label="weight")
    if kind == "figure_legend":  # four long entries in a row: wider than a phone's figure
        lines = [axes[0].plot([0, 1], [i, i + 1])[0] for i in range(4)]
        fig.legend(lines, [f"a long label for line number {i}" for i in range(4)],
                   loc="outside lower center", ncol=4, title="lines")
    if kind == "legend_right":
        axes[-1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    if kind == "legend_below":  # chapter 5's Fig. 5.1: four entries in a row under one panel
        fig.delaxes(axes[1])
        axes = axes[:1]
        axes[0].set_subplotspec(fig.add_gridspec(1, 1)[0])
        for label in ("Fenchel dual", "Markov kernel", "one-sided transport"):
            axes[0].plot(np.arange(5), np.arange(5) ** 0.5, "o", label=label)
        axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncols=4)
    if kind == "twin":
        axes[0].twinx().plot([0, 4], [1, 0], color="k")
    return fig, list(axes)


KINDS = ["sharey", "colorbar", "figure_legend", "legend_right", "legend_below", "small_multiples", "twin"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_figure_after_the_block_is_drawn_as_without_it(kind):
    """Two copies of one figure, drawn alike; one goes through the block: the next draw of each is
    the same picture (constrained layout starts each draw from the last one's positions, so a
    legend under its panel or a colour bar moves a little with every draw: the copy that did not go
    through the block says what the next draw would have been)."""
    fig, _ = _figure(kind)
    twin, _ = _figure(kind)
    assert _settled(fig) == _settled(twin)
    with stacked_for_phone(fig):
        _png(fig)
    assert _png(fig) == _png(twin)
    plt.close(fig), plt.close(twin)


@pytest.mark.parametrize("kind", KINDS)
def test_the_variant_stacks_the_panels_in_reading_order(kind, recwarn):
    fig, axes = _figure(kind)
    with stacked_for_phone(fig):
        fig.draw_without_rendering()
        assert fig.get_size_inches()[0] == PHONE_WIDTH_IN
        boxes = [ax.get_position() for ax in axes]
        per_row = 2 if kind == "small_multiples" else 1
        rows = [boxes[i : i + per_row] for i in range(0, len(boxes), per_row)]
        for upper, lower in zip(rows, rows[1:]):  # each row wholly above the next
            assert min(b.y0 for b in upper) > max(b.y1 for b in lower)
        for row in rows:
            for left, right in zip(row, row[1:]):
                assert left.x1 < right.x0
        if per_row == 1:  # one panel to a row takes most of the width
            assert all(b.width > 0.6 for b in boxes)
        # every panel stands alone, so a shared axis shows its tick labels on each
        for ax in axes:
            assert ax.xaxis.get_major_ticks()[0].label1.get_visible()
            assert ax.yaxis.get_major_ticks()[0].label1.get_visible()
        fig.draw_without_rendering()
        for legend in [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend())]:
            assert legend.get_window_extent().width <= fig.bbox.width  # no legend widens the figure
        if kind == "figure_legend":
            assert fig.legends[0]._ncols < 4 and fig.legends[0].get_title().get_text() == "lines"
        if kind in ("legend_right", "legend_below"):
            fig.draw_without_rendering()
            legend, panel = axes[-1].get_legend().get_window_extent(), axes[-1].get_window_extent()
            assert legend.y1 < panel.y0 and legend.x1 <= fig.bbox.x1 + 1  # under its panel, inside the figure
            assert legend.y0 >= fig.bbox.y0 - 1  # and not cut off at the figure's foot
    # a layout Matplotlib could not apply warns (and the warning would show in the book's page)
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)], [str(w.message) for w in recwarn]
    plt.close(fig)


def test_a_layout_that_squeezes_the_panels_is_refused(tmp_path, monkeypatch):
    """A legend entry wider than a phone's figure cannot be packed narrower: constrained layout
    gives up and leaves the panel a strip.  The variant is refused (the desk figure stays), loudly,
    rather than shipped squeezed, as chapter 5's first figure once was."""
    fig, axes = _figure("sharey")
    axes[0].legend([axes[0].lines[0]], ["a label too long for the four inches of a phone's figure, too long"],
                   loc="upper center", bbox_to_anchor=(0.5, -0.3))
    with pytest.raises(RuntimeError, match="could not fit|of its slot"):
        with stacked_for_phone(fig):
            pass
    monkeypatch.setenv(book.FIGURES_ENV, str(tmp_path))
    with pytest.warns(RuntimeWarning, match="no phone variant for ch0-squeezed.phone.png"):
        book.save_figure(fig, "ch0-squeezed")
    assert not (tmp_path / "ch0-squeezed.phone.png").exists()
    plt.close(fig)


def test_phone_text_px_follows_the_column():
    assert phone_text_px(715) == pytest.approx(10 / 72 * 110 * 342 / 715)
    assert phone_text_px(300) == pytest.approx(10 / 72 * 110)  # never drawn larger than its file
    assert phone_text_px(715) < PHONE_MIN_TEXT_PX <= phone_text_px(440)


def test_save_figure_writes_a_phone_variant_only_when_a_phone_needs_it(tmp_path, monkeypatch):
    monkeypatch.setenv(book.FIGURES_ENV, str(tmp_path))
    wide, _ = _figure("colorbar")
    before = _settled(wide)
    path = book.save_figure(wide, "ch0-wide")
    phone = tmp_path / "ch0-wide.phone.png"
    assert phone.is_file() and _png(wide) == before  # the notebook still shows the desk figure
    with Image.open(path) as desk, Image.open(phone) as small:
        assert phone_text_px(desk.size[0]) < PHONE_MIN_TEXT_PX
        assert phone_text_px(small.size[0]) >= PHONE_MIN_TEXT_PX
        assert small.size[1] > desk.size[1]  # stacked: taller than the desk figure
    narrow = plt.figure(figsize=(4.0, 3.0))
    narrow.subplots().plot([0, 1])
    book.save_figure(narrow, "ch0-narrow")
    assert (tmp_path / "ch0-narrow.png").is_file() and not (tmp_path / "ch0-narrow.phone.png").exists()
    # a figure that no longer needs a variant does not keep a stale one
    book.save_figure(narrow, "ch0-wide")
    assert not phone.exists()
    plt.close("all")


def test_a_figure_that_cannot_be_laid_out_again_keeps_its_desk_form(tmp_path, monkeypatch):
    """A layout the phone variant cannot handle costs the variant, not the notebook."""
    import attnopt.course.plotting as plotting

    def broken(fig, width=PHONE_WIDTH_IN):
        raise RuntimeError("a layout stacked_for_phone does not know")

    monkeypatch.setattr(plotting, "stacked_for_phone", broken)
    monkeypatch.setenv(book.FIGURES_ENV, str(tmp_path))
    fig, _ = _figure("sharey")
    with pytest.warns(RuntimeWarning, match="no phone variant for ch0-odd.phone.png"):
        path = book.save_figure(fig, "ch0-odd")
    assert path.is_file() and not (tmp_path / "ch0-odd.phone.png").exists()
    plt.close(fig)
