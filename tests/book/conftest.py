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


# ------------------------------------------------------------- the site's checks in two processes

# Tests that share a pass computed once per process run in one pytest-xdist worker: the desk pass
# over every page (tests/book/desk_pass.py: the site audit's and axe's every-page tests), the phone
# and tablet pass (its module fixture), the audit of the planted site, the parsed pages.  Every other
# test is a unit of its own.  (xdist's ``--dist loadgroup`` would do this with marks, but it renames
# the tests through ``item._nodeid``, which pytest 9 no longer reads, so its groups fall apart and
# each pass ran twice.)
SHARED_PASSES = {
    "tests/book/test_reader.py::test_every_page_passes": "desk_pass",
    "tests/book/test_accessibility.py::test_axe_wcag21_aa_on_every_page": "desk_pass",
    "tests/book/test_mobile.py::test_every_page_on_a_phone_and_a_tablet": "mobile_pass",
    "tests/book/test_reader.py::test_each_check_reports_its_planted_defect": "reader_planted",
    "tests/book/test_html.py": "html_soups",
}


def shared_pass(nodeid: str) -> str | None:
    """The name of the shared pass a test's node id belongs to, or None."""
    test = nodeid.split("[", 1)[0]
    return SHARED_PASSES.get(test) or SHARED_PASSES.get(test.split("::", 1)[0])


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedPassScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with a scope per shared pass and one per other test (the largest
        scopes are handed out first)."""

        def _split_scope(self, nodeid: str) -> str:
            return shared_pass(nodeid) or nodeid

    return SharedPassScheduling(config, log)
