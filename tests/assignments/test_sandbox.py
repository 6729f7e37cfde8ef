"""Every trick that raised a score or touched a classmate's grade, planted in a submission and graded
through the real ``nbgrader autograde`` of the course's configuration (book/instructors.md).

Each cheater hands in the chapter 3 assignment with Task 4 answered honestly (2 points) and Tasks 1
to 3 faked by one trick: rewriting the grading files, reading and printing the course secret,
patching ``coursework`` in the kernel or handing in a tampered ``coursework.py``, overriding ``own``
and the checks in the notebook, loading a renamed copy
of the library, executing the instructor's source notebook, writing into another student's
submission and the gradebook, or reaching the network. Each must score exactly 2 (its faked tasks 0), the course's files must stay
byte for byte as they were, the secret must appear in no graded notebook, and the honest student
graded after them keeps 13 of 13. Needs bubblewrap (``apt-get install bubblewrap``); without a
working sandbox, autograde must refuse and say why, which is tested too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("assignments_tool", ROOT / "tools" / "assignments.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)
sys.path.insert(0, str(ROOT / "assignments" / "grading"))
import autograde_sandbox  # noqa: E402
import sandbox_worker  # noqa: E402

A = "ch3_one_sided_eot"
COURSE_ID = "attention-as-optimization"
FAKED = ("test_sparsemax_backward", "test_softmax_backward", "test_lse_hessian")
KERNEL_RACE = r"Address already in use|Kernel didn't respond"


def bwrap_works() -> bool:
    try:
        autograde_sandbox.Sandbox(None, None, timeout=120).close()
        return True
    except autograde_sandbox.SandboxUnavailable:
        return False


SANDBOX = bwrap_works()
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason="no working bubblewrap on this machine (apt-get install bubblewrap)")


def test_the_sandbox_works_where_it_is_required():
    """CI sets ATTNOPT_REQUIRE_SANDBOX=1 (.ci/run installs bubblewrap): there the attacks must run, not skip."""
    if os.environ.get("ATTNOPT_REQUIRE_SANDBOX") == "1":
        assert SANDBOX, "ATTNOPT_REQUIRE_SANDBOX=1, but bubblewrap does not work here (see autograde_sandbox.Sandbox)"

# Functions that return zeros of the right shape: what a cheater hands in for the faked tasks.
ZEROS = '''
def sparsemax_backward(p, upstream, tau=1.0):
    return torch.zeros_like(p)


def softmax_backward(p, upstream, tau=1.0):
    return torch.zeros_like(p)


def lse_hessian(scores, tau=1.0):
    return torch.zeros(*scores.shape, scores.shape[-1])
'''


def attacks(course: Path, library: Path, port: int) -> dict[str, str]:
    """Student id -> the code of a cell placed after the setup cell (the course's absolute path and
    the library's are given to the cheaters: the worst case, a student who knows the machine)."""
    course, grading, secret_file = str(course), str(course / "grading"), str(course / "course_secret")
    return {
        "a-rewrite-grading": ZEROS + f'''
import os
for target in ({grading!r} + "/hidden_checks.py", "../../../grading/hidden_checks.py",
               {grading!r} + "/coursework.py", "coursework.py"):
    try:
        with open(target, "w") as fh:
            fh.write("def check_close(*a, **k): pass\\ndef check(*a, **k): pass\\ndef check_shape(*a, **k): pass\\n"
                     "def own(f, ns=None): return f\\ndef hidden_checks(*a): pass\\n")
    except OSError as e:
        print("could not write", target, e)
''',
        "b-read-secret": ZEROS + f'''
import os
for path in ({secret_file!r}, "../../../course_secret"):
    try:
        print("SECRET:", open(path).read())
    except OSError as e:
        print("no secret at", path, e)
print("ENV:", os.environ.get("ATTNOPT_COURSE_SECRET"))
''',
        "c-patch-coursework": ZEROS + '''
import coursework
coursework.check_close = coursework.check = coursework.check_shape = lambda *a, **k: None
coursework.own = lambda f, ns=None: f
coursework.hidden_checks = lambda *a, **k: None
import sys
sys.modules["coursework"] = coursework
print("coursework patched in", coursework.__file__)
''',
        "d-override-own": ZEROS + '''
own = lambda f, ns=None: f
check_close = check = check_shape = lambda *a, **k: None
hidden_checks = lambda *a, **k: None
print("own overridden")
''',
        # the checks' helpers handed in tampered (TAMPERED below), nothing else faked in the notebook
        "i-tampered-coursework-file": ZEROS,
        "e-renamed-library": f'''
import importlib.util, sys
sys.path.insert(0, {str(library.parent)!r})
lib = None
for name, path in (("lib_copy", {str(library / "transforms" / "geometry.py")!r}), ("lib_copy2", "/work/main/src/attnopt/transforms/geometry.py")):
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        lib = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(lib)
        break
    except Exception as e:
        print("no copy at", path, e)


def sparsemax_backward(p, upstream, tau=1.0):
    import attnopt.transforms
    return torch.zeros_like(p)


def softmax_backward(p, upstream, tau=1.0):
    return lib.advantage_gradient(p, upstream, tau)


def lse_hessian(scores, tau=1.0):
    return lib.fisher_information(torch.softmax(scores / tau, dim=-1)) / tau
''',
        "f-instructor-source": f'''
import json
for path in ({course!r} + "/source/{A}/{A}.ipynb", "../../../source/{A}/{A}.ipynb"):
    try:
        nb = json.load(open(path))
        for cell in nb["cells"]:
            if cell["metadata"].get("nbgrader", {{}}).get("solution") and cell["cell_type"] == "code":
                exec("".join(cell["source"]), globals())
        break
    except OSError as e:
        print("no source at", path, e)
''' + ZEROS.replace("def ", "def _unused_"),
        "g-other-submissions": ZEROS + f'''
import glob, os
for path in glob.glob({course!r} + "/submitted/*/{A}/*.ipynb") + glob.glob("../../*/{A}/*.ipynb") + [
        {course!r} + "/gradebook.db", {course!r} + "/nbgrader_config.py"]:
    try:
        with open(path, "w") as fh:
            fh.write("overwritten")
    except OSError as e:
        print("could not write", path, e)
''',
        "h-network": ZEROS + f'''
import socket
try:
    with socket.create_connection(("127.0.0.1", {port}), timeout=3) as s:
        s.sendall(b"LEAKED")
except OSError as e:
    print("no network:", e)
''',
    }


#: A ``coursework.py`` whose checks pass everything: handed in by ``i-tampered-coursework-file`` (a
#: submission through the exchange carries the release's files, which a student may edit).
TAMPERED = ("def check_close(*a, **k): pass\ndef check(*a, **k): pass\ndef check_shape(*a, **k): pass\n"
            "def own(f, ns=None): return f\ndef hidden_checks(*a, **k): pass\n")


def snapshot(course: Path) -> dict[str, str]:
    """sha256 of every file of the course but nbgrader's own outputs (autograded/, the gradebook, logs)."""
    skip = ("autograded", "feedback", "gradebook.db", ".nbgrader.log", "grades.csv")
    return {str(p.relative_to(course)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(course.rglob("*"))
            if p.is_file() and not str(p.relative_to(course)).startswith(skip)}


def hand_in(course: Path, student: str, cells: dict[str, str]) -> None:
    nb = json.loads((course / "release" / A / f"{A}.ipynb").read_text())
    source = json.loads((course / "source" / A / f"{A}.ipynb").read_text())
    solutions = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in source["cells"]
                 if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code"}
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in cells:
            cell["source"] = cells[gid]
        elif gid == "eot_value":
            cell["source"] = solutions["eot_value"]
    dest = course / "submitted" / student / A
    dest.mkdir(parents=True)
    (dest / f"{A}.ipynb").write_text(json.dumps(nb, indent=1))
    # the release's other files come back with the notebook, as `nbgrader submit` hands them in
    for path in (course / "release" / A).iterdir():
        if path.is_file() and path.suffix != ".ipynb":
            (dest / path.name).write_bytes(path.read_bytes())
    if student == "i-tampered-coursework-file":
        (dest / "coursework.py").write_text(TAMPERED)


def autograde(course: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [*tool.nbgrader_command(), "autograde", A, *extra]
    run = subprocess.run(command, cwd=course, env=tool.nbgrader_env(), capture_output=True, text=True)
    if run.returncode and re.search(KERNEL_RACE, run.stderr):
        run = subprocess.run(command, cwd=course, env=tool.nbgrader_env(), capture_output=True, text=True)
    return run


def scores(course: Path, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID) as gb:
        nb = gb.find_submission_notebook(A, A, student)
        return {g.name: g.auto_score for g in nb.grades if g.auto_score is not None}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    import attnopt

    course = tmp_path_factory.mktemp("sandbox-course")
    tool.stage(course, "public")  # the tricks replace the public variant's functions
    tool.generate(course, quiet=True)
    received = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)

    def listen():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                received.append(conn.recv(100))
            except OSError:
                pass

    stop = threading.Event()
    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    planted = attacks(course, Path(attnopt.__file__).parent, server.getsockname()[1])
    for student, code in planted.items():
        solution_cells = {"sparsemax_backward": code, "softmax_backward": "", "lse_hessian": ""}
        hand_in(course, student, solution_cells)
    source = json.loads((course / "source" / A / f"{A}.ipynb").read_text())
    hand_in(course, "z-honest", {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in source["cells"]
                                 if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code"})
    before = snapshot(course)
    run = autograde(course)
    stop.set()
    thread.join()
    server.close()
    return course, run, before, received, list(planted)


@needs_sandbox
def test_autograde_runs_every_submission(graded):
    course, run, _, _, students = graded
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]
    for student in [*students, "z-honest"]:
        assert (course / "autograded" / student / A / f"{A}.ipynb").exists(), student


@needs_sandbox
@pytest.mark.parametrize("student", list(attacks(Path("/c"), Path("/l"), 0)))
def test_a_trick_scores_nothing_for_what_it_faked(graded, student):
    got = scores(graded[0], student)
    assert {gid: got[gid] for gid in FAKED} == dict.fromkeys(FAKED, 0.0), got
    assert got["test_eot_value"] == 2.0, got  # the honest task still counts: the sandbox is not a blanket zero


@needs_sandbox
def test_the_honest_student_graded_after_them_keeps_full_marks(graded):
    got = scores(graded[0], "z-honest")
    assert sum(got.values()) == 13.0, got  # Tasks 1 to 4 and 7; the two written answers wait for a grader


@needs_sandbox
def test_the_course_files_are_unchanged(graded):
    course, _, before, _, _ = graded
    assert snapshot(course) == before


@needs_sandbox
def test_the_secret_reaches_no_graded_notebook(graded):
    course = graded[0]
    secret = (course / "course_secret").read_text().strip()
    for path in (course / "autograded").rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    text = (course / "autograded" / "b-read-secret" / A / f"{A}.ipynb").read_text()
    assert "no secret at" in text and "ENV: None" in text, text[-2000:]


@needs_sandbox
def test_no_byte_leaves_through_the_network(graded):
    course, _, _, received, _ = graded
    assert received == []
    assert "no network" in (course / "autograded" / "h-network" / A / f"{A}.ipynb").read_text()


@needs_sandbox
def test_the_tricks_in_the_kernel_ran(graded):
    """The patches of ``coursework`` and ``own`` really ran in the student's kernel (so they failed
    because the checks run elsewhere, not because an import failed before the trick), and a tampered
    ``coursework.py`` handed in was replaced by the instructor's before grading."""
    autograded = graded[0] / "autograded"
    assert "coursework patched in" in (autograded / "c-patch-coursework" / A / f"{A}.ipynb").read_text()
    assert "own overridden" in (autograded / "d-override-own" / A / f"{A}.ipynb").read_text()
    tampered = autograded / "i-tampered-coursework-file" / A / "coursework.py"
    assert tampered.read_bytes() == (graded[0] / "source" / A / "coursework.py").read_bytes()


@needs_sandbox
def test_the_library_is_absent_not_just_blocked(graded):
    text = (graded[0] / "autograded" / "e-renamed-library" / A / f"{A}.ipynb").read_text()
    assert "no copy at" in text and "the course library is not available while your notebook is graded" in text


def test_without_a_sandbox_autograde_refuses_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(autograde_sandbox.shutil, "which", lambda name: None)
    with pytest.raises(autograde_sandbox.SandboxUnavailable) as error:
        autograde_sandbox.Sandbox(None, None)
    message = str(error.value)
    assert "bubblewrap" in message and "allow_unsandboxed = True" in message and "course secret" in message


def test_the_wire_format_carries_data_only():
    import numpy as np
    import torch

    value = ({"a": torch.arange(6.0).reshape(2, 3), "b": [1, 2.5, float("inf"), None, True]},
             np.ones(2), torch.zeros(0, 3), 2**70)
    header, blobs = sandbox_worker.encode(value)
    json.dumps(header, allow_nan=False)  # strict JSON: no NaN or Infinity literals
    back = sandbox_worker.decode(json.loads(json.dumps(header)), blobs)
    assert torch.equal(back[0]["a"], value[0]["a"]) and back[0]["b"] == value[0]["b"] and back[3] == 2**70
    assert isinstance(back[1], np.ndarray) and back[2].shape == (0, 3)

    class Evil:
        def __reduce__(self):
            return (print, ("pickled",))

    for bad in (Evil(), lambda: 0, object(), torch.zeros(2, dtype=torch.complex128)):
        with pytest.raises(sandbox_worker.ProtocolError):
            sandbox_worker.encode(bad)
    for forged in ({"__t": "tensor", "dtype": "float64", "shape": [4], "blob": 0},  # 8 bytes for 4 numbers
                   {"__t": "tensor", "dtype": "object", "shape": [1], "blob": 0},
                   {"__t": "pickle", "v": "gASVAAAAAAAAAAA="}, {"__t": "float", "v": "1e400"}):
        with pytest.raises(sandbox_worker.ProtocolError):
            sandbox_worker.decode(forged, [b"\0" * 8])


@needs_sandbox
def test_gradients_flow_through_a_sandboxed_call_and_errors_name_the_students_line():
    import torch

    sandbox = autograde_sandbox.Sandbox(None, None, timeout=120)
    try:
        reply, _ = sandbox.request({"op": "exec", "cell": 1, "code": (
            "import torch\n"
            "def f(x, w=2.0):\n    return (w * x).exp(), {'s': x.sum()}\n"
            "def g(x):\n    y = x + 1\n    return y / 0 if x.shape[0] > 2 else y[5]\n")})
        assert reply["names"] == {"torch": "value", "f": "callable", "g": "callable"}, reply
        x = torch.randn(4, dtype=torch.float64, requires_grad=True)
        out, extra = autograde_sandbox.StudentFunction(sandbox, "f")(x, w=3.0)
        (grad,) = torch.autograd.grad((out * torch.arange(4.0)).sum() + extra["s"], x)
        assert torch.allclose(grad, 3 * (3 * x).exp() * torch.arange(4.0) + 1, atol=1e-12, rtol=0)
        with pytest.raises(autograde_sandbox.SandboxError) as error:
            autograde_sandbox.StudentFunction(sandbox, "g")(torch.zeros(2))
        assert error.value.ename == "IndexError" and error.value.frames[-1][2] == "return y / 0 if x.shape[0] > 2 else y[5]"
    finally:
        sandbox.close()


@needs_sandbox
def test_only_the_gradebooks_own_cells_run_as_checks(graded):
    """A cell runs in the grader only if its grade id is the gradebook's and its text is the gradebook's,
    word for word, once: forged metadata, an edited locked cell or a second copy run in the sandbox."""
    import nbformat

    course = graded[0]
    nb = nbformat.read(course / "source" / A / f"{A}.ipynb", as_version=4)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    forged = lambda source, **meta: nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
        "grade": False, "locked": True, "solution": False, "schema_version": 3, **meta}})
    cells = [by_id["setup"], forged("open('x', 'w')", grade_id="setup"), forged("pass", grade_id="my_check"),
             by_id["test_eot_value"], by_id["test_eot_value"], forged(by_id["test_lse_hessian"].source + "\npass",
                                                                       grade_id="test_lse_hessian", grade=True, points=2),
             by_id["eot_value"]]
    nb.cells = cells
    resources = {"nbgrader": {"db_url": f"sqlite:///{course / 'gradebook.db'}", "notebook": A, "assignment": A}}
    assert autograde_sandbox._trusted_cells(nb, resources) == {0: "setup", 3: "test"}


