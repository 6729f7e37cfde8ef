"""Sphinx extension: the API reference has one page per public module of ``attnopt``, none forgotten.

Each page of ``book/api/`` documents one module with ``automodule`` (inside ``eval-rst``).  Pages
are written by hand, because the reference is grouped by chapter, but a module must not be
forgotten: once every page is read, each public submodule of the package (a name not starting with
an underscore) must have been documented by some page, or the build warns (fails, in the strict
build) and names the page to add.
"""

from __future__ import annotations

import importlib
import pkgutil

from sphinx.util import logging

PACKAGE = "attnopt"
logger = logging.getLogger(__name__)


def public_modules(package: str) -> list[str]:
    """The public modules of ``package`` at any depth, as dotted names: no part of the name starts
    with an underscore, and the module declares public names (``__all__``; a package whose
    ``__init__`` only describes its folder, like ``attnopt.course``, has none to document)."""
    pkg = importlib.import_module(package)
    names = [info.name for info in pkgutil.walk_packages(pkg.__path__, f"{package}.")]
    public = [n for n in names if not any(part.startswith("_") for part in n.split("."))]
    return sorted(n for n in public if getattr(importlib.import_module(n), "__all__", None))


API_INDEX = "book/api/index"


def check_every_module_has_a_page(app, env) -> None:
    if API_INDEX not in env.found_docs:
        return  # a book without the API reference (the strict-build tests build a few pages only)
    documented = set(env.get_domain("py").modules)
    for module in public_modules(PACKAGE):
        if module not in documented:
            page = module.rsplit(".", 1)[1]
            logger.warning(
                f"{module} is a public module but no page of the API reference documents it: add "
                f"book/api/{page}.md (with '.. automodule:: {module}') and list it in _toc.yml and book/api/index.md"
            )


def setup(app):
    app.connect("env-check-consistency", check_every_module_has_a_page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
