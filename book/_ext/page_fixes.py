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
"""

from __future__ import annotations

import functools
import html
import re

# The theme's toggle: <a ...>Title</a><details><summary><span class="toctree-toggle" ...
_TOGGLE = re.compile(
    r'(<a\b[^>]*class="[^"]*\breference\b[^"]*"[^>]*>(?P<title>(?:(?!</a>).)*)</a>\s*<details\b[^>]*>\s*)<summary>',
    re.S,
)
_TAG = re.compile(r"<[^>]+>")


def _name_toggles(toctree_html: str) -> str:
    def named(m: re.Match) -> str:
        title = html.unescape(_TAG.sub("", m["title"])).strip()
        return f'{m[1]}<summary aria-label="{html.escape(f"Pages in {title}")}">'

    return _TOGGLE.sub(named, toctree_html)


def _accessible_toctree(generate):
    @functools.wraps(generate)
    def wrapper(kind, *args, **kwargs):
        out = generate(kind, *args, **kwargs)
        return _name_toggles(out) if isinstance(out, str) else out

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
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    # after the theme has put its toctree function in the context (default priority 500)
    app.connect("html-page-context", _accessible_page, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
