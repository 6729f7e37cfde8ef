"""The student edition (`make student-book`) has every exercise and no solution."""

from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from book_paths import BUILD

STUDENT = BUILD / "student" / "_build" / "html"


def parse(html_dir: Path) -> dict[str, BeautifulSoup]:
    """Every page of an edition, parsed once (parsing is most of what this test costs)."""
    return {str(page.relative_to(html_dir)): BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
            for page in sorted(html_dir.rglob("*.html")) if "_static" not in page.parts}


def collect(soups: dict[str, BeautifulSoup], selector: str) -> dict[str, list[str]]:
    found = {}
    for page, soup in soups.items():
        items = [" ".join(tag.get_text(" ").split()) for tag in soup.select(selector)]
        if items:
            found[page] = items
    return found


def test_student_edition_has_exercises_but_no_solutions(html_dir):
    if not (STUDENT / "index.html").exists():
        pytest.fail(f"no student edition at {STUDENT}: run `make student-book` (make test does)")
    book, student = parse(html_dir), parse(STUDENT)
    solutions = collect(book, "div.solution")
    assert solutions, "the book has no exercise solutions at all, so this test would prove nothing"
    exercises = collect(book, "div.exercise")
    assert collect(student, "div.exercise") == exercises, "the student edition must keep every exercise"
    assert not collect(student, "div.solution"), "solutions left in the student edition"
    # Not even the text of a solution may survive (e.g. moved out of its box).
    student_text = {page: " ".join(student[page].get_text(" ").split()) for page in solutions}
    for page, texts in solutions.items():
        for text in texts:
            body = text.split(" ", 3)[-1][:120]  # skip the "Solution to Exercise N" heading
            assert body not in student_text[page], f"{page}: solution text leaked: {body!r}"