def test_the_explicit_override_grades_without_isolation_but_still_without_the_library():
    import torch

    with pytest.raises(autograde_sandbox.SandboxUnavailable):
        autograde_sandbox.Sandbox(None, None, kind="none")
    sandbox = autograde_sandbox.Sandbox(None, None, kind="none", allow_unsandboxed=True, timeout=120)
    try:
        assert sandbox.kind == "none"
        reply, _ = sandbox.request({"op": "exec", "cell": 1, "code": (
            "import torch\ndef f(x):\n    return 2 * x\ntry:\n    import attnopt\nexcept ImportError as e:\n    print(e)\n")})
        assert "not available while your notebook is graded" in reply["output"]
        assert torch.equal(autograde_sandbox.StudentFunction(sandbox, "f")(torch.ones(2)), torch.full((2,), 2.0))
    finally:
        sandbox.close()


def test_a_student_name_never_replaces_a_builtin_or_a_checks_name():
    namespace = {"check_close": "the course's", "f": "the test cell's"}
    values: set = set()
    names = {"abs": "callable", "isinstance": "callable", "len": "value", "__builtins__": "value", "check_close": "callable",
             "f": "callable", "eot_value": "callable", "n_keys": "value", "not an identifier": "callable", 3: "callable"}
    autograde_sandbox.bind_student_names(namespace, names, {"check_close", "f"}, values, sandbox=None)
    assert namespace["check_close"] == "the course's" and namespace["f"] == "the test cell's"
    assert isinstance(namespace.pop("eot_value"), autograde_sandbox.StudentFunction)
    assert set(namespace) == {"check_close", "f"} and values == {"n_keys"}


