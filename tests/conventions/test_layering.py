"""The library's layering (issue 29), read from its source with ``ast``: nothing is imported to check it.

- ``src/attnopt/`` holds one subpackage per view (``fenchel``, ``kernels``, ``transforms``,
  ``continuous``), one for the course's tooling (``course``) and the shared core (``_validation``,
  ``_numerics``, ``_optional`` and the package's ``__init__``);
- a view never imports ``attnopt.course``, and the core imports no view but the one the package's
  ``__init__`` re-exports (``transforms.attention``);
- a name that starts with an underscore is private to its subpackage: no module imports one from
  another subpackage (a view's engines are modules ``_name.py`` whose own names are public, so a
  composite may call them);
- no public module is over 700 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "attnopt"
VIEWS = ("fenchel", "kernels", "transforms", "continuous")
CORE = ("_validation", "_numerics", "_optional")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(name: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """Every import of ``path`` (at any depth, functions included) as (absolute module, names, line)."""
    name = module_name(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(name, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = [alias.name for alias in node.names]
            # 'from . import x' imports the module x of that package
            found.append((target, names, node.lineno))
    return found


def subpackage(module: str) -> str:
    """'attnopt.continuous._checks' -> 'continuous'; a core module -> 'core'."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in VIEWS + ("course",):
        return parts[1]
    return "core"


SOURCES = sorted(PACKAGE.rglob("*.py"))
ALL_MODULES = {module_name(p) for p in SOURCES}


def test_the_folders_are_the_views_the_course_and_a_small_core():
    top = {p.name for p in PACKAGE.iterdir() if not p.name.startswith(".") and p.name != "__pycache__"}
    assert top == {"__init__.py", *(f"{c}.py" for c in CORE), *VIEWS, "course"}, sorted(top)
    for folder in VIEWS + ("course",):
        assert (PACKAGE / folder / "__init__.py").is_file()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_layering(path):
    importer = module_name(path)
    mine = subpackage(importer)
    problems = []
    for target, names, line in imports(path):
        if not target.startswith("attnopt"):
            continue
        theirs = subpackage(target)
        if mine in VIEWS and (theirs == "course" or target.startswith("attnopt.course")):
            problems.append(f"line {line}: the view {mine} imports the course ({target})")
        if mine == "core" and importer != "attnopt" and theirs != "core":
            problems.append(f"line {line}: the core module {importer} imports a view ({target})")
        if theirs != mine and theirs != "core":
            private = [n for n in names if n.startswith("_") and f"{target}.{n}" not in ALL_MODULES]
            if private:
                problems.append(f"line {line}: {importer} imports {private} from {target}, private to {theirs}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", [p for p in SOURCES if not p.name.startswith("_") or p.name == "__init__.py"],
                         ids=lambda p: module_name(p))
def test_no_public_module_is_over_700_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 700, f"{module_name(path)} has {lines} lines: move an engine into a private module beside it"


def test_the_checker_finds_what_it_looks_for(tmp_path):
    """The parser resolves relative imports the way Python does (else the test above could pass on anything)."""
    (tmp_path / "attnopt" / "kernels").mkdir(parents=True)
    bad = tmp_path / "attnopt" / "kernels" / "regularity.py"
    bad.write_text("from ..course.plotting import _STYLE\nfrom . import _as_measure\nfrom .._validation import require\n")
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        found = imports(bad)
    finally:
        SRC = saved
    assert found == [("attnopt.course.plotting", ["_STYLE"], 1), ("attnopt.kernels", ["_as_measure"], 2),
                     ("attnopt._validation", ["require"], 3)]


# ------------------------------------------------------------------ the short import paths


def run_python(code: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_short_path_is_the_module_itself():
    """``import attnopt.geometry`` gives ``attnopt.transforms.geometry`` itself, by every form of import,
    with its own name and spec; a patch through either name is seen through the other."""
    out = run_python('''
import importlib, attnopt
for short, target in attnopt.ALIASES.items():
    a = importlib.import_module(short)
    b = importlib.import_module(target)
    assert a is b, short
    assert a.__name__ == target and a.__spec__.name == target, (short, a.__spec__)
    assert getattr(attnopt, short.split(".")[1]) is b, short
    for name in b.__all__:
        exec(f"from {short} import {name} as x", {})
import attnopt.geometry as g
from attnopt import widgets
import attnopt.course.widgets as w
assert widgets is w
g.fisher_information, saved = "patched", g.fisher_information
import attnopt.transforms.geometry as g2
assert g2.fisher_information == "patched"
g.fisher_information = saved
importlib.reload(attnopt.geometry)
print("ok", len(attnopt.ALIASES))
''')
    assert out.startswith("ok 14"), out


def test_importing_the_library_leaves_the_course_unimported():
    """The course's tooling (Matplotlib figures, widgets, the VQA models) is imported only on demand."""
    out = run_python("import sys, attnopt, attnopt.fenchel, attnopt.kernels, attnopt.continuous\n"
                     "print(sorted(m for m in sys.modules if m.startswith('attnopt.course')))")
    assert out.strip() == "[]", out
