"""One figure style for the whole book.

Figures are drawn on an opaque white canvas with dark ink and a colour-blind-safe palette
(Okabe & Ito), so they stay legible when the book is read in its dark theme: the theme shows
images as they are, and a transparent figure with black text would vanish on a dark page.

References:
    Okabe and Ito (2008), *Color Universal Design (CUD): How to Make Figures and Presentations That
    Are Friendly to Colorblind People* (the palette).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import torch

from .._validation import check_int, check_number

__all__ = ["PALETTE", "attention_heatmap", "small_multiples", "use_book_style"]

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
