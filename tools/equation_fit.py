"""Which display equations fit a phone's column: each one typeset by the book's own MathJax.

The book's offline MathJax (3.2) breaks no display equation into lines, and on a phone
``book/assets/maths_fit.js`` shrinks an equation wider than its column down to 60 % of its size;
one still wider scrolls inside its box (issue 27 asks that nine in ten fit).  This tool answers,
without a build of the book, whether an equation as written in a page's source fits, so that a
writer can place ``aligned``/``split`` breaks and check them at once.

It opens one page of a built book (for the book's MathJax configuration, macros and CSS) at the
phone's size of the site audit (390 x 844), puts each equation into the article in a box of the
given width (the room the equation has there: 358 px in the text, about 313 in a theorem or a
proof, 291 inside two boxes), lets MathJax typeset it and applies maths_fit.js's rule.

Usage::

    python tools/equation_fit.py book/ch2/wasserstein.md [notebooks/ch2_regularity.ipynb ...]
    python tools/equation_fit.py --tex '\\sum_i p_i = 1' --room 313
    python tools/equation_fit.py --json /tmp/eqs.json        # [{"tex": ..., "room_px": ...}, ...]

A file's display equations are those of MyST markdown (``$$ ... $$`` blocks, with or without a
label, and ``{math}`` directives), of a notebook's markdown cells, and of ``.. math::`` blocks in a
Python module's docstrings.  ``--html DIR`` names the built book (default ``_build/_build/html``);
the exit status is 1 when an equation does not fit, 2 when MathJax reports an error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import site_audit  # noqa: E402

MATHS_FIT = Path(__file__).resolve().parent.parent / "book" / "assets" / "maths_fit.js"


def _fit_limit(name: str) -> float:
    """A limit of maths_fit.js, read from the script itself so that the two never disagree."""
    m = re.search(rf"var {name} = ([0-9.]+);", MATHS_FIT.read_text(encoding="utf-8"))
    if m is None:
        raise RuntimeError(f"{MATHS_FIT} no longer defines {name}: update tools/equation_fit.py")
    return float(m.group(1))


#: maths_fit.js's limits: the smallest scale of an equation's size and the smallest font size.
MIN_SCALE = _fit_limit("MIN_SCALE")
MIN_PX = _fit_limit("MIN_PX")
#: The room of an equation in the text of a phone's page (the article's column at 390 px).
TEXT_ROOM = 358
#: The page whose MathJax configuration and styles are used.
HOST_PAGE = "book/ch3/regularizers.html"

_DOLLAR_BLOCK = re.compile(r"^[ \t]*\$\$[ \t]*\n(.*?)\n[ \t]*\$\$(?:[ \t]*\(([^)]+)\))?[ \t]*$", re.S | re.M)
_DOLLAR_LINE = re.compile(r"^[ \t]*\$\$(.+?)\$\$(?:[ \t]*\(([^)]+)\))?[ \t]*$", re.M)
_MATH_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{math\}[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
_RST_MATH = re.compile(r"^([ \t]*)\.\. math::[ \t]*\n((?:\1[ \t]+[^\n]*\n|[ \t]*\n)+)", re.M)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _from_markdown(text: str, where: str, first_line: int = 1) -> list[dict]:
    found = []
    for m in _DOLLAR_BLOCK.finditer(text):
        found.append({"where": f"{where}:{first_line - 1 + _line(text, m.start())}", "label": m.group(2) or "",
                      "tex": m.group(1).strip()})
    for m in _DOLLAR_LINE.finditer(text):
        found.append({"where": f"{where}:{first_line - 1 + _line(text, m.start())}", "label": m.group(2) or "",
                      "tex": m.group(1).strip()})
    for m in _MATH_DIRECTIVE.finditer(text):
        body = m.group(2)
        label = (re.search(r"^:label:\s*(\S+)", body, re.M) or [None, ""])[1]
        tex = "\n".join(line for line in body.splitlines() if not re.match(r"^:\w+:", line)).strip()
        found.append({"where": f"{where}:{first_line - 1 + _line(text, m.start())}", "label": label, "tex": tex})
    return sorted(found, key=lambda e: int(e["where"].rsplit(":", 1)[1]))


def equations_in(path: Path) -> list[dict]:
    """The display equations of a MyST page, a notebook or a Python module, in reading order."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        found = []
        for i, cell in enumerate(json.loads(text)["cells"]):
            if cell["cell_type"] == "markdown":
                found += _from_markdown("".join(cell["source"]), f"{path}[cell {i} {cell.get('id', '')}]")
        return found
    if path.suffix == ".py":
        found = []
        for m in _RST_MATH.finditer(text):
            lines = [line.strip() for line in m.group(2).splitlines()]
            label = next((line.split(":", 2)[2].strip() for line in lines if line.startswith(":label:")), "")
            tex = "\n".join(line for line in lines if line and not re.match(r"^:\w+:", line))
            found.append({"where": f"{path}:{_line(text, m.start())}", "label": label, "tex": tex})
        return found
    return _from_markdown(text, str(path))


