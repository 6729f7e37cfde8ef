"""Run every assignment's hidden checks on the instructor's solutions under many course secrets.

The hidden checks draw their inputs from the course secret, so a correct solution must pass them
whatever the secret is: a check that fails one key in a few hundred (a tolerance too tight for an
ill-conditioned draw, an iteration that diverges on a rare input) would cost a whole class its
points in one course out of a few hundred. This script stages the assignments in a temporary
course directory, runs each source notebook's cells (the solutions and the visible checks) once,
then calls each task's hidden checks under the secrets ``sweep/0``, ``sweep/1``, ... and reports,
per task, how many secrets failed and the first failure's feedback. The secrets are fixed, so a
failure can be reproduced with ``ATTNOPT_COURSE_SECRET=sweep/<i>``. It does this for the public
notebooks (variant 0 of every task) and again for each variant a course may draw
(``assignments/variants/``), with that variant's solution.

Run it after changing ``assignments/grading/hidden_checks.py`` or a task (about 0.7 s per secret
for all twenty tasks on a laptop CPU; ``tests/assignments/test_checks.py`` runs 20 secrets):

    python tools/sweep_hidden_checks.py --secrets 1000            # every task
    python tools/sweep_hidden_checks.py --secrets 1000 newton_dual  # one task

It exits with status 1 if any secret failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HIDDEN_CALL = re.compile(r'hidden_checks\("(\w+)", globals\(\)\)')


_spec = importlib.util.spec_from_file_location("assignments_tool", ROOT / "tools" / "assignments.py")
assignments_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(assignments_tool)  # stage() and assignment_names(), loaded once


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def solution_namespaces(course: Path, tasks: set[str] | None = None):
    """Yield ``(assignment, task, namespace)``: the namespace of the instructor's notebook run up to
    and including the task's test cell (whose hidden checks run there once, under the staged secret).
    A notebook with none of ``tasks`` is not run."""
    for name in assignments_tool.assignment_names(course):
        for path in sorted((course / "source" / name).glob("*.ipynb")):
            cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
            calls = [HIDDEN_CALL.search(_source(c)) for c in cells]
            if tasks is not None and not tasks & {call[1] for call in calls if call}:
                continue
            namespace: dict = {"__name__": "__main__"}
            for cell, call in zip(cells, calls):
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(_source(cell), f"<{path.stem}>", "exec"), namespace)
                if call and (tasks is None or call[1] in tasks):
                    yield name, call[1], namespace


def variant_choice(variant: int) -> tuple[str | dict, set[str] | None]:
    """What to stage for ``variant`` (0: the public notebooks) and the tasks that have it."""
    if variant == 0:
        return "public", None
    choice = {name: {task: variant for task, variants in assignments_tool.task_variants(name).items() if len(variants) >= variant}
              for name in assignments_tool.assignment_names()}
    return choice, {task for picks in choice.values() for task in picks}


def max_variant() -> int:
    return max((len(v) for name in assignments_tool.assignment_names()
                for v in assignments_tool.task_variants(name).values()), default=0)


def sweep(n_secrets: int, tasks: set[str] | None = None, course: Path | None = None,
          variant: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Task -> the secrets (and the feedback) on which the solution fails its hidden checks, for the
    tasks' ``variant`` (0: the public notebooks; above, only the tasks that have that variant)."""
    choice, varied = variant_choice(variant)
    if varied is not None:
        tasks = varied if tasks is None else tasks & varied
    sys.path.insert(0, str(ROOT / "assignments" / "grading"))
    import coursework

    saved = {k: os.environ.get(k) for k in ("ATTNOPT_COURSE_DIR", "ATTNOPT_COURSE_SECRET")}
    failures: dict[str, list[tuple[str, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        course = course or Path(tmp) / "course"
        assignments_tool.stage(course, choice)
        os.environ["ATTNOPT_COURSE_DIR"] = str(course)
        os.environ["ATTNOPT_COURSE_SECRET"] = "sweep/staged"
        try:
            for _, task, namespace in solution_namespaces(course, tasks):
                failures[task] = []
                for i in range(n_secrets):
                    secret = os.environ["ATTNOPT_COURSE_SECRET"] = f"sweep/{i}"
                    out = io.StringIO()
                    with contextlib.redirect_stdout(out):
                        try:
                            coursework.hidden_checks(task, namespace)
                        except AssertionError:
                            failures[task].append((secret, out.getvalue()))
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="*", help="task names of hidden_checks.py (default: all)")
    parser.add_argument("--secrets", type=int, default=200, help="secrets per task (default 200)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    failures = {}
    for variant in range(max_variant() + 1):
        found = sweep(args.secrets, set(args.tasks) or None, variant=variant)
        failures |= {(task if variant == 0 else f"{task} (variant {variant})"): f for task, f in found.items()}
    missing = set(args.tasks) - {task.split(" (")[0] for task in failures}
    if missing:
        print(f"no test cell calls the hidden checks of: {', '.join(sorted(missing))}")
        return 2
    for task, failed in failures.items():
        print(f"{task}: {len(failed)} of {args.secrets} secrets failed")
    for task, failed in failures.items():
        if failed:
            secret, feedback = failed[0]
            print(f"\n{task}, ATTNOPT_COURSE_SECRET={secret}:\n{feedback.strip()}")
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
