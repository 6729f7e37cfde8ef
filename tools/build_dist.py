"""Build the package's wheel and source archive offline, from a clean copy of the checkout.

    python tools/build_dist.py DEST      # writes DEST/attnopt-X.Y.Z-py3-none-any.whl and .tar.gz

What is packaged (``pyproject.toml``, ``README.md``, the licences and ``src/``) is copied to a
temporary folder first, so that the build leaves nothing in the checkout and sees no stale
``*.egg-info`` or ``build/``. ``python -m build --no-isolation`` builds the source archive, then the
wheel from that archive (so the archive is known to build), with this environment's setuptools:
nothing is downloaded. Used by ``tests/package`` (``make test``), the Colab set-up test and the
release workflow.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGED = ("pyproject.toml", "README.md", "LICENSE", "LICENSE-CONTENT.md")


def build(dest: Path, root: Path = ROOT) -> tuple[Path, Path]:
    """Build into ``dest`` (created); return ``(wheel, sdist)``."""
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="attnopt-build-") as tmp:
        copy = Path(tmp) / "attnopt"
        copy.mkdir()
        for name in PACKAGED:
            shutil.copy2(root / name, copy / name)
        shutil.copytree(root / "src", copy / "src",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
        done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dest), str(copy)],
                              cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"python -m build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    wheels, sdists = sorted(dest.glob("attnopt-*.whl")), sorted(dest.glob("attnopt-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise RuntimeError(f"expected one wheel and one source archive in {dest}; found {wheels + sdists}")
    return wheels[0], sdists[0]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for path in build(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
