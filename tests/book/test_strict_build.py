"""The book's build is strict: a broken reference or citation fails it.

A one-page book with the course's own configuration is built three times: as written (it must
pass, so the test can fail), then with a broken equation reference, then with an unknown citation.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JUPYTER_BOOK = Path(sys.executable).parent / "jupyter-book"

PAGE = """# A page

$$
e^{i\\pi} + 1 = 0
$$ (euler)

Equation {eq}`EQ` is due to Euler; attention is older than Transformers {cite}`KEY`.
"""


def build(tmp_path: Path, eq: str, key: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    (site / "book").mkdir(parents=True)
    shutil.copy(ROOT / "_config.yml", site / "_config.yml")
    shutil.copy(ROOT / "book" / "references.bib", site / "book" / "references.bib")
    for folder in ("_ext", "assets"):
        shutil.copytree(ROOT / "book" / folder, site / "book" / folder)
    (site / "_toc.yml").write_text("format: jb-book\nroot: book/page\nchapters:\n  - file: book/bibliography\n")
    (site / "book" / "page.md").write_text(PAGE.replace("EQ", eq).replace("KEY", key))
    shutil.copy(ROOT / "book" / "bibliography.md", site / "book" / "bibliography.md")
    return subprocess.run(
        [str(JUPYTER_BOOK), "build", str(site), "--all", "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "eq,key,fails,message",
    [
        ("euler", "bahdanau2015neural", False, None),
        ("eulr", "bahdanau2015neural", True, "eulr"),
        ("euler", "nobody2099", True, "nobody2099"),
    ],
    ids=["intact", "broken-equation-reference", "unknown-citation"],
)
def test_broken_reference_fails_the_build(tmp_path, eq, key, fails, message):
    result = build(tmp_path, eq, key)
    log = result.stdout + result.stderr
    if not fails:
        assert result.returncode == 0, log[-3000:]
    else:
        assert result.returncode != 0, "a broken reference did not fail the build"
        assert message in log, log[-3000:]
