"""One figure style for the whole book.

Figures are drawn on an opaque white canvas with dark ink and a colour-blind-safe palette
(Okabe & Ito), so they stay legible when the book is read in its dark theme: the theme shows
images as they are, and a transparent figure with black text would vanish on a dark page.

References:
    Okabe and Ito (2008), *Color Universal Design (CUD): How to Make Figures and Presentations That
    Are Friendly to Colorblind People* (the palette).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import torch

from .._validation import check_int, check_number

__all__ = ["PALETTE", "PHONE_WIDTH_IN", "attention_heatmap", "phone_text_px", "small_multiples", "stacked_for_phone",
           "use_book_style"]

#: Okabe–Ito colours, safe for the common forms of colour blindness.
PALETTE = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "green": "#009E73",
    "vermillion": "#D55E00",
    "sky": "#56B4E9",
    "purple": "#CC79A7",
    "yellow": "#F0E442",
    "black": "#000000",
}

_STYLE = {
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "savefig.transparent": False,
    "savefig.bbox": "tight",
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "figure.figsize": (6.4, 4.0),
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.edgecolor": "#333333",
    "axes.labelcolor": "#111111",
    "text.color": "#111111",
    "xtick.color": "#333333",
    "ytick.color": "#333333",
    "axes.grid": False,
    "grid.color": "#dddddd",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "viridis",
    "legend.frameon": False,
    "axes.prop_cycle": mpl.cycler(color=[PALETTE[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky", "black")]),
}


def use_book_style() -> None:
    """Apply the book's Matplotlib style (white canvas, palette, sizes) to the current session.

    Examples:
        >>> use_book_style()
        >>> import matplotlib as mpl
        >>> mpl.rcParams["figure.facecolor"], mpl.rcParams["font.size"]
        ('white', 10.0)
    """
    mpl.rcParams.update(_STYLE)
    # Jupyter's inline backend draws its own figure background; make it the same opaque white.
    try:  # pragma: no cover - only inside IPython
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png", facecolor="white")
    except Exception:
        pass
    from .book import _phone_variants_of_outputs

    _phone_variants_of_outputs()


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def attention_heatmap(
    weights,
    ax: plt.Axes | None = None,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
    annotate: bool = False,
    colorbar: bool = True,
    vmax: float | None = None,
) -> plt.Axes:
    """Draw an ``(n_queries, n_keys)`` matrix of attention weights as a heatmap.

    Rows are queries, columns keys; masked (zero) weights show as the colormap's floor.

    Args:
        weights: the matrix, a tensor or an array.
        ax: the axes to draw on (default: a new figure sized to the matrix).
        row_labels, col_labels: tick labels of the queries and keys.
        title: the axes' title.
        annotate: write each weight in its cell.
        colorbar: draw a colour bar labelled "weight".
        vmax: the weight drawn in the brightest colour (default: the largest weight).

    Returns:
        The axes.

    Raises:
        ValueError: ``weights`` not a non-empty 2-D matrix of finite numbers, ``vmax <= 0``.

    Examples:
        >>> import matplotlib.pyplot as plt
        >>> weights = torch.softmax(torch.randn(3, 5), dim=-1)
        >>> ax = attention_heatmap(weights, title="weights")
        >>> ax.get_xlabel(), ax.get_ylabel()
        ('key $j$', 'query $i$')
        >>> plt.close(ax.figure)
    """
    w = _numpy(weights)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 2-D (n_queries, n_keys) matrix; got shape {w.shape}")
    if not np.issubdtype(w.dtype, np.number) or not np.isfinite(w).all():
        raise ValueError("weights must hold finite numbers (NaN or an infinity would draw as a wrong colour)")
    if vmax is not None:
        vmax = check_number(vmax, "vmax", low=0.0, low_open=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * w.shape[1] + 1.8, 0.45 * w.shape[0] + 1.0))
    im = ax.imshow(w, vmin=0.0, vmax=vmax if vmax is not None else max(float(w.max()), 1e-12), aspect="equal")
    ax.set_xlabel("key $j$")
    ax.set_ylabel("query $i$")
    ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=60, ha="right")
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), row_labels)
    if annotate:
        for (i, j), val in np.ndenumerate(w):
            ax.text(j, i, f"{val:.2f}", ha="center", va="center", fontsize=7, color="white" if val < 0.6 * w.max() else "black")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight $p_{ij}$")
    return ax


def small_multiples(n: int, ncols: int = 3, *, panel_size: tuple[float, float] = (3.0, 2.6), **kwargs):
    """A grid of ``n`` panels (``ncols`` wide), for small multiples; unused panels are hidden.

    Args:
        n: the number of panels.
        ncols: panels per row (at most ``n``).
        panel_size: width and height of one panel, in inches.
        **kwargs: passed to :func:`matplotlib.pyplot.subplots` (e.g. ``sharey=True``).

    Returns:
        ``(fig, axes)``: the figure and a flat array of the ``n`` visible axes.

    Raises:
        TypeError: ``n`` or ``ncols`` not an int.
        ValueError: ``n`` or ``ncols`` below 1.

    Examples:
        >>> import matplotlib.pyplot as plt
        >>> fig, axes = small_multiples(4, ncols=3)
        >>> len(axes), fig.get_size_inches().tolist()
        (4, [9.0, 5.2])
        >>> plt.close(fig)
    """
    n = check_int(n, "n")
    ncols = check_int(ncols, "ncols")
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows), squeeze=False, **kwargs)
    flat = axes.ravel()
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


#: The width of a figure's phone variant in inches (440 px at the house DPI; shown in a phone's
#: 342-px column, a 390-px screen less the page's margins, its 10-pt text is 11.9 CSS px).
PHONE_WIDTH_IN = 4.0
#: The text column of a 390-px phone, in CSS px.
PHONE_COLUMN_PX = 342
#: The smallest figure text a phone may show, in CSS px (issue 27 of the course asks 8.5).
PHONE_MIN_TEXT_PX = 8.5


def phone_text_px(width_px: float, *, dpi: float = 110.0, font_pt: float = 10.0,
                  column_px: float = PHONE_COLUMN_PX) -> float:
    """The size, in CSS px, at which a figure ``width_px`` pixels wide shows ``font_pt`` text in a
    phone's column: ``font_pt / 72 * dpi`` pixels in the file, scaled by ``min(1, column / width)``
    (a figure is never drawn larger than its file).

    Examples:
        A 6.5-inch figure at the house DPI (715 px) shows its 10-pt text at 7.3 px; the 4-inch
        phone variant at 11.9 px:

        >>> round(phone_text_px(715), 1), round(phone_text_px(440), 1)
        (7.3, 11.9)
    """
    return font_pt / 72 * dpi * min(1.0, column_px / width_px)


# The attributes of a Matplotlib legend that packing its entries sets.
_LEGEND_PACKING = ("_ncols", "_legend_box", "_legend_handle_box", "_legend_title_box", "texts", "legend_handles")


def _set_legend_columns(legend, ncols: int) -> None:
    """Lay ``legend``'s entries out in ``ncols`` columns.  Matplotlib's ``set_ncols`` only records
    the number (the entries were packed when the legend was made), so the entries are packed
    again from the legend's own handles and labels, its title kept."""
    title = legend.get_title()
    text, props = title.get_text(), title.get_fontproperties()
    legend._ncols = ncols
    legend._init_legend_box(list(legend.legend_handles), [t.get_text() for t in legend.texts])
    legend.set_title(text, prop=props)
    legend.stale = True


