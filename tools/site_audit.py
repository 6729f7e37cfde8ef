"""Read the built book as a reader would, in headless Chromium, and list what gets in the way.

Each check returns the places that fail it (an empty list is a pass):

``wide_equations``
    Display equations wider than their column at 1280 px (they would scroll sideways, their
    number out of sight).
``figures_without_caption``
    Images in a page's content that are not a numbered figure with a caption.
``figures_without_alt``
    Images without alt text that describes them (missing, too short, or a file name).
``small_figure_text``
    Figures whose smallest text shows below 9 CSS px: the house style's smallest font
    (:data:`MIN_FONT_PT`), at the PNG's DPI, scaled by its displayed width over its natural width.
``build_paths``
    Outputs that print a build path, an object repr or a warning.
``console_errors``
    Errors in the browser's console, failed requests (a missing favicon included) and uncaught
    exceptions.
``duplicate_titles``
    Pages whose title another page also has.
``raw_tex_in_bibliography``
    Bibliography entries with raw TeX (``$``, ``\\``, braces) left in them.
``wide_code``
    Visible code cells (not folded) wider than their column: they scroll sideways.
``mathjax_errors``
    Formulas MathJax could not typeset: an ``mjx-merror`` or ``data-mjx-error`` element, or
    "Math input error" / "Math output error" shown in the page.
``control_characters``
    Control characters (U+0000 to U+001F except tab, newline and carriage return, and U+007F) in a
    page's HTML outside its scripts and styles: a TeX command whose backslash a Python string
    swallowed (``"\\approx"`` holds U+0007) reaches the reader that way.

A phone and a tablet pass (:func:`mobile_audit`; ``--mobile``) read every page again at 390 x 844
with touch (a phone) and at 900 x 900 (a tablet) and list, per device:

``contents_toggle``
    Pages whose table-of-contents button does not open the contents, or whose open contents do
    not close again (with Escape, as from a keyboard).
``page_scrolls_sideways``
    Pages wider than the screen (the whole page would scroll sideways).
``cut_figures``
    Images wider than the column that holds them (a part of the figure is cut off).
``explorer_fit``
    Page explorers wider than the screen, or with a control under 44 x 44 CSS px.
``equation_numbers_overlap``
    Display equations whose number is drawn over the equation.
``equations_not_fitting``
    Pages where more than a tenth of the display equations scroll sideways, and any equation
    that scrolls without the ``maths-scrolls`` cue (``book/assets/maths_fit.js``).
``small_figure_text_on_phone``
    Figures whose smallest text (:data:`MIN_FONT_PT` at the PNG's DPI) shows below
    :data:`MIN_PHONE_TEXT_PX` on the screen, for the image the browser chose (a wide figure's
    phone variant, ``book/_ext/phone_figures.py``, where it has one).
``first_sentence_off_screen``
    Pages whose first sentence of prose (the first paragraph outside boxes, code, figures and
    tables) starts below the first screen: the reader must scroll past a box to start reading.

Usage::

    python tools/site_audit.py [HTML_DIR] [--pages book/ch2/*.html ...] [--json OUT] [--mobile]

``HTML_DIR`` defaults to ``_build/_build/html`` (``$ATTNOPT_BUILD_DIR`` is honoured).  The
exit status is 1 when any check fails.  ``tests/book/test_reader.py`` runs the same checks in
``make test``, and plants one defect per check to show that each can fail.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import socketserver
import struct
import sys
import threading
from collections import defaultdict
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: The smallest font of the house style (``attnopt.plotting``), in points; notebooks may not set a
#: smaller one (a convention test checks their code).
MIN_FONT_PT = 10.0
#: The smallest legible text, in CSS pixels.
MIN_TEXT_PX = 9.0
VIEWPORT = {"width": 1280, "height": 900}
CHECKS = (
    "wide_equations",
    "figures_without_caption",
    "figures_without_alt",
    "small_figure_text",
    "build_paths",
    "console_errors",
    "duplicate_titles",
    "raw_tex_in_bibliography",
    "wide_code",
    "mathjax_errors",
    "control_characters",
)
# What an output must never show: a build or temporary path, a Path or object repr, a warning.
LEAKS = re.compile(
    r"(/_build/|_build/results|PosixPath\(|WindowsPath\(|/tmp/|site-packages|<[\w.]+ object at 0x"
    r"|\b\w*Warning\b:|Traceback \(most recent call last\))"
)

#: The phone and the tablet of the mobile pass (:func:`mobile_audit`).
DEVICES = {
    "phone": dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, device_scale_factor=3),
    "tablet": dict(viewport={"width": 900, "height": 900}),
}
MOBILE_CHECKS = (
    "contents_toggle",
    "page_scrolls_sideways",
    "cut_figures",
    "explorer_fit",
    "equation_numbers_overlap",
    "equations_not_fitting",
    "small_figure_text_on_phone",
    "first_sentence_off_screen",
)
#: The smallest figure text a phone or a tablet may show, in CSS px (issue 27 asks 8.5).
MIN_PHONE_TEXT_PX = 8.5
#: The smallest touch target the book draws for an explorer's control (WCAG 2.2 asks 24 px).
MIN_TARGET_PX = 44
#: The share of a page's display equations that may scroll sideways on a phone or a tablet.
MAX_SCROLLING_SHARE = 0.10

# Control characters a page's text may not hold: C0 less tab, newline and carriage return; DEL.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Scripts and styles are not text (the bundled scripts may hold any character in a string).
_NOT_TEXT = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.S | re.I)

# Everything the page tells us, gathered in one evaluation.
_PAGE_SCRIPT = r"""
() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('article') || document.body;
  const icon = document.querySelector('link[rel~="icon"]');
  const out = {title: document.title, equations: [], images: [], outputs: [], code: [],
               favicon: icon ? icon.getAttribute('href') : null};
  for (const box of article.querySelectorAll('mjx-container[display="true"]')) {
    const math = box.querySelector('mjx-math');
    const holder = box.closest('div.math') || box.parentElement;
    const column = holder.getBoundingClientRect().width;
    const width = math ? math.getBoundingClientRect().width : box.scrollWidth;
    const eqno = holder.querySelector('.eqno');
    const extra = eqno ? eqno.getBoundingClientRect().width : 0;
    const tex = (holder.getAttribute('data-tex') || holder.textContent || '').trim().slice(0, 80);
    out.equations.push({width: width + extra, column: column, scroll: box.scrollWidth - box.clientWidth,
                        id: holder.id || (holder.querySelector('[id]') || {}).id || '', tex: tex});
  }
  for (const img of article.querySelectorAll('img')) {
    if (img.closest('.navbar-brand, .sidebar-primary-items__start, header, footer')) continue;
    const fig = img.closest('figure');
    const cap = fig ? fig.querySelector('figcaption') : null;
    out.images.push({src: img.getAttribute('src'), alt: img.getAttribute('alt') || '',
                     natural: img.naturalWidth, shown: img.getBoundingClientRect().width,
                     caption: cap ? cap.textContent.trim() : '',
                     numbered: !!(cap && cap.querySelector('.caption-number'))});
  }
  for (const o of article.querySelectorAll('.cell_output, .output')) out.outputs.push(o.innerText);
  out.mathErrors = [];
  for (const box of document.querySelectorAll('mjx-container')) {
    const e = box.querySelector('mjx-merror, [data-mjx-error]');
    if (!e) continue;
    const where = box.closest('[id]');
    out.mathErrors.push(((e.getAttribute('data-mjx-error') || e.textContent || '').trim() || 'error') +
                        (where ? ' in #' + where.id : ''));
  }
  const shown = document.body.innerText;
  for (const text of ['Math input error', 'Math output error'])
    if (shown.includes(text) && !out.mathErrors.length) out.mathErrors.push(text + ' shown');
  for (const pre of article.querySelectorAll('.cell_input pre, div.highlight pre')) {
    const hidden = pre.closest('details:not([open])') || pre.offsetParent === null;
    if (!hidden) out.code.push({over: pre.scrollWidth - pre.clientWidth, start: pre.textContent.slice(0, 60)});
  }
  return out;
}
"""


def _png_dpi(path: Path) -> float | None:
    """The DPI stored in a PNG's pHYs chunk (Matplotlib writes it), or None."""
    with open(path, "rb") as f:
        data = f.read(4096)
    i = data.find(b"pHYs")
    if i < 0:
        return None
    per_unit, _, unit = struct.unpack(">IIB", data[i + 4 : i + 13])
    return per_unit * 0.0254 if unit == 1 else None


