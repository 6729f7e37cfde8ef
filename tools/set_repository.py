"""Point the book at another repository (a fork): rewrite the one address and every notebook's Colab install line.

The address lives in ``_config.yml`` (``repository.url`` and ``repository.branch``); the notebooks'
first cell repeats it because Colab cannot read the book's configuration. This script keeps the two
in step; ``tests/conventions`` fails when they disagree.

Usage: python tools/set_repository.py https://github.com/OWNER/REPO [--branch BRANCH]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTALL = re.compile(r"attnopt @ git\+(?P<url>https://[^@\"']+)@(?P<branch>[\w./-]+)")


def config_repository(config_text: str) -> tuple[str, str]:
    url = re.search(r"^repository:\n(?:  .*\n)*?  url: *(\S+)", config_text, re.M)
    branch = re.search(r"^repository:\n(?:  .*\n)*?  branch: *(\S+)", config_text, re.M)
    if not url or not branch:
        raise ValueError("_config.yml has no repository.url / repository.branch")
    return url.group(1), branch.group(1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="https://github.com/OWNER/REPO")
    parser.add_argument("--branch", default="main")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", args.url):
        parser.error("url must look like https://github.com/OWNER/REPO (Colab opens GitHub repositories)")
    config = ROOT / "_config.yml"
    text = config.read_text()
    old_url, old_branch = config_repository(text)
    text = text.replace(f"  url: {old_url}", f"  url: {args.url}", 1).replace(f"  branch: {old_branch}", f"  branch: {args.branch}", 1)
    config.write_text(text)
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        for cell in nb["cells"]:
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = INSTALL.sub(f"attnopt @ git+{args.url}@{args.branch}", src)
        nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"repository set to {args.url} (branch {args.branch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
