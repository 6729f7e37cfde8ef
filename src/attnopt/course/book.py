"""Small helpers every notebook of the course uses: device choice, seeding, test data, checks, results.

A notebook picks its device and seeds its generators (:func:`pick_device`, :func:`seed_everything`),
draws its test data (:func:`random_qkv`), compares one computation with another
(:func:`max_error`), and records its key numbers with :func:`record`; the course's tests read them
back and check them against the claims the book makes, so a figure and the sentence under it cannot
drift apart silently.  Tables and figures for the book go through :func:`markdown_table` and
:func:`save_figure`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import random
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from .._optional import require
from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_choice,
    check_device,
    check_float_dtype,
    check_int,
    check_same_device,
)

__all__ = [
    "FIGURES_ENV",
    "RESULTS_ENV",
    "SEED_RANGE",
    "check_scale",
    "in_colab",
    "markdown_table",
    "max_error",
    "pick_device",
    "random_qkv",
    "record",
    "save_figure",
    "save_page_explorer",
    "seed_everything",
]

#: Environment variable naming the folder :func:`record` writes to (set by the book's runner).
RESULTS_ENV = "ATTNOPT_RESULTS_DIR"
#: Environment variable naming the folder :func:`save_figure` writes to (set by the book's runner).
FIGURES_ENV = "ATTNOPT_FIGURES_DIR"

SCALES = ("book", "full")


def in_colab() -> bool:
    """True when running inside Google Colab.

    Examples:
        >>> in_colab()
        False
    """
    return "google.colab" in sys.modules


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """Resolve a notebook's ``device`` parameter: ``"auto"`` means CUDA when available, else CPU.

    Args:
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``.

    Returns:
        The ``torch.device``, checked to exist on this machine.

    Raises:
        TypeError: ``device`` neither a string nor a ``torch.device``.
        ValueError: a string torch does not know (the message lists the accepted ones), or an
            accelerator (CUDA, MPS) that this machine does not have.

    Examples:
        >>> pick_device("cpu")
        device(type='cpu')
    """
    return check_device(device, "device", auto=True)


def check_scale(scale: str) -> str:
    """Validate a notebook's ``scale`` parameter (``"book"`` for CPU figures, ``"full"`` for a GPU).

    Returns:
        ``scale``, checked.

    Raises:
        TypeError: ``scale`` not a string.
        ValueError: ``scale`` not one of ``("book", "full")``.

    Examples:
        >>> check_scale("book")
        'book'
    """
    return check_choice(scale, "scale", SCALES)


#: The range of seeds that seed_everything accepts, that of ``torch.manual_seed``.
SEED_RANGE = (-(2**63), 2**64 - 1)


def _seed_arg(seed) -> int:
    seed = check_int(seed, "seed", minimum=None)
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"seed must be an int in [-2**63, 2**64 - 1] (the range of torch.manual_seed); got {seed}")
    return seed


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and PyTorch; return a fresh CPU ``torch.Generator`` seeded with ``seed``.

    NumPy, whose seeds are below :math:`2^{32}`, gets ``seed % 2**32``.

    Args:
        seed: an int in ``[-2**63, 2**64 - 1]`` (:data:`SEED_RANGE`, the range of
            ``torch.manual_seed``; a negative seed is mapped by torch to ``2**64 - 1 + seed``).

    Returns:
        A ``torch.Generator`` on the CPU.

    Raises:
        TypeError: ``seed`` not an int (a bool or a float included).
        ValueError: ``seed`` outside :data:`SEED_RANGE`; it is refused rather than reduced, so
            that two different seeds never give the same stream silently.

    Examples:
        >>> a = torch.rand(3, generator=seed_everything(0))
        >>> b = torch.rand(3, generator=seed_everything(0))
        >>> bool(torch.equal(a, b))
        True
    """
    seed = _seed_arg(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def random_qkv(shape, *, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
    """Queries, keys and values with independent standard normal entries, the same on every device.

    The three tensors are drawn on the CPU, in that order, from one generator seeded with ``seed``,
    then moved to ``device``: a notebook run on a GPU checks the same numbers as on a CPU.

    Args:
        shape: the shape of each tensor, e.g. ``(batch, heads, n, d)``.
        seed: an int in :data:`SEED_RANGE`.
        dtype: a floating ``torch.dtype`` (the numbers are drawn in it).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"`` or a ``torch.device``.

    Returns:
        ``(q, k, v)``, three tensors of ``shape``.

    Raises:
        TypeError: ``shape`` not a sequence of ints, ``seed`` not an int, ``dtype`` not a floating
            ``torch.dtype``, ``device`` of another kind.
        ValueError: a negative size, ``seed`` outside :data:`SEED_RANGE`, a device this machine does
            not have.

    Examples:
        >>> q, k, v = random_qkv((2, 4, 8), seed=1, dtype=torch.float64)
        >>> q.shape, k.dtype
        (torch.Size([2, 4, 8]), torch.float64)
        >>> again = random_qkv((2, 4, 8), seed=1, dtype=torch.float64)
        >>> bool(torch.equal(q, again[0]))
        True
    """
    if not isinstance(shape, (tuple, list, torch.Size)):
        raise TypeError(f"shape must be a tuple of ints such as (batch, heads, n, d); got {type(shape).__name__}")
    shape = tuple(check_int(size, f"shape[{i}]", minimum=0) for i, size in enumerate(shape))
    seed = _seed_arg(seed)
    dtype = check_float_dtype(dtype)
    device = check_device(device, "device", auto=True)
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=generator, dtype=dtype).to(device) for _ in range(3))


