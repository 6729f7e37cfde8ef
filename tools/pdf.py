"""Print the built book to one offline PDF, in table-of-contents order.

Each page of the HTML build is opened in Debian's headless Chromium (driven by Playwright, no
browser download), MathJax is allowed to finish typesetting, and the page is printed with the
theme's print stylesheet; the pages are then joined with pypdf, with one bookmark per page.

Usage: python tools/pdf.py BUILD_DIR OUT.pdf   (BUILD_DIR as in the Makefile, default _build)
"""

from __future__ import annotations

import functools
import http.server
import io
import shutil
import socketserver
import sys
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def toc_order(toc_path: Path) -> list[str]:
    toc = yaml.safe_load(toc_path.read_text())
    order = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                order.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                walk(node.get(key, []))
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k in ("parts", "chapters")})
    return order


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def build_pdf(build_dir: Path, out: Path) -> list[tuple[str, int]]:
    """Print every page of the book built in ``build_dir`` into ``out``, in the order of the staged
    table of contents; return ``(title, first_page)`` per page."""
    from playwright.sync_api import sync_playwright
    from pypdf import PdfReader, PdfWriter

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    html_dir, toc_path = build_dir / "_build" / "html", build_dir / "site" / "_toc.yml"
    handler = functools.partial(_Quiet, directory=str(html_dir))
    writer, outline = PdfWriter(), []
    with socketserver.TCPServer(("127.0.0.1", 0), handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            context = browser.new_context()
            context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
            page = context.new_page()
            for entry in toc_order(toc_path):
                if not (html_dir / f"{entry}.html").is_file():
                    raise FileNotFoundError(f"{entry}.html is in the table of contents but not in {html_dir}")
                page.goto(f"{base}/{entry}.html", wait_until="load")
                if page.locator('script[src*="mathjax"]').count():
                    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
                    page.evaluate("() => MathJax.startup.promise")
                title = page.title().split(" — ")[0].strip()
                # The theme prints its own header with the page title but without the chapter's
                # number (the numbered heading is hidden in print): give it the number the
                # bookmark and the HTML page have.
                page.evaluate("(t) => { const h = document.querySelector('#jb-print-docs-body h1');"
                              " if (h) h.textContent = t; }", title)
                page.emulate_media(media="print")
                pdf = page.pdf(format="A4", print_background=True,
                               margin={"top": "15mm", "bottom": "15mm", "left": "12mm", "right": "12mm"})
                start = len(writer.pages)
                writer.append(PdfReader(io.BytesIO(pdf)))
                writer.add_outline_item(title=title, page_number=start)
                outline.append((title, start))
            browser.close()
        httpd.shutdown()
    out.parent.mkdir(parents=True, exist_ok=True)
    writer.add_metadata({"/Title": "Attention as Optimization"})
    with out.open("wb") as f:
        writer.write(f)
    return outline


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outline = build_pdf(Path(argv[0]), Path(argv[1]))
    print(f"{argv[1]}: {len(outline)} sections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
