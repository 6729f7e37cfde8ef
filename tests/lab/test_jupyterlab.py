"""JupyterLab, in a browser: an explorer notebook runs and its widgets answer a slider.

The test starts JupyterLab headless on a free local port (no token, no browser of its own) over a
temporary copy of one explorer notebook (so that nothing is saved into the repository), opens it in
Debian's Chromium through Playwright, runs every cell, drags the first slider of the explorer (the
strength of the regularizer) to its end, and checks that the figure (the PNG of the
``ipywidgets.Image``) and the line of numbers under it changed as the maths says (a weaker
regularizer keeps more keys).  A screenshot of the page is left next to the server's log, in the
test's temporary folder.  Every wait is bounded, and the server (with its kernel) is stopped at
the end whatever happened.  ``make lab`` starts the same JupyterLab, with a browser, on
``notebooks/``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "ch3_explorer.ipynb"  # the lightest explorer: one query's weights
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
START_S, RUN_S, REDRAW_S = 90, 240, 60  # bounds on the server's start, running the cells, one redraw


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server over a copy of the notebook; yields its URL; stops it afterwards."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, work / NOTEBOOK)
    port = free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), MPLBACKEND="module://matplotlib_inline.backend_inline")
    jupyter = Path(sys.executable).parent / "jupyter"
    command = [
        str(jupyter), "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
        "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={work}",
        f"--LabApp.user_settings_dir={tmp_path / 'settings'}", f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
        "--LabApp.expose_app_in_browser=True",
        *(["--allow-root"] if os.geteuid() == 0 else []),  # CI containers run as root
    ]
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start within {START_S} s:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, work
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the server and the kernels it started
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=20)
        log.close()


def explorer_state(page) -> dict:
    """The explorer's figure (its PNG's address) and its line of numbers, as the page shows them."""
    return page.evaluate(
        """() => {
            const images = [...document.querySelectorAll('.jp-OutputArea img.widget-image')];
            const html = [...document.querySelectorAll('.jp-OutputArea .widget-html-content')];
            return {src: images.length ? images[0].src : null,
                    readout: html.length ? html[html.length - 1].textContent : null};
        }"""
    )


@pytest.mark.slow
def test_explorer_runs_in_jupyterlab_and_answers_a_slider(lab):
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed (apt-get install chromium; .ci/run does it)")
    url, work = lab
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(RUN_S * 1000)
            page.goto(f"{url}/lab/tree/{NOTEBOOK}")
            page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook')",
                                   timeout=START_S * 1000)
            # wait for the kernel, then run every cell as a reader's "Run All" does
            page.wait_for_function(
                """() => { const w = window.jupyterapp.shell.currentWidget;
                           return w && w.sessionContext && w.sessionContext.session
                                  && w.sessionContext.session.kernel
                                  && w.sessionContext.session.kernel.status === 'idle'; }""",
                timeout=START_S * 1000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(
                """() => { const w = window.jupyterapp.shell.currentWidget;
                           const cells = w.content.widgets.filter(c => c.model.type === 'code');
                           const last = cells[cells.length - 1];
                           return last.model.executionCount !== null
                                  && w.sessionContext.session.kernel.status === 'idle'; }""",
                timeout=RUN_S * 1000)
            failed = page.evaluate(
                "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                ".filter(o => (o.dataset.mimeType || '').endsWith('stderr')"
                " || o.querySelector('.jp-RenderedText[data-mime-type*=error]')).length")
            assert failed == 0, "a cell failed or wrote to stderr"
            page.wait_for_selector(".jp-OutputArea img.widget-image", timeout=REDRAW_S * 1000)
            before = explorer_state(page)
            assert before["src"] and "keys kept" in before["readout"], before

            # drag the first slider's handle (tau) to the right end of its track, as a reader does
            slider = page.locator(".jp-OutputArea .widget-slider").first
            slider.scroll_into_view_if_needed()
            handle = slider.locator(".noUi-handle").first.bounding_box()
            track = slider.locator(".noUi-target").first.bounding_box()
            page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
            page.mouse.down()
            page.mouse.move(track["x"] + track["width"] + 20, handle["y"] + handle["height"] / 2, steps=8)
            page.mouse.up()
            redrawn = ("(old) => { const i = document.querySelector('.jp-OutputArea img.widget-image');"
                       " return i && i.src !== old; }")
            try:
                page.wait_for_function(redrawn, arg=before["src"], timeout=REDRAW_S * 1000)
            except playwright_api.TimeoutError:
                # A drag that missed the handle (the page may still have been laying out the
                # outputs): record what the page showed, then move the slider from the keyboard,
                # as a reader can too; a slider that answers neither fails the test.
                page.screenshot(path=str(work.parent / "lab-missed-drag.png"))
                slider.locator(".noUi-handle").first.focus()
                for key in ("End", "ArrowRight", "ArrowRight"):
                    page.keyboard.press(key)
                page.wait_for_function(redrawn, arg=before["src"], timeout=REDRAW_S * 1000)
            page.wait_for_function(
                "(old) => [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
                ".some(e => e.textContent.includes('keys kept') && e.textContent !== old)",
                arg=before["readout"], timeout=REDRAW_S * 1000)
            after = explorer_state(page)
            page.screenshot(path=str(work.parent / "lab.png"))
            kept = [int(state["readout"].split(" of ")[0]) for state in (before, after)]
            assert kept[1] > kept[0], (before, after)  # a weaker regularizer keeps more keys
        finally:
            browser.close()
    saved = json.loads((work / NOTEBOOK).read_text())
    assert saved["cells"], "the copy of the notebook is intact"
