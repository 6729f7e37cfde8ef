"""Write the configuration of another edition of the book next to the staged one.

``student``: the same book with every exercise's solution removed (sphinx-exercise's
``hide_solutions``), for handing to students.

Usage: python tools/edition.py student SITE_DIR   (writes SITE_DIR/_config.student.yml)
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "student":
        print(__doc__, file=sys.stderr)
        return 2
    site = Path(argv[1])
    config = yaml.safe_load((site / "_config.yml").read_text())
    config["title"] = f"{config['title']} (student edition)"
    config.setdefault("sphinx", {}).setdefault("config", {})["hide_solutions"] = True
    (site / "_config.student.yml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