@contextlib.contextmanager
def serve(html_dir: Path):
    """Serve ``html_dir`` on a free localhost port; yield its URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
        # several pages load at once (:func:`map_pages`), each asking for dozens of files
        daemon_threads = True

    handler = functools.partial(Quiet, directory=str(html_dir))
    with Server(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()


def _is_redirect(path: Path) -> bool:
    head = path.read_text(encoding="utf-8", errors="replace")[:300].lower()
    return 'http-equiv="refresh"' in head


def content_pages(html_dir: Path) -> list[str]:
    """Every page of the book (relative paths), without Sphinx's generated indexes and sources
    and without redirects (Jupyter Book's ``index.html`` sends the reader to the root page)."""
    skip = {"genindex.html", "search.html", "prf-prf.html", "py-modindex.html"}
    return sorted(
        str(p.relative_to(html_dir))
        for p in html_dir.rglob("*.html")
        if not ({"_static", "_modules", "_sources", "_images"} & set(p.relative_to(html_dir).parts))
        and p.name not in skip
        and not _is_redirect(p)
    )


def _launch(playwright):
    if not Path(CHROMIUM).exists():
        raise RuntimeError("Debian's chromium is not installed (apt-get install chromium; .ci/run does it)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def workers() -> int:
    """How many pages the site's passes load at once, one browser each: the cores this process may
    use, at most 4 (``$ATTNOPT_BROWSER_WORKERS`` overrides).  A page's load, MathJax's typesetting
    and axe's rules run in the page's renderer on one core, so two cores check two pages at a time."""
    env = os.environ.get("ATTNOPT_BROWSER_WORKERS", "").strip()
    if env:
        return max(1, int(env))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores))