_MEASURE = """async ([tex, room, minScale, minPx]) => {
  const holder = document.createElement('div');
  holder.className = 'math notranslate nohighlight';
  holder.style.width = room + 'px';
  holder.style.maxWidth = room + 'px';
  holder.textContent = '\\\\[' + tex + '\\\\]';
  (document.querySelector('article') || document.body).appendChild(holder);
  await MathJax.typesetPromise([holder]);
  const box = holder.querySelector('mjx-container');
  const math = box.querySelector('mjx-math') || box;
  const error = holder.querySelector('mjx-merror, [data-mjx-error]');
  const width = math.getBoundingClientRect().width;
  const size = parseFloat(getComputedStyle(box).fontSize);
  const scale = width <= room ? 1 : Math.max(minScale, minPx / size, (room - 2) / width);
  const result = {width: Math.round(width), scale: Number(scale.toFixed(3)), fitted: Math.round(width * scale),
                  error: error ? (error.getAttribute('data-mjx-error') || error.textContent) : null};
  MathJax.typesetClear([holder]);
  holder.remove();
  return result;
}"""


def measure(equations: list[dict], html_dir: Path) -> list[dict]:
    """Each equation with its width at full size, the scale maths_fit.js gives it, and ``fits``."""
    from playwright.sync_api import sync_playwright

    out = []
    with site_audit.serve(html_dir) as base, sync_playwright() as playwright:
        browser = site_audit._launch(playwright)
        try:
            page = browser.new_context(**site_audit.DEVICES["phone"]).new_page()
            page.goto(f"{base}/{HOST_PAGE}", wait_until="load")
            page.wait_for_function("() => document.documentElement.dataset.mathsFitted === 'true'", timeout=60_000)
            for eq in equations:
                room = int(eq.get("room_px") or TEXT_ROOM)
                got = page.evaluate(_MEASURE, [eq["tex"], room, MIN_SCALE, MIN_PX])
                out.append({**eq, "room_px": room, **got, "fits": got["fitted"] <= room + 1})
        finally:
            browser.close()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--tex", action="append", default=[], help="a display equation's TeX (repeatable)")
    parser.add_argument("--room", type=int, default=TEXT_ROOM, help="the box's width for --tex and files (px)")
    parser.add_argument("--json", type=Path, help='a list of {"tex": ..., "room_px": ...}')
    parser.add_argument("--html", type=Path, default=Path("_build/_build/html"))
    parser.add_argument("--only-wide", action="store_true", help="list only the equations that do not fit")
    args = parser.parse_args(argv)
    if not (args.html / HOST_PAGE).exists():
        parser.error(f"no built book at {args.html} (run `make html`, or name one with --html)")
    equations = [{"where": "--tex", "label": "", "tex": t, "room_px": args.room} for t in args.tex]
    for path in args.files:
        equations += [{**e, "room_px": args.room} for e in equations_in(path)]
    if args.json:
        equations += [{"where": str(args.json), "label": e.get("label", ""), **e} for e in json.loads(args.json.read_text())]
    if not equations:
        parser.error("no equation given (files, --tex or --json)")
    results = measure(equations, args.html)
    status = 0
    for r in results:
        if r["error"]:
            status = 2
        elif not r["fits"]:
            status = max(status, 1)
        if args.only_wide and r["fits"] and not r["error"]:
            continue
        verdict = "ERROR " + r["error"] if r["error"] else ("fits" if r["fits"] else "SCROLLS")
        first = " ".join(r["tex"].split())[:70]
        print(f"{r['where']} {r['label']}: {r['width']} px at full size, x{r['scale']} -> {r['fitted']} px "
              f"in {r['room_px']}: {verdict}   {first}")
    wide = sum(not r["fits"] for r in results)
    print(f"{len(results) - wide} of {len(results)} fit")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
