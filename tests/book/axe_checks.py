"""axe-core in the built book's pages (tests/book/test_accessibility.py, tests/book/desk_pass.py).

axe-core is the copy that the PyPI package axe-playwright-python bundles (``axe.min.js``): nothing is
fetched at run time. A page is loaded once in a tab whose context shows the book in the light
scheme, checked, switched to the dark scheme as the theme's own button does, and checked again.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path

import axe_playwright_python

from book_paths import load_tool

site_audit = load_tool("site_audit")
AXE_JS = Path(axe_playwright_python.__file__).parent / "axe.min.js"

WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
BLOCKING = ("serious", "critical")
SCHEMES = ("light", "dark")
_RUN_AXE = """(tags) => axe.run(document, {runOnly: {type: 'tag', values: tags},
                                          resultTypes: ['violations']})"""


def _scheme_context(browser, base: str, scheme: str, width: int = 1280):
    """A browser context that shows the book in ``scheme`` and can reach only the local server."""
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
    # the theme's own switch stores the choice here; its inline script reads it before painting
    context.add_init_script(f"localStorage.setItem('mode', '{scheme}'); localStorage.setItem('theme', '{scheme}')")
    context.add_init_script(path=str(AXE_JS))
    return context


def _open(page, url: str) -> None:
    """Load ``url`` and wait until MathJax has typeset (pages without maths do not load it)."""
    page.goto(url, wait_until="load")
    if page.evaluate("() => document.querySelector('script[src*=\"mathjax\"]') !== null"):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
        page.evaluate("() => MathJax.startup.promise")


def _show_scheme(page, scheme: str) -> None:
    """Switch the loaded page to ``scheme`` as the theme's own button does (no reload)."""
    page.evaluate(
        """(scheme) => { localStorage.setItem('mode', scheme); localStorage.setItem('theme', scheme);
                         document.documentElement.dataset.mode = scheme;
                         document.documentElement.dataset.theme = scheme; }""",
        scheme,
    )
    # the theme animates some colours (the search button's): measure after the transitions end
    page.evaluate(
        """() => Promise.all(document.getAnimations()
                 .filter(a => a.effect && a.effect.getTiming().iterations !== Infinity)
                 .map(a => a.finished.catch(() => null)))"""
    )


def axe_violations(browser, html_dir: Path, pages: list[str], schemes=SCHEMES) -> dict[str, dict]:
    """The serious and critical violations of ``pages`` in each scheme:
    {scheme: {(rule, impact, help): ['page: element: summary', ...]}}.  Each page is loaded (and its
    maths typeset) once, in the first scheme, and switched to the others; the pages are shared out
    among the site audit's browsers (``site_audit.map_pages``), each keeping one tab."""
    found = {scheme: defaultdict(list) for scheme in schemes}
    with site_audit.serve(html_dir) as base:

        @contextlib.contextmanager
        def open_worker(b):
            context = _scheme_context(b, base, schemes[0])
            try:
                page = context.new_page()
                yield lambda rel: _page_violations(page, base, rel, schemes)
            finally:
                context.close()

        per_page = site_audit.map_pages(pages, open_worker, browser)
    for violations in per_page:
        for scheme, key, where in violations:
            found[scheme][key].append(where)
    return found


def _page_violations(page, base: str, rel: str, schemes, opened: bool = False) -> list[tuple]:
    """[(scheme, (rule, impact, help), 'page: element: summary')] for one page, in each scheme
    (``opened``: the page is loaded and typeset in ``page`` already, in the first scheme)."""
    out = []
    if not opened:
        _open(page, f"{base}/{rel}")
    for scheme in schemes:
        _show_scheme(page, scheme)
        theme = page.evaluate("document.documentElement.dataset.theme")
        assert theme == scheme, f"{rel}: data-theme is {theme!r}, not {scheme!r}"
        for rule in page.evaluate(_RUN_AXE, WCAG_TAGS)["violations"]:
            if rule["impact"] not in BLOCKING:
                continue
            for node in rule["nodes"]:
                target = " ".join(str(t) for t in node["target"])
                detail = (node.get("failureSummary") or "").replace("\n", " ")[:160]
                out.append((scheme, (rule["id"], rule["impact"], rule["help"]), f"{rel}: {target}: {detail}"))
    return out
