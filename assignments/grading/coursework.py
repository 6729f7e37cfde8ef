"""Checks for the course's assignments: messages a student can act on, and "write it yourself".

This module ships with every assignment (``tools/assignments.py`` copies it next to each notebook,
and ``nbgrader autograde`` copies the instructor's version over a student's). The test cells use

* ``check_close(found, expected, what)``, ``check_one_hot(found, expected, what)``,
  ``check_shape(found, shape, what)``,
  ``check(condition, what, expected, found)``: an ``AssertionError`` that says what was checked,
  what was expected and what was found (numbers, shapes, the largest difference and where);
* ``own(function, namespace)``: the student's function, wrapped so that every call runs with the
  course library ``attnopt`` made unavailable (see :func:`without_attnopt`). A solution may mention
  ``attnopt`` in a docstring or a comment; calling it, under any name, raises ``LibraryBlocked``.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib.abc
import sys
import types

import torch

LIBRARY = "attnopt"


class LibraryBlocked(RuntimeError):
    """Raised when the student's function calls the course library."""


def _in_library(name) -> bool:
    return isinstance(name, str) and (name == LIBRARY or name.startswith(LIBRARY + "."))


def _blocked_call():
    """Raise the error of a blocked library function (its code object carries its name)."""
    frame = sys._getframe(1)
    raise LibraryBlocked(
        f"`{frame.f_globals.get('__name__', LIBRARY)}.{frame.f_code.co_qualname}` of the course library was "
        "called while your function ran; the task asks you to write it yourself with torch, so your "
        "function may not call attnopt (by any name). Mentioning it in a comment or docstring is fine."
    )


def _blocked(*args, **kwargs):  # its code object replaces the library's while a student's function runs
    return __import__("sys").modules["coursework"]._blocked_call()


