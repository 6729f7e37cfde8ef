"""The built book as a reader meets it, in headless Chromium at 1280 px (tools/site_audit.py).

One test per check over every page: display equations fit the column, every figure is numbered,
captioned and described, its text legible (the house style's 10 pt at >= 9 CSS px), no output
leaks a build path or a warning, no console error on any page (nor a missing favicon), page titles
are distinct, the bibliography has no raw TeX, visible code does not scroll sideways, MathJax
typesets every formula without an error, and no page holds a control character.  Each check
is also run on a copy of the site with one planted defect per check, which it must report: a check
that cannot fail is no check.  Screenshots of the pages a reader meets first, at 1280 px and on a
phone, land in _build/screenshots/ for a person to look at.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import desk_pass
from book_paths import BUILD, load_tool

site_audit = load_tool("site_audit")

SHOTS = BUILD / "screenshots"
# The landing page, one theory page per chapter, the VQA notebook.
SCREENSHOT_PAGES = [
    "book/preface.html",
    "book/ch1/duality.html",
    "book/ch2/markov_kernels.html",
    "book/ch3/softmax_solves_eot.html",
    "book/ch4/continuous_attention.html",
    "book/ch5/index.html",
    "notebooks/ch4_vqa_attention_maps.html",
]


@pytest.fixture(scope="module")
def findings(html_dir):
    # one load of each page at a desk, shared with axe's checks (tests/book/desk_pass.py)
    return desk_pass.desk_pass(html_dir)["audit"]


@pytest.mark.slow
@pytest.mark.parametrize("check", site_audit.CHECKS)
def test_every_page_passes(findings, check):
    found = findings[check]
    assert not found, f"{check}: {len(found)} place(s):\n" + "\n".join(found[:40])


# ---------------------------------------------------------------- each check fails on a planted defect

WIDE_TEX = r"\[" + " + ".join(f"x_{{{i}}}^{{2}}" for i in range(90)) + r" = \mathrm{planted}\]"
LONG_LINE = "planted = [" + ", ".join(str(i) for i in range(120)) + "]"


def _plant(html_dir: Path, tmp: Path) -> tuple[Path, list[str]]:
    """A copy of the site with book/planted.html and book/planted-bibliography.html, each defect marked 'planted'."""
    site = tmp / "html"
    shutil.copytree(html_dir, site)
    png = next(p for p in sorted((site / "_images").glob("*.png")))
    page = (site / "book" / "notation.html").read_text(encoding="utf-8")
    page = page.replace('<link rel="icon"', '<link rel="planted-no-icon"')  # no favicon
    defects = f"""
<div class="math notranslate nohighlight">{WIDE_TEX}</div>
<img src="../_images/{png.name}" id="planted-bare-image">
<figure class="align-default"><img src="../_images/{png.name}" alt="planted: a figure shown far too small to read" style="width:180px">
<figcaption><p><span class="caption-number">Fig. 9.9 </span><span class="caption-text">Planted caption.</span></p></figcaption></figure>
<div class="cell_output docutils container"><div class="output text_plain highlight-myst-ansi notranslate">
<div class="highlight"><pre><span></span>PosixPath('/home/planted/_build/results/planted.json')</pre></div></div></div>
<div class="highlight-python notranslate"><div class="highlight"><pre><span></span>{LONG_LINE}</pre></div></div>
<script>console.error("planted console error")</script>
<div class="math notranslate nohighlight" id="planted-math-error">\\[\\frac{{x}}\\]</div>
<p>\\(\\lVert x\\rVert\x07pprox 1\\): a planted control character.</p>
"""
    marker = '<section id="notation">' if '<section id="notation">' in page else "<article"
    head, _, tail = page.partition(marker)
    page = head + marker + tail.replace(">", ">" + defects, 1) if tail else page
    (site / "book" / "planted.html").write_text(page, encoding="utf-8")
    bib = (site / "book" / "bibliography.html").read_text(encoding="utf-8")
    bib = bib.replace('<div class="citation"', '<div class="citation" id="planted"><p>Planted Author. A title with raw TeX $q$ left in. 2026.</p></div>\n<div class="citation"', 1)
    (site / "book" / "planted-bibliography.html").write_text(bib, encoding="utf-8")
    return site, ["book/planted.html", "book/notation.html", "book/planted-bibliography.html"]


@pytest.fixture(scope="module")
def planted(html_dir, browser, tmp_path_factory):
    site, pages = _plant(html_dir, tmp_path_factory.mktemp("planted"))
    return site_audit.audit(site, pages, browser=browser)


@pytest.mark.slow
@pytest.mark.parametrize("check", site_audit.CHECKS)
def test_each_check_reports_its_planted_defect(planted, check):
    assert any("planted" in line for line in planted[check]), f"{check} missed its planted defect: {planted[check]}"


@pytest.mark.slow
def test_the_shared_desk_pass_reports_the_planted_defects(html_dir, tmp_path):
    """The checks of every page above come from the pass shared with axe (desk_pass.py: one tab per
    browser, reused from page to page): on the planted site it reports what site_audit.audit
    reports, each error on the page that logged it, and axe's findings of the planted page."""
    site, pages = _plant(html_dir, tmp_path)
    pages = ["book/preface.html", *pages, "book/ch1/duality.html"]
    shared = desk_pass._run(site, pages)
    alone = site_audit.audit(site, pages)
    assert shared["audit"] == alone
    assert all(any("planted" in line for line in shared["audit"][check]) for check in site_audit.CHECKS)
    console = shared["audit"]["console_errors"]
    assert console and all(line.startswith("book/planted") for line in console), console
    assert shared["axe"][0] == pages


def test_several_browsers_find_what_one_finds(html_dir, browser, tmp_path):
    """The passes share the pages among browsers (site_audit.map_pages): the findings, and their
    order, must not depend on how many; three, so that the shared path runs on any machine."""
    site, pages = _plant(html_dir, tmp_path)
    pages = pages + ["book/preface.html", "book/ch1/duality.html"]
    one = site_audit.audit(site, pages, browser=browser, n_workers=1)
    assert site_audit.audit(site, pages, browser=browser, n_workers=3) == one
    assert sum(len(v) for v in one.values()) >= len(site_audit.CHECKS)  # the planted defects, found


def test_a_failing_page_fails_the_pass(html_dir):
    """An error while one browser checks one page is raised to the caller, not lost in its thread."""
    import contextlib

    @contextlib.contextmanager
    def open_worker(b):
        def check(rel):
            if rel == "b":
                raise ValueError("planted failure on page b")
            return rel.upper()

        yield check

    assert site_audit.map_pages(["a", "c"], open_worker, n_workers=2) == ["A", "C"]
    with pytest.raises(ValueError, match="planted failure"):
        site_audit.map_pages(["a", "b", "c", "d"], open_worker, n_workers=2)


# ---------------------------------------------------------------- screenshots for a person to look at


@pytest.mark.slow
@pytest.mark.parametrize("page", SCREENSHOT_PAGES)
def test_screenshots(html_dir, browser, page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with site_audit.serve(html_dir) as base:
        for width, height, label in ((1280, 900, "1280"), (390, 844, "phone")):
            context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
            p = context.new_page()
            try:
                p.goto(f"{base}/{page}", wait_until="load")
                p.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=10_000)
                p.evaluate("() => MathJax.startup.promise")
                stem = page.replace("/", "_").removesuffix(".html")
                p.screenshot(path=str(SHOTS / f"{stem}-{label}.png"), full_page=False)
                assert p.evaluate("document.documentElement.scrollWidth") <= width + 1, f"{page} scrolls sideways at {width} px"
            finally:
                context.close()
