"""Autograding in which no submission can raise its own score, read what it should not, or touch anyone else's.

``nbgrader autograde`` normally runs a submission's notebook, checks included, in one Jupyter
kernel started as the instructor: the student's code can then rewrite the checks, read the course
secret, or patch ``coursework`` so that every check passes. The course's ``nbgrader_config.py``
replaces nbgrader's ``Execute`` step by :class:`SandboxedExecute`, which splits the notebook in two:

* **the student's cells** run in a separate process, ``sandbox_worker.py``, inside a sandbox
  (:func:`detect_sandbox`): bubblewrap with no network, a private ``/tmp``, the submission's own
  files copied to a scratch directory (the only place it may write), read-only system and Python
  folders, and nothing of the course directory (secret, ``grading/``, ``source/``, gradebook, other
  submissions) nor the library ``attnopt``, which is absent, so no import, alias or copy of it runs;
* **the locked cells**, checked against the gradebook's copy word for word, run here, in the
  grader's process: the setup cell (also in the sandbox, which needs its imports and dtype) and the
  test cells, visible and hidden checks alike. The student's functions appear in the test cells'
  namespace as :class:`StudentFunction` proxies: a call sends its arguments to the sandbox, which
  calls the function there and sends back the result as data only (JSON and raw tensor bytes, see
  ``sandbox_worker.py``; never pickle). Gradients flow through a call (:class:`_RemoteCall`), so a
  check may differentiate a student's function.

A test cell's score is decided by what happens here: nothing a submission does to its own process
changes it. Where no sandbox works, grading stops with the reason, unless the course sets
``c.SandboxedExecute.allow_unsandboxed = True`` (for submissions you trust): then the student's
cells run in a plain child process, with the library blocked but the files of this machine open.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sandbox_worker as wire  # noqa: E402  (the message format, shared with the sandbox)

WORKER = HERE / "sandbox_worker.py"
SCRATCH = "/submission"  # where the sandbox sees its scratch directory


class SandboxError(Exception):
    """An error raised by the student's code in the sandbox (its type is ``ename``)."""

    def __init__(self, ename: str, evalue: str, frames=()):
        super().__init__(evalue)
        self.ename, self.evalue, self.frames = ename, evalue, [tuple(f) for f in frames]

    def __str__(self):
        return self.evalue


class SandboxUnavailable(RuntimeError):
    """No sandbox works on this machine, and running unsandboxed was not allowed."""


# ------------------------------------------------------------------------------------ the sandbox


def library_paths() -> list[str]:
    """Where this machine's ``attnopt`` lives (to hide it from the sandbox if a bound folder holds it)."""
    import importlib.util

    spec = importlib.util.find_spec("attnopt")
    if spec is None:
        return []
    return [os.path.realpath(p) for p in (spec.submodule_search_locations or [os.path.dirname(spec.origin)])]


