"""A module of attnopt as it was at a git commit, for benchmarks that time this tree against it
(``--baseline-commit``) in the same run."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_commit(commit: str, module: str):
    """``attnopt.<module>`` of ``commit``, with the whole package of that commit (its private engine
    modules and validation layer) copied to a temporary package of another name, so that both
    versions can be imported side by side (the package's imports are relative)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout

    pkg = Path(tempfile.mkdtemp()) / f"attnopt_{commit[:8]}"
    pkg.mkdir()
    for path in git("ls-tree", "-r", "--name-only", commit, "src/attnopt/").split():
        if path.endswith(".py"):  # the package's modules, in its folders (issue 29) or flat (before)
            target = pkg / Path(path).relative_to("src/attnopt")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(git("show", f"{commit}:{path}"))
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module(f"{pkg.name}.{module}")
