"""Fixtures for the checks that run after the book is built (`make html`)."""

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = (ROOT / os.environ.get("ATTNOPT_BUILD_DIR", "_build")).resolve()
HTML = BUILD / "_build" / "html"
RESULTS = BUILD / "results"


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