def _within(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def bwrap_command(python: str, scratch: str, course: str | None) -> list[str]:
    """The bubblewrap command line that runs the worker: what the sandbox sees and what it does not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (`bwrap`) is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", "65534", "--gid", "65534", "--clearenv",
            # an empty /tmp first: the binds below go on top of it, so an environment that lives
            # under /tmp (a CI checkout, a throwaway venv) is still there, and nothing else of /tmp
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    roots = []
    for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            roots.append(path)
    # the interpreter and its packages: the environment (a venv) and the Python it was made from; the
    # interpreter is named by its folder's real path (a linked venv folder is not in the sandbox), and
    # not resolved itself, so that it still finds its venv's pyvenv.cfg
    python = os.path.join(os.path.realpath(os.path.dirname(python)), os.path.basename(python))
    prefix = os.path.dirname(os.path.dirname(python))
    for path in sorted({prefix, os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}):
        if not any(_within(path, r) for r in roots):
            args += ["--ro-bind", path, path]
            roots.append(path)
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"):
        args += ["--ro-bind-try", path, path]
    if course is not None:
        for root in roots:
            if _within(course, root):
                raise SandboxUnavailable(f"the course directory {course} lies inside {root}, which the sandbox must "
                                         "read (the Python environment): move the course directory elsewhere")
    for path in library_paths():  # an attnopt installed inside a folder the sandbox reads: hide it
        if any(_within(path, r) for r in roots):
            args += ["--tmpfs", path]
    args += ["--bind", scratch, SCRATCH, "--chdir", SCRATCH,
             "--ro-bind", str(WORKER), "/grader/sandbox_worker.py",
             "--setenv", "HOME", SCRATCH, "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "OMP_NUM_THREADS", "1",
             "--setenv", "MPLBACKEND", "Agg",
             python, "-I", "-B", "/grader/sandbox_worker.py"]
    return args


def unsandboxed_command(python: str) -> list[str]:
    return [python, "-I", "-B", str(WORKER)]


class Sandbox:
    """One submission's sandboxed worker: ``request`` sends a message and waits for the reply."""

    def __init__(self, files_from: Path | None, course: Path | None, kind: str = "auto",
                 allow_unsandboxed: bool = False, python: str = sys.executable, timeout: float = 60.0):
        self.timeout = timeout
        self.scratch = tempfile.mkdtemp(prefix="attnopt-grading-")
        os.chmod(self.scratch, 0o700)
        if files_from is not None:  # the submission's own files (regular files only; no links)
            for path in Path(files_from).iterdir():
                if path.is_file() and not path.is_symlink():
                    shutil.copyfile(path, Path(self.scratch) / path.name)
        self.kind, reasons = None, []
        kinds = ["bwrap"] if kind in ("auto", "bwrap") else []
        for candidate in kinds:
            try:
                self._start(bwrap_command(python, self.scratch, str(course) if course else None), cwd=None)
                self.kind = candidate
                break
            except SandboxUnavailable as exc:
                reasons.append(str(exc))
        if self.kind is None:
            if not allow_unsandboxed:
                self.close()
                raise SandboxUnavailable(
                    "no sandbox to run the submission's code in: " + "; ".join(reasons or [f"sandbox = {kind!r}"])
                    + ". Grading untrusted code without one would let it read the course secret and the hidden "
                    "checks and rewrite other students' grades, so autograde stops. Install bubblewrap, or, for "
                    "submissions you trust, set c.SandboxedExecute.allow_unsandboxed = True in nbgrader_config.py.")
            self._start(unsandboxed_command(python), cwd=self.scratch, isolated=False)
            self.kind = "none"

    def _start(self, command: list[str], cwd, isolated: bool = True) -> None:
        env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": self.scratch, "MPLBACKEND": "Agg"}
        self.errors = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                        cwd=cwd, env=env, start_new_session=True)
        try:
            reply, _ = self.request({"op": "hello"}, timeout=max(self.timeout, 120.0))
        except SandboxError as exc:
            self.errors.seek(0)
            detail = self.errors.read().decode(errors="replace").strip()[-2000:]
            self.process.kill()
            raise SandboxUnavailable(f"{command[0]} could not start the grading process ({exc}; {detail})") from None
        if isolated and reply.get("library_found") is not False:
            self.kill()
            raise SandboxUnavailable("the course library attnopt is importable inside the sandbox; refusing to grade")

    def request(self, header: dict, blobs=(), timeout: float | None = None) -> tuple[dict, list[bytes]]:
        if self.process is None or self.process.poll() is not None:
            raise SandboxError("SandboxStopped", "the grading process of your notebook stopped earlier "
                               "(a cell ran past its time limit, or your code ended the process)")
        deadline = time.monotonic() + (timeout or self.timeout)
        fd, fd_in = self.process.stdout.fileno(), self.process.stdin.fileno()
        os.set_blocking(fd_in, False)  # a worker that stops reading must not block the grader forever

        def read(n):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            return os.read(fd, n)

        def write(view):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd_in], [], left)[1]:
                raise TimeoutError
            return os.write(fd_in, view[:65536])

        try:
            wire.write_message(fd_in, header, blobs, write)
            reply, reply_blobs = wire.read_message(read)
        except TimeoutError:
            self.kill()
            raise SandboxError("CellTimeoutError", f"your code ran for more than {timeout or self.timeout:g} s "
                               "(the time limit of a cell) and was stopped") from None
        except (EOFError, BrokenPipeError, OSError, ValueError, RecursionError, wire.ProtocolError) as exc:
            self.kill()
            raise SandboxError("SandboxStopped", f"the grading process of your notebook stopped ({type(exc).__name__})") from None
        if not isinstance(reply, dict):
            self.kill()
            raise SandboxError("SandboxStopped", "the grading process sent a malformed reply")
        return reply, reply_blobs

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
            self.process.wait()

    def close(self) -> None:
        process = getattr(self, "process", None)
        if process is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
            process.stdout.close()
        if getattr(self, "errors", None) is not None:
            self.errors.close()
        self.process = None
        shutil.rmtree(self.scratch, ignore_errors=True)