def max_error(actual, expected) -> float:
    """The largest entrywise difference ``max |actual - expected|``, as a Python float.

    What a notebook prints when it checks one computation against another.  Entries that are equal
    count 0, infinities included (a masked ``-inf`` against a masked ``-inf``); a NaN in either
    tensor gives ``nan``, so that a check ``max_error(a, b) < tol`` fails.  Two floating dtypes are
    compared in the wider one.

    Args:
        actual, expected: floating tensors (or numbers, or nested lists of them) whose shapes
            broadcast, on one device.

    Returns:
        The largest difference; ``0.0`` when there is nothing to compare (an empty broadcast shape).

    Raises:
        TypeError: an argument that is not a floating tensor or a number.
        ValueError: shapes that do not broadcast; tensors on different devices.

    Examples:
        >>> inf = float("inf")
        >>> a, b = torch.tensor([1.0, 2.0, -inf]), torch.tensor([1.0, 2.5, -inf])
        >>> max_error(a, b)
        0.5
        >>> p = torch.softmax(torch.tensor([0.1, 0.7]), dim=-1)
        >>> reference = torch.tensor([0.1, 0.7], dtype=torch.float64).softmax(-1)
        >>> max_error(p, reference) < 1e-7
        True
    """
    a = as_float_tensor(actual, "actual")
    b = as_float_tensor(expected, "expected", like=a)
    check_same_device(b, "expected", a, "actual")
    shape = broadcast_shapes(actual=a.shape, expected=b.shape)
    if math.prod(shape) == 0:
        return 0.0
    dtype = torch.promote_types(a.dtype, b.dtype)
    a, b = a.detach().to(dtype), b.detach().to(dtype)
    difference = torch.where(a == b, torch.zeros((), dtype=dtype, device=a.device), (a - b).abs())
    return difference.max().item()



