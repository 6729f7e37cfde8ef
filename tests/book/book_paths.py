"""Where the build under test lives (ATTNOPT_BUILD_DIR, default _build), shared by the book tests."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = (ROOT / os.environ.get("ATTNOPT_BUILD_DIR", "_build")).resolve()
HTML = BUILD / "_build" / "html"
RESULTS = BUILD / "results"
