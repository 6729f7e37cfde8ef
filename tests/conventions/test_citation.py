"""Licences, CITATION.cff, the landing page's "How to cite" and the changelog agree with each other
and with the package.

CITATION.cff is validated offline against the Citation File Format 1.2.0 schema that
check-jsonschema ships (``vendor.citation-file-format``).
"""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHECK = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
CFF = yaml.safe_load((ROOT / "CITATION.cff").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PREFACE = (ROOT / "book" / "preface.md").read_text()
COPYRIGHT = "Copyright (c) 2026 The Attention as Optimization authors"
CC_BY = "https://creativecommons.org/licenses/by/4.0/"


def validate(path: Path) -> subprocess.CompletedProcess:
    if CHECK is None:
        pytest.fail("check-jsonschema is not installed (requirements.txt pins it)")
    return subprocess.run([CHECK, "--builtin-schema", "vendor.citation-file-format", str(path)],
                          capture_output=True, text=True)


def test_citation_cff_is_valid_cff_1_2_0():
    assert CFF["cff-version"] == "1.2.0"
    result = validate(ROOT / "CITATION.cff")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validator_fails_on_a_broken_citation(tmp_path):
    broken = tmp_path / "CITATION.cff"
    text = (ROOT / "CITATION.cff").read_text()
    broken.write_text(re.sub(r"(?m)^authors:\n(  .*\n)+", "", text))  # authors are required
    assert validate(broken).returncode != 0
    broken.write_text(text.replace("date-released: \"2026-11-27\"", "date-released: \"27 November 2026\""))
    assert validate(broken).returncode != 0


def test_the_citation_is_this_version():
    import attnopt

    assert str(CFF["version"]) == PYPROJECT["version"] == attnopt.__version__
    assert CFF["license"] == ["MIT", "CC-BY-4.0"]
    assert CFF["title"] == "Attention as Optimization"


def bibtex_entry(page: str) -> dict:
    block = re.search(r"```bibtex\n(@software\{[^,]+,\n.*?\n\})\n```", page, re.S)
    assert block, "the landing page has no ```bibtex block with an @software entry"
    fields = dict(re.findall(r"^\s+(\w+)\s*=\s*\{(.*)\},?$", block.group(1), re.M))
    return {key: value.strip("{}") if key == "author" else value for key, value in fields.items()}


def test_how_to_cite_on_the_landing_page_agrees_with_citation_cff():
    assert "## How to cite" in PREFACE
    entry = bibtex_entry(PREFACE)
    author = " and ".join(a.get("name") or f"{a['family-names']}, {a['given-names']}" for a in CFF["authors"])
    assert entry["author"] == author
    assert entry["title"] == CFF["title"]
    assert entry["year"] == str(CFF["date-released"])[:4]
    assert entry["version"] == str(CFF["version"])
    assert entry["url"] == CFF["repository-code"]
    # the text citation: authors (year). *Title* (version X) [...]. URL
    section = PREFACE.split("## How to cite", 1)[1].split("\n## ", 1)[0]
    quote = " ".join(line.lstrip("> ").strip() for line in section.splitlines() if line.startswith(">"))
    quote = quote.replace("`", "")  # the address as inline code: shown in full, not as a link
    expected = f"{author} ({entry['year']}). *{CFF['title']}* (version {CFF['version']})"
    assert quote.startswith(expected), quote
    assert quote.endswith(CFF["repository-code"])


def test_the_licences_are_said_everywhere():
    assert COPYRIGHT in (ROOT / "LICENSE").read_text()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    content = (ROOT / "LICENSE-CONTENT.md").read_text()
    assert COPYRIGHT in content and "CC BY 4.0" in content and f"{CC_BY}legalcode" in content
    assert PYPROJECT["license"] == "MIT" and PYPROJECT["license-files"] == ["LICENSE", "LICENSE-CONTENT.md"]
    footer = yaml.safe_load((ROOT / "_config.yml").read_text())["html"]["extra_footer"]
    readme = (ROOT / "README.md").read_text()
    licence = PREFACE.split("## Licence", 1)[1]
    guide = (ROOT / "book" / "instructors.md").read_text().split("## Licence", 1)[1]
    for where, text in {"the site footer": footer, "the README": readme, "the landing page": licence,
                        "the instructor's guide": guide}.items():
        assert "CC BY 4.0" in text and "MIT" in text, f"{where} must name both licences"
    for where, text in {"the site footer": footer, "the landing page": licence, "the instructor's guide": guide}.items():
        assert CC_BY in text, f"{where} must link to the licence"


def test_the_changelog_has_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "Keep a Changelog" in changelog and "## [Unreleased]" in changelog
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert versions, "no released version in CHANGELOG.md"
    assert (PYPROJECT["version"], str(CFF["date-released"])) in versions, (
        "CHANGELOG.md's entry of this version and CITATION.cff's date-released disagree"
    )
    for version, _ in versions:
        assert f"[{version}]: " in changelog, f"no link for [{version}]"


def test_set_citation_names_persons_in_all_three_places(tmp_path):
    """tools/set_citation.py (issue 28: authors an instructor can name) rewrites CITATION.cff, the
    BibTeX entry and the text citation together; the result is valid CFF and agrees with itself."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("set_citation", ROOT / "tools" / "set_citation.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    persons = [tool.parse_person("Ada Lovelace"), tool.parse_person("Noether, Emmy")]
    cff_text, preface = tool.rewrite(persons, (ROOT / "CITATION.cff").read_text(), PREFACE)
    (tmp_path / "CITATION.cff").write_text(cff_text)
    result = validate(tmp_path / "CITATION.cff")
    assert result.returncode == 0, result.stdout + result.stderr
    cff = yaml.safe_load(cff_text)
    assert cff["authors"] == [{"family-names": "Lovelace", "given-names": "Ada"},
                              {"family-names": "Noether", "given-names": "Emmy"}]
    assert bibtex_entry(preface)["author"] == "Lovelace, Ada and Noether, Emmy"
    assert "> Lovelace, Ada and Noether, Emmy (2026). *Attention as Optimization*" in preface
    # only the authors change: today's authors give back today's files
    back_cff, back_preface = tool.rewrite(CFF["authors"], cff_text, preface)
    assert (back_cff, back_preface) == ((ROOT / "CITATION.cff").read_text(), PREFACE)
    with pytest.raises(ValueError):
        tool.parse_person("Cher")
