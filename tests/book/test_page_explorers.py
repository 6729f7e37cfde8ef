"""The explorers on the book's pages (attnopt.page_explorer), moved by keyboard in headless Chromium.

For each page of ``PAGES``: the page loads with no request beyond the local server and transfers at
most 3 MB (compressed as a static host serves it); the explorer's controls are wired (shown, each with its label); each slider, focused and
moved with the arrow keys (and Home/End), and each menu, set to another option, changes the figure
and its alt text, and the numbers the page then shows are the ones ``attnopt.explore`` computes for
the state the controls show (recomputed here from the notebook's record, compared at the precision
shown).  Screenshots at 1280 px and 390 px, before and after moving the first slider, land in
``_build/screenshots/`` for a person to look at; at 390 px the page must not scroll sideways.

To add an explorer: record its grid (``explorer.grid``) and what its states need with
``attnopt.book.record`` under the key ``page_explorer``, write a function ``(record, values) ->
{label: number}`` that recomputes the numbers the page shows with ``attnopt.explore``, and add one
line to ``PAGES``.  A theory page's explorer (``attnopt.book.save_page_explorer`` and the
``explorer-figure`` directive) is added the same way, with the record of the notebook that saves it.
"""

from __future__ import annotations

import gzip
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch

from attnopt import explore
from book_paths import BUILD, load_tool

site_audit = load_tool("site_audit")
SHOTS = BUILD / "screenshots"
MAX_TRANSFER = 3_000_000  # bytes a page with an explorer may transfer, everything included
# What a static host (GitHub Pages) sends gzip-compressed; images and fonts go as they are.  The
# local test server compresses nothing, so the test compresses what it received: uncompressed, the
# theme's icons and MathJax alone are over 4 MB on every page of the book.
COMPRESSED = re.compile(r"text/|javascript|json|svg")
MIN_SLIDER_VALUES = 20  # a slider with fewer positions does not feel continuous


def ch3_numbers(record: dict, values: dict) -> dict:
    """Chapter 3's explorer: one query's weights for a regularizer, its strength and ALiBi."""
    page = record["page_explorer"]
    scores = torch.tensor(page["scores"], dtype=torch.float64)
    name, alpha = page["regularizers"][values["regularizer"]]
    view = explore.regularized_weights(scores, values["tau"], name, alpha=alpha, alibi_slope=values["alibi_slope"])
    positions = torch.arange(scores.shape[0], dtype=torch.float64)
    return {
        "keys with weight > 0": int(view.support_size),
        "largest weight": float(view.weights.max()),
        "on key": int(view.weights.argmax()),
        "mean position": float(view.weights @ positions),
    }


def _preference(favoured: str, like: torch.Tensor, weight: float) -> torch.Tensor:
    """Uniform, or ``weight`` on template ``favoured`` ("t1".."t5") and the rest shared equally."""
    n = like.shape[0]
    if favoured == "uniform":
        return torch.full((n,), 1.0 / n, dtype=like.dtype)
    u = torch.full((n,), (1.0 - weight) / (n - 1), dtype=like.dtype)
    u[int(favoured[1:]) - 1] = weight
    return u


def ch1_numbers(record: dict, values: dict) -> dict:
    """Chapter 1's explorer: the exact estimate against the closed form (18), by alpha and preference."""
    page = record["page_explorer"]
    T = torch.tensor(page["templates"], dtype=torch.float64)
    z = torch.tensor(page["z"], dtype=torch.float64)
    u = _preference(values["favoured"], T, page["favoured_weight"])
    view = explore.preference_view(T, u, z, values["alpha"])
    return {"error ‖ĥ − ĥ_α‖": float(view.error), "shift ‖ĥ − μ‖": float(view.shift),
            "error / shift": float(view.error / view.shift)}


def ch1_fig3_numbers(record: dict, values: dict) -> dict:
    """Fig. 3 of chapter 1 (its notebook and the small-alpha page): the two estimates by alpha."""
    page = record["page_explorer"]
    T, u, z = (torch.tensor(page[k], dtype=torch.float64) for k in ("templates", "u", "z"))
    view = explore.preference_view(T, u, z, values["alpha"])
    return {"‖ĥ − ĥ_α‖": float(view.error), "‖ĥ − μ‖": float(view.shift), "ratio": float(view.error / view.shift)}


