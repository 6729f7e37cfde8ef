"""Sphinx extension: a phone gets each wide figure laid out for its screen.

A house figure is 6.5 inches wide (715 px at 110 dpi).  A phone's column is 342 px, so the figure
scaled into it shows its 10-pt labels at 7.3 px, under the 8.5 px a reader can read.  When a
notebook saves a figure for the book (``attnopt.book.save_figure``), it also saves a phone variant,
``figures/<name>.phone.png``: the same figure drawn 4 inches wide with its panels stacked
(``attnopt.plotting.stacked_for_phone``), whose labels show at about 12 px.

This extension offers the variant to narrow screens with the HTML ``<picture>`` element::

    <picture><source media="(max-width: 600px)" srcset="../_images/phone/<name>.png">
    <img src="../_images/<name>.png" alt="..."></picture>

A browser fetches one of the two, so a desk loads no phone figure and a phone no desk figure.
The variant is found for

* a theory page's ``{figure} /figures/<name>.png``, by its file name;
* a notebook's figure output, by its content: in the book's build every figure a notebook
  displays gets a variant ``figures/outputs/<sha256 of the PNG>.png`` (``attnopt.book``'s
  wrapper of the inline backend), and myst-nb names the output ``<sha256 of the PNG>.png``, so
  a variant is only ever offered for the very figure it was drawn from.

Other builders (the PDF) keep the desk figure.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from docutils import nodes

#: The screens that get the phone variant (book.css uses the same width for a phone).
MEDIA = "(max-width: 600px)"
_CLASS = "phone-variant-"
_IMG = re.compile(r'<img\b([^>]*?)\bclass="([^"]*?)\b' + _CLASS + r'([A-Za-z0-9_-]+)\b\s*([^"]*)"([^>]*)>')


def _variant(app, node: nodes.image) -> tuple[str, Path] | None:
    """``node``'s phone variant: the name it gets under ``_images/phone/`` and its file, or None."""
    figures = Path(app.srcdir) / "figures"
    uri = node.get("candidates", {}).get("*") or node.get("uri", "")
    source = Path(uri) if Path(uri).is_absolute() else Path(app.srcdir) / uri
    if source.parent.resolve() == figures.resolve():
        phone = figures / f"{source.stem}.phone.png"
    elif source.suffix == ".png" and source.is_file():
        # a notebook's output, found by what it shows (myst-nb names it by the same digest)
        phone = figures / "outputs" / f"{hashlib.sha256(source.read_bytes()).hexdigest()}.png"
    else:
        return None
    if not phone.is_file():
        return None
    return (source.stem if phone.parent == figures else phone.stem), phone


def _mark(app, doctree, docname) -> None:
    if app.builder.format != "html":
        return
    used = app.env.__dict__.setdefault("phone_variants", {})
    for node in doctree.findall(nodes.image):
        found = _variant(app, node)
        if found is not None:
            node["classes"].append(_CLASS + found[0])
            used[found[0]] = str(found[1])


def _picture(pathto):
    def replace(m: re.Match) -> str:
        before, classes, stem, rest, after = m.groups()
        classes = " ".join((classes + " " + rest).split())
        img = f'<img{before}{f"class={chr(34)}{classes}{chr(34)}" if classes else ""}{after}>'
        src = pathto(f"_images/phone/{stem}.png", 1)
        return f'<picture><source media="{MEDIA}" srcset="{src}" type="image/png">{img}</picture>'

    return replace


def _pictures(app, pagename, templatename, context, doctree) -> None:
    body = context.get("body")
    if body and _CLASS in body:
        context["body"] = _IMG.sub(_picture(context["pathto"]), body)


def _copy(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir) / "_images" / "phone"
    out.mkdir(parents=True, exist_ok=True)
    for stem, phone in sorted(app.env.__dict__.get("phone_variants", {}).items()):
        if Path(phone).is_file():
            shutil.copyfile(phone, out / f"{stem}.png")


def setup(app):
    app.connect("doctree-resolved", _mark)
    app.connect("html-page-context", _pictures)
    app.connect("build-finished", _copy)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": False}
