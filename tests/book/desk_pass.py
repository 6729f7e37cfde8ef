"""One load of every page at a desk (1280 px) for two suites: the site audit's checks
(``tools/site_audit.py``, asserted by tests/book/test_reader.py) and axe-core's WCAG rules in both
colour schemes (tests/book/axe_checks.py, asserted by tests/book/test_accessibility.py).

Loading a page and letting MathJax typeset it is most of what checking it costs (about 1.4 s of a
core per page here), and both suites look at the same pages at the same width. Each of the site
audit's browsers (``site_audit.map_pages``) keeps one tab in axe's light-scheme context, which
reaches only the local server: it loads a page, reads what the site audit reads (with the console
errors, exceptions and HTTP errors of that load), then runs axe in the light and the dark scheme.
The planted-defect tests of both suites still run each suite on its own
(``site_audit.audit``, ``axe_checks.axe_violations``), through the same per-page code.

The result is kept for the pytest process (the first module to ask computes it).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path

from book_paths import load_tool

site_audit = load_tool("site_audit")
_DONE: dict[str, dict] = {}


def desk_pass(html_dir: Path) -> dict:
    """``{"audit": findings, "axe": (pages, {scheme: {(rule, impact, help): [where, ...]}})}`` for
    every page of the book in ``html_dir``; computed once per process."""
    key = str(Path(html_dir).resolve())
    if key not in _DONE:
        _DONE[key] = _run(Path(html_dir))
    return _DONE[key]


def _run(html_dir: Path, pages: list[str] | None = None) -> dict:
    """The shared pass over ``pages`` (default: every page), not kept."""
    import axe_checks

    pages = site_audit.content_pages(html_dir) if pages is None else pages
    schemes = axe_checks.SCHEMES
    with site_audit.serve(html_dir) as base:

        @contextlib.contextmanager
        def open_worker(b):
            context = axe_checks._scheme_context(b, base, schemes[0])
            try:
                page = context.new_page()
                errors: list[str] = []
                site_audit.listen(page, base, errors)

                def check(rel):
                    errors.clear()
                    info = site_audit.read_page(page, f"{base}/{rel}", errors)
                    return info, axe_checks._page_violations(page, base, rel, schemes, opened=True)

                yield check
            finally:
                context.close()

        per_page = site_audit.map_pages(pages, open_worker)
    found = {scheme: defaultdict(list) for scheme in schemes}
    for _, violations in per_page:
        for scheme, rule, where in violations:
            found[scheme][rule].append(where)
    audit = site_audit.findings(html_dir, pages, [info for info, _ in per_page])
    return {"audit": audit, "axe": (pages, found)}