def _raise(reply: dict) -> None:
    error = reply.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise SandboxError("SandboxStopped", "malformed error")
        raise SandboxError(str(error.get("ename", "Error"))[:100], str(error.get("evalue", "")),
                           [f for f in error.get("frames", []) if isinstance(f, list) and len(f) == 3])


# -------------------------------------------------------------------- the student's functions, here


class StudentFunction:
    """A function the student defined in the sandbox; calling it calls it there, on copies of the arguments."""

    __sandboxed__ = True

    def __init__(self, sandbox: Sandbox, name: str):
        self._sandbox, self.__name__, self.__qualname__ = sandbox, name, name
        self.__doc__ = f"the student's `{name}`, run in the sandbox"

    def __repr__(self):
        return f"<the student's function {self.__name__}>"

    def __call__(self, *args, **kwargs):
        import torch

        inputs = [t for t in wire._tensors((args, kwargs)) if t.requires_grad] if torch.is_grad_enabled() else []
        if not inputs:
            return self._call(args, kwargs, set())[0]
        box = {}
        outputs = _RemoteCall.apply(self, args, kwargs, box, *inputs)
        return box["rebuild"](outputs)

    def _call(self, args, kwargs, grad_ids):
        header_args, blobs = wire.encode(args, grad_ids)
        header_kwargs, more = wire.encode(kwargs, grad_ids)
        shift = len(blobs)
        header_kwargs = _shift_blobs(header_kwargs, shift)
        reply, reply_blobs = self._sandbox.request(
            {"op": "call", "name": self.__name__, "args": header_args, "kwargs": header_kwargs}, [*blobs, *more])
        _raise(reply)
        grad_outputs = []

        def collect(t, node):
            if node.get("requires_grad"):
                grad_outputs.append(t)
            return t

        try:
            result = wire.decode(reply.get("result"), reply_blobs, collect)
        except (wire.ProtocolError, TypeError, ValueError, KeyError, RecursionError) as exc:
            raise SandboxError("ProtocolError", f"your function's result cannot be read: {exc}") from None
        return result, reply.get("call_id"), grad_outputs


def _shift_blobs(tree, shift):
    if isinstance(tree, list):
        return [_shift_blobs(v, shift) for v in tree]
    if isinstance(tree, dict):
        if tree.get("__t") in ("tensor", "ndarray"):
            return dict(tree, blob=tree["blob"] + shift)
        return {k: _shift_blobs(v, shift) for k, v in tree.items()}
    return tree