def _check_phone_layout(fig, order, per_row: int, heights, messages) -> None:
    """Raise RuntimeError unless the phone layout gave every panel a usable place: constrained
    layout applied (no "collapsed" warning from its last draw), and each panel at least
    two fifths of its slot's width and a third of its row's height (the rest is labels, titles
    and colour bars).  A variant whose panels were squeezed to a strip is worse than none."""
    collapsed = [m for m in messages if "constrained_layout not applied" in m]
    if collapsed:
        raise RuntimeError(f"constrained layout could not fit the panels {fig.get_size_inches()[0]:.1f} in wide")
    fig_h = fig.get_size_inches()[1]
    for i, (_, axes) in enumerate(order):
        box = axes[0].get_position()  # in figure fractions
        width_share, height_share = box.width * per_row, box.height * fig_h / heights[i // per_row]
        if width_share < 0.4 or height_share < 1 / 3:
            raise RuntimeError(
                f"panel {i + 1} of {len(order)} got {width_share:.0%} of its slot's width and "
                f"{height_share:.0%} of its row's height")


@contextlib.contextmanager
def stacked_for_phone(fig, width: float = PHONE_WIDTH_IN):
    """Lay ``fig`` out for a phone while the block runs, then restore it exactly.

    Inside the block the figure is ``width`` inches wide and its panels (an axes placed by a grid
    spec, with its twins, insets and colour bars) are laid out again in reading order (by rows,
    then columns): one per row, or two per row for small multiples whose panels are at most half
    the new width.  A panel keeps its shape within limits: its height is scaled by its new width
    over its old one, clipped to [0.8, 1.5], so that a wide single panel does not flatten and a
    small multiple does not tower.  Tick labels that a shared axis hid on inner panels come back
    (each panel now stands alone), a legend placed to the right of its panel moves under it, and a
    legend wider than the narrow figure takes fewer columns.
    The fonts keep their size, which is the point: the variant is shown at about its natural
    width, so its 10-pt text stays about 12 CSS px on a phone, where the desktop figure, scaled
    into the phone's column, would show it at 7 px.

    Constrained layout (the house figures use it) places the panels anew inside the block and
    again after it (drawn until they stay put), so the figure drawn after the block is the one
    that would have been drawn without it.

    Args:
        fig: a Matplotlib figure.
        width: the phone variant's width, in inches.

    Examples:
        Three panels 2.2 inches wide go two to a row; two 3.2 inches wide, one to a row:

        >>> import matplotlib.pyplot as plt
        >>> def cells(axes):  # each panel's (row, column) in its grid
        ...     return [divmod(int(ax.get_subplotspec().num1),
        ...                    ax.get_gridspec().ncols) for ax in axes]
        >>> fig, axes = plt.subplots(1, 3, figsize=(6.5, 2.4),
        ...                          layout="constrained")
        >>> with stacked_for_phone(fig):
        ...     cells(axes), float(fig.get_size_inches()[0])
        ([(0, 0), (0, 1), (1, 0)], 4.0)
        >>> cells(axes), fig.get_size_inches().tolist()
        ([(0, 0), (0, 1), (0, 2)], [6.5, 2.4])
        >>> fig2, axes2 = plt.subplots(1, 2, figsize=(6.5, 2.4),
        ...                            layout="constrained")
        >>> with stacked_for_phone(fig2):
        ...     cells(axes2)
        [(0, 0), (1, 0)]
        >>> plt.close(fig), plt.close(fig2)
        (None, None)
    """
    from matplotlib.gridspec import GridSpec
    from matplotlib.transforms import ScaledTranslation

    old_size = fig.get_size_inches().copy()
    # Constrained layout starts each draw from the positions the last one left (a legend placed by
    # axes fractions, or a colour bar, moves a little with every draw), so the panels' positions
    # are put back as they were: the next draw is then the one the block replaced.
    positions = [(ax, ax._originalPosition.frozen(), ax._position.frozen()) for ax in fig.axes]
    fig_w, fig_h = old_size
    groups: dict = {}
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if spec is None or not ax.get_visible():
            continue  # colour bars and insets follow their parent; hidden panels keep their place
        key = (id(spec.get_gridspec()), spec.rowspan.start, spec.rowspan.stop, spec.colspan.start, spec.colspan.stop)
        groups.setdefault(key, (spec, []))[1].append(ax)
    if not groups:
        yield fig
        return
    order = sorted(groups.values(), key=lambda g: (g[0].rowspan.start, g[0].colspan.start))
    sizes = []
    for spec, _ in order:
        nrows, ncols = spec.get_gridspec().get_geometry()
        sizes.append((fig_w * len(spec.colspan) / ncols, fig_h * len(spec.rowspan) / nrows))
    per_row = 2 if len(order) > 2 and max(w for w, _ in sizes) <= 0.55 * width else 1
    rows = -(-len(order) // per_row)
    heights = [0.0] * rows
    for i, (w, h) in enumerate(sizes):
        heights[i // per_row] = max(heights[i // per_row], h * float(np.clip(width / per_row / w, 0.8, 1.5)))
    extra = 0.35 * len(fig.legends) + (0.3 if getattr(fig, "_suptitle", None) is not None else 0.0)
    # what is changed besides the grid, to be put back: (axis, tick-label keyword, value)
    ticks, legends, columns = [], [], []
    for _, axes in order:
        for ax in axes:
            shared_x = len(ax.get_shared_x_axes().get_siblings(ax)) > 1
            shared_y = len(ax.get_shared_y_axes().get_siblings(ax)) > 1
            for axis, keyword, shared in ((ax.xaxis, "labelbottom", shared_x), (ax.yaxis, "labelleft", shared_y)):
                first = axis.get_major_ticks()[:1]
                if shared and first and not first[0].label1.get_visible():
                    ticks.append((axis, keyword))
            legend = ax.get_legend()
            if legend is not None:
                anchor = legend.get_bbox_to_anchor()
                # outside its panel: to the right of it, or under it (placed by axes fractions,
                # so its distance from the panel would change with the panel's new height)
                if anchor.x0 >= ax.bbox.x1 - 2 or anchor.y1 <= ax.bbox.y0 + 2:
                    legends.append((ax, legend, legend._loc, legend._bbox_to_anchor))
    stack = GridSpec(rows, per_row, figure=fig, height_ratios=heights)
    try:
        fig.set_size_inches(width, sum(heights) + extra + 0.6 * len(legends))
        for i, (_, axes) in enumerate(order):
            for ax in axes:
                ax.set_subplotspec(stack[i // per_row, i % per_row])
        for axis, keyword in ticks:
            axis.set_tick_params(which="both", **{keyword: True})
        renderer = fig.canvas.get_renderer()
        # A legend wider than the narrow figure takes fewer columns, before any layout is drawn:
        # constrained layout cannot fit a legend wider than the figure and would collapse the
        # panels (a legend's width does not depend on where the layout puts it).
        for legend in [*fig.legends, *(ax.get_legend() for _, axes in order for ax in axes)]:
            if legend is None or legend._ncols < 2:
                continue
            # what packing replaces, kept to be put back as it was (packing again is not bit-exact)
            columns.append((legend, {name: getattr(legend, name) for name in _LEGEND_PACKING}))
            while legend._ncols > 1 and legend.get_window_extent(renderer).width > 0.95 * fig.bbox.width:
                _set_legend_columns(legend, legend._ncols - 1)
        with warnings.catch_warnings():
            # the first layout, drawn to find where the axes' labels end; the check is below
            warnings.filterwarnings("ignore", message="constrained_layout not applied")
            fig.draw_without_rendering()
        for ax, legend, _, _ in legends:
            # under the panel's x axis (its tick labels and label), whatever height the layout gives it
            below = (ax.bbox.y0 - ax.xaxis.get_tightbbox(renderer).y0) / fig.dpi + 0.05
            legend.set_bbox_to_anchor((0.5, 0.0), transform=ax.transAxes + ScaledTranslation(0, -below, fig.dpi_scale_trans))
            legend._loc = 9  # upper center
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.draw_without_rendering()  # the layout with the legends in their new places
        _check_phone_layout(fig, order, per_row, heights, [str(w.message) for w in caught])
        yield fig
    finally:
        for legend, packing in columns:
            for name, value in packing.items():
                setattr(legend, name, value)
            legend.stale = True
        for spec, axes in order:
            for ax in axes:
                ax.set_subplotspec(spec)
        for axis, keyword in ticks:
            axis.set_tick_params(which="both", **{keyword: False})
        for _, legend, loc, anchor in legends:
            legend._loc, legend._bbox_to_anchor = loc, anchor
            legend.stale = True
        fig.set_size_inches(old_size)
        for ax, original, active in positions:
            ax._set_position(original, which="original")
            ax._set_position(active, which="active")
