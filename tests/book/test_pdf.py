"""The offline PDF (`make pdf`) holds every page of the book, in order, with its figures."""

import re

import pytest
from bs4 import BeautifulSoup

from book_paths import BUILD, load_tool

PDF = BUILD / "book.pdf"


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def test_pdf_has_every_page_and_figure(html_dir):
    from pypdf import PdfReader

    pdf_tool = load_tool("pdf")

    if not PDF.exists():
        pytest.fail(f"no PDF at {PDF}: run `make pdf` (make test does)")
    reader = PdfReader(PDF)
    entries = pdf_tool.toc_order(BUILD / "site" / "_toc.yml")
    titles, figures = [], 0
    for entry in entries:
        soup = BeautifulSoup((html_dir / f"{entry}.html").read_text(encoding="utf-8"), "html.parser")
        titles.append(soup.title.get_text().split(" — ")[0].strip())
        figures += len(soup.select(".cell_output img, figure img"))
    # One bookmark per page of the book, in table-of-contents order.
    assert [item.title for item in reader.outline] == titles
    # Each page's title is in the text, where its bookmark points.
    starts = [reader.get_destination_page_number(item) for item in reader.outline]
    texts = [page.extract_text() for page in reader.pages]  # once: pypdf takes about a second a page
    for title, start in zip(titles, starts):
        assert squash(title) in squash(texts[start]), f"{title!r} not on PDF page {start + 1}"
    # Every figure of the book is embedded as an image.
    embedded = sum(len(page.images) for page in reader.pages)
    assert figures > 0 and embedded >= figures, f"{embedded} images in the PDF for {figures} figures in the book"
    # Maths is typeset, not raw TeX.
    text = "".join(texts)
    assert "\\frac" not in text and "$$" not in text
