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
