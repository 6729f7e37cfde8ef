"""Sphinx extension: small fixes to what the theme and its extensions put on every page.

* sphinx-thebe registers its configuration script once per read of the sources; with Jupyter Book
  that happens twice, and the second ``const THEBE_JS_URL = ...`` is a console error on every
  page.  Scripts are de-duplicated per page.
* pydata-sphinx-theme writes ``localStorage.mode || default_mode`` into every page; with no
  ``default_mode`` in the context that is the empty string, which its script reports as an
  invalid mode (another console error).  The default is ``"auto"``: the reader's system setting.
"""

from __future__ import annotations


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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
