"""Fixtures for the checks that run after the book is built (`make html`)."""

import json
from pathlib import Path

import pytest

from book_paths import HTML, RESULTS, load_tool


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


@pytest.fixture(scope="module")
def server(html_dir):
    """The built site served on the loopback by the site audit's server; yields its base URL."""
    with load_tool("site_audit").serve(html_dir) as base:
        yield base


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium, launched with the site audit's arguments (one per module)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = load_tool("site_audit")._launch(p)
        yield b
        b.close()
