"""The notebook runner: executes into the staging folder, records results, and caches locally only."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "tools" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lib.py").write_text("x = 1\n")
    (tmp_path / "notebooks").mkdir()
    for name, value in {"ROOT": tmp_path, "BUILD": tmp_path / "_build", "SITE": tmp_path / "_build" / "site",
                        "RESULTS": tmp_path / "_build" / "results", "CACHE": tmp_path / "_build" / "cache",
                        "FIGURES": tmp_path / "_build" / "site" / "figures"}.items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setenv("ATTNOPT_RESULTS_DIR", str(tmp_path / "_build" / "results"))
    monkeypatch.delenv("CI", raising=False)
    return module


def write_notebook(path: Path, value: int) -> None:
    cells = [
        {"cell_type": "code", "id": "params", "metadata": {"tags": ["parameters"]}, "source": "seed = 0", "outputs": [],
         "execution_count": None},
        {"cell_type": "code", "id": "work", "metadata": {}, "outputs": [], "execution_count": None,
         "source": f"from attnopt.book import record\nrecord('demo', value={value}, seed=seed)"},
    ]
    nb = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


@pytest.mark.slow
def test_cache_skips_unchanged_and_reruns_changed(runner, tmp_path, monkeypatch):
    nb = tmp_path / "notebooks" / "demo.ipynb"
    write_notebook(nb, 1)
    assert runner.execute(nb, {}, force=False) == "executed"
    executed = json.loads((tmp_path / "_build" / "site" / "notebooks" / "demo.ipynb").read_text())
    assert "remove-cell" not in executed["cells"][0]["metadata"]["tags"], "the parameters cell is shown in the book"
    assert json.loads((tmp_path / "_build" / "results" / "demo.json").read_text())["value"] == 1
    assert runner.execute(nb, {}, force=False) == "cached"
    assert runner.execute(nb, {"seed": 3}, force=False) == "executed", "new parameters must re-execute"
    assert runner.execute(nb, {"seed": 3}, force=False) == "cached"
    (tmp_path / "src" / "lib.py").write_text("x = 2\n")
    assert runner.execute(nb, {"seed": 3}, force=False) == "executed", "a library change must re-execute"
    write_notebook(nb, 2)
    assert runner.execute(nb, {"seed": 3}, force=False) == "executed"
    assert json.loads((tmp_path / "_build" / "results" / "demo.json").read_text()) == {"value": 2, "seed": 3}
    assert runner.execute(nb, {"seed": 3}, force=True) == "executed", "--force / CI never uses the cache"
    executed = json.loads((tmp_path / "_build" / "site" / "notebooks" / "demo.ipynb").read_text())
    injected = [c for c in executed["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "remove-cell" in injected[0]["metadata"]["tags"], "papermill's injected cell is hidden"


@pytest.mark.slow
def test_notebook_that_records_nothing_fails(runner, tmp_path):
    nb = tmp_path / "notebooks" / "silent.ipynb"
    write_notebook(nb, 1)
    text = nb.read_text().replace("record('demo', value=1, seed=seed)", "print(seed)")
    assert "record(" not in text.split("import record")[1]
    nb.write_text(text)
    with pytest.raises(RuntimeError, match="recorded no results"):
        runner.execute(nb, {}, force=False)
