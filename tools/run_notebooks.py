"""Execute every notebook with papermill into the book's staging folder.

The book is built from a staging copy of the sources, ``_build/site/``: the pages, the
configuration, and the notebooks *as executed here* (never the committed, output-free ones).
Each notebook runs in a fresh kernel with its default parameters; its key numbers land in
``_build/results/<stem>.json`` through :func:`attnopt.course.book.record`.

Execution cache (local work only): a notebook whose content, library source and parameters are
unchanged since its last successful run is not executed again. ``--force`` or ``CI=true`` in the
environment disables the cache, so CI always executes from scratch.

Parallel runs: ``--jobs N`` notebooks run at a time, each in its own worker process and kernel
(default: one per CPU core, at most 4; ``ATTNOPT_NOTEBOOK_JOBS`` overrides the default). Every
kernel computes with ONE thread (``OMP_NUM_THREADS=1`` and friends, whatever ``--jobs`` is), so a
notebook's numbers do not depend on the machine or on how many run beside it, and two kernels do
not fight over the cores. The longest notebooks start first: the order is the wall times of the
last runs (``_build/results/_timings.json``), else the rough times in :data:`EXPECTED_SECONDS`.

CPU time: each notebook's kernel CPU time is recorded in ``_build/results/_timings.json`` with the
CPU time of a fixed PyTorch workload measured in the same run (tools/cpu_reference.py, before and
after the notebooks), so that the budget test compares what a notebook does on any machine.

Usage: python tools/run_notebooks.py [--force] [--jobs N] [--only STEM ...] [-p NAME VALUE ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import sys
import resource
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import cpu_reference  # noqa: E402  (tools/ is no package)
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
# One compute thread per kernel: set in the environment the kernels inherit, before torch (or
# NumPy's BLAS) starts in them.
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
# Rough wall times (s) of the longest notebooks on the 2-core machine, for ordering a fresh build
# that has no _timings.json yet: the longest start first, so that none of them starts last. A
# notebook not named here counts as short (10 s).
EXPECTED_SECONDS = {"ch4_vqa_attention_maps": 200, "ch4_multimodal": 46, "ch4_continuous_2d": 26,
                    "ch3_flash_kernel": 40, "ch1_fig4_pretrained": 15, "ch2_regularity": 13,
                    "ch3_two_sided": 13}


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


#: A notebook whose kernel takes more CPU seconds than this is followed, in its worker, by one run of
#: the reference workload, whose time then scales that notebook's (see tests/book/test_results.py):
#: taken under the load the notebook met, not only before and after all of them.
LONG_CPU_SECONDS = 60.0


def _children_cpu_seconds() -> float:
    """CPU time (user + system) of this process's finished children: the kernels it has shut down."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one(nb: Path, parameters: dict, force: bool) -> tuple[str, float, float, str | None, float | None]:
    """Execute one notebook (in a worker process): ``(status, wall seconds, kernel CPU seconds, error
    text or None, CPU seconds of the reference workload run right after it or None)``. The kernel's CPU time is what the notebook costs whatever else the machine runs:
    its one thread's wall time on a quiet machine, but not the time it waited for a busy core."""
    start, cpu = time.perf_counter(), _children_cpu_seconds()
    try:
        status, error = execute(nb, parameters, force), None
    except Exception as err:  # report every failing notebook, then fail
        status, error = "FAILED", f"{type(err).__name__}: {err}"
    seconds, cpu = time.perf_counter() - start, _children_cpu_seconds() - cpu
    after = None
    if status == "executed" and cpu > LONG_CPU_SECONDS:
        # how fast the machine runs the reference workload now, beside what ran beside this notebook
        after = cpu_reference.measure(repeat=1)
    return status, seconds, cpu, error, after


def longest_first(notebooks: list[Path], timings: dict) -> list[Path]:
    """The notebooks, longest (last recorded wall time, else the rough guess) first."""
    def expected(nb: Path) -> float:
        recorded = timings.get(nb.stem, {}).get("seconds")
        return float(recorded) if recorded is not None else float(EXPECTED_SECONDS.get(nb.stem, 10))

    return sorted(notebooks, key=lambda nb: (-expected(nb), nb.name))


