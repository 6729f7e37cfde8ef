"""Fixtures for the checks that run after the book is built (`make html`)."""

import json
from pathlib import Path

import pytest

from book_paths import HTML, RESULTS


@pytest.fixture(scope="session")
def html_dir() -> Path:
    if not (HTML / "index.html").exists():
        pytest.fail(f"no built book at {HTML}: run `make html` (make test does) before tests/book")
    return HTML


@pytest.fixture(scope="session")
def results():
    def load(stem: str) -> dict:
        path = RESULTS / f"{stem}.json"
        if not path.exists():
            pytest.fail(f"{path} missing: the notebook {stem}.ipynb did not record its results")
        return json.loads(path.read_text())

    return load
