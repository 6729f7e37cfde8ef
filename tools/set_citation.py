"""Name the people to cite: the authors of ``CITATION.cff`` and of the landing page's *How to cite*.

The course is cited from three places that must agree (``tests/conventions/test_citation.py``
checks them): ``CITATION.cff`` (GitHub's *Cite this repository*), the BibTeX entry and the text
citation of ``book/preface.md``. A group of people that maintains the course, or an instructor who
publishes an adapted copy for a class, names its authors once here, as persons, and the script
rewrites all three; nothing else in those files changes.

Usage:
    python tools/set_citation.py "Given Family" ["Given Family" ...]   # persons, in order
    python tools/set_citation.py --entity "The Attention as Optimization authors"
    python tools/set_citation.py --show                                # print the authors now
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CFF = ROOT / "CITATION.cff"
PREFACE = ROOT / "book" / "preface.md"


def parse_person(text: str) -> dict[str, str]:
    """``"Given Family"`` or ``"Family, Given"`` as CFF's ``given-names`` and ``family-names``."""
    text = " ".join(text.split())
    if "," in text:
        family, given = (part.strip() for part in text.split(",", 1))
    else:
        given, _, family = text.rpartition(" ")
    if not given or not family or any(c in text for c in '{}"\n'):
        raise ValueError(f"an author is 'Given Family' or 'Family, Given', without braces or quotes; got {text!r}")
    return {"given-names": given, "family-names": family}


def cff_authors(authors: list[dict[str, str]]) -> str:
    lines = ["authors:"]
    for a in authors:
        if "name" in a:
            lines.append(f'  - name: "{a["name"]}"')
        else:
            lines += [f'  - family-names: "{a["family-names"]}"', f'    given-names: "{a["given-names"]}"']
    return "\n".join(lines) + "\n"


def citation_name(authors: list[dict[str, str]]) -> str:
    """The authors as BibTeX and the text citation write them: ``Family, Given and Family, Given``."""
    return " and ".join(a.get("name") or f"{a['family-names']}, {a['given-names']}" for a in authors)


def rewrite(authors: list[dict[str, str]], cff: str, preface: str) -> tuple[str, str]:
    """``(CITATION.cff, preface.md)`` with ``authors`` in place of their current authors."""
    old = re.search(r"(?m)^authors:\n(?:  .*\n)+", cff)
    if old is None:
        raise ValueError("CITATION.cff has no authors: block")
    cff = cff[:old.start()] + cff_authors(authors) + cff[old.end():]
    name = citation_name(authors)
    bibtex = "{{" + name + "}}" if len(authors) == 1 and "name" in authors[0] else "{" + name + "}"
    preface, n_bib = re.subn(r"(?m)^(  author  = ).*,$", lambda m: f"{m.group(1)}{bibtex},", preface, count=1)
    section = re.search(r"## How to cite\n(.*?)(?=\n## )", preface, re.S)
    quote = re.search(r"(?m)^> .*? \((\d{4})\)\. \*", section.group(1)) if section else None
    if not n_bib or quote is None:
        raise ValueError("book/preface.md has no BibTeX author line or no text citation under '## How to cite'")
    start = section.start(1) + quote.start()
    end = section.start(1) + quote.start(1) - 2  # the authors end before " (YEAR)"
    preface = preface[:start] + "> " + name + preface[end:]
    return cff, preface


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("persons", nargs="*", help='"Given Family" or "Family, Given", in citation order')
    parser.add_argument("--entity", help="one collective author instead of persons")
    parser.add_argument("--show", action="store_true", help="print the authors of CITATION.cff and exit")
    args = parser.parse_args(argv)
    if args.show:
        print("\n".join(re.findall(r'(?m)^  - (?:name|family-names): "(.*)"', CFF.read_text())))
        return 0
    if bool(args.persons) == bool(args.entity):
        parser.error("give either persons or --entity")
    try:
        authors = [{"name": args.entity}] if args.entity else [parse_person(p) for p in args.persons]
        cff, preface = rewrite(authors, CFF.read_text(), PREFACE.read_text())
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    CFF.write_text(cff)
    PREFACE.write_text(preface)
    print(f"authors: {citation_name(authors)} (CITATION.cff, book/preface.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