def map_pages(pages: list[str], open_worker, browser=None, n_workers: int | None = None) -> list:
    """``[check(rel) for rel in pages]``, computed by ``n_workers`` browsers (default
    :func:`workers`) that each take the next page from one queue.

    ``open_worker(browser)`` is a context manager that yields ``check`` for one browser (so that a
    worker can keep one tab for all its pages).  ``browser``, when given, is the first worker's;
    every other worker launches its own in its own thread (Playwright's sync API is not
    thread-safe: one instance per thread).  The first error in any worker is raised here."""
    import queue

    n = max(1, min(n_workers or workers(), len(pages)))
    todo: queue.Queue = queue.Queue()
    for item in enumerate(pages):
        todo.put(item)
    results: list = [None] * len(pages)
    errors: list[BaseException] = []

    def drain(b) -> None:
        with open_worker(b) as check:
            while not errors:
                try:
                    i, rel = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = check(rel)

    def own_browser() -> None:
        try:
            from playwright.sync_api import sync_playwright

            with sync_playwright() as playwright:
                b = _launch(playwright)
                try:
                    drain(b)
                finally:
                    b.close()
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=own_browser, daemon=True) for _ in range(n - (browser is not None))]
    for t in threads:
        t.start()
    if browser is not None:
        try:
            drain(browser)
        except BaseException as exc:
            errors.append(exc)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _each_visit(visit_one, base: str, *args):
    """An ``open_worker`` for :func:`map_pages` that calls ``visit_one(browser, url, *args)``."""

    @contextlib.contextmanager
    def open_worker(browser):
        yield lambda rel: visit_one(browser, f"{base}/{rel}", *args)

    return open_worker


def listen(page, local: str, errors: list[str]) -> None:
    """Append to ``errors`` what ``page`` logs as an error, throws, or gets as an HTTP error from ``local``."""
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"exception: {exc}"))
    page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url[len(local):]}") if r.status >= 400 else None)


