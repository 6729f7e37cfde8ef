"""tools/equation_fit.py finds every display equation of a source (its measuring needs a built book
and a browser; tests/book checks the built pages themselves)."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("equation_fit", ROOT / "tools" / "equation_fit.py")
equation_fit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(equation_fit)


def test_every_kind_of_display_equation_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text with $x$ inline.\n\n$$\na=b\n$$ (eq-one)\n\n1. An item:\n\n   $$\n   c=d\n   $$\n\n"
        "$$e=f$$\n\n```{math}\n:label: eq-two\ng=h\n```\n"
    )
    found = equation_fit.equations_in(page)
    assert [(e["label"], e["tex"]) for e in found] == [("eq-one", "a=b"), ("", "c=d"), ("", "e=f"), ("eq-two", "g=h")]
    assert found[0]["where"].endswith(":3")

    notebook = tmp_path / "n.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": ["$$x$$"]},
                                              {"cell_type": "markdown", "id": "m1", "source": ["$$\n", "y=1\n", "$$"]}]}))
    assert [e["tex"] for e in equation_fit.equations_in(notebook)] == ["y=1"]

    module = tmp_path / "m.py"
    module.write_text('def f():\n    r"""Doc.\n\n    .. math::\n\n        p = q\n\n    Done."""\n')
    assert [e["tex"] for e in equation_fit.equations_in(module)] == ["p = q"]


def test_the_limits_are_read_from_maths_fit_js():
    """Read from the script (a rename there fails the import above): a scale and a font size."""
    assert 0 < equation_fit.MIN_SCALE <= 1 and 6 <= equation_fit.MIN_PX <= 20
