"""The student edition (`make student-book`) has every exercise and no solution."""

from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from book_paths import BUILD

STUDENT = BUILD / "student" / "_build" / "html"


def collect(html_dir: Path, selector: str) -> dict[str, list[str]]:
    found = {}
    for page in sorted(html_dir.rglob("*.html")):
        if "_static" in page.parts:
            continue
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        items = [" ".join(tag.get_text(" ").split()) for tag in soup.select(selector)]
        if items:
            found[str(page.relative_to(html_dir))] = items
    return found


def test_student_edition_has_exercises_but_no_solutions(html_dir):
    if not (STUDENT / "index.html").exists():
        pytest.fail(f"no student edition at {STUDENT}: run `make student-book` (make test does)")
    solutions = collect(html_dir, "div.solution")
    assert solutions, "the book has no exercise solutions at all, so this test would prove nothing"
    exercises = collect(html_dir, "div.exercise")
    assert collect(STUDENT, "div.exercise") == exercises, "the student edition must keep every exercise"
    assert not collect(STUDENT, "div.solution"), "solutions left in the student edition"
    # Not even the text of a solution may survive (e.g. moved out of its box).
    student_text = {page: " ".join(BeautifulSoup((STUDENT / page).read_text(encoding="utf-8"), "html.parser").get_text(" ").split())
                    for page in solutions}
    for page, texts in solutions.items():
        for text in texts:
            body = text.split(" ", 3)[-1][:120]  # skip the "Solution to Exercise N" heading
            assert body not in student_text[page], f"{page}: solution text leaked: {body!r}"