def read_page(page, url: str, errors: list[str]) -> dict:
    """Load ``url`` in ``page`` (whose context reaches only the local server and whose errors
    :func:`listen` appends to ``errors``), let MathJax typeset, and return what the page shows plus
    the errors logged since ``errors`` was last emptied."""
    page.goto(url, wait_until="load")
    with contextlib.suppress(Exception):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=10_000)
        page.evaluate("() => MathJax.startup.promise")
    page.wait_for_timeout(100)
    info = page.evaluate(_PAGE_SCRIPT)
    info["errors"] = list(errors)
    return info


def visit(browser, url: str) -> dict:
    """Open ``url`` at 1280 px in a new context, let MathJax typeset, and return what the page
    shows plus its console errors (:func:`read_page`)."""
    context = browser.new_context(viewport=VIEWPORT)
    local = "/".join(url.split("/", 3)[:3])
    errors: list[str] = []
    # Nothing but the local server may be reached (the book must work offline).
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(local) else route.abort())
    page = context.new_page()
    listen(page, local, errors)
    try:
        return read_page(page, url, errors)
    finally:
        context.close()


# What a phone or a tablet shows, gathered in one evaluation once MathJax has typeset the page.
_MOBILE_SCRIPT = r"""
() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('article') || document.body;
  const width = window.innerWidth;
  const out = {pageWidth: document.documentElement.scrollWidth, width: width, height: window.innerHeight,
               images: [], explorers: [], equations: []};
  // the page's first sentence of prose: the first visible paragraph outside boxes, code and figures
  const first = [...article.querySelectorAll('p')].find(p => p.offsetParent !== null
      && p.textContent.trim().length > 30
      && !p.closest('.admonition, nav, .cell_input, .cell_output, figure, table, .toctree-wrapper, dl'));
  out.firstSentence = first ? {top: first.getBoundingClientRect().top + window.scrollY,
                               text: first.textContent.trim().slice(0, 50)} : null;
  for (const img of article.querySelectorAll('img')) {
    if (img.offsetParent === null) continue;
    const holder = img.closest('figure, .cell_output, .page-explorer, p, div') || article;
    const r = img.getBoundingClientRect(), h = holder.getBoundingClientRect();
    out.images.push({src: (img.getAttribute('src') || '').slice(0, 60), right: r.right, width: r.width,
                     holderRight: h.right, articleRight: article.getBoundingClientRect().right,
                     current: img.currentSrc || img.src, natural: img.naturalWidth});
  }
  for (const root of article.querySelectorAll('.page-explorer')) {
    const r = root.getBoundingClientRect();
    const small = [];
    for (const c of root.querySelectorAll('input, select')) {
      const b = c.getBoundingClientRect();
      if (b.height < %(target)d || b.width < %(target)d) small.push(c.name + ' ' + Math.round(b.width) + 'x' + Math.round(b.height));
    }
    out.explorers.push({id: root.id, right: r.right, small: small,
                        wired: root.dataset.wired === 'true'});
  }
  for (const box of article.querySelectorAll('mjx-container[display="true"]')) {
    const holder = box.closest('div.math') || box.parentElement;
    const math = box.querySelector('mjx-math') || box;
    const eqno = holder.querySelector('.eqno');
    let overlap = false;
    if (eqno && eqno.offsetParent !== null) {
      const a = eqno.getBoundingClientRect(), m = math.getBoundingClientRect(), v = box.getBoundingClientRect();
      // the visible part of the equation (it may scroll inside its box)
      const left = Math.max(m.left, v.left), right = Math.min(m.right, v.right);
      overlap = a.left < right - 1 && a.right > left + 1 && a.top < m.bottom - 1 && a.bottom > m.top + 1;
    }
    const scroller = [box, holder].find(e => e.scrollWidth > e.clientWidth + 1);
    out.equations.push({id: holder.id || '', scrolls: !!scroller, cue: holder.classList.contains('maths-scrolls'),
                        overlap: overlap});
  }
  return out;
}
""" % {"target": MIN_TARGET_PX}


