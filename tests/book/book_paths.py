"""Where the build under test lives (ATTNOPT_BUILD_DIR, default _build), shared by the book tests."""

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = (ROOT / os.environ.get("ATTNOPT_BUILD_DIR", "_build")).resolve()
HTML = BUILD / "_build" / "html"
RESULTS = BUILD / "results"


def load_tool(name: str):
    """Import ``tools/<name>.py`` (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
