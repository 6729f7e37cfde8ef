"""The instructor's guide's commands, run as written through nbgrader's CLI, for two students.

One assignment (chapter 3) goes through the whole cycle in a fresh course directory made by
``tools/assignments.py``: ``release_assignment``; the first student (this machine's user, as on a
JupyterHub) runs ``fetch_assignment``, answers every task correctly and runs ``submit``, and the
instructor runs ``collect``; the second student hands in through a learning platform, whose download
``zip_collect`` reads. Their answers are wrong in the ways students get them wrong: a function that
only works for the visible test's shape (caught by a hidden check), a forgotten 1/tau, a call to the
library through an alias imported outside the function. Then ``autograde`` (no warning),
``generate_feedback``, ``release_feedback`` and ``fetch_feedback``, ``export``. Scores come from
``grades.csv``; the wrong student's feedback must say what to fix and must not show hidden code.
"""

from __future__ import annotations

import csv
import getpass
import html
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("assignments_tool", ROOT / "tools" / "assignments.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

A = "ch3_one_sided_eot"
COURSE_ID = "attention-as-optimization"
LMS_STUDENT = "s0002"
KERNEL_RACE = r"Address already in use|Kernel didn't respond"

WRONG = {  # grade id of the solution cell -> the wrong student's cell
    "sparsemax_backward": '''
def sparsemax_backward(p, upstream, tau=1.0):
    """Tuned until the visible test passed."""
    if p.shape[-1] != 9:
        return torch.zeros_like(p)
    support = (p > 0).to(p.dtype)
    mean = (support * upstream).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
    return support * (upstream - mean) / tau
''',
    "softmax_backward": '''
def softmax_backward(p, upstream, tau=1.0):
    return p * (upstream - (p * upstream).sum(-1, keepdim=True))
''',
    "lse_hessian": '''
from attnopt.geometry import fisher_information as fi


def lse_hessian(scores, tau=1.0):
    return fi(torch.softmax(scores / tau, dim=-1)) / tau
''',
}


AUTOGRADE_FLAGS = tool.autograde_flags()  # [] where bubblewrap works (CI installs it)


def nbgrader(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    flags = AUTOGRADE_FLAGS if args[0] == "autograde" else []
    run = subprocess.run([*tool.nbgrader_command(), *args, *flags], cwd=cwd, env=tool.nbgrader_env(), capture_output=True, text=True)
    if check:
        assert run.returncode == 0, f"nbgrader {' '.join(args)}:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    return run


def answer(notebook: Path, cells: dict[str, str]) -> None:
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in cells:
            cell["source"] = cells[gid].strip("\n")
    notebook.write_text(json.dumps(nb, indent=1))


@pytest.fixture(scope="module")
def cycle(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    # the public variant of every task: the wrong answers above are wrong for it (test_nbgrader.py
    # grades the variants a course draws from its secret)
    tool.stage(course, "public")
    tool.generate(course, quiet=True)
    student = getpass.getuser()
    exchange = ["--course", COURSE_ID, f"--Exchange.root={course / 'exchange'}"]
    logs = {}

    nbgrader("release_assignment", A, cwd=course)
    home = tmp_path_factory.mktemp("student-home")
    nbgrader("fetch_assignment", A, *exchange, cwd=home)
    fetched = home / A / f"{A}.ipynb"
    source = json.loads((course / "source" / A / f"{A}.ipynb").read_text())
    answer(fetched, {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in source["cells"]
                     if c["metadata"].get("nbgrader", {}).get("solution")})
    nbgrader("submit", A, *exchange, cwd=home)
    logs["collect"] = nbgrader("collect", A, cwd=course)

    download = course / "downloaded" / A / "extracted"
    download.mkdir(parents=True)
    wrong = download / f"{LMS_STUDENT}_attempt_2026-10-01_{A}.ipynb"
    shutil.copy(course / "release" / A / f"{A}.ipynb", wrong)
    answer(wrong, WRONG | {"eot_value": next("".join(c["source"]) for c in source["cells"]
                                                  if c["metadata"].get("nbgrader", {}).get("grade_id") == "eot_value")})
    logs["zip_collect"] = nbgrader("zip_collect", A, cwd=course)

    logs["autograde"] = nbgrader("autograde", A, cwd=course, check=False)
    if logs["autograde"].returncode and re.search(KERNEL_RACE, logs["autograde"].stderr):
        # another process took the kernel's port: as the guide says, run autograde again
        logs["autograde"] = nbgrader("autograde", A, cwd=course, check=False)
    assert logs["autograde"].returncode == 0, logs["autograde"].stderr[-5000:]
    logs["generate_feedback"] = nbgrader("generate_feedback", A, cwd=course)
    logs["release_feedback"] = nbgrader("release_feedback", A, cwd=course)
    logs["fetch_feedback"] = nbgrader("fetch_feedback", A, *exchange, cwd=home)
    logs["export"] = nbgrader("export", cwd=course)
    return course, home, student, logs


def test_collected_both_ways(cycle):
    course, _, student, _ = cycle
    assert (course / "submitted" / student / A / f"{A}.ipynb").exists()
    assert (course / "submitted" / LMS_STUDENT / A / f"{A}.ipynb").exists()


def test_autograde_does_not_warn(cycle):
    log = cycle[3]["autograde"]
    assert "[AutogradeApp | WARNING]" not in log.stdout + log.stderr, (log.stdout + log.stderr)[-3000:]


def test_scores(cycle):
    course, _, student, _ = cycle
    with open(course / "grades.csv") as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh) if row["assignment"] == A}
    # 13 autograded points (Tasks 1 to 4 and 7); the two written answers (2 + 2) wait for a grader
    assert float(rows[student]["raw_score"]) == 13.0 and float(rows[student]["max_score"]) == 17.0
    assert float(rows[LMS_STUDENT]["raw_score"]) == 2.0  # Task 4 only


def feedback_text(course: Path, student: str) -> str:
    page = (course / "feedback" / student / A / f"{A}.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_feedback_says_what_to_fix_and_hides_the_hidden_checks(cycle):
    course = cycle[0]
    text = feedback_text(course, LMS_STUDENT)
    # Task 1: passes the visible test, fails a hidden check, named with what it found
    assert re.search(r"hidden check 1 \(a \(5, 3, 12\) batch of scores .*?\): d loss / d scores: expected tensor of shape \(5, 3, 12\)", text), text[:3000]
    # Task 2: the forgotten 1/tau
    assert "the chain rule through s / tau brings a factor 1/tau" in text
    # Task 3: the library through an alias: absent from the sandbox the submission runs in
    assert "LibraryBlocked" in text and "the course library is not available while your notebook is graded" in text
    # the hidden checks' code is not in the feedback, only their labels and results
    hidden_code = "".join(path.read_text() for path in (ROOT / "assignments" / "grading").glob("*_checks*.py"))
    for line in hidden_code.splitlines():
        if line.strip().startswith(("check_close(", "f, g = h.student", "lib = ", "with h.case(")) and len(line.strip()) > 25:
            assert line.strip() not in text, line
    assert "def sparsemax_backward(h)" not in text and "h.case(" not in text


def test_released_feedback_reaches_the_exchange_student(cycle):
    _, home, _, logs = cycle
    assert list((home / A / "feedback").glob(f"*/{A}.html")), logs["fetch_feedback"].stderr[-2000:]
    assert LMS_STUDENT in logs["release_feedback"].stderr  # skipped, with a message
