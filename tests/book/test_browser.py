"""Open the built book in headless Chromium (Debian's, driven by Playwright) and look at it.

Checks what only a browser can: the maths is typeset by the offline MathJax (no raw TeX left), the
notebook's figure is loaded and visible, and figures keep a white card in the dark theme.
Screenshots land in _build/screenshots/ for a person to look at.
"""

from pathlib import Path

import pytest

from book_paths import BUILD, load_tool

site_audit = load_tool("site_audit")
SHOTS = BUILD / "screenshots"
PAGES = ["book/preface.html", "book/notation.html", "notebooks/attention_in_a_few_lines.html"]


def open_page(browser, url, dark=False):
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, color_scheme="dark" if dark else "light")
    # Nothing but the local server may be reached.
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("http://127.0.0.1") else route.abort())
    page = context.new_page()
    page.goto(url, wait_until="load")
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
    page.evaluate("() => MathJax.startup.promise")
    return context, page


@pytest.mark.parametrize("path", PAGES)
def test_maths_typeset_and_screenshot(browser, server, path):
    context, page = open_page(browser, f"{server}/{path}")
    try:
        typeset = page.locator("mjx-container").count()
        assert typeset > 0, f"{path}: no typeset maths"
        text = page.locator("article").inner_text()
        for raw in ("\\(", "\\)", "$$", "\\begin{"):
            assert raw not in text, f"{path}: raw TeX {raw!r} left in the page"
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / (Path(path).stem + ".png")), full_page=False)
    finally:
        context.close()


def test_notebook_figure_visible_in_both_themes(browser, server):
    for dark in (False, True):
        context, page = open_page(browser, f"{server}/notebooks/attention_in_a_few_lines.html", dark=dark)
        try:
            assert page.evaluate("document.documentElement.dataset.theme") == ("dark" if dark else "light")
            img = page.locator(".cell_output img").first
            img.scroll_into_view_if_needed()
            assert img.is_visible()
            assert page.evaluate("(img) => img.complete && img.naturalWidth > 100", img.element_handle())
            background = page.evaluate("(img) => getComputedStyle(img).backgroundColor", img.element_handle())
            if dark:
                assert background == "rgb(255, 255, 255)", f"figure background in dark mode: {background}"
            SHOTS.mkdir(parents=True, exist_ok=True)
            img.screenshot(path=str(SHOTS / f"figure-{'dark' if dark else 'light'}.png"))
            if dark:
                page.screenshot(path=str(SHOTS / "notebook-dark.png"))
        finally:
            context.close()
