"""Execute every notebook with papermill into the book's staging folder.

The book is built from a staging copy of the sources, ``_build/site/``: the pages, the
configuration, and the notebooks *as executed here* (never the committed, output-free ones).
Each notebook runs in a fresh kernel with its default parameters; its key numbers land in
``_build/results/<stem>.json`` through :func:`attnopt.book.record`.

Execution cache (local work only): a notebook whose content, library source and parameters are
unchanged since its last successful run is not executed again. ``--force`` or ``CI=true`` in the
environment disables the cache, so CI always executes from scratch.

Usage: python tools/run_notebooks.py [--force] [--only STEM ...] [-p NAME VALUE ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# ATTNOPT_BUILD_DIR lets several builds (e.g. one per chapter being written) live side by side.
BUILD = (ROOT / os.environ.get("ATTNOPT_BUILD_DIR", "_build")).resolve()
SITE = BUILD / "site"
RESULTS = BUILD / "results"
# Figures a notebook saves for the theory pages (attnopt.book.save_figure); pages include them as
# /figures/<name>.png, so they live in the book's source folder, outside book/ (re-staged each run).
FIGURES = SITE / "figures"
CACHE = BUILD / "cache"
# Cells with these tags are run but not shown in the rendered book.  The parameters cell is shown:
# the reader is told to edit it, and the cells below use its names.
HIDDEN_TAGS = {"injected-parameters", "colab-setup"}


def library_digest() -> str:
    h = hashlib.sha256()
    for path in sorted((ROOT / "src").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def stage_sources() -> None:
    """Copy the book's pages and configuration next to the executed notebooks."""
    SITE.mkdir(parents=True, exist_ok=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, SITE / name)
    if (SITE / "book").exists():
        shutil.rmtree(SITE / "book")
    shutil.copytree(ROOT / "book", SITE / "book", ignore=shutil.ignore_patterns("__pycache__"))
    # Notebooks deleted from the repository must not linger in the staged book.
    wanted = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    for stale in (SITE / "notebooks").glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()


def hide_setup_cells(path: Path) -> None:
    """Tag the injected-parameter and Colab-setup cells so that the book does not render them."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if HIDDEN_TAGS & set(tags) and "remove-cell" not in tags:
            tags.append("remove-cell")
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def execute(nb: Path, parameters: dict, force: bool) -> str:
    import papermill

    out = SITE / "notebooks" / nb.name
    key_file = CACHE / f"{nb.stem}.key"
    key = hashlib.sha256(
        nb.read_bytes() + library_digest().encode() + json.dumps(parameters, sort_keys=True).encode()
    ).hexdigest()
    result = RESULTS / f"{nb.stem}.json"
    if not force and out.exists() and result.exists() and key_file.exists() and key_file.read_text() == key:
        return "cached"
    key_file.unlink(missing_ok=True)
    result.unlink(missing_ok=True)  # a stale record must never pass for a fresh one
    out.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(
        str(nb),
        str(out),
        parameters=parameters,
        kernel_name="python3",
        cwd=str(nb.parent),
        progress_bar=False,
        request_save_on_cell_execute=False,
    )
    hide_setup_cells(out)
    if not result.exists():
        raise RuntimeError(f"{nb.name} ran but recorded no results (expected {result})")
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(key)
    return "executed"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="ignore the execution cache")
    parser.add_argument("--only", nargs="*", default=None, help="notebook stems to run (default: all)")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), help="override a parameter (JSON value)")
    args = parser.parse_args(argv)
    force = args.force or os.environ.get("CI", "").lower() in {"1", "true", "yes"}
    parameters = {}
    for name, value in args.p:
        try:
            parameters[name] = json.loads(value)
        except json.JSONDecodeError:
            parameters[name] = value

    os.environ["ATTNOPT_RESULTS_DIR"] = str(RESULTS)
    os.environ["ATTNOPT_FIGURES_DIR"] = str(FIGURES)
    FIGURES.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # Progress bars (attnopt.widgets.progress) are for readers running a notebook, not for the book.
    os.environ.setdefault("TQDM_DISABLE", "1")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stage_sources()
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.only:
        notebooks = [nb for nb in notebooks if nb.stem in set(args.only)]
    failures = []
    total = time.perf_counter()
    timings_file = RESULTS / "_timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    for nb in notebooks:
        start = time.perf_counter()
        try:
            status = execute(nb, parameters, force)
        except Exception as err:  # report every failing notebook, then fail
            status = "FAILED"
            failures.append((nb.name, err))
        seconds = time.perf_counter() - start
        if status == "executed":  # wall time of the last real execution, for the time budget test
            timings[nb.stem] = {"seconds": round(seconds, 1), "parameters": parameters}
        print(f"{nb.name:48s} {status:9s} {seconds:7.1f} s", flush=True)
    timings_file.write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n")
    print(f"{len(notebooks)} notebook(s) in {time.perf_counter() - total:.1f} s")
    for name, err in failures:
        print(f"\n--- {name} failed ---\n{err}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