def ch2_numbers(record: dict, values: dict) -> dict:
    """Chapter 2's explorer: the particle flow at one temperature, variant and layer."""
    page = record["page_explorer"]
    x = torch.tensor(page["x"], dtype=torch.float64)
    view = explore.particle_flow(x, values["tau"], page["depth"], variant=values["variant"])
    layer = values["layer"]
    return {"clusters": int(view.clusters[layer]),
            "diameter / initial": float(view.diameters[layer] / view.diameters[0])}


def ch4_numbers(record: dict, values: dict) -> dict:
    """Chapter 4's explorer: a density over a scene, by its standard deviation, place and family."""
    page = record["page_explorer"]
    image = torch.tensor(page["image"], dtype=torch.float64)
    mu = torch.tensor(page["places"][values["place"]], dtype=torch.float64)
    covariance = values["sigma"] ** 2 * torch.eye(2, dtype=torch.float64)
    view = explore.density_view(explore.image_value_function(image), mu, covariance, values["family"])
    red, green, blue = view.context.tolist()
    return {
        "context R": red,
        "context G": green,
        "context B": blue,
        "mass on the image": float(view.mass),
        "support, % of pixels": 100 * view.support.double().mean().item(),
    }


def ch5_numbers(record: dict, values: dict) -> dict:
    """Chapter 5's explorer: the largest difference of each view from SDPA, for one query."""
    page = record["page_explorer"]
    query, keys = (torch.tensor(page[k], dtype=torch.float64) for k in ("query", "keys"))
    absent = None if values["absent"] == "none" else int(values["absent"])
    view = explore.four_views(query, keys, values["tau"], regularizer=values["regularizer"], absent=absent)
    return dict(zip(("Fenchel dual", "Markov kernel", "transport"), view.gaps.tolist()))


def ch3_regularizers_numbers(record: dict, values: dict) -> dict:
    """Chapter 3's theory page: keys kept by six regularizers at temperature tau (closed forms on s / tau)."""
    from attnopt.transforms import entmax, entmax15, prior_softmax, softmax, sparsemax

    page = record["page_explorer"]
    s = torch.tensor(page["scores"], dtype=torch.float64) / values["tau"]
    prior = torch.tensor(page["prior"], dtype=torch.float64)
    weights = {
        "softmax": softmax(s),
        "entmax 1.25": entmax(s, 1.25),
        "1.5-entmax": entmax15(s),
        "sparsemax": sparsemax(s),
        "entmax 3": entmax(s, 3.0),
        "prior softmax": prior_softmax(s, prior),
    }
    return {f"keys kept, {name}": int((p > 0).sum()) for name, p in weights.items()}


def ch4_densities_numbers(record: dict, values: dict) -> dict:
    """Chapter 4's theory page: a Gaussian and a truncated parabola of one variance v, in closed form
    (peaks 1/sqrt(2 pi v) and 3 / (4 sqrt(5 v)), support mean -+ sqrt(5 v))."""
    v, mean = values["variance"], values["mean"]
    half = math.sqrt(5 * v)
    return {
        "Gaussian's peak": 1 / math.sqrt(2 * math.pi * v),
        "parabola's peak": 3 / (4 * half),
        "parabola from": mean - half,
        "parabola to": mean + half,
    }


class ExplorerPage(NamedTuple):
    path: str  # the built page, relative to the HTML folder
    record: str  # the stem of the notebook's results (attnopt.book.record), with key "page_explorer"
    numbers: Callable[[dict, dict], dict]  # (record, values of the controls) -> {label: number}


PAGES = [
    ExplorerPage("notebooks/ch1_explorer.html", "ch1_explorer", ch1_numbers),
    ExplorerPage("notebooks/ch1_gaussian_fig3.html", "ch1_gaussian_fig3", ch1_fig3_numbers),
    ExplorerPage("book/ch1/small_alpha.html", "ch1_gaussian_fig3", ch1_fig3_numbers),
    ExplorerPage("notebooks/ch2_explorer.html", "ch2_explorer", ch2_numbers),
    ExplorerPage("notebooks/ch3_explorer.html", "ch3_explorer", ch3_numbers),
    ExplorerPage("notebooks/ch4_explorer.html", "ch4_explorer", ch4_numbers),
    ExplorerPage("notebooks/ch5_explorer.html", "ch5_explorer", ch5_numbers),
    ExplorerPage("book/ch3/regularizers.html", "ch3_sdpa_is_eot", ch3_regularizers_numbers),
    ExplorerPage("book/ch4/regularized_prediction_maps.html", "ch4_continuous_1d", ch4_densities_numbers),
]


