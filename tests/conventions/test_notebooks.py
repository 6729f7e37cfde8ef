"""Conventions every notebook of the course follows (checked on the committed, unexecuted files)."""

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def toc_files(node) -> set[str]:
    found = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "root"):
                found.add(value)
            found |= toc_files(value)
    elif isinstance(node, list):
        for item in node:
            found |= toc_files(item)
    return found


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.fixture(params=NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def notebook(request):
    return request.param, json.loads(request.param.read_text())


def test_committed_without_outputs(notebook):
    path, nb = notebook
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name}: outputs committed"
            assert cell.get("execution_count") is None, f"{path.name}: execution counts committed"


def test_parameters_cell(notebook):
    path, nb = notebook
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    values = {}
    for node in ast.parse(source(tagged[0])).body:
        assert isinstance(node, ast.Assign), f"{path.name}: the parameters cell holds only assignments"
        values[node.targets[0].id] = ast.literal_eval(node.value)
    assert isinstance(values.get("seed"), int), f"{path.name}: parameter 'seed' (int) missing"
    assert values.get("device") == "auto", f"{path.name}: parameter device must default to 'auto'"
    assert values.get("scale") == "book", f"{path.name}: parameter scale must default to 'book'"


# The Colab set-up cell (first cell, tag 'colab-setup') is checked in test_colab_setup.py.


def test_seeded_and_records_results(notebook):
    path, nb = notebook
    code = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "code")
    assert "seed_everything(seed)" in code, f"{path.name}: must seed every generator from the 'seed' parameter"
    assert "pick_device(device)" in code, f"{path.name}: must resolve the 'device' parameter with pick_device"
    assert re.search(rf"record\(\s*\"{path.stem}\"", code), f"{path.name}: must record its key numbers as record(\"{path.stem}\", ...)"


def test_in_table_of_contents(notebook):
    path, _ = notebook
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert f"notebooks/{path.stem}" in toc_files(toc), f"{path.name} is not in _toc.yml"


def test_claims_are_tested(notebook):
    """Every notebook has claims in tests/book/test_results*.py that its recorded numbers must meet."""
    path, _ = notebook
    text = "\n".join(p.read_text() for p in (ROOT / "tests" / "book").glob("test_results*.py"))
    assert f'results("{path.stem}")' in text, f"{path.name}: no claims about its results in tests/book/test_results*.py"


# ---------------------------------------------------------------- notebooks read as lessons (STYLE.md)

# 76 columns: what a code block shows at 1280 px without scrolling (684 px at 8.4 px a character).
MAX_LINES, MAX_COLUMNS, MIN_FONT = 40, 76, 10
# A cell that creates a figure (it must be folded and captioned).
DRAWS = re.compile(r"\b(plt\.(subplots|figure|subplot)|small_multiples|attention_heatmap|page_explorer)\(")
# A page explorer (attnopt.page_explorer) writes each frame's alt text itself (tests/book checks it).
PAGE_EXPLORER = re.compile(r"\bpage_explorer\(")
MYST_ROLE = re.compile(r"\{[a-z][\w-]*(:[\w-]+)?\}`")
MYST_DIRECTIVE = re.compile(r"^\s*(```|:::)\s*\{[a-z]", re.M)
MYST_TARGET = re.compile(r"^\([\w-]+\)=\s*$", re.M)


def tags(cell) -> list:
    return cell.get("metadata", {}).get("tags", [])


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code" and "colab-setup" not in tags(c)]


def test_parameters_cell_is_the_first_code_cell_and_says_how_to_change_it(notebook):
    path, nb = notebook
    first = code_cells(nb)[0]
    assert "parameters" in tags(first), f"{path.name}: the parameters cell must be the first code cell (after the Colab set-up)"
    assert not {"remove-cell", "remove-input", "hide-input", "hide-cell"} & set(tags(first)), f"{path.name}: parameters cell hidden"
    assert source(first).lstrip().startswith("#"), f"{path.name}: the parameters cell opens with a comment on how to change it"


def test_code_cells_are_short_and_narrow(notebook):
    path, nb = notebook
    for i, cell in enumerate(code_cells(nb)):
        lines = source(cell).rstrip("\n").split("\n")
        assert len(lines) <= MAX_LINES, f"{path.name}: code cell {i} has {len(lines)} lines (at most {MAX_LINES}: split it)"
        wide = [n for n, line in enumerate(lines, 1) if len(line) > MAX_COLUMNS]
        assert not wide, f"{path.name}: code cell {i} has lines over {MAX_COLUMNS} columns: {wide}"


def test_bookkeeping_is_removed_from_the_page(notebook):
    path, nb = notebook
    for cell in code_cells(nb):
        if re.search(r"\brecord\(", source(cell)):
            assert "remove-cell" in tags(cell), f"{path.name}: the cell calling record(...) must be tagged remove-cell"


def test_figures_are_folded_numbered_captioned_and_described(notebook):
    path, nb = notebook
    drawn = 0
    for cell in code_cells(nb):
        if not DRAWS.search(source(cell)) or "remove-cell" in tags(cell):
            continue
        drawn += 1
        start = source(cell).strip().split("\n")[0][:60]
        assert {"hide-input", "remove-input"} & set(tags(cell)), f"{path.name}: plotting cell not folded (hide-input): {start}"
        meta = cell.get("metadata", {}).get("mystnb", {})
        figure, image = meta.get("figure", {}), meta.get("image", {})
        assert str(figure.get("name", "")).startswith("fig-"), f"{path.name}: figure without a name 'fig-...': {start}"
        assert len(figure.get("caption", "")) >= 30, f"{path.name}: figure without a caption that says what to see: {start}"
        if not PAGE_EXPLORER.search(source(cell)):
            assert len(image.get("alt", "")) >= 30, f"{path.name}: figure without alt text describing it: {start}"
    assert drawn, f"{path.name}: draws no figure"


def test_figure_text_is_not_smaller_than_the_house_style(notebook):
    path, nb = notebook
    code = "\n".join(source(c) for c in code_cells(nb))
    for m in re.finditer(r"(fontsize|labelsize|size)\s*=\s*(['\"]?)([\w.]+)\2", code):
        value = m.group(3)
        if value in ("xx-small", "x-small", "small", "smaller"):
            pytest.fail(f"{path.name}: {m.group(0)} is smaller than the house style's {MIN_FONT} pt")
        if re.fullmatch(r"\d+(\.\d+)?", value) and m.group(1) != "size" and float(value) < MIN_FONT:
            pytest.fail(f"{path.name}: {m.group(0)} is smaller than the house style's {MIN_FONT} pt")


def test_markdown_is_plain(notebook):
    """Colab and JupyterLab show MyST roles and directives as raw text: notebooks use plain Markdown."""
    path, nb = notebook
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = source(cell)
        for pattern, what in ((MYST_ROLE, "role"), (MYST_DIRECTIVE, "directive"), (MYST_TARGET, "target")):
            m = pattern.search(text)
            assert not m, f"{path.name}: MyST {what} {m.group(0)!r} in a Markdown cell (use a Markdown link or plain words)"
