"""Run the code of an exercise's solution, as printed on a chapter's exercises page.

The solutions on ``book/chN/exercises.md`` quote what their code prints; the results tests run
that code (the page's text, not a copy) and compare the printed numbers with the quoted ones.
"""

import contextlib
import io
import re
import textwrap
from pathlib import Path

BOOK = Path(__file__).resolve().parents[2] / "book"


def python_blocks(text: str) -> list[str]:
    """The Python code blocks of a piece of a page, dedented."""
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)\n *```", text, re.S)]


def exercises_page(chapter: int) -> str:
    """The text of chapter ``chapter``'s exercises page."""
    return (BOOK / f"ch{chapter}" / "exercises.md").read_text()


def solution_code(chapter: int, label: str) -> list[str]:
    """The Python code blocks of the solution of exercise ``label`` on chapter ``chapter``'s page."""
    text = exercises_page(chapter)
    start = text.index("````{solution} " + label)
    blocks = python_blocks(text[start:text.index("\n````\n", start)])
    assert blocks, f"the solution of {label} has no code"
    return blocks


def run_solution(chapter: int, label: str) -> list[str]:
    """Run every code block of the solution of ``label`` in one namespace; return the printed lines."""
    namespace = {"__name__": "__main__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in solution_code(chapter, label):
            exec(compile(block, f"ch{chapter}/exercises.md:{label}", "exec"), namespace)
    return out.getvalue().splitlines()