class _BlockImports(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _in_library(name):
            raise ImportError(f"`import {name}` is not available inside your function: write it yourself with torch")
        return None


class _BlockedModule(types.ModuleType):
    def __getattr__(self, name):
        raise LibraryBlocked(f"`{self.__name__}.{name}`: the course library is not available inside your function; write it yourself with torch")


def _library_modules() -> list[tuple[str, object]]:
    """``(name, module)`` for every entry of ``sys.modules`` under ``attnopt`` (``None`` entries included)."""
    # inline rather than _in_library: sys.modules holds thousands of names, and this runs per call
    prefix = LIBRARY + "."
    return [(name, module) for name, module in list(sys.modules.items())
            if isinstance(name, str) and (name.startswith(prefix) or name == LIBRARY)]


# The last scan of _library_functions: its key, the module values it saw (held, so that their ids
# cannot be reused by new objects), and the functions it found.
_SCAN: dict = {"key": None, "held": None, "functions": []}


def _library_functions(modules: list | None = None):
    """Every function defined in a loaded attnopt module, with the classes' methods.

    The scan walks every module and every class in it, thousands of objects, and a test cell calls
    the student's function many times; it is redone only when a library module was imported,
    reloaded or rebound, or one of its top-level names was (the key: each module's name, identity
    and the identities of its values)."""
    modules = _library_modules() if modules is None else modules
    live = [(name, module) for name, module in modules if module is not None]
    held = [tuple(vars(module).values()) for _, module in live]
    key = tuple((name, id(module), tuple(map(id, values))) for (name, module), values in zip(live, held))
    if key == _SCAN["key"]:
        return _SCAN["functions"]
    seen = {}
    for (modname, module), values in zip(live, held):
        for value in values:
            candidates = [value]
            if isinstance(value, type) and _in_library(getattr(value, "__module__", None)):
                for attr in vars(value).values():
                    candidates.append(getattr(attr, "__func__", attr))
                    if isinstance(attr, property):
                        candidates += [attr.fget, attr.fset]
            for fn in candidates:
                while isinstance(fn, types.FunctionType) and fn.__closure__ and hasattr(fn, "__wrapped__"):
                    fn = fn.__wrapped__
                if isinstance(fn, types.FunctionType) and _in_library(fn.__module__):
                    seen[id(fn)] = fn
    _SCAN.update(key=key, held=held, functions=list(seen.values()))
    return _SCAN["functions"]


@contextlib.contextmanager
def without_attnopt(namespace: dict | None = None):
    """Make the course library unavailable for the duration of the block.

    Every function of every loaded ``attnopt`` module (and every method of its classes) gets the
    code of a function that raises ``LibraryBlocked``, so the library cannot be reached under any
    name: through the module, through a ``from attnopt... import f as g`` done anywhere in the
    notebook, or through a default argument; a library class cannot be constructed (its
    ``__init__`` is a library function). Names of ``namespace`` bound to library modules point to
    a module that raises, and ``import attnopt`` raises ``ImportError``. Everything is restored on
    exit.
    """
    modules = _library_modules()
    swapped = []
    for fn in _library_functions(modules):
        code = _blocked.__code__.replace(co_name=fn.__code__.co_name, co_qualname=fn.__code__.co_qualname)
        if fn.__closure__:  # a closure's code cannot be swapped; calls to it reach a swapped function
            continue
        swapped.append((fn, fn.__code__))
        fn.__code__ = code
    rebound = {}
    if namespace is not None:
        for name, value in list(namespace.items()):
            if isinstance(value, types.ModuleType) and _in_library(value.__name__):
                rebound[name] = value
                namespace[name] = _BlockedModule(value.__name__)
    hidden = dict(modules)
    for name in hidden:
        del sys.modules[name]
    finder = _BlockImports()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(hidden)
        if namespace is not None:
            namespace.update(rebound)
        for fn, code in swapped:
            fn.__code__ = code


def own(function, namespace: dict | None = None):
    """``function`` wrapped so that each call runs :func:`without_attnopt`."""
    if not callable(function):
        raise AssertionError(f"expected a function, found {type(function).__name__}: run the cell that defines it")
    if type(function).__dict__.get("__sandboxed__"):  # autograde's proxy: it runs where attnopt is absent
        return function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with without_attnopt(namespace):
            return function(*args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------------------------
# assertions with messages


def _fmt(x, limit: int = 8) -> str:
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.numel() == 1:
            return f"{x.item():.6g}"
        flat = x.reshape(-1)
        body = ", ".join(f"{v:.4g}" for v in flat[:limit].tolist())
        more = f", ... ({x.numel()} numbers)" if x.numel() > limit else ""
        return f"tensor of shape {tuple(x.shape)}: [{body}{more}]"
    if isinstance(x, float):
        return f"{x:.6g}"
    return repr(x)


def check(condition, what: str, expected=None, found=None, hint: str = "") -> None:
    """Assert ``condition``; the message names the check, the expected and the found value."""
    if not bool(condition):
        parts = [what]
        if expected is not None:
            parts.append(f"expected {expected if isinstance(expected, str) else _fmt(expected)}")
        if found is not None:
            parts.append(f"found {found if isinstance(found, str) else _fmt(found)}")
        raise AssertionError(": ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if parts[1:] else "") + (f". {hint}" if hint else ""))


def check_shape(found, shape, what: str) -> None:
    """``found`` is a tensor of the given shape."""
    if not isinstance(found, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor of shape {tuple(shape)}, found {type(found).__name__}")
    check(tuple(found.shape) == tuple(shape), f"{what}: shape", str(tuple(shape)), str(tuple(found.shape)))


def check_close(found, expected, what: str, atol: float = 1e-12, rtol: float = 0.0, hint: str = "") -> None:
    """``found`` equals ``expected`` within ``atol + rtol |expected|`` entrywise (NaN never does)."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    if not isinstance(found, torch.Tensor):
        try:
            found = torch.as_tensor(found, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"{what}: expected a tensor, found {type(found).__name__}") from None
    if found.shape != expected.shape:
        raise AssertionError(f"{what}: expected shape {tuple(expected.shape)}, found shape {tuple(found.shape)}")
    found64 = found.detach().to(torch.float64)
    if torch.isnan(found64).any():
        where = tuple(torch.nonzero(torch.isnan(found64))[0].tolist())
        raise AssertionError(f"{what}: found nan at index {where} (expected {_fmt(expected[where]) if where else _fmt(expected)})"
                             + (f". {hint}" if hint else ""))
    both_inf = torch.isinf(found64) & torch.isinf(expected) & (torch.sign(found64) == torch.sign(expected))
    diff = torch.where(both_inf, torch.zeros_like(found64), (found64 - expected).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    bound = atol + rtol * expected.abs()
    if torch.any(diff > bound):
        worst = tuple(torch.nonzero(diff - bound == (diff - bound).max())[0].tolist())
        at = f" at index {worst}" if worst else ""
        raise AssertionError(
            f"{what}: expected {_fmt(expected)}, found {_fmt(found64)}; the largest difference is "
            f"{diff[worst].item():.3g}{at} (expected {expected[worst].item():.10g}, found {found64[worst].item():.10g}, "
            f"tolerance {bound[worst].item() if bound.ndim else float(bound):.1g})" + (f". {hint}" if hint else "")
        )


def check_one_hot(found, expected, what: str, atol: float = 1e-12) -> None:
    """``found`` equals ``expected``, a tensor of zeros and ones (a one-hot plan, a causal row): every
    zero exactly, as a sparse solution must give it, and every one within ``atol``, because weights
    normalized by a division may round their one by an ulp (1 - 2.2e-16 is a correct one-hot plan)."""
    check_close(found, expected, what, atol=atol)  # the shape, no nan, and the ones
    expected = torch.as_tensor(expected, dtype=torch.float64)
    found64 = torch.as_tensor(found).detach().to(torch.float64)
    zeros = expected == 0
    if zeros.any():
        check(bool(torch.all(found64[zeros] == 0)), f"{what}: the entries that must vanish", "exactly 0",
              found64[zeros].abs().max())


# ----------------------------------------------------------------------------------------------
# hidden checks (run only by nbgrader autograde; see hidden_checks.py of the course directory)


GRADING_COURSE = None  # set by autograde_sandbox.py in the grader's process: the course being graded


def _course_directory():
    """The course directory while grading, or None when a student runs the notebook.

    $ATTNOPT_COURSE_DIR if set; else the course that ``nbgrader autograde`` runs the notebook in
    (``<course>/autograded/<student>/<assignment>``), or whose source folder an instructor runs it
    in (``<course>/source/<assignment>``). The course is found from the folder names only, so
    files a student hands in beside the notebook cannot pose as the course directory.
    """
    import os
    from pathlib import Path

    if GRADING_COURSE is not None:
        return Path(GRADING_COURSE)
    if os.environ.get("ATTNOPT_COURSE_DIR"):
        return Path(os.environ["ATTNOPT_COURSE_DIR"])
    here = Path.cwd().resolve()
    if len(here.parents) >= 3 and here.parents[1].name == "autograded":
        return here.parents[2]
    if len(here.parents) >= 2 and here.parent.name == "source" and (here.parents[1] / "nbgrader_config.py").exists():
        return here.parents[1]
    return None


def course_secret(course=None) -> str:
    """$ATTNOPT_COURSE_SECRET, or the first line of ``<course>/course_secret``."""
    import os

    if os.environ.get("ATTNOPT_COURSE_SECRET"):
        return os.environ["ATTNOPT_COURSE_SECRET"].strip()
    path = (course or _course_directory()) / "course_secret"
    if path.exists() and path.read_text().strip():
        return path.read_text().strip().splitlines()[0]
    raise AssertionError(f"hidden checks: no course secret; set ATTNOPT_COURSE_SECRET or write one line to {path} "
                         "(tools/assignments.py creates it)")


class _Hidden:
    """What a task of hidden_checks.py gets: the student's functions, a secret generator, cases."""

    def __init__(self, task, namespace, secret, variant=0, params=None):
        self.task, self.namespace, self.secret = task, namespace, secret
        # which variant of the task this course set (0: the one in the course's public repository) and
        # its parameters, from <course>/grading/variants.json (tools/assignments.py writes it)
        self.variant, self.params = variant, dict(params or {})
        self.results: list[tuple[str, str | None]] = []
        self._draws = 0

    def student(self, name):
        if name not in self.namespace:
            raise AssertionError(f"`{name}` is not defined: run the cell that defines it")
        return own(self.namespace[name], self.namespace)

    def rng(self) -> torch.Generator:
        import hashlib

        self._draws += 1
        digest = hashlib.sha256(f"{self.secret}/{self.task}/{self._draws}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))

    @contextlib.contextmanager
    def case(self, label):
        try:
            yield
        except AssertionError as error:
            self.results.append((label, str(error)))
        except Exception as error:  # the student's function raised: say where, in their code only
            name = getattr(error, "ename", None) or type(error).__name__  # a SandboxError carries the student's type
            self.results.append((label, f"your code raised {name}: {error}{_student_frames(error)}"))
        else:
            self.results.append((label, None))


def _student_frames(error) -> str:
    import traceback

    if getattr(error, "frames", None) is not None:  # raised in the sandbox: the student's own lines only
        return "".join(f" (line {lineno} of your cell: `{line}`)" for _, lineno, line in error.frames[-2:])
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not any(part in f.filename for part in ("coursework.py", "hidden_checks.py", "variant_checks_", "site-packages", "/attnopt/",
                                                         "autograde_sandbox.py", "sandbox_worker.py"))]
    return "".join(f" (line {f.lineno} of your cell: `{(f.line or '').strip()}`)" for f in frames[-2:])


def _variant(course, task: str) -> dict:
    """The variant of ``task`` that the course's notebooks were made with (0 where none was drawn)."""
    import json

    path = course / "grading" / "variants.json"
    record = json.loads(path.read_text()).get(task, {}) if path.exists() else {}
    return {"variant": record.get("variant", 0), "params": record.get("params", {})}


def hidden_checks(task: str, namespace: dict) -> None:
    """Run the hidden checks of ``task`` on the student's functions in ``namespace``; print one line
    per check (its label, and for a failure what was expected and found) and fail if any failed."""
    import importlib.util

    import os

    if GRADING_COURSE is None and os.environ.get("NBGRADER_EXECUTION") == "autograde":
        # autograde ran this cell in the submission's own kernel: the course's nbgrader_config.py did
        # not load (nbgrader then falls back to its defaults), and grades made there could be forged
        raise AssertionError("autograde ran this notebook without the course's sandbox (see the errors about "
                             "nbgrader_config.py in autograde's log); no points are given until it is fixed")
    course = _course_directory()
    if course is None:
        print(f"hidden checks of {task}: they run when your notebook is graded, on other inputs")
        return
    path = course / "grading" / "hidden_checks.py"
    if not path.exists():
        raise AssertionError(f"hidden checks: {path} is missing; run tools/assignments.py on the course directory")
    spec = importlib.util.spec_from_file_location("hidden_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    h = _Hidden(task, namespace, course_secret(course), **_variant(course, task))
    with h.case("the hidden checks could not finish"):
        getattr(module, task)(h)
    if h.results[-1][1] is None:  # that one is reported only when it fails
        h.results.pop()
    failed = [(i, label, message) for i, (label, message) in enumerate(h.results, 1) if message is not None]
    for i, (label, message) in enumerate(h.results, 1):
        print(f"hidden check {i} ({label}): " + ("passed" if message is None else message))
    if failed:
        raise AssertionError(f"{len(failed)} of {len(h.results)} hidden checks failed: "
                             + "; ".join(f"hidden check {i} ({label})" for i, label, _ in failed)) from None
