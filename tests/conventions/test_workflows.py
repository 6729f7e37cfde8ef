"""The GitHub workflows: valid, building the book with the README's command, testing pull requests
with .ci/run, releasing the tested wheel and sdist on a tag, and naming no repository (its address
lives in _config.yml only)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CHECK = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")


def load(name):
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def validate(*paths):
    if CHECK is None:
        pytest.fail("check-jsonschema is not installed (requirements.txt pins it)")
    return subprocess.run([CHECK, "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True)


def test_workflows_are_valid():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert files, "no workflow in .github/workflows"
    result = validate(*files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validator_fails_on_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("name: broken\non: push\njobs:\n  build:\n    steps: {}\n")  # no runs-on, steps not a list
    assert validate(broken).returncode != 0


def test_the_book_is_built_with_the_readme_command_and_published():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme
    book = load("book.yml")
    assert book["on"]["push"]["branches"] == ["main"]
    steps = book["jobs"]["build"]["steps"]
    assert any(s.get("run", "").strip() == "make book" for s in steps), "the build job must run `make book`"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/_build/html"
    assert any(s.get("uses", "").startswith("actions/deploy-pages") for s in book["jobs"]["deploy"]["steps"])
    assert book["permissions"]["pages"] == "write" and book["permissions"]["id-token"] == "write"


def test_pull_requests_run_the_ci_entry_point():
    tests = load("tests.yml")
    assert "pull_request" in tests["on"]
    runs = " ".join(s.get("run", "") for s in tests["jobs"]["test"]["steps"])
    assert "bash .ci/run" in runs


def test_no_workflow_names_the_repository():
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    owner_repo = re.sub(r"^https://github.com/", "", url)
    for path in WORKFLOWS.glob("*.yml"):
        assert owner_repo not in path.read_text(), f"{path.name} names {owner_repo}: the address lives in _config.yml"


def test_a_tag_releases_the_tested_wheel_and_sdist():
    release = load("release.yml")
    assert release["on"]["push"]["tags"] == ["v*"]
    assert release["permissions"]["contents"] == "read", "only the publishing job may write"
    build = release["jobs"]["build"]["steps"]
    runs = [s.get("run", "") for s in build]
    built = next(i for i, run in enumerate(runs) if "tools/build_dist.py dist" in run)
    tested = next(i for i, run in enumerate(runs) if "ATTNOPT_DIST=dist" in run and "pytest" in run and "tests/package" in run)
    assert built < tested, "the package tests must run on the files that are released"
    assert any('"$GITHUB_REF_NAME" = "v$version"' in run for run in runs), "the tag must be the package's version"
    upload = next(s for s in build if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["with"]["path"].rstrip("/") == "dist"
    publish = release["jobs"]["publish"]
    assert publish["needs"] == "build" and publish["permissions"]["contents"] == "write"
    script = " ".join(s.get("run", "") for s in publish["steps"])
    assert "gh release create" in script and "gh release upload" in script
    assert script.count("dist/*.whl dist/*.tar.gz") == 2, "both files are attached to the release"
