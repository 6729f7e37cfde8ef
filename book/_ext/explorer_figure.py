"""Sphinx extension: a page explorer as a numbered figure on a theory page.

A notebook saves an explorer with ``attnopt.book.save_page_explorer(explorer, name)``: the
explorer's HTML as ``figures/<name>.html`` and its default state as ``figures/<name>.png``.  A
MyST page shows it with::

    :::{explorer-figure} /figures/<name>
    :name: fig-<label>
    :alt: the still's alt text (the explorer's frames carry their own)

    The caption, as in a {figure}; later paragraphs are its legend.
    :::

The directive makes one ``figure`` node (numbered by ``numfig``, a target for ``{numref}``) that
holds the explorer's HTML for HTML builders and the still PNG for every other builder (an
``only`` node each), then the caption.  The HTML's script (``page_explorer.js``) wires it as on a
notebook's page.  A missing file is an error of the build (a warning, and the book builds with
``-W``): run the notebook that saves it first.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective


class ExplorerFigure(SphinxDirective):
    required_arguments = 1  # /figures/<name>, relative to the book's source folder (no suffix)
    has_content = True
    option_spec = {
        "name": directives.unchanged,
        "alt": directives.unchanged,
        "class": directives.class_option,
    }

    def run(self):
        stem = self.arguments[0]
        if not stem.startswith("/"):
            raise self.error("explorer-figure: give the path from the book's root, e.g. /figures/ch3-name")
        source = Path(self.env.srcdir) / stem.lstrip("/")
        page = source.with_suffix(".html")
        if not page.is_file():
            return [self.state.document.reporter.warning(
                f"explorer-figure: {page} not found (run the notebook that saves it with "
                "attnopt.book.save_page_explorer)", line=self.lineno)]
        self.env.note_dependency(str(page))
        figure = nodes.figure(classes=["explorer-figure", *self.options.get("class", [])])
        self.set_source_info(figure)
        html = addnodes.only(expr="html")
        html += nodes.raw("", page.read_text(encoding="utf-8"), format="html")
        still = addnodes.only(expr="not html")
        still += nodes.image(uri=f"{stem}.png", alt=self.options.get("alt", ""))
        figure += [html, still]
        if self.content:
            body = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, body)
            first = body[0] if len(body) else None
            if isinstance(first, nodes.paragraph):
                caption = nodes.caption(first.rawsource, "", *first.children)
                caption.source, caption.line = first.source, first.line
                figure += caption
                rest = body.children[1:]
            else:
                rest = body.children
            if rest:
                figure += nodes.legend("", *rest)
        self.add_name(figure)
        return [figure]


def setup(app):
    app.add_directive("explorer-figure", ExplorerFigure)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
