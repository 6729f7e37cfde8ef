"""Sphinx extension: document every public module of a package, found at build time.

``.. attnopt-api:: attnopt`` (inside ``eval-rst``, so that its body is parsed as reStructuredText) expands to one section per public submodule (names not starting with an
underscore), each with ``automodule :members:``. A new module of the library appears in the API
reference without editing any page.
"""

from __future__ import annotations

import importlib
import pkgutil

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def public_modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return sorted(
        f"{package}.{info.name}" for info in pkgutil.iter_modules(pkg.__path__) if not info.name.startswith("_")
    )


class PackageAPI(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self):
        lines: list[str] = []
        for module in public_modules(self.arguments[0]):
            title = f"``{module}``"
            lines += [title, "-" * len(title), "", f".. automodule:: {module}", "   :members:", ""]
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="attnopt-api"), container)
        return container.children


def setup(app):
    app.add_directive("attnopt-api", PackageAPI)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
