"""Static checks on the rendered site: pages, images, links, launch buttons, hidden cells, offline maths."""

from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest
import yaml
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[2]


def toc_entries() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    found = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", toc.get("chapters", [])))
    return found


def pages(html_dir: Path) -> list[Path]:
    return sorted(p for p in html_dir.rglob("*.html") if "_static" not in p.parts and "_modules" not in p.parts)


@pytest.fixture(scope="module")
def soups(html_dir):
    return {p: BeautifulSoup(p.read_text(encoding="utf-8"), "html.parser") for p in pages(html_dir)}


def notebook_stems() -> list[str]:
    return sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_every_toc_entry_has_a_page(html_dir):
    missing = [entry for entry in toc_entries() if not (html_dir / f"{entry}.html").exists()]
    assert not missing, f"table-of-contents entries without a page: {missing}"


def test_every_image_resolves(soups, html_dir):
    broken, count = [], 0
    for page, soup in soups.items():
        for img in soup.find_all("img"):
            src = img.get("src", "")
            if src.startswith("data:"):
                continue
            count += 1
            assert not urlparse(src).scheme, f"{page.name}: image from the network: {src}"
            if not (page.parent / unquote(src)).resolve().is_file():
                broken.append(f"{page.relative_to(html_dir)} -> {src}")
    assert not broken, f"images that do not resolve: {broken}"
    assert count > 0, "no images at all in the book"


def test_no_broken_internal_links(soups, html_dir):
    ids = {page.resolve(): {tag["id"] for tag in soup.find_all(id=True)} for page, soup in soups.items()}
    broken = []
    for page, soup in soups.items():
        for a in soup.find_all("a", href=True):
            href = a["href"]
            if urlparse(href).scheme or href.startswith(("mailto:", "javascript:")):
                continue
            path, fragment = urldefrag(href)
            target = (page.parent / unquote(path)).resolve() if path else page.resolve()
            if path and not target.exists():
                broken.append(f"{page.relative_to(html_dir)} -> {href}")
            elif fragment and target.suffix == ".html" and target in ids and fragment not in ids[target]:
                broken.append(f"{page.relative_to(html_dir)} -> {href} (no such anchor)")
    assert not broken, f"broken internal links: {broken}"


@pytest.mark.parametrize("stem", notebook_stems())
def test_notebook_page_has_colab_link_and_hides_setup(stem, html_dir):
    url, branch = None, None
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url, branch = config["repository"]["url"], config["repository"]["branch"]
    owner_repo = urlparse(url).path.strip("/")
    soup = BeautifulSoup((html_dir / "notebooks" / f"{stem}.html").read_text(encoding="utf-8"), "html.parser")
    expected = f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/notebooks/{stem}.ipynb"
    links = [a["href"] for a in soup.find_all("a", href=True)]
    assert expected in links, f"no Colab link {expected} on {stem}.html"
    # Injected-parameter and Colab-setup cells run but are not shown; the parameters cell is shown
    # (the reader is told to edit it, and the cells below use its names).
    for tag in ("injected-parameters", "colab-setup"):
        assert not soup.select(f".tag_{tag}"), f"{stem}.html shows a cell tagged {tag}"
    assert soup.select(".tag_parameters"), f"{stem}.html hides its parameters cell"
    assert "google.colab" not in soup.get_text()
    assert soup.select(".cell_output img"), f"{stem}.html has no figure"


def test_maths_served_offline(soups, html_dir):
    for page, soup in soups.items():
        for script in soup.find_all("script", src=True):
            assert not urlparse(script["src"]).scheme, f"{page.name} loads a script from the network: {script['src']}"
    assert (html_dir / "_static" / "mathjax" / "tex-chtml.js").is_file()


def test_dark_mode_stylesheet_is_linked(soups):
    page = next(p for p in soups if p.name == "preface.html")
    assert any("book.css" in link.get("href", "") for link in soups[page].find_all("link")), "book.css not linked"


def test_api_reference_has_a_page_for_every_public_module(html_dir):
    import sys

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from attnopt_api import public_modules

    index = (html_dir / "book" / "api" / "index.html").read_text(encoding="utf-8")
    pages = {page.name: page.read_text(encoding="utf-8") for page in (html_dir / "book" / "api").glob("*.html")}
    modules = public_modules("attnopt")
    assert {"attnopt.fenchel", "attnopt.transforms.geometry", "attnopt.course.widgets"} <= set(modules)
    for name in modules:
        documented = [page for page, text in pages.items() if f'id="module-{name}"' in text]
        assert len(documented) == 1, f"{name} is documented by {documented} (one page of the API reference expected)"
        assert f'href="{documented[0]}"' in index, f"the API reference's index does not link to {name}"


def test_each_chapter_links_to_the_reference_pages_of_its_modules(html_dir):
    """Issue #17: the API reference is grouped by chapter, and each chapter points to its pages."""
    chapters = {
        "ch1": ("fenchel", "pretrained"),
        "ch2": ("kernels", "regularity"),
        "ch3": ("transforms", "geometry"),
        "ch4": ("value_functions", "continuous", "continuous_attention", "mixture", "vqa", "vqa_data"),
    }
    for chapter, modules in chapters.items():
        html = (html_dir / "book" / chapter / "index.html").read_text(encoding="utf-8")
        for name in modules:
            assert f'href="../api/{name}.html"' in html, f"{chapter}/index does not link to the page of attnopt.{name}"