class Visit(NamedTuple):
    context: object
    page: object
    transferred: list  # bytes of each response
    outside: list  # requests to anything but the local server (aborted)


def visit(browser, base: str, path: str, width: int, height: int) -> Visit:
    context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
    transferred, outside = [], []

    def route(r):
        if r.request.url.startswith(base) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()

    def count(response):
        if response.url.startswith(base):
            try:
                body = response.body()
            except Exception:  # a redirect has no body
                return
            kind = response.headers.get("content-type", "")
            transferred.append(len(gzip.compress(body, 6)) if COMPRESSED.search(kind) else len(body))

    page.on("response", count)
    page.goto(f"{base}/{path}", wait_until="load")
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
    page.evaluate("() => MathJax.startup.promise")
    page.wait_for_selector(".page-explorer[data-wired='true']", timeout=10_000)
    return Visit(context, page, transferred, outside)


def shown_numbers(readout: str) -> dict:
    """``'controls — a: 1; b: 0.25'`` -> ``{'a': '1', 'b': '0.25'}`` (the text after the dash)."""
    _, _, numbers = readout.partition(" — ")
    return dict(part.rsplit(": ", 1) for part in numbers.split("; "))


def assert_numbers_shown(shown: dict, expected: dict, where: str) -> None:
    assert set(shown) == set(expected), f"{where}: the page shows {sorted(shown)}, expected {sorted(expected)}"
    for label, value in expected.items():
        text = shown[label]
        if isinstance(value, int):
            assert int(text) == value, f"{where}: {label} shown {text}, computed {value}"
        else:
            # as precise as the text: half a unit of its last digit
            tolerance = 0.5 * 10 ** Decimal(text).as_tuple().exponent * (1 + 1e-9) + 1e-12
            assert abs(float(text) - value) <= tolerance, f"{where}: {label} shown {text}, computed {value:.6g}"


def state_of(page, root, grid: dict) -> dict:
    """The values the controls show, read from the page (positions into the recorded grid)."""
    positions = root.evaluate(
        "r => Object.fromEntries([...r.querySelectorAll('input[type=range], select')]"
        ".map(f => [f.name, Number(f.value)]))")
    return {name: grid[name][position] for name, position in positions.items()}


def look(root) -> dict:
    return root.evaluate(
        "r => ({src: r.querySelector('img.page-explorer-frame').src,"
        " alt: r.querySelector('img.page-explorer-frame').alt,"
        " readout: r.querySelector('output.page-explorer-readout').textContent,"
        " state: r.dataset.state})")


def check_state(page, root, record, spec, where):
    values = state_of(page, root, record["page_explorer"]["grid"])
    seen = look(root)
    assert_numbers_shown(shown_numbers(seen["readout"]), spec.numbers(record, values), f"{where} at {values}")
    return seen


