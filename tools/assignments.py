"""Make the student (release) versions of the nbgrader assignments.

``assignments/`` is an nbgrader course directory holding only what is written by hand: the
source notebooks (``source/<assignment>/<notebook>.ipynb``, with solutions), ``grading/`` (the
checks' helpers ``coursework.py`` and the hidden checks ``hidden_checks.py``) and
``nbgrader_config.py``. This script copies them into a course directory under the build folder
(``_build/assignments`` for ``make assignments``): ``coursework.py`` next to every source notebook
(so that it ships with the release and autograde restores it over a student's copy),
``hidden_checks.py`` to ``<course>/grading/`` (never released). It writes a random course secret to
``<course>/course_secret`` unless one is there or ``ATTNOPT_COURSE_SECRET`` is set: the hidden
checks draw their inputs from it, so keep that file (or the variable) for the whole term. From the
secret it also draws a variant of each task listed in ``assignments/variants/<assignment>.py``
(never variant 0, the public notebook) and writes the course's source notebooks with them, recording
the draw in ``<course>/grading/variants.json`` for the hidden checks. Then it runs
``nbgrader generate_assignment`` for every assignment, so that nothing generated lands in git.
What nbgrader keeps in that course directory (``gradebook.db``, ``submitted/``, ``autograded/``,
``feedback/``, ``exchange/``) is left in place, so the same directory can be used to collect and
grade a class.

Usage: python tools/assignments.py [COURSE_DIR]   (default: $ATTNOPT_BUILD_DIR/assignments)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "assignments"
VARIANTS = SOURCE / "variants"  # the variants of each task a course draws from its secret (never in a release)
# grading/ of the course directory: the hidden checks, the checks' helpers as the grader imports
# them, and the sandboxed autograde step (with the worker it runs in the sandbox)
GRADING_FILES = ("hidden_checks.py", "coursework.py", "autograde_sandbox.py", "sandbox_worker.py")
VARIANT_CHECKS = "variant_checks_*.py"  # the hidden checks of the tasks' variants, one file per assignment
PRIVATE = ("course_secret", "grading", "source", "gradebook.db", "submitted", "autograded", "feedback", "downloaded")
PRIVATE_FOLDERS = ("submitted", "autograded", "feedback", "downloaded")


def nbgrader_command() -> list[str]:
    """The nbgrader of the environment running this script (the venv's, under make)."""
    exe = Path(sys.executable).with_name("nbgrader")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "nbgrader"]


def nbgrader_env() -> dict[str, str]:
    """The environment with this interpreter's bin folder first on PATH: nbgrader runs ``alembic``
    (to check its database schema) and ``python`` kernels from PATH, so an environment that is not
    activated would otherwise fail or use another Python."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def sandbox_available() -> bool:
    """Whether autograde's sandbox (bubblewrap) works on this machine: it starts one and stops it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("autograde_sandbox", SOURCE / "grading" / "autograde_sandbox.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.Sandbox(None, None, timeout=120).close()
        return True
    except module.SandboxUnavailable:
        return False


def autograde_flags() -> list[str]:
    """Flags for ``nbgrader autograde`` in the tests: none where the sandbox works; elsewhere (a
    machine without bubblewrap) the explicit override, so that the honest and mistaken submissions'
    scores are still tested; the attacks need the sandbox and are skipped there."""
    return [] if sandbox_available() else ["--SandboxedExecute.allow_unsandboxed=True"]