def _contents_toggle(page) -> str | None:
    """Open the table of contents with its visible button, close it with Escape; what went wrong."""
    toggle = page.locator(".bd-header-article .primary-toggle, .header-article-items .primary-toggle")
    if toggle.count() == 0:
        toggle = page.locator(".primary-toggle:visible")
    if toggle.count() == 0 or not toggle.first.is_visible():
        return "no visible contents button"
    toggle.first.click()
    try:
        page.wait_for_function("() => { const d = document.getElementById('pst-primary-sidebar-modal');"
                               " return d && d.open && d.querySelector('nav a') !== null; }", timeout=2_000)
    except Exception:
        return "the contents button does not open the contents"
    page.keyboard.press("Escape")
    try:
        page.wait_for_function("() => !document.getElementById('pst-primary-sidebar-modal').open", timeout=2_000)
    except Exception:
        return "the open contents do not close with Escape"
    return None


def device_tab(browser, device: str, local: str):
    """``(context, page)``: a tab on ``device`` (a key of :data:`DEVICES`) whose context reaches only
    the server at ``local``; the caller closes the context."""
    context = browser.new_context(**DEVICES[device])
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(local) else route.abort())
    return context, context.new_page()


def read_mobile(page, url: str) -> dict:
    """Load ``url`` in a tab of :func:`device_tab`, let MathJax typeset, and return what the page shows
    and whether its contents open and close (``toggle``: None or what went wrong)."""
    page.goto(url, wait_until="load")
    with contextlib.suppress(Exception):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=10_000)
        page.evaluate("() => MathJax.startup.promise")
        # typeset and fitted (book/assets/maths_fit.js sets this after MathJax's first pass)
        page.wait_for_function("() => document.documentElement.dataset.mathsFitted === 'true'", timeout=20_000)
    page.wait_for_timeout(100)
    info = page.evaluate(_MOBILE_SCRIPT)
    info["toggle"] = _contents_toggle(page)
    return info


def mobile_visit(browser, url: str, device: str) -> dict:
    """Open ``url`` on ``device`` (a key of :data:`DEVICES`) in a new context and return
    :func:`read_mobile`'s reading of it."""
    context, page = device_tab(browser, device, "/".join(url.split("/", 3)[:3]))
    try:
        return read_mobile(page, url)
    finally:
        context.close()


def mobile_audit(html_dir: Path, pages: list[str] | None = None, browser=None,
                 devices=tuple(DEVICES), n_workers: int | None = None) -> dict[str, dict[str, list[str]]]:
    """The phone and tablet pass over ``pages`` (default: all): ``{device: {check: places}}``.
    ``n_workers`` browsers share the pages (:func:`map_pages`)."""
    html_dir = Path(html_dir)
    pages = content_pages(html_dir) if pages is None else pages
    found = {d: {name: [] for name in MOBILE_CHECKS} for d in devices}
    with serve(html_dir) as base:
        # one queue for both devices, so that no browser idles between the passes
        items = [(device, rel) for device in devices for rel in pages]

        @contextlib.contextmanager
        def open_worker(b):
            # one tab per device for all of this browser's pages, as the desk pass keeps one: a new
            # context per page (its set-up and a new renderer every time; the routing turns the HTTP
            # cache off either way) made the pass take about 1.5 times as long here; each page is a
            # new document, and test_mobile checks that a kept tab reads what a fresh context reads
            tabs = {}

            def check(item):
                device, rel = item
                if device not in tabs:
                    tabs[device] = device_tab(b, device, base)
                return read_mobile(tabs[device][1], f"{base}/{rel}")

            try:
                yield check
            finally:
                for context, _ in tabs.values():
                    context.close()

        visits = dict(zip(items, map_pages(items, open_worker, browser, n_workers)))
    for device in devices:
        out = found[device]
        for rel in pages:
            info = visits[device, rel]
            if info["toggle"]:
                out["contents_toggle"].append(f"{rel}: {info['toggle']}")
            if info["pageWidth"] > info["width"] + 1:
                out["page_scrolls_sideways"].append(f"{rel}: {info['pageWidth']} px on a {info['width']}-px screen")
            for img in info["images"]:
                if img["right"] > min(img["holderRight"], img["articleRight"], info["width"]) + 1:
                    out["cut_figures"].append(f"{rel}: {img['src']} ({img['width']:.0f} px wide)")
                px = _figure_text_px(html_dir, base, img)
                if px is not None and px < MIN_PHONE_TEXT_PX:
                    name = unquote(img["current"].rsplit("/", 1)[-1])
                    out["small_figure_text_on_phone"].append(
                        f"{rel}: {name}: {MIN_FONT_PT:g}-pt text shows at {px:.1f} px ({img['natural']} px wide, shown {img['width']:.0f} px)")
            for ex in info["explorers"]:
                if ex["right"] > info["width"] + 1 or ex["small"] or not ex["wired"]:
                    why = ", ".join(filter(None, [
                        f"right edge at {ex['right']:.0f} px" if ex["right"] > info["width"] + 1 else "",
                        f"controls under {MIN_TARGET_PX} px: {'; '.join(ex['small'])}" if ex["small"] else "",
                        "not wired" if not ex["wired"] else ""]))
                    out["explorer_fit"].append(f"{rel}: {ex['id']}: {why}")
            eqs = info["equations"]
            for eq in eqs:
                if eq["overlap"]:
                    out["equation_numbers_overlap"].append(f"{rel}: {eq['id'] or 'an equation'}")
                if eq["scrolls"] and not eq["cue"]:
                    out["equations_not_fitting"].append(f"{rel}: {eq['id'] or 'an equation'} scrolls without a cue")
            first = info.get("firstSentence")
            if first and first["top"] > info["height"]:  # a reader must scroll to the first sentence
                out["first_sentence_off_screen"].append(
                    f"{rel}: {first['text']!r}... starts {first['top']:.0f} px down on a {info['height']}-px screen")
            scrolling = sum(eq["scrolls"] for eq in eqs)
            if eqs and scrolling > MAX_SCROLLING_SHARE * len(eqs):
                out["equations_not_fitting"].append(f"{rel}: {scrolling} of {len(eqs)} display equations scroll")
    return found