def _plain(value):
    """Convert tensors/arrays/NumPy scalars to JSON-serialisable Python values."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return _plain(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def record(name: str, **numbers) -> Path:
    """Write a notebook's key numbers to ``$ATTNOPT_RESULTS_DIR/<name>.json`` (default ``./results``).

    Numbers recorded by earlier calls with the same ``name`` in the same run are kept and updated,
    so a notebook may record as it goes.  Tensors and NumPy values are written as numbers or
    lists; NaN and infinities (of any origin) as the strings ``"nan"``, ``"inf"``, ``"-inf"``.

    Args:
        name: a plain file stem such as the notebook's name (no path separator, not ``.``/``..``).
        **numbers: values made of numbers, strings, bools, ``None``, tensors, NumPy values, lists
            and dicts.

    Returns:
        The path written.

    Raises:
        TypeError: ``name`` not a string, or a value that cannot be written as JSON (named by its
            keyword); nothing is written then.
        ValueError: an empty ``name`` or one with a path separator; an existing results file that
            is not valid JSON.

    Examples:
        >>> import tempfile
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {RESULTS_ENV: tempfile.mkdtemp()}):
        ...     path = record("demo", error=2.5e-16, sizes=torch.tensor([4, 16]))
        >>> json.loads(path.read_text())
        {'error': 2.5e-16, 'sizes': [4, 16]}
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string (a plain file stem such as the notebook's name); got {type(name).__name__}")
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"name must be a plain file stem such as the notebook's name; got {name!r}")
    plain = {}
    for key, value in numbers.items():
        plain[key] = _plain(value)
        try:
            json.dumps(plain[key])
        except (TypeError, ValueError) as err:
            raise TypeError(f"{key}={type(value).__name__} cannot be recorded: record numbers, strings, "
                            f"tensors, arrays, lists or dicts of them ({err})") from err
    folder = Path(os.environ.get(RESULTS_ENV, "results"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError as err:
        raise ValueError(f"cannot update {path}: it is not valid JSON ({err}); delete it") from err
    data.update(plain)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def save_figure(fig, name: str):
    """Save ``fig`` for the book's theory pages, as ``$ATTNOPT_FIGURES_DIR/<name>.png``.

    The book's runner sets the folder; a page shows the figure with
    ``:::{figure} /figures/<name>.png``.  Outside the book (Colab, JupyterLab) nothing is written
    and None is returned, so a notebook may call it unconditionally.  The figure keeps the house
    style's size and resolution (:func:`attnopt.course.plotting.use_book_style`).

    Args:
        fig: a Matplotlib figure.
        name: a plain file stem such as ``"ch1-fig3"`` (letters, digits, ``-`` and ``_``).

    Returns:
        The path written, or None when ``$ATTNOPT_FIGURES_DIR`` is not set.

    Raises:
        TypeError: ``fig`` is not a Matplotlib figure.
        ValueError: ``name`` is not a plain file stem.

    Examples:
        Outside the book's build (no ``$ATTNOPT_FIGURES_DIR``) nothing is written:

        >>> import matplotlib.pyplot as plt
        >>> from unittest import mock
        >>> fig = plt.figure()
        >>> with mock.patch.dict(os.environ, {FIGURES_ENV: ""}):
        ...     print(save_figure(fig, "ch0-demo"))
        None
        >>> plt.close(fig)
    """
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure; got {type(fig).__name__}")
    path = _figure_path(name, ".png")
    if path is not None:
        fig.savefig(path)
        _save_phone_variant(fig, path, path.with_name(path.stem + ".phone.png"))
    return path


def _save_phone_variant(fig, drawn, phone: Path) -> Path | None:
    """Save ``fig``'s phone variant as ``phone`` when a phone would show the text of ``drawn`` (the
    desk figure's PNG: a path or a file object) under 8.5 px: the panels stacked 4 inches wide
    (:func:`attnopt.course.plotting.stacked_for_phone`).  The book's HTML offers it to narrow
    screens (``book/_ext/phone_figures.py``).  Returns the variant's path, or None."""
    from PIL import Image

    from .plotting import PHONE_MIN_TEXT_PX, phone_text_px, stacked_for_phone

    phone.unlink(missing_ok=True)  # a figure that no longer needs one must not keep a stale one
    with Image.open(drawn) as image:
        width, dpi = image.size[0], image.info.get("dpi", (fig.dpi,))[0]
    if phone_text_px(width, dpi=dpi) >= PHONE_MIN_TEXT_PX:
        return None
    try:
        with stacked_for_phone(fig):
            fig.savefig(phone)
    except Exception as err:  # a figure that cannot be laid out again keeps its desk form
        phone.unlink(missing_ok=True)
        warnings.warn(f"no phone variant for {phone.name}: {err}", RuntimeWarning, stacklevel=3)
        return None
    return phone


def _phone_variants_of_outputs() -> None:
    """In the book's build, give every figure a notebook displays its phone variant.

    A notebook's page in the book shows its figure outputs, which ``myst-nb`` writes as
    ``_images/<sha256 of the PNG>.png``.  Inside IPython with ``$ATTNOPT_FIGURES_DIR`` set (the
    book's runner), the inline backend's PNG formatter is wrapped: after it draws a figure, the
    figure's phone variant (:func:`_save_phone_variant`'s rule) is saved as
    ``$ATTNOPT_FIGURES_DIR/outputs/<sha256 of the PNG drawn>.png``, which
    ``book/_ext/phone_figures.py`` finds by the output's file name.  Elsewhere nothing changes."""
    folder = os.environ.get(FIGURES_ENV)
    if not folder:
        return
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    formatter = shell.display_formatter.formatters["image/png"]
    try:
        draw = formatter.lookup_by_type(Figure)
    except KeyError:
        return
    if getattr(draw, "phone_variants", False):
        return

    def draw_with_phone_variant(fig, *args, **kwargs):
        data = draw(fig, *args, **kwargs)
        raw = base64.b64decode(data) if isinstance(data, str) else data
        if isinstance(raw, bytes) and raw:
            path = Path(folder) / "outputs" / f"{hashlib.sha256(raw).hexdigest()}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            _save_phone_variant(fig, io.BytesIO(raw), path)
        return data

    draw_with_phone_variant.phone_variants = True
    formatter.for_type(Figure, draw_with_phone_variant)


def _figure_path(name: str, suffix: str) -> Path | None:
    """``$ATTNOPT_FIGURES_DIR/<name><suffix>`` (its folder made), or None outside the book's build;
    ``name`` must be a plain file stem."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"name must be a plain file stem of letters, digits, '-' and '_'; got {name!r}")
    folder = os.environ.get(FIGURES_ENV)
    if not folder:
        return None
    path = Path(folder) / f"{name}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save_page_explorer(explorer, name: str):
    """Save a page explorer for the book's theory pages, next to the figures of :func:`save_figure`.

    Writes ``$ATTNOPT_FIGURES_DIR/<name>.html`` (the explorer's HTML, see
    :mod:`attnopt.course.page_explorer`) and ``<name>.png`` (its default state as a still, for builders
    other than HTML).  A page shows them as a numbered figure with the book's directive
    ``:::{explorer-figure} /figures/<name>`` (``book/_ext/explorer_figure.py``), which takes
    ``:name:``, ``:alt:`` and a caption like ``{figure}``.  Outside the book (Colab, JupyterLab)
    nothing is written and None is returned, so a notebook may call it unconditionally.

    Args:
        explorer: a :class:`attnopt.course.page_explorer.PageExplorer`.
        name: a plain file stem such as ``"ch1-fig3"`` (letters, digits, ``-`` and ``_``).

    Returns:
        The path of the HTML written, or None when ``$ATTNOPT_FIGURES_DIR`` is not set.

    Raises:
        TypeError: ``explorer`` is not a PageExplorer.
        ValueError: ``name`` is not a plain file stem.

    Examples:
        Outside the book's build (no ``$ATTNOPT_FIGURES_DIR``) nothing is written:

        >>> from unittest import mock
        >>> from attnopt.page_explorer import Frame, Slider, page_explorer
        >>> def draw(fig, x):
        ...     fig.subplots().plot([0, 1], [0, x])
        ...     return Frame({"x": x}, f"a line rising to {x}")
        >>> explorer = page_explorer([Slider("x", [1.0, 2.0], label="x")],
        ...                          draw, label="a line", figsize=(2, 1))
        >>> with mock.patch.dict(os.environ, {FIGURES_ENV: ""}):
        ...     print(save_page_explorer(explorer, "ch0-demo"))
        None
    """
    import io

    from .page_explorer import PageExplorer

    if not isinstance(explorer, PageExplorer):
        raise TypeError(f"explorer must be a PageExplorer (attnopt.page_explorer); got {type(explorer).__name__}")
    path = _figure_path(name, ".html")
    if path is None:
        return None
    from PIL import Image

    path.write_text(explorer.html + "\n", encoding="utf-8")
    Image.open(io.BytesIO(explorer.images[explorer.default])).save(path.with_suffix(".png"), format="PNG")
    return path


def _cell(value, digits: int) -> str:
    value = _plain(value)
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return ", ".join(_cell(v, digits) for v in value)
    return str(value).replace("|", "\\|")


def markdown_table(rows, columns=None, *, digits: int = 3):
    """A table of results for a notebook to display: Markdown, so Jupyter, Colab and the book draw a table.

    Args:
        rows: a list of dicts (their keys, in first-seen order, are the columns) or of sequences
            (then ``columns`` names them).  Values may be numbers, tensors, strings or lists.
        columns: column headers (required for rows that are sequences; selects and orders the
            columns of dict rows).
        digits: significant digits of floating-point numbers.

    Returns:
        An ``IPython.display.Markdown`` object (the last expression of a cell displays it).

    Raises:
        TypeError: rows that are neither dicts nor sequences, ``digits`` not an int.
        ValueError: sequence rows without ``columns``, or of another length.
        ImportError: IPython is not installed (``pip install "attnopt[notebook]"``).

    Examples:
        >>> rows = [{"n": 4, "ratio": 2.4817}, {"n": 16, "ratio": 3.8}]
        >>> print(markdown_table(rows).data)
        | n | ratio |
        |---:|---:|
        | 4 | 2.48 |
        | 16 | 3.8 |
    """
    Markdown = require("IPython.display", "attnopt.book.markdown_table").Markdown

    digits = check_int(digits, "digits")
    rows = list(rows)
    if columns is None:
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError("columns must be given when the rows are sequences")
        columns = list(dict.fromkeys(k for r in rows for k in r))
    columns = [str(c) for c in columns]
    body = []
    for r in rows:
        if isinstance(r, dict):
            cells = [r.get(c, "") for c in columns]
        elif isinstance(r, (list, tuple)):
            if len(r) != len(columns):
                raise ValueError(f"a row has {len(r)} values for {len(columns)} columns")
            cells = list(r)
        else:
            raise TypeError(f"rows must be dicts or sequences; got {type(r).__name__}")
        body.append("| " + " | ".join(_cell(v, digits) for v in cells) + " |")
    numeric = [all(isinstance(_plain(r.get(c) if isinstance(r, dict) else r[i]), (int, float)) for r in rows)
               for i, c in enumerate(columns)] if rows else [False] * len(columns)
    align = ["---:" if n else ":---" for n in numeric]
    text = "\n".join(["| " + " | ".join(columns) + " |", "|" + "|".join(align) + "|", *body])
    return Markdown(text)