def assignment_names(course: Path = SOURCE) -> list[str]:
    return sorted(p.name for p in (course / "source").iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


# ----------------------------------------------------------------------------- variants of the tasks


def task_variants(name: str) -> dict[str, list[dict]]:
    """Task -> its variants 1, 2, ... (``assignments/variants/<name>.py``; variant 0 is the source notebook)."""
    path = VARIANTS / f"{name}.py"
    if not path.exists():
        return {}
    spec = importlib.util.spec_from_file_location(f"variants_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VARIANTS


def draw_variants(secret: str, name: str) -> dict[str, int]:
    """The variant of each task of ``name`` that the course with this secret sets: never 0, the public
    one, whose solution is in this repository; each task's draw is independent of the others'."""
    drawn = {}
    for task, variants in task_variants(name).items():
        digest = hashlib.sha256(f"{secret}/variant/{name}/{task}".encode()).digest()
        drawn[task] = 1 + int.from_bytes(digest[:8], "little") % len(variants)
    return drawn


def _cell_key(cell: dict) -> str | None:
    gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
    if gid:
        return gid
    text = "".join(cell["source"])
    if cell["cell_type"] == "markdown" and text.startswith("## Task "):
        return "task:" + text.split()[2]
    return None


def render(notebook: dict, variants: list[dict]) -> dict:
    """The notebook with each of ``variants`` applied to its cells (see ``assignments/variants/``)."""
    cells = {}
    for cell in notebook["cells"]:
        key = _cell_key(cell)
        if key is not None:
            cells[key] = cell
    for variant in variants:
        for key, edit in variant["cells"].items():
            if key not in cells:
                raise KeyError(f"variant {variant['about']!r}: the notebook has no cell {key!r}")
            text = "".join(cells[key]["source"])
            if isinstance(edit, str):
                text = edit
            else:
                for old, new in edit:
                    if text.count(old) != 1:
                        raise ValueError(f"variant {variant['about']!r}: {old!r} occurs {text.count(old)} times in {key!r}")
                    text = text.replace(old, new)
            cells[key]["source"] = text.splitlines(keepends=True)
    return notebook


def read_secret(course: Path) -> str:
    """The course secret as the hidden checks read it: $ATTNOPT_COURSE_SECRET, else ``course_secret``."""
    if os.environ.get("ATTNOPT_COURSE_SECRET"):
        return os.environ["ATTNOPT_COURSE_SECRET"].strip()
    return (course / "course_secret").read_text().strip().splitlines()[0]


def set_variants(course: Path, choice: str | dict[str, dict[str, int]] = "secret") -> dict[str, dict[str, int]]:
    """Render the course's source notebooks for the chosen variants and record them for the hidden checks.

    ``choice`` is ``"secret"`` (what a course does: drawn from its secret), ``"public"`` (variant 0
    everywhere, the notebooks of this repository) or ``{assignment: {task: variant}}``. The record,
    ``<course>/grading/variants.json``, maps each task to its variant and the variant's parameters.
    """
    record, chosen = {}, {}
    for name in assignment_names(course):
        variants = task_variants(name)
        if choice == "secret":
            picks = draw_variants(read_secret(course), name)
        elif choice == "public":
            picks = dict.fromkeys(variants, 0)
        else:
            picks = {task: choice.get(name, {}).get(task, 0) for task in variants}
        path = next((course / "source" / name).glob("*.ipynb"))
        notebook = json.loads((SOURCE / "source" / name / path.name).read_text())
        applied = [variants[task][i - 1] for task, i in picks.items() if i]
        path.write_text(json.dumps(render(notebook, applied), indent=1, ensure_ascii=False) + "\n")
        chosen[name] = picks
        for task, i in picks.items():
            record[task] = {"variant": i, "params": variants[task][i - 1]["params"] if i else {}}
    (course / "grading" / "variants.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return chosen


def stage(course: Path, variants: str | dict[str, dict[str, int]] = "secret") -> None:
    """Copy the sources, the checks and the configuration into ``course``, replacing older copies,
    with the tasks' variants drawn from the course secret (see :func:`set_variants` for ``variants``)."""
    course.mkdir(parents=True, exist_ok=True)
    if (course / "source").exists():
        shutil.rmtree(course / "source")
    shutil.copytree(SOURCE / "source", course / "source", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for name in assignment_names(course):
        shutil.copy2(SOURCE / "grading" / "coursework.py", course / "source" / name / "coursework.py")
    (course / "grading").mkdir(exist_ok=True)
    for path in [SOURCE / "grading" / name for name in GRADING_FILES] + sorted((SOURCE / "grading").glob(VARIANT_CHECKS)):
        shutil.copy2(path, course / "grading" / path.name)
    shutil.copy2(SOURCE / "nbgrader_config.py", course / "nbgrader_config.py")
    secret = course / "course_secret"
    if not os.environ.get("ATTNOPT_COURSE_SECRET") and not secret.exists():
        secret.write_text(secrets.token_hex(16) + "\n")
    set_variants(course, variants)
    private(course)


def private(course: Path) -> None:
    """Only the instructor may read the secret, the checks, the solutions and the grades: on a shared
    machine (a JupyterHub) students have accounts of their own. What students need (release/,
    exchange/) keeps its permissions."""
    for name in PRIVATE:
        path = course / name
        if name in PRIVATE_FOLDERS:  # made now, so that what nbgrader writes into them is private from the start
            path.mkdir(exist_ok=True)
        if path.exists():
            path.chmod(0o700 if path.is_dir() else 0o600)


def generate(course: Path, quiet: bool = False) -> dict[str, Path]:
    """Run ``nbgrader generate_assignment`` on every assignment; return the release folders.

    One nbgrader run does them all (the assignment argument is a glob; its start-up is most of
    the time an assignment takes); it also records each assignment, with its tests and points,
    in the course's ``gradebook.db``.
    """
    course = course.resolve()
    names = assignment_names(course)
    for stale in (course / "release").glob("*"):  # releases of assignments that were removed
        if stale.is_dir() and stale.name not in names:
            shutil.rmtree(stale)
    subprocess.run(
        [*nbgrader_command(), "generate_assignment", "*", "--force", f"--CourseDirectory.root={course}"]
        + (["--log-level=WARN"] if quiet else []),
        cwd=course,
        env=nbgrader_env(),
        check=True,
    )
    private(course)  # the gradebook is new after the first run
    return {name: course / "release" / name for name in names}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ROOT / os.environ.get("ATTNOPT_BUILD_DIR", "_build") / "assignments"
    parser.add_argument("course", nargs="?", type=Path, default=default, help="course directory to (re)generate")
    args = parser.parse_args(argv)
    stage(args.course)
    released = generate(args.course)
    print()
    for name, path in released.items():
        notebooks = ", ".join(sorted(p.name for p in path.glob("*.ipynb")))
        print(f"{name}: {path.resolve()} ({notebooks})")
    print(f"\nThe release versions are in {(args.course / 'release').resolve()}")


if __name__ == "__main__":
    main()