@pytest.mark.parametrize("spec", PAGES, ids=[p.path for p in PAGES])
def test_explorer_moves_by_keyboard_and_shows_the_librarys_numbers(browser, server, results, spec):
    record = results(spec.record)
    grid = record["page_explorer"]["grid"]
    v = visit(browser, server, spec.path, 1280, 1000)
    try:
        page = v.page
        root = page.locator(".page-explorer").first
        root.scroll_into_view_if_needed()
        assert root.locator(".page-explorer-controls").is_visible(), "the script did not show the controls"
        # every control has its label; sliders are native ranges over the whole grid
        fields = root.locator("input[type=range], select")
        names = [fields.nth(i).get_attribute("name") for i in range(fields.count())]
        assert sorted(names) == sorted(grid), (names, sorted(grid))
        for i in range(fields.count()):
            field = fields.nth(i)
            label = root.locator(f"label[for='{field.get_attribute('id')}']")
            assert label.count() == 1 and label.inner_text().strip(), f"{names[i]} has no label"
        ranges = root.locator("input[type=range]")
        assert ranges.count() >= 1, "an explorer has at least one slider"
        for i in range(ranges.count()):
            r = ranges.nth(i)
            n = len(grid[r.get_attribute("name")])
            assert int(r.get_attribute("max")) == n - 1 and n >= MIN_SLIDER_VALUES, f"{r.get_attribute('name')}: {n}"
        assert root.locator("output.page-explorer-readout").get_attribute("aria-live") == "polite"

        before = check_state(page, root, record, spec, "default")
        defaults = [int(ranges.nth(i).input_value()) for i in range(ranges.count())]
        seen = before
        for i in range(ranges.count()):
            r = ranges.nth(i)
            name = r.get_attribute("name")
            r.focus()
            for key in ("ArrowRight", "ArrowLeft", "ArrowLeft", "End", "Home"):
                old = seen
                position = int(r.input_value())
                r.press(key)
                moved = int(r.input_value())
                if moved == position:  # at an end of the grid: the key cannot move it
                    continue
                seen = check_state(page, root, record, spec, f"{name} after {key}")
                assert seen["src"] != old["src"], f"{name} after {key}: the figure did not change"
                assert seen["alt"] != old["alt"] and len(seen["alt"]) >= 15, f"{name} after {key}: the alt text"
                value = root.locator(f"output[for='{r.get_attribute('id')}']").inner_text()
                assert r.get_attribute("aria-valuetext") == value, f"{name}: aria-valuetext and the value shown differ"
                assert float(value) == pytest.approx(grid[name][moved], rel=5e-3), f"{name}: shows {value}"
        # back to the default state by keyboard: every option of a menu must change the figure there
        for i, position in enumerate(defaults):
            r = ranges.nth(i)
            r.focus()
            r.press("Home")
            for _ in range(position):
                r.press("ArrowRight")
            assert int(r.input_value()) == position
        seen = check_state(page, root, record, spec, "default again")
        assert seen["src"] == before["src"] and seen["readout"] == before["readout"]
        selects = root.locator("select")
        for i in range(selects.count()):
            s = selects.nth(i)
            name = s.get_attribute("name")
            count, current = s.locator("option").count(), int(s.input_value())
            for position in [*(p for p in range(count) if p != current), current]:
                old = seen
                s.focus()
                s.select_option(str(position))
                seen = check_state(page, root, record, spec, f"{name} option {position}")
                assert seen["src"] != old["src"], f"{name} option {position}: the figure did not change"
        assert not v.outside, f"requests beyond the local server: {v.outside[:5]}"
        total = sum(v.transferred)
        assert total <= MAX_TRANSFER, f"{spec.path} transfers {total / 1e6:.2f} MB (> {MAX_TRANSFER / 1e6:.0f} MB)"
    finally:
        v.context.close()


@pytest.mark.parametrize("spec", PAGES, ids=[p.path for p in PAGES])
def test_screenshots_before_and_after_a_slider_moves(browser, server, spec):
    SHOTS.mkdir(parents=True, exist_ok=True)
    stem = "page-explorer-" + Path(spec.path).stem
    for width, height in ((1280, 900), (390, 844)):
        v = visit(browser, server, spec.path, width, height)
        try:
            page = v.page
            root = page.locator(".page-explorer").first
            slider = root.locator("input[type=range]").first
            root.scroll_into_view_if_needed()
            # the explorer at the top of the window, below the theme's header bar
            page.evaluate("el => { el.scrollIntoView({block: 'start'}); window.scrollBy(0, -70); }",
                          root.element_handle())
            page.screenshot(path=str(SHOTS / f"{stem}-{width}-before.png"))
            old = look(root)["src"]
            slider.focus()
            for _ in range(4):
                slider.press("ArrowLeft")
            assert look(root)["src"] != old
            page.screenshot(path=str(SHOTS / f"{stem}-{width}-after.png"))
            assert page.evaluate("document.documentElement.scrollWidth") <= width + 1, f"{spec.path} scrolls sideways at {width} px"
            assert slider.is_visible() and slider.bounding_box()["x"] + slider.bounding_box()["width"] <= width
        finally:
            v.context.close()


def test_readout_parser():
    assert shown_numbers("τ = 1, regularizer: softmax — keys: 5; weight: 0.637") == {"keys": "5", "weight": "0.637"}
    assert re.fullmatch(r"\d+", shown_numbers("x = 1 — n: 12")["n"])
    with pytest.raises(AssertionError):
        assert_numbers_shown({"w": "0.637"}, {"w": 0.6376}, "planted")  # off by more than half a unit
    assert_numbers_shown({"w": "0.637", "n": "5"}, {"w": 0.63749, "n": 5}, "ok")
