"""Sphinx extension: the bibliography labelled the way the pages cite, by author and year.

The pages cite with ``bibtex_reference_style = author_year`` ("Litman (2025)"); pybtex's default
list style labels the entries alphabetically ("[Lit25]"), so a reader meets two systems.  This
registers a pybtex style ``authoryear``: entries sorted by author, year and title and labelled
"Litman 2025", "Amari & Ohara 2011", "Vaswani et al. 2017" (with a, b, ... where two would
coincide), and a referencing style ``author_year_round`` that puts citations in round brackets.
``_config.yml`` selects them (``bibtex_default_style``, ``bibtex_reference_style``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import sphinxcontrib.bibtex.plugin

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle


def _surname(person) -> str:
    name = " ".join(person.prelast_names + person.last_names)
    return str(Text.from_latex(name)).strip("{}") or str(person)


class AuthorYearLabelStyle(BaseLabelStyle):
    def format_label(self, entry) -> str:
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [_surname(p) for p in people]
        if not names:
            who = str(Text.from_latex(entry.fields.get("title", entry.key)))[:20]
        elif len(names) == 1:
            who = names[0]
        elif len(names) == 2:
            who = f"{names[0]} & {names[1]}"
        else:
            who = f"{names[0]} et al."
        return f"{who} {entry.fields.get('year', 'n.d.')}"

    def format_labels(self, sorted_entries):
        labels = [self.format_label(entry) for entry in sorted_entries]
        counts, seen = Counter(labels), Counter()
        for label in labels:
            if counts[label] > 1:
                seen[label] += 1
                yield f"{label}{chr(ord('a') + seen[label] - 1)}"
            else:
                yield label


class AuthorYearStyle(UnsrtStyle):
    default_label_style = "authoryear"
    default_sorting_style = "author_year_title"


def _round() -> BracketStyle:
    return BracketStyle(left="(", right=")")


@dataclass
class AuthorYearRoundReferenceStyle(AuthorYearReferenceStyle):
    """Citations in round brackets, "(Litman, 2025)", as textbooks print them (the default is [...])."""

    bracket_parenthetical: BracketStyle = field(default_factory=_round)
    bracket_textual: BracketStyle = field(default_factory=_round)
    bracket_author: BracketStyle = field(default_factory=_round)
    bracket_label: BracketStyle = field(default_factory=_round)
    bracket_year: BracketStyle = field(default_factory=_round)


def setup(app):
    register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabelStyle)
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    sphinxcontrib.bibtex.plugin.register_plugin(
        "sphinxcontrib.bibtex.style.referencing", "author_year_round", AuthorYearRoundReferenceStyle
    )
    return {"parallel_read_safe": True, "parallel_write_safe": True}