def _import_torch_function():
    import torch

    class _RemoteCall(torch.autograd.Function):
        """A call of a student's function as one node of the grader's autograd graph: the backward
        pass asks the sandbox for the vector-Jacobian product of the same call."""

        @staticmethod
        def forward(ctx, fn, args, kwargs, box, *inputs):
            result, call_id, grad_outputs = fn._call(args, kwargs, {id(t) for t in inputs})
            ctx.fn, ctx.call_id, ctx.n_inputs = fn, call_id, len(inputs)
            ctx.shapes = [(t.shape, t.dtype) for t in grad_outputs]
            order = {id(t): i for i, t in enumerate(grad_outputs)}

            def rebuild(outputs):
                def sub(x):
                    if isinstance(x, torch.Tensor) and id(x) in order:
                        return outputs[order[id(x)]]
                    if isinstance(x, tuple):
                        return tuple(sub(v) for v in x)
                    if isinstance(x, list):
                        return [sub(v) for v in x]
                    if isinstance(x, dict):
                        return {k: sub(v) for k, v in x.items()}
                    return x
                return sub(result)

            box["rebuild"] = rebuild
            if not grad_outputs:  # nothing depends on the inputs: autograd still needs one output
                return torch.zeros(())
            return tuple(grad_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            none = (None, None, None, None)
            if ctx.call_id is None:
                return (*none, *([None] * ctx.n_inputs))
            grads = [torch.zeros(s, dtype=d) if g is None else g for g, (s, d) in zip(grads, ctx.shapes)]
            tree, blobs = wire.encode(grads)
            reply, reply_blobs = ctx.fn._sandbox.request({"op": "backward", "call_id": ctx.call_id, "grads": tree}, blobs)
            _raise(reply)
            found = wire.decode(reply.get("grads"), reply_blobs)
            if not isinstance(found, list) or len(found) != ctx.n_inputs or not all(isinstance(t, torch.Tensor) for t in found):
                raise SandboxError("ProtocolError", "malformed gradient")
            return (*none, *found)

    return _RemoteCall


class _Lazy:
    def __getattr__(self, name):
        global _RemoteCall
        _RemoteCall = _import_torch_function()
        return getattr(_RemoteCall, name)


_RemoteCall = _Lazy()


# --------------------------------------------------------------------------- running a notebook


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _trusted_cells(nb, resources) -> dict[int, str]:
    """Index -> ``"setup"`` or ``"test"`` for the cells whose source is the gradebook's word for word."""
    meta = resources.get("nbgrader", {})
    if not meta.get("db_url"):
        return {}
    from nbgrader.api import Gradebook, MissingEntry

    trusted, seen = {}, set()
    with Gradebook(meta["db_url"]) as gb:
        for i, cell in enumerate(nb.cells):
            info = cell.metadata.get("nbgrader", {})
            gid = info.get("grade_id")
            if cell.cell_type != "code" or not gid or gid in seen or info.get("solution"):
                continue
            try:
                source = gb.find_source_cell(gid, meta["notebook"], meta["assignment"])
            except MissingEntry:
                continue
            if source.cell_type == "code" and source.locked and source.source == cell.source:
                seen.add(gid)
                try:
                    gb.find_grade_cell(gid, meta["notebook"], meta["assignment"])
                    trusted[i] = "test"
                except MissingEntry:
                    trusted[i] = "setup"
    return trusted


def _error_output(exc, filename: str):
    from nbformat.v4 import new_output

    if isinstance(exc, SandboxError):
        ename, evalue, student = exc.ename, exc.evalue, exc.frames
    else:
        ename, evalue, student = type(exc).__name__, str(exc), getattr(exc, "frames", [])
    lines = [f"  {f.filename}, line {f.lineno}: {f.line}" for f in traceback.extract_tb(exc.__traceback__)
             if f.filename == filename]  # the test cell's own lines: never the checks' files
    lines += [f"  {name}, line {lineno} (your code): {line}" for name, lineno, line in student]
    return new_output("error", ename=ename, evalue=evalue,
                      traceback=["Traceback (most recent call last):", *lines, f"{ename}: {evalue}"])


def bind_student_names(namespace: dict, names: dict, own_names: set, student_values: set, sandbox) -> None:
    """Make the student's new functions callable from the checks (as proxies) and note their other
    values. A name a trusted cell bound, a builtin (a student's ``abs`` or ``isinstance`` must not
    answer for the checks) or a dunder is never taken from the student."""
    import builtins

    for name, what in names.items():
        if (not isinstance(name, str) or not name.isidentifier() or name.startswith("__") or name in own_names
                or hasattr(builtins, name)):
            continue
        if what == "callable":
            namespace[name] = StudentFunction(sandbox, name)
            student_values.discard(name)
        else:
            namespace.pop(name, None)
            student_values.add(name)


def run_notebook(nb, resources, sandbox: Sandbox, course: Path | None = None) -> None:
    """Run ``nb``'s code cells: the student's in ``sandbox``, the trusted ones (see
    :func:`_trusted_cells`) here with the student's functions as proxies; set each cell's outputs."""
    import torch
    from nbformat.v4 import new_output

    coursework = _trusted_coursework(course)
    trusted = _trusted_cells(nb, resources)
    namespace: dict = {"__name__": "__main__"}
    own_names: set[str] = set()  # bound by trusted cells: never replaced by a student's name
    student_values: set[str] = set()
    dtype, rng = torch.get_default_dtype(), torch.random.get_rng_state()
    count = 0
    try:
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            count += 1
            cell.outputs, cell.execution_count = [], count
            kind = trusted.get(i)
            if kind is None or kind == "setup":  # the student's cells, and the setup, run in the sandbox
                try:
                    reply, _ = sandbox.request({"op": "exec", "code": cell.source, "cell": count})
                    output, error = reply.get("output", ""), reply.get("error")
                    names = reply.get("names", {}) if isinstance(reply.get("names"), dict) else {}
                except SandboxError as exc:
                    output, error, names = "", {"ename": exc.ename, "evalue": exc.evalue, "frames": []}, {}
                if output and kind is None:
                    cell.outputs.append(new_output("stream", name="stdout", text=str(output)))
                if error and kind is None:
                    cell.outputs.append(_error_output(SandboxError(str(error.get("ename")), str(error.get("evalue")),
                                                                   error.get("frames", [])), ""))
                bind_student_names(namespace, names, own_names, student_values, sandbox)
                if kind is None:
                    continue
            filename = f"<{cell.metadata['nbgrader']['grade_id']}>"
            code = compile(cell.source, filename, "exec")
            for name in _names(code) & student_values - namespace.keys():  # a value the student computed
                with contextlib.suppress(SandboxError, wire.ProtocolError):
                    reply, blobs = sandbox.request({"op": "get", "name": name})
                    if "error" not in reply:
                        namespace[name] = wire.decode(reply.get("result"), blobs)
            before = dict(namespace)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                try:
                    exec(code, namespace)
                    error = None
                except Exception as exc:
                    error = exc
            own_names |= {n for n, v in namespace.items() if before.get(n, out) is not v and not isinstance(v, StudentFunction)}
            if out.getvalue():
                cell.outputs.append(new_output("stream", name="stdout", text=out.getvalue()))
            if error is not None:
                cell.outputs.append(_error_output(error, filename))
    finally:
        torch.set_default_dtype(dtype)
        torch.random.set_rng_state(rng)
        del coursework


def _trusted_coursework(course: Path | None):
    """The course's ``coursework`` module (``grading/coursework.py``) as ``sys.modules['coursework']``,
    the one the test cells and the hidden checks import, set to find the course directory."""
    import importlib.util

    path = (course / "grading" / "coursework.py") if course else HERE / "coursework.py"
    module = sys.modules.get("coursework")
    if module is None or Path(getattr(module, "__file__", "")).resolve() != path.resolve():
        spec = importlib.util.spec_from_file_location("coursework", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["coursework"] = module
        spec.loader.exec_module(module)
    module.GRADING_COURSE = course
    return module


# ------------------------------------------------------------------------------- nbgrader's step


def _preprocessor_base():
    try:
        from nbgrader.preprocessors import NbGraderPreprocessor
    except ImportError:  # this module is also used without nbgrader (tools/sweep_hidden_checks.py)
        return object
    return NbGraderPreprocessor


def _make_preprocessor():
    from traitlets import Bool, Integer, Unicode

    class SandboxedExecute(_preprocessor_base()):
        """nbgrader's ``Execute``, with the student's code in a sandbox and the checks out of its reach."""

        sandbox = Unicode("auto", help="`auto` or `bwrap`: the sandbox to run submissions in").tag(config=True)
        allow_unsandboxed = Bool(False, help=(
            "Where no sandbox works, run the student's code in a plain child process anyway, with the "
            "course's files readable and writable by it: only for submissions you trust.")).tag(config=True)
        timeout = Integer(60, help="seconds a cell, or a call of the student's function, may take").tag(config=True)
        course_directory = Unicode("", help="the course directory (grading/ holds the checks)").tag(config=True)

        def preprocess(self, nb, resources):
            course = Path(self.course_directory) if self.course_directory else None
            path = resources.get("metadata", {}).get("path")
            sandbox = Sandbox(Path(path) if path else None, course, self.sandbox, self.allow_unsandboxed,
                              timeout=self.timeout)
            if sandbox.kind == "none":
                self.log.warning("grading WITHOUT a sandbox (allow_unsandboxed): the submission's code can read and "
                                 "write this machine's files")
            try:
                run_notebook(nb, resources, sandbox, course)
            finally:
                sandbox.close()
            return nb, resources

    return SandboxedExecute


try:
    SandboxedExecute = _make_preprocessor()
except ImportError:  # traitlets missing: only the proxies and the sandbox are used
    SandboxedExecute = None