def _figure_text_px(html_dir: Path, base: str, img: dict) -> float | None:
    """The CSS size at which ``img`` (an image of a mobile visit) shows :data:`MIN_FONT_PT` text:
    the chosen file's DPI (a Matplotlib PNG's pHYs chunk), scaled by its shown width over its
    natural one; None for images without a DPI (photographs, explorer frames, icons)."""
    url = (img.get("current") or "").split("?")[0].split("#")[0]
    if not url.startswith(base) or not url.endswith(".png") or not img.get("natural") or not img.get("width"):
        return None
    file = html_dir / unquote(url[len(base):].lstrip("/"))
    dpi = _png_dpi(file) if file.is_file() else None
    return MIN_FONT_PT / 72 * dpi * img["width"] / img["natural"] if dpi else None


def audit(html_dir: Path, pages: list[str] | None = None, browser=None,
          n_workers: int | None = None) -> dict[str, list[str]]:
    """Run every check over ``pages`` (default: all) of the built book in ``html_dir``;
    ``n_workers`` browsers share the pages (:func:`map_pages`)."""
    html_dir = Path(html_dir)
    pages = content_pages(html_dir) if pages is None else pages
    with serve(html_dir) as base:
        visits = map_pages(pages, _each_visit(visit, base), browser, n_workers)
    return findings(html_dir, pages, visits)