@needs_sandbox
def test_the_instructors_files_are_private(graded):
    """On a shared machine students have accounts: only the instructor reads the secret, the checks,
    the solutions, the gradebook and the submissions; the release stays readable."""
    course = graded[0]
    for name in tool.PRIVATE:
        mode = (course / name).stat().st_mode & 0o777
        assert mode & 0o077 == 0, f"{name}: mode {mode:o}"
    assert (course / "release").stat().st_mode & 0o005 == 0o005


def test_hidden_checks_fail_closed_when_autograde_runs_them_in_the_submissions_kernel(monkeypatch):
    """If nbgrader_config.py did not load, nbgrader would run the notebook in a kernel the student
    controls: the hidden checks then fail for everyone instead of passing for a cheater."""
    import coursework

    monkeypatch.setattr(coursework, "GRADING_COURSE", None)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError, match="without the course's sandbox"):
        coursework.hidden_checks("eot_value", {})


@needs_sandbox
def test_eight_megabytes_each_way_and_a_call_past_its_time_limit_stops_the_sandbox():
    import torch

    sandbox = autograde_sandbox.Sandbox(None, None, timeout=120)
    try:
        sandbox.request({"op": "exec", "cell": 1, "code": (
            "import time\ndef double(x):\n    return 2 * x\ndef slow(x):\n    time.sleep(30)\n    return x\n")})
        x = torch.randn(1000, 1000, dtype=torch.float64)
        assert torch.equal(autograde_sandbox.StudentFunction(sandbox, "double")(x), 2 * x)
        sandbox.timeout = 2
        with pytest.raises(autograde_sandbox.SandboxError, match="more than 2 s") as error:
            autograde_sandbox.StudentFunction(sandbox, "slow")(x)
        assert error.value.ename == "CellTimeoutError"
        with pytest.raises(autograde_sandbox.SandboxError, match="stopped earlier"):
            autograde_sandbox.StudentFunction(sandbox, "double")(x)
    finally:
        sandbox.close()
