"""Accessibility of the built book, in headless Chromium (Debian's, driven by Playwright).

axe-core's WCAG 2.1 A and AA rules (tags ``wcag2a``, ``wcag2aa``, ``wcag21a``, ``wcag21aa``) run on
every page of the book, once in the light and once in the dark colour scheme (pydata-sphinx-theme
keeps the reader's choice in ``localStorage.mode`` and shows it as ``data-theme`` on ``<html>``).
A page passes when axe reports no violation of impact *serious* or *critical*.  Every page is
loaded once in one browser tab, checked in the light scheme, switched to the dark one as the
theme's button does, and checked again; one test per scheme reports all its violations together,
grouped by rule;
the full list is written to ``_build/accessibility-<scheme>.json``.  axe-core is the copy that the
PyPI package axe-playwright-python bundles (``axe.min.js``): nothing is fetched at run time.

A page with planted violations shows that the check can fail.  Two more things a reader who does
not use a mouse or does not see the page depends on: MathJax attaches hidden MathML to every
formula for screen readers, and keyboard focus is drawn.
"""

from __future__ import annotations

import json
import shutil

import pytest

from book_paths import BUILD, load_tool

axe_playwright_python = pytest.importorskip("axe_playwright_python")
import desk_pass  # noqa: E402
from axe_checks import SCHEMES, _open, _scheme_context, axe_violations  # noqa: E402

site_audit = load_tool("site_audit")


def _report(found: dict) -> str:
    lines = []
    for (rule, impact, help_), where in sorted(found.items()):
        pages = {w.split(":", 1)[0] for w in where}
        lines.append(f"{rule} ({impact}): {help_} -- {len(where)} element(s) on {len(pages)} page(s)")
        lines += [f"    {w}" for w in where[:6]]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def every_page(html_dir):
    # one load of each page at a desk, shared with the site audit's checks (tests/book/desk_pass.py)
    pages, by_scheme = desk_pass.desk_pass(html_dir)["axe"]
    assert len(pages) > 50, pages
    return pages, by_scheme


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_axe_wcag21_aa_on_every_page(every_page, scheme):
    pages, by_scheme = every_page
    found = by_scheme[scheme]
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / f"accessibility-{scheme}.json").write_text(
        json.dumps({f"{r} ({i}): {h}": w for (r, i, h), w in sorted(found.items())}, indent=1) + "\n"
    )
    assert not found, f"{scheme} scheme, {len(pages)} pages:\n" + _report(found)


@pytest.mark.slow
def test_axe_reports_planted_violations(html_dir, browser, tmp_path):
    """A check that cannot fail is no check: a nameless sidebar toggle and a pale link are reported."""
    site = tmp_path / "html"
    shutil.copytree(html_dir, site)
    page = (site / "book" / "notation.html").read_text(encoding="utf-8")
    planted = (
        '<details><summary class="planted-toggle"><i class="fa-solid fa-chevron-down"></i></summary>'
        "<p>planted</p></details>"
        '<p style="background:#ffffff"><a href="#" style="color:#c8c8c8">a planted pale link</a></p>'
    )
    head, marker, tail = page.partition("<article")
    assert marker, "book/notation.html has no <article>"
    tail = tail.replace(">", ">" + planted, 1)
    (site / "book" / "planted.html").write_text(head + marker + tail, encoding="utf-8")
    for scheme, found in axe_violations(browser, site, ["book/planted.html"]).items():
        rules = {rule for rule, _, _ in found}
        assert {"summary-name", "color-contrast"} <= rules, f"{scheme}: " + _report(found)


def test_mathjax_attaches_mathml_for_screen_readers(html_dir, browser):
    """Every typeset formula carries MathJax's hidden MathML (the assistive-mml extension)."""
    with site_audit.serve(html_dir) as base:
        context = _scheme_context(browser, base, "light")
        try:
            page = context.new_page()
            _open(page, f"{base}/book/notation.html")
            counts = page.evaluate(
                """() => ({formulas: document.querySelectorAll('mjx-container').length,
                           mathml: document.querySelectorAll('mjx-container > mjx-assistive-mml > math').length})"""
            )
        finally:
            context.close()
    assert counts["formulas"] > 10, counts
    assert counts["mathml"] == counts["formulas"], counts


@pytest.mark.parametrize("scheme", SCHEMES)
def test_keyboard_focus_is_visible(html_dir, browser, scheme):
    """Tabbing through a page draws a ring around each focused control: an outline of at least
    2 px (book.css) or the theme's own focus ring, a box shadow."""
    with site_audit.serve(html_dir) as base:
        context = _scheme_context(browser, base, scheme)
        try:
            page = context.new_page()
            _open(page, f"{base}/book/ch2/applications.html")
            seen = []
            for _ in range(12):
                page.keyboard.press("Tab")
                seen.append(
                    page.evaluate(
                        """() => { const e = document.activeElement;
                                   // the theme rings a sidebar toggle's chevron, not the <summary>
                                   const s = getComputedStyle(e.querySelector(':scope > .toctree-toggle') || e);
                                   return {tag: e.tagName, text: (e.textContent || '').trim().slice(0, 30),
                                           style: s.outlineStyle, width: parseFloat(s.outlineWidth) || 0,
                                           shadow: s.boxShadow}; }"""
                    )
                )
        finally:
            context.close()
    focused = [s for s in seen if s["tag"] not in ("BODY", "HTML")]
    assert len(focused) >= 8, seen
    invisible = [s for s in focused if (s["style"] == "none" or s["width"] < 2) and s["shadow"] in ("", "none")]
    assert not invisible, f"focus not drawn on: {invisible}"
