"""Every page of the book opens with its prose (issue 27): after the title comes a paragraph, not a
box, and a chapter's *Sources* (the equation-by-equation map to the source documents) is folded
away at the page's end, so that on a phone the first sentence is on the first screen. The built
pages are checked for the same in the phone pass of tools/site_audit.py
(``first_sentence_off_screen``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[2] / "book"
PAGES = sorted(p for p in BOOK.rglob("*.md") if "_" not in p.parts[-2][:1] and p.name != "bibliography.md")
DIRECTIVE = re.compile(r"^(:::+|```+)\s*\{")


def first_block(text: str) -> str:
    """The first non-blank line after the page's title (and after MyST's front matter and targets)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# ")) + 1
    return next(line for line in lines[start:] if line.strip() and not re.match(r"^\(.*\)=$", line))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(BOOK)))
def test_a_page_opens_with_prose(page):
    assert not DIRECTIVE.match(first_block(page.read_text(encoding="utf-8"))), \
        f"{page.relative_to(BOOK)} opens with a box or a directive, not with its prose"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(BOOK)))
def test_sources_are_folded_after_the_prose(page):
    text = page.read_text(encoding="utf-8")
    for match in re.finditer(r"^:::+\{admonition\} Sources\n:class: (.*)$", text, re.M):
        assert "dropdown" in match.group(1).split(), f"{page.relative_to(BOOK)}: a Sources box that is not folded"
        prose_before = len(re.sub(r"(?s)```.*?```|:::.*?:::", "", text[:match.start()]).split())
        assert prose_before >= 150, f"{page.relative_to(BOOK)}: Sources after only {prose_before} words of prose"


def test_the_check_finds_a_page_that_opens_with_a_box():
    boxed = "# Title\n\n:::{admonition} Sources\n:class: sources\n- a source\n:::\n\nThe prose.\n"
    assert DIRECTIVE.match(first_block(boxed))
    assert not DIRECTIVE.match(first_block("# Title\n\n(a-target)=\nThe prose first.\n"))
