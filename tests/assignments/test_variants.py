"""The tasks' variants (``assignments/variants/``): what a course draws from its secret.

The public solutions in this repository solve variant 0 of every task, which no course draws. Each
variant a course may draw must be solvable (its solution passes its visible checks and its hidden
checks, here and under 20 secrets), and a copy of the public solutions, pasted as it is or with its
function renamed to the variant's, must fail every varied task, so that it scores at most half of an
assignment's autograded points whatever the secret (``test_nbgrader.py`` grades such a copy through
nbgrader under a fresh secret); and the solution of the variant a course did not draw fails the one
it drew.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "assignments" / "grading"))
_spec = importlib.util.spec_from_file_location("assignments_tool", ROOT / "tools" / "assignments.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)
_spec = importlib.util.spec_from_file_location("sweep_tool", ROOT / "tools" / "sweep_hidden_checks.py")
sweep_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep_tool)

VARIED = {name: tool.task_variants(name) for name in tool.assignment_names() if tool.task_variants(name)}
CASES = [(name, v) for name, tasks in VARIED.items() for v in range(1, max(len(t) for t in tasks.values()) + 1)]
HIDDEN_CALL = re.compile(r'hidden_checks\("(\w+)", globals\(\)\)')


def _text(cell) -> str:
    return "".join(cell["source"])


def staged(tmp_path, name: str, v: int) -> Path:
    """A course with every task of ``name`` that has a variant ``v`` set to it."""
    course = tmp_path / "course"
    tool.stage(course, {name: {task: v for task, variants in VARIED[name].items() if len(variants) >= v}})
    return course


def run(course: Path, name: str, monkeypatch, answers: dict[str, str] | None = None) -> dict[str, str | None]:
    """Run the course's source notebook of ``name`` in this process, with the hidden checks of the
    course; ``answers`` replace solution cells (by grade id). Test cell -> None, or why it failed."""
    monkeypatch.setenv("ATTNOPT_COURSE_DIR", str(course))
    monkeypatch.setenv("ATTNOPT_COURSE_SECRET", "variants/test")
    monkeypatch.chdir(course / "source" / name)
    notebook = json.loads(next((course / "source" / name).glob("*.ipynb")).read_text())
    namespace, outcome = {"__name__": "__main__"}, {}
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        gid = cell["metadata"]["nbgrader"]["grade_id"]
        code = (answers or {}).get(gid, _text(cell))
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"<{gid}>", "exec"), namespace)
        except Exception as error:  # noqa: BLE001  (a failing check, or a copy that does not even run)
            outcome[gid] = f"{type(error).__name__}: {error}"
        else:
            outcome[gid] = None
        outcome[gid + "/out"] = out.getvalue()
    return outcome


def public_answers(name: str) -> dict[str, str]:
    notebook = json.loads((ROOT / "assignments" / "source" / name / f"{name}.ipynb").read_text())
    return {c["metadata"]["nbgrader"]["grade_id"]: _text(c) for c in notebook["cells"]
            if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code"}


def test_a_course_never_draws_the_public_variant_and_draws_every_other():
    for name, tasks in VARIED.items():
        seen = {task: set() for task in tasks}
        for i in range(300):
            drawn = tool.draw_variants(f"term {i}", name)
            assert drawn == tool.draw_variants(f"term {i}", name)  # the same secret, the same variants
            for task, v in drawn.items():
                seen[task].add(v)
        assert seen == {task: set(range(1, len(v) + 1)) for task, v in tasks.items()}, (name, seen)


@pytest.mark.parametrize("name,v", CASES)
def test_each_variant_passes_its_visible_and_hidden_checks(tmp_path, monkeypatch, name, v):
    course = staged(tmp_path, name, v)
    outcome = run(course, name, monkeypatch)
    failed = {gid: why for gid, why in outcome.items() if not gid.endswith("/out") and why}
    assert not failed, failed
    notebook = json.loads(next((course / "source" / name).glob("*.ipynb")).read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code" and HIDDEN_CALL.search(_text(cell)):  # the hidden checks ran, and passed
            out = outcome[cell["metadata"]["nbgrader"]["grade_id"] + "/out"]
            assert "hidden check 1 (" in out and "failed" not in out, out
    record = json.loads((course / "grading" / "variants.json").read_text())
    assert {t: r["variant"] for t, r in record.items() if t in VARIED[name]} == \
        {t: v for t, vs in VARIED[name].items() if len(vs) >= v}


@pytest.mark.parametrize("renamed", [False, True], ids=["verbatim", "renamed"])
@pytest.mark.parametrize("name,v", CASES)
def test_a_copy_of_the_public_solution_fails_every_varied_task(tmp_path, monkeypatch, name, v, renamed):
    course = staged(tmp_path, name, v)
    answers = public_answers(name)
    notebook = json.loads(next((course / "source" / name).glob("*.ipynb")).read_text())
    if renamed:  # the copier renames the public function to the one the variant asks for
        for cell in notebook["cells"]:
            gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if gid in answers:
                wanted = re.search(r"^def (\w+)\(", _text(cell), re.M)[1]
                answers[gid] = re.sub(r"^def \w+\(", f"def {wanted}(", answers[gid], count=1, flags=re.M)
    outcome = run(course, name, monkeypatch, answers)
    points = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"] for c in notebook["cells"]
              if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "code"}
    varied = {task for task, variants in VARIED[name].items() if len(variants) >= v}
    for c in notebook["cells"]:
        gid = c["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in points and HIDDEN_CALL.search(_text(c))[1] in varied:
            assert outcome[gid], f"{gid}: the public solution passes variant {v}"
    scored = sum(p for gid, p in points.items() if outcome[gid] is None)
    assert scored <= sum(points.values()) / 2, (scored, outcome)


def test_every_variant_changes_the_task_text_and_its_solution():
    """A variant rewrites the task's text (what must be derived), and, for a task in code, its
    solution and its visible test; no two variants of a task are the same."""
    for name, tasks in VARIED.items():
        public = json.loads((ROOT / "assignments" / "source" / name / f"{name}.ipynb").read_text())
        for task, variants in tasks.items():
            rendered = [json.dumps(tool.render(json.loads(json.dumps(public)), [variant])) for variant in variants]
            assert len({json.dumps(public), *rendered}) == len(variants) + 1, task
            for variant in variants:
                keys = set(variant["cells"])
                assert any(k.startswith("task:") for k in keys), (task, variant["about"])
                assert task in keys or f"test_{task}" in keys or any(k.startswith("written_") for k in keys), task


def test_an_edit_that_no_longer_matches_stops_the_staging():
    public = json.loads((ROOT / "assignments" / "source" / "ch3_one_sided_eot" / "ch3_one_sided_eot.ipynb").read_text())
    stale = {"about": "a stale edit", "params": {}, "cells": {"intro": [("| 1 | a row that is not there |", "x")]}}
    with pytest.raises(ValueError, match="occurs 0 times"):
        tool.render(public, [stale])
    with pytest.raises(KeyError, match="no cell"):
        tool.render(public, [{"about": "a missing cell", "params": {}, "cells": {"task:99": "x"}}])


@pytest.mark.parametrize("v", range(1, sweep_tool.max_variant() + 1))
def test_the_variants_pass_their_hidden_checks_under_every_secret_of_a_sweep(v):
    failures = sweep_tool.sweep(20, variant=v)
    assert failures, "no task has this variant"
    failed = {task: f for task, f in failures.items() if f}
    assert not failed, "\n\n".join(f"{task}: {len(f)} of 20 secrets failed; {f[0][0]}:\n{f[0][1]}" for task, f in failed.items())


@pytest.mark.parametrize("name,v", [(name, v) for name, v in CASES if v <= 2])
def test_the_other_variants_solution_fails_too(tmp_path, monkeypatch, name, v):
    """A student who finds ``assignments/variants/`` but pastes the solution of the variant the course
    did not draw fails every task whose two variants differ (both are in the repository, so this is
    the copy a guess of the draw gives; the guide says a copy of the right one passes)."""
    other = 3 - v
    rendered = staged(tmp_path / "other", name, other)
    notebook = json.loads(next((rendered / "source" / name).glob("*.ipynb")).read_text())
    answers = {c["metadata"]["nbgrader"]["grade_id"]: _text(c) for c in notebook["cells"]
               if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code"}
    course = staged(tmp_path / "drawn", name, v)
    outcome = run(course, name, monkeypatch, answers)
    drawn = json.loads(next((course / "source" / name).glob("*.ipynb")).read_text())
    assert set(answers) <= {c["metadata"].get("nbgrader", {}).get("grade_id") for c in drawn["cells"]}
    both = {task for task, variants in VARIED[name].items() if len(variants) >= 2}
    checked = 0
    for c in drawn["cells"]:
        gid = c["metadata"].get("nbgrader", {}).get("grade_id")
        call = HIDDEN_CALL.search(_text(c)) if c["cell_type"] == "code" else None
        if call and call[1] in both:
            assert outcome[gid], f"{gid}: the solution of variant {other} passes variant {v}"
            checked += 1
    assert checked == len(both & {HIDDEN_CALL.search(_text(c))[1] for c in drawn["cells"]
                                  if c["cell_type"] == "code" and HIDDEN_CALL.search(_text(c))})
    assert checked >= 3, checked
