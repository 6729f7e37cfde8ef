"""The offline PDF (`make pdf`) holds every page of the book, in order, with its figures.

The PDF is read with PDFium (``pypdfium2``), not with pypdf, which joins it (``tools/pdf.py``): an
independent reader, and one that extracts the text of the whole book in a few seconds where pypdf
took about a second a page.
"""

import re

import pytest
from bs4 import BeautifulSoup

from book_paths import BUILD, load_tool

PDF = BUILD / "book.pdf"


def squash(text: str) -> str:
    # PDFium reports a hyphen it takes for a line-end hyphenation as U+FFFE
    return re.sub(r"\s+", "", text.replace("\ufffe", "-")).lower()


def test_pdf_has_every_page_and_figure(html_dir):
    import pypdfium2
    import pypdfium2.raw as pdfium_c

    pdf_tool = load_tool("pdf")

    if not PDF.exists():
        pytest.fail(f"no PDF at {PDF}: run `make pdf` (make test does)")
    document = pypdfium2.PdfDocument(PDF)
    entries = pdf_tool.toc_order(BUILD / "site" / "_toc.yml")
    titles, figures = [], 0
    for entry in entries:
        soup = BeautifulSoup((html_dir / f"{entry}.html").read_text(encoding="utf-8"), "html.parser")
        titles.append(soup.title.get_text().split(" — ")[0].strip())
        figures += len(soup.select(".cell_output img, figure img"))
    # One bookmark per page of the book, in table-of-contents order, all at the top level.
    outline = list(document.get_toc())
    assert [item.get_title() for item in outline] == titles
    assert all(item.level == 0 for item in outline)
    texts, embedded = [], 0
    for index in range(len(document)):
        page = document[index]
        texts.append(page.get_textpage().get_text_range())
        # images drawn inside form XObjects count too (get_objects descends into them)
        embedded += sum(1 for _ in page.get_objects(filter=(pdfium_c.FPDF_PAGEOBJ_IMAGE,)))
    # Each page's title is in the text, where its bookmark points.
    for title, item in zip(titles, outline):
        dest = item.get_dest()
        assert dest is not None and dest.get_index() is not None, f"the bookmark {title!r} points nowhere"
        start = dest.get_index()
        assert squash(title) in squash(texts[start]), f"{title!r} not on PDF page {start + 1}"
    # Every figure of the book is embedded as an image.
    assert figures > 0 and embedded >= figures, f"{embedded} images in the PDF for {figures} figures in the book"
    # Maths is typeset, not raw TeX.
    text = "".join(texts)
    assert "\\frac" not in text and "$$" not in text