def default_jobs() -> int:
    if os.environ.get("ATTNOPT_NOTEBOOK_JOBS"):
        return max(1, int(os.environ["ATTNOPT_NOTEBOOK_JOBS"]))
    return max(1, min(4, os.cpu_count() or 1))


def _worker(conn, nb: Path, parameters: dict, force: bool) -> None:
    try:
        conn.send(run_one(nb, parameters, force))
    finally:
        conn.close()


def run_all(notebooks: list[Path], parameters: dict, force: bool, jobs: int) -> tuple[dict, list]:
    """Run the notebooks in order, ``jobs`` at a time; print each as it ends. ``(results, failures)``.

    Each notebook runs in a forked worker process (it inherits this module's paths and the
    environment as they are now; nothing is pickled but the result), which starts the kernel.
    """
    results, failures = {}, []

    def report(nb, status, seconds, cpu_seconds, error, reference_after):
        results[nb.stem] = (status, seconds, cpu_seconds, reference_after)
        if error is not None:
            failures.append((nb.name, error))
        cpu = f"  (kernel CPU {cpu_seconds:6.1f} s)" if status == "executed" else ""
        print(f"{nb.name:48s} {status:9s} {seconds:7.1f} s{cpu}", flush=True)

    if jobs == 1:
        for nb in notebooks:
            report(nb, *run_one(nb, parameters, force))
        return results, failures
    context = multiprocessing.get_context("fork")
    pending, running = list(notebooks), {}
    while pending or running:
        while pending and len(running) < jobs:
            nb = pending.pop(0)
            receive, send = context.Pipe(duplex=False)
            worker = context.Process(target=_worker, args=(send, nb, parameters, force), daemon=True)
            worker.start()
            send.close()
            running[receive] = (worker, nb, time.perf_counter())
        for receive in multiprocessing.connection.wait(list(running)):
            worker, nb, start = running.pop(receive)
            try:
                outcome = receive.recv()
            except EOFError:  # the worker process itself died
                worker.join()
                outcome = ("FAILED", time.perf_counter() - start, 0.0, f"its worker process died (exit code {worker.exitcode})", None)
            receive.close()
            worker.join()
            report(nb, *outcome)
    return results, failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="ignore the execution cache")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help="notebooks run at a time (default: the CPU cores, at most 4)")
    parser.add_argument("--only", nargs="*", default=None, help="notebook stems to run (default: all)")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), help="override a parameter (JSON value)")
    args = parser.parse_args(argv)
    force = args.force or os.environ.get("CI", "").lower() in {"1", "true", "yes"}
    jobs = default_jobs() if args.jobs is None else args.jobs
    if jobs < 1:
        parser.error("--jobs must be at least 1")
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
    os.environ.update(ONE_THREAD)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stage_sources()
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.only:
        notebooks = [nb for nb in notebooks if nb.stem in set(args.only)]
    total = time.perf_counter()
    timings_file = RESULTS / "_timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    reference = [cpu_reference.measure(repeat=2)]  # this machine's speed, now and after the notebooks
    results, failures = run_all(longest_first(notebooks, timings), parameters, force, jobs)
    if any(status == "executed" for status, *_ in results.values()):
        reference.append(cpu_reference.measure(repeat=2))
    for stem, (status, seconds, cpu_seconds, after) in results.items():
        if status == "executed":  # the last real execution's times, for the time budget test
            # a long notebook is scaled by the reference run right after it, under the load it met
            # (the larger of the two: a quiet moment can only make the reference faster)
            ref = min(reference) if after is None else max(after, min(reference))
            timings[stem] = {"seconds": round(seconds, 1), "kernel_cpu_seconds": round(cpu_seconds, 1),
                             "reference_cpu_seconds": round(ref, 3), "parameters": parameters}
    timings_file.write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n")
    print(f"{len(notebooks)} notebook(s) in {time.perf_counter() - total:.1f} s ({jobs} at a time, one thread each)")
    for name, err in sorted(failures):
        print(f"\n--- {name} failed ---\n{err}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
