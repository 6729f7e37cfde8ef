"""The notebook runner: executes into the staging folder, records results, caches locally only, and runs
several notebooks at a time, one compute thread each, longest first."""

import importlib.util
import json
import re
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


# ------------------------------------------------------------------------------------------------
# Several notebooks at a time, one compute thread each, longest first
# ------------------------------------------------------------------------------------------------


def write_code_notebook(path: Path, code: str) -> None:
    cells = [
        {"cell_type": "code", "id": "params", "metadata": {"tags": ["parameters"]}, "source": "seed = 0",
         "outputs": [], "execution_count": None},
        {"cell_type": "code", "id": "work", "metadata": {}, "outputs": [], "execution_count": None, "source": code},
    ]
    nb = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def test_longest_notebooks_start_first(runner, tmp_path):
    names = ["a_short", "b_unknown", "c_long", "ch4_vqa_attention_maps"]
    notebooks = [tmp_path / f"{name}.ipynb" for name in names]
    recorded = {"a_short": {"seconds": 2.0, "parameters": {}}, "c_long": {"seconds": 50.0, "parameters": {}}}
    order = [nb.stem for nb in runner.longest_first(notebooks, recorded)]
    # no record for the VQA notebook: its rough time (200 s); none for b_unknown: the default, 10 s
    assert order == ["ch4_vqa_attention_maps", "c_long", "b_unknown", "a_short"]
    recorded["ch4_vqa_attention_maps"] = {"seconds": 1.0, "parameters": {}}
    assert [nb.stem for nb in runner.longest_first(notebooks, recorded)][-1] == "ch4_vqa_attention_maps", (
        "a recorded time wins over the rough guess"
    )


RENDEZVOUS = """
import os, time, torch
from pathlib import Path
from attnopt.book import record
here, other = Path(os.environ['RENDEZVOUS']) / '{me}', Path(os.environ['RENDEZVOUS']) / '{other}'
here.touch()
deadline = time.monotonic() + 120
while not other.exists():  # only ends when the other notebook runs at the same time
    assert time.monotonic() < deadline, 'the other notebook never ran beside this one'
    time.sleep(0.1)
record('{me}', threads=torch.get_num_threads(), omp=os.environ.get('OMP_NUM_THREADS'), seed=seed)
"""


@pytest.mark.slow
def test_notebooks_run_side_by_side_with_one_thread_each(runner, tmp_path, monkeypatch, capsys):
    for name in ("_config.yml", "_toc.yml"):
        (tmp_path / name).write_text("\n")
    (tmp_path / "book").mkdir()
    for me, other in (("left", "right"), ("right", "left")):
        write_code_notebook(tmp_path / "notebooks" / f"{me}.ipynb", RENDEZVOUS.format(me=me, other=other))
    write_code_notebook(tmp_path / "notebooks" / "broken.ipynb", "raise ValueError('deliberately broken')")
    monkeypatch.setenv("RENDEZVOUS", str(tmp_path))
    for name in ("MPLBACKEND", "TQDM_DISABLE", "ATTNOPT_FIGURES_DIR", *runner.ONE_THREAD):
        monkeypatch.setenv(name, "4" if name in runner.ONE_THREAD else "")  # restored after the test
    monkeypatch.delenv("ATTNOPT_NOTEBOOK_JOBS", raising=False)

    assert runner.main(["--jobs", "3"]) == 1, "a failing notebook fails the run"
    out, err = capsys.readouterr()
    results = tmp_path / "_build" / "results"
    for name in ("left", "right"):
        recorded = json.loads((results / f"{name}.json").read_text())
        assert recorded["threads"] == 1 and recorded["omp"] == "1", "each kernel computes with one thread"
        assert re.search(rf"^{name}\.ipynb +executed", out, re.M)
    assert re.search(r"^broken\.ipynb +FAILED", out, re.M)
    assert "--- broken.ipynb failed ---" in err and "deliberately broken" in err
    assert "(3 at a time, one thread each)" in out
    timings = json.loads((results / "_timings.json").read_text())
    assert set(timings) == {"left", "right"}, "only real executions are timed"
    for name in ("left", "right"):  # the kernel's CPU time is counted (its start-up alone takes some)
        assert 0.0 < timings[name]["kernel_cpu_seconds"] <= timings[name]["seconds"] * 1.5, timings[name]
        # with the CPU time of the reference workload in the same run (the budget test's yardstick)
        assert 0.1 < timings[name]["reference_cpu_seconds"] < 60, timings[name]

    # the cache still works: the two good notebooks are not executed again, the broken one is
    (tmp_path / "notebooks" / "broken.ipynb").unlink()
    assert runner.main(["--jobs", "2"]) == 0
    out, _ = capsys.readouterr()
    assert re.search(r"^left\.ipynb +cached", out, re.M) and re.search(r"^right\.ipynb +cached", out, re.M)