def findings(html_dir: Path, pages: list[str], visits: list[dict]) -> dict[str, list[str]]:
    """The checks of :data:`CHECKS` on what :func:`read_page` returned for each of ``pages``."""
    html_dir = Path(html_dir)
    found: dict[str, list[str]] = {name: [] for name in CHECKS}
    titles: dict[str, list[str]] = defaultdict(list)
    for rel, info in zip(pages, visits):
        titles[info["title"]].append(rel)
        for eq in info["equations"]:
            over = max(eq["width"] - eq["column"], eq["scroll"])
            if over > 1:
                found["wide_equations"].append(f"{rel}: {over:.0f} px too wide: {eq['id'] or eq['tex']}")
        for img in info["images"]:
            src = img["src"] or ""
            name = unquote(src.rsplit("/", 1)[-1])
            if not img["caption"] or not img["numbered"]:
                found["figures_without_caption"].append(f"{rel}: {name}")
            alt = img["alt"].strip()
            if len(alt) < 15 or re.search(r"\.(png|jpe?g|svg|gif)\b|^[\w./-]+$", alt):
                found["figures_without_alt"].append(f"{rel}: {name} (alt {alt!r})")
            file = (html_dir / rel).parent / unquote(src)
            dpi = _png_dpi(file) if file.suffix == ".png" and file.is_file() else None
            if dpi and img["natural"] and img["shown"]:
                px = MIN_FONT_PT / 72 * dpi * img["shown"] / img["natural"]
                if px < MIN_TEXT_PX:
                    found["small_figure_text"].append(
                        f"{rel}: {name}: {MIN_FONT_PT:g} pt text shows at {px:.1f} px "
                        f"({img['natural']} px wide at {dpi:.0f} dpi, shown {img['shown']:.0f} px)"
                    )
        for text in info["outputs"]:
            m = LEAKS.search(text)
            if m:
                found["build_paths"].append(f"{rel}: {m.group(0)!r} in an output")
        for err in info["errors"]:
            found["console_errors"].append(f"{rel}: {err}")
        # Headless Chromium does not ask for a favicon; a browser does, and logs a 404 without one.
        icon = info.get("favicon")
        if not icon:
            found["console_errors"].append(f"{rel}: no favicon (a browser's request for /favicon.ico fails)")
        elif not ((html_dir / rel).parent / unquote(icon.split("?")[0])).is_file():
            found["console_errors"].append(f"{rel}: favicon {icon} missing")
        for code in info["code"]:
            if code["over"] > 1:
                found["wide_code"].append(f"{rel}: {code['over']} px: {code['start'].strip()[:40]!r}")
        for err in info["mathErrors"]:
            found["mathjax_errors"].append(f"{rel}: {err}")
        found["control_characters"] += _control_characters(html_dir / rel, rel)
        if rel.endswith("bibliography.html"):
            found["raw_tex_in_bibliography"] += _raw_tex(html_dir / rel, rel)
    for title, where in titles.items():
        if len(where) > 1:
            found["duplicate_titles"].append(f"{title!r}: {', '.join(where)}")
    return found


def _control_characters(path: Path, rel: str) -> list[str]:
    text = _NOT_TEXT.sub("", path.read_text(encoding="utf-8", errors="replace"))
    return [
        f"{rel}: U+{ord(m.group(0)):04X} in {text[max(0, m.start() - 30) : m.end() + 30]!r}"
        for m in CONTROL_CHARACTERS.finditer(text)
    ]


def _raw_tex(path: Path, rel: str) -> list[str]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    bad = []
    for entry in soup.select("div.citation, dl.citation > dd, .bibliography li, div[role=doc-biblioentry]"):
        text = entry.get_text(" ", strip=True)
        if re.search(r"\$|\\[a-zA-Z]|[{}]", text):
            bad.append(f"{rel}: {text[:90]}")
    return bad


def main(argv=None) -> int:
    build = ROOT / os.environ.get("ATTNOPT_BUILD_DIR", "_build")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", nargs="?", default=str(build / "_build" / "html"))
    parser.add_argument("--pages", nargs="*", help="pages relative to HTML_DIR (globs allowed); default all")
    parser.add_argument("--json", help="write the findings to this file")
    parser.add_argument("--mobile", action="store_true", help="run the phone and tablet pass instead")
    args = parser.parse_args(argv)
    html_dir = Path(args.html_dir)
    pages = None
    if args.pages:
        pages = sorted({str(p.relative_to(html_dir)) for pattern in args.pages for p in html_dir.glob(pattern)})
    if args.mobile:
        by_device = mobile_audit(html_dir, pages)
        for device, checks in by_device.items():
            for name in MOBILE_CHECKS:
                print(f"{device} {name}: {len(checks[name])}")
                for line in checks[name]:
                    print(f"  {line}")
        if args.json:
            Path(args.json).write_text(json.dumps(by_device, indent=2) + "\n")
        return 1 if any(v for checks in by_device.values() for v in checks.values()) else 0
    found = audit(html_dir, pages)
    for name in CHECKS:
        print(f"{name}: {len(found[name])}")
        for line in found[name]:
            print(f"  {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2) + "\n")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
