"""The site's checks run in two pytest-xdist processes (``make test``), and a pass over every page is
computed once per process: every test that uses one must be scheduled with the others that use it
(tests/book/conftest.py: ``SHARED_PASSES``), or the pass runs once more in the other process."""

from book_paths import ROOT
from conftest import SHARED_PASSES, shared_pass

# the fixture through which a test gets a shared pass, and the pass
PASS_FIXTURES = {"findings": "desk_pass", "every_page": "desk_pass", "mobile_findings": "mobile_pass",
                 "planted": "reader_planted", "soups": "html_soups"}


def test_every_test_of_a_shared_pass_is_scheduled_with_it(request):
    for item in request.session.items:
        for fixture, name in PASS_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                assert shared_pass(item.nodeid) == name, f"{item.nodeid} uses {fixture} outside its pass"


def test_every_name_in_the_schedule_is_a_test_or_module_that_exists():
    """A renamed test would silently leave its pass's schedule (and the pass would run twice)."""
    assert set(SHARED_PASSES.values()) == set(PASS_FIXTURES.values())
    for key in SHARED_PASSES:
        path, _, test = key.partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert not test or f"\ndef {test}(" in source, f"{key}: no such test"


def test_other_tests_are_units_of_their_own():
    assert shared_pass("tests/book/test_mobile.py::test_the_skip_link_moves_to_the_content") is None
    assert shared_pass("tests/book/test_reader.py::test_screenshots[book/preface.html]") is None
    assert shared_pass("tests/book/test_html.py::test_no_broken_internal_links") == "html_soups"
    assert shared_pass("tests/book/test_accessibility.py::test_axe_wcag21_aa_on_every_page[dark]") == "desk_pass"


def test_two_workers_keep_a_pass_in_one_process(html_dir):
    """The scheduler at work: under ``pytest -n 2`` every test of test_html (one pass: the parsed
    pages) runs in one worker, while the other tests are shared out (a newer pytest-xdist that no
    longer calls the scheduler's ``_split_scope`` would fail here)."""
    import re
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider",
                          "tests/book/test_html.py", "tests/book/test_results_ch1.py", "tests/book/test_results_ch2.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    ran = re.findall(r"\[(gw\d+)\]\s+\[\s*\d+%\]\s+PASSED\s+(tests/book/\S+?)::", run.stdout)
    workers = {}
    for worker, module in ran:
        workers.setdefault(module, set()).add(worker)
    assert len(ran) > 30 and len(workers) == 3, run.stdout[-3000:]
    assert len(workers["tests/book/test_html.py"]) == 1, workers
    assert len(set().union(*workers.values())) == 2, workers  # the rest went to the other worker too
