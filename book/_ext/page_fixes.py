"""Sphinx extension: small fixes to what the theme and its extensions put on every page.

* sphinx-thebe registers its configuration script once per read of the sources; with Jupyter Book
  that happens twice, and the second ``const THEBE_JS_URL = ...`` is a console error on every
  page.  Scripts are de-duplicated per page.
* pydata-sphinx-theme writes ``localStorage.mode || default_mode`` into every page; with no
  ``default_mode`` in the context that is the empty string, which its script reports as an
  invalid mode (another console error).  The default is ``"auto"``: the reader's system setting.
* The theme's sidebar opens and closes a chapter's pages with a ``<summary>`` that holds only a
  chevron icon, so a screen reader announces a button without a name.  Each gets an
  ``aria-label`` naming the chapter it opens.
* docutils writes the bibliography as ``role="list"`` holding ``role="doc-biblioentry"`` items;
  ARIA requires a list's children to be list items (``doc-biblioentry`` is deprecated), so the
  entries get ``role="listitem"``.
* The book's two scripts go on every page, deferred (they run once the page is parsed, before
  its DOMContentLoaded) and ahead of MathJax's (priority 200 < 500): ``page_explorer.js`` wires
  the explorers before MathJax typesets the page (seconds on a theory page), ``navigation.js``
  makes the sidebar's visible toggle open the table of contents, ``maths_fit.js`` sets a display
  equation wider than a narrow column in a size that fits (see each one's header).
"""

from __future__ import annotations

import functools


def _name_toggles(toctree):
    """Give each ``<summary>`` toggle of the theme's toctree (a BeautifulSoup tree) an accessible
    name: "Pages in <the title of the entry it opens>"."""
    for summary in toctree.select("li > details > summary"):
        if summary.get_text(strip=True) or summary.get("aria-label"):
            continue  # a part caption inside the summary names it already
        link = summary.find_parent("li").find("a", class_="reference", recursive=False)
        if link is not None:
            summary["aria-label"] = f"Pages in {link.get_text(' ', strip=True)}"
    return toctree


def _accessible_toctree(generate):
    @functools.wraps(generate)
    def wrapper(*args, **kwargs):
        out = generate(*args, **kwargs)
        if isinstance(out, str):
            from bs4 import BeautifulSoup

            return str(_name_toggles(BeautifulSoup(out, "html.parser")))
        return _name_toggles(out) if hasattr(out, "select") else out

    return wrapper


def _accessible_page(app, pagename, templatename, context, doctree):
    if "generate_toctree_html" in context:
        context["generate_toctree_html"] = _accessible_toctree(context["generate_toctree_html"])
    body = context.get("body")
    if body and 'role="doc-biblioentry"' in body:
        context["body"] = body.replace('role="doc-biblioentry"', 'role="listitem"')


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if scripts:
        seen, kept = set(), []
        for script in scripts:
            # An inline script registered before the builder started has filename '' and one
            # registered after it None: the same script to a reader, two to Sphinx.
            attributes = getattr(script, "attributes", {})
            key = (getattr(script, "filename", None) or "", tuple(sorted(attributes.items())))
            if key not in seen:
                seen.add(key)
                kept.append(script)
        context["script_files"] = kept
    context.setdefault("default_mode", "auto")


def setup(app):
    for script in ("page_explorer.js", "navigation.js", "maths_fit.js"):
        app.add_js_file(script, priority=200, defer="defer")
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    # after the theme has put its toctree function in the context (default priority 500)
    app.connect("html-page-context", _accessible_page, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
