"""The studio in a real browser: headless Chromium picks an example, runs it, and sees every panel;
then downloads the run, replays a hostile copy of it and a broken one, and closes the tab.

Needs the Debian ``chromium`` package (``/usr/bin/chromium``) and the ``playwright`` Python package
(never ``playwright install``: it downloads a browser). Skipped with the reason when either is missing.
Screenshots go to pytest's tmp dir and, if set, to ``$RECAP_SCREENSHOT_DIR`` (the README's pictures in
docs/screenshots/ are made this way: ``RECAP_SCREENSHOT_DIR=docs/screenshots pytest tests/test_browser.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import free_port, tiny

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]

#: Playwright's waits, in ms: for what the page shows next, and for a page load, a run or a comparison.
#: Generous, so that a busy CPU is not a failure (a page that never shows it still fails, later).
SHOW_MS, RUN_MS = 60_000, 300_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing: apt-get install chromium"),
]


@pytest.fixture(scope="module")
def studio():
    """``(url, demo)`` of a running studio: the embedded model when it ships, else the tiny LLaVA."""
    import app
    from recap.runtime import EMBEDDED_MODEL, Runtime
    from recap.studio.environment import default_runtime_factory

    def factory(model_id: str) -> Runtime:
        if model_id == "tiny-llava":
            return Runtime(tiny("llava"))
        return default_runtime_factory(model_id)

    embedded = (EMBEDDED_MODEL / "config.json").is_file()
    demo = app.build_demo(runtime_factory=factory, models=_embedded_models() if embedded else ["tiny-llava"])
    port = free_port()
    kwargs = {**app.launch_kwargs(), "server_name": "127.0.0.1", "server_port": port}
    demo.queue().launch(**kwargs, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/", demo
    demo.close()


def _embedded_models() -> list[str]:
    """The studio's own offer: v2 (the default) and, when it ships, v1."""
    from recap.runtime import EMBEDDED_MODEL_V1
    from recap.studio.environment import EMBEDDED_V1_ID, EMBEDDED_V2_ID

    v1_ships = (EMBEDDED_MODEL_V1 / "config.json").is_file()
    return [EMBEDDED_V2_ID, EMBEDDED_V1_ID] if v1_ships else [EMBEDDED_V2_ID]


def _save(page, tmp_path: Path, name: str, element: str | None = None) -> Path:
    """A screenshot of the whole page (or of ``element``, a selector), kept under ``name``."""
    path = tmp_path / name
    if element is None:
        page.screenshot(path=str(path), full_page=True)
    else:
        page.locator(element).screenshot(path=str(path))
    target = os.environ.get("RECAP_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)
    return path


def _browser(playwright, tmp_path, width: int = 1400):
    return playwright.chromium.launch_persistent_context(
        str(tmp_path / f"profile-{width}"),  # a fresh user-data-dir per run
        executable_path=CHROMIUM,
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": width, "height": 1000},
        accept_downloads=True,
    )


@contextlib.contextmanager
def _page(url: str, tmp_path: Path, width: int = 1400, on_request=None):
    """The studio at ``url`` in a fresh browser profile, loaded (its Run button shown); closed after.
    ``on_request(request)`` sees every request the page makes."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as playwright:
        context = _browser(playwright, tmp_path, width)
        try:
            page = context.new_page()
            if on_request is not None:
                page.on("request", on_request)
            page.goto(url)
            page.wait_for_selector("#run-button", timeout=RUN_MS)
            yield page
        finally:
            context.close()


@pytest.fixture
def fresh_studio():
    """A fresh server on the embedded models, v2 first (nothing loaded, no visitor yet): the first click."""
    import app
    from recap.runtime import EMBEDDED_MODEL
    from recap.studio.serving import RuntimeCache

    if not (EMBEDDED_MODEL / "config.json").is_file():
        pytest.skip("the embedded model is not in assets/ yet")
    demo = app.build_demo(models=_embedded_models(), cache=RuntimeCache())
    port = free_port()
    kwargs = {**app.launch_kwargs(), "server_name": "127.0.0.1", "server_port": port}
    demo.queue().launch(**kwargs, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def _cards(page) -> dict[str, str]:
    """The stats cards, label -> value."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('#stats .recap-card')].map(
            card => [card.querySelector('.recap-card-label').innerText,
                     card.querySelector('.recap-card-value').innerText]))"""
    )


def _first_run_at_step_one(page) -> tuple[float, int | None, str]:
    """Run the page's current request, then show step 1: the run's tokens per pass, the nodes step 1
    proposed (None when its words say otherwise) and the memory line after the run."""
    page.click("#run-button")
    page.wait_for_function("document.querySelector('#status').innerText.includes('Done')", timeout=RUN_MS)
    mat = float(_cards(page)["MAT (tokens a pass)"])
    memory = page.locator("#memory-state").inner_text()
    number = page.locator("#step-slider input[type=number]")
    number.fill("1")
    number.press("Enter")
    page.wait_for_function(
        "document.querySelector('#step-words').innerText.startsWith('Step 1:')", timeout=SHOW_MS
    )
    words = page.locator("#step-words").inner_text()
    proposed = re.match(r"Step 1: the drafter proposed (\d+) node", words)
    return mat, int(proposed.group(1)) if proposed else None, memory


def test_first_click_on_a_fresh_server_drafts_at_step_one_with_v2(fresh_studio, tmp_path, idle_cost_curve):
    from recap.studio.ui.examples import examples

    first_image, first_prompt = examples("embedded-v2")[0]
    with _page(fresh_studio, tmp_path) as page:
        assert "loads with the model on your first run" in page.locator("#memory-state").inner_text()
        # the page opens on v2, with v2's first example pre-filled
        assert page.locator("#model input").input_value() == "Embedded VLM v2 (wider world)"
        assert page.locator("#prompt textarea").input_value() == first_prompt
        assert Path(first_image).name in page.locator("#input-image img").get_attribute("src")
        mat, proposed, memory = _first_run_at_step_one(page)  # RECAP is the default method
        assert "warm" in memory and "started from the shipped memory" in memory
        _save(page, tmp_path, "first-click-1500.png")
        assert proposed is not None and proposed >= 1, page.locator("#step-words").inner_text()
        assert mat >= 1.5, f"first click: {mat} tokens per pass"


@pytest.mark.parametrize("width", [1500, 390])
def test_choosing_v1_shows_its_examples_and_its_first_click_drafts_at_step_one(
    fresh_studio, tmp_path, width, idle_cost_curve
):
    from recap.runtime import EMBEDDED_MODEL_V1
    from recap.studio.ui.examples import examples

    if not (EMBEDDED_MODEL_V1 / "config.json").is_file():
        pytest.skip("the embedded model v1 is not in assets/models")
    first_image, first_prompt = examples("embedded-v1")[0]
    with _page(fresh_studio, tmp_path, width) as page:
        page.wait_for_selector("#examples", state="visible", timeout=SHOW_MS)  # laid out after the button
        assert not page.locator("#examples-1").is_visible()
        page.click("#model input")
        page.get_by_role("option", name="Embedded VLM v1 (small world)").click()
        # v2's pre-filled example gives way to v1's first one, and v1's examples replace v2's
        page.wait_for_function(
            "(text) => document.querySelector('#prompt textarea').value === text",
            arg=first_prompt,
            timeout=SHOW_MS,
        )
        page.wait_for_selector("#examples-1", state="visible", timeout=SHOW_MS)
        assert not page.locator("#examples").is_visible()
        assert "loads with the model on your first run" in page.locator("#memory-state").inner_text()
        mat, proposed, memory = _first_run_at_step_one(page)
        assert "started from the shipped memory" in memory
        page.wait_for_timeout(500)
        assert not _entities_shown(page, "run") and _fits(page)
        _save(page, tmp_path, f"v1-first-click-{width}.png")
        assert proposed is not None and proposed >= 1, page.locator("#step-words").inner_text()
        assert mat >= 1.5, f"v1's first click: {mat} tokens per pass"
        assert Path(first_image).name in page.locator("#input-image img").get_attribute("src")


def test_example_run_shows_answer_tree_and_fused_distribution(studio, tmp_path):
    studio_url, _ = studio
    with _page(studio_url, tmp_path) as page:
        # the seed box starts blank ("blank = random"), not at 0 (which would seed every sampled run)
        page.click("#advanced button")
        page.wait_for_selector("#seed input", state="visible", timeout=SHOW_MS)
        page.wait_for_function("document.querySelector('#seed input').value === ''", timeout=SHOW_MS)
        # the second example (the first one is pre-filled): clicking it must fill the prompt
        from recap.studio.ui.examples import examples

        if len(examples()) < 2:
            pytest.skip("assets/examples holds fewer than two examples")
        expected = examples()[1][1]
        page.locator('#examples [data-testid="dataset-cell-1-0"]').click()
        page.wait_for_function(
            "(text) => document.querySelector('#prompt textarea').value === text",
            arg=expected,
            timeout=SHOW_MS,
        )
        page.click("#run-button")
        page.wait_for_selector("#answer .token", timeout=RUN_MS)
        page.wait_for_function("document.querySelector('#status').innerText.includes('Done')", timeout=RUN_MS)
        assert page.locator("#answer .token").count() >= 2
        page.wait_for_selector("#tree-plot .js-plotly-plot", timeout=SHOW_MS)
        page.wait_for_selector("#fused-plot .js-plotly-plot", timeout=SHOW_MS)
        # the tree has its root and at least one point per trace; the fused view has its title
        assert page.locator("#tree-plot .scatterlayer .point").count() >= 1
        assert "fused distribution" in page.locator("#fused-plot .gtitle").text_content()
        assert _save(page, tmp_path, "studio_after_run.png").stat().st_size > 10_000


def test_a_photo_with_the_embedded_model_shows_the_note_on_the_run_tab(studio, tmp_path):
    """The issue's first minutes: a cat photo uploaded and asked about with the embedded model (v2, the
    default). The Run tab says, above the answer, that the model only knows drawn scenes and what to pick
    for photos, while the run goes on to its end."""
    studio_url, demo = studio
    data = pytest.importorskip("skimage.data", reason="scikit-image (requirements-dev.txt) holds the photo")
    if "embedded-v2" not in demo.studio.models:
        pytest.skip("the embedded model is not in assets/ yet")
    from PIL import Image

    photo = tmp_path / "my_cat.png"
    Image.fromarray(data.chelsea()).save(photo)
    note = "this image does not look like a drawn scene of coloured shapes"
    with _page(studio_url, tmp_path) as page:
        page.set_input_files("#input-image input[type=file]", str(photo))
        page.wait_for_function(
            "document.querySelector('#input-image img')?.src.includes('my_cat')", timeout=SHOW_MS
        )
        page.locator("#prompt textarea").fill("What animal is in this photo?")
        page.click("#run-button")
        page.wait_for_function(
            f"document.querySelector('#status').innerText.includes({note!r})", timeout=RUN_MS
        )
        page.wait_for_function(
            "document.querySelector('#status').innerText.startsWith('Done')", timeout=RUN_MS
        )
        status = page.locator("#status")
        assert status.is_visible() and note in status.inner_text() and "For photos" in status.inner_text()
        assert page.locator("#answer .token").count() >= 2  # the answer came all the same
        # the note is on the Run tab above the answer, in bold
        above = page.evaluate(
            "() => document.querySelector('#status').getBoundingClientRect().bottom"
            " <= document.querySelector('#answer').getBoundingClientRect().top + 1"
        )
        assert above and "does not look like" in page.locator("#status strong").inner_text()
        _save(page, tmp_path, "studio_photo_note.png")


def test_stop_during_a_delayed_display_leaves_the_stopped_status_and_no_error(studio, tmp_path):
    # a run paced by a display delay, stopped mid-way: the status must end on the Stopped line (an update
    # of the run still in flight once overwrote it) and show no "Error" badge (a cancelled run left one)
    studio_url, _ = studio
    with _page(studio_url, tmp_path) as page:
        page.click("#advanced button")
        delay = page.locator("#delay input[type=number]")
        delay.wait_for(state="visible", timeout=SHOW_MS)
        delay.fill("500")
        delay.press("Enter")
        # a long answer (a detailed description) by Token Recycling (it keeps memories too): about 20
        # passes, 10 s of display, so the Stop lands mid-run even on a loaded machine, where a display
        # update may take a second; RECAP answers the first example in about 4 passes
        page.locator("#prompt textarea").fill("What is in the image? Please be detailed.")
        page.locator("#method label", has_text="Token Recycling").click()
        page.click("#run-button")
        page.wait_for_function("document.querySelectorAll('#answer .token').length >= 2", timeout=RUN_MS)
        page.click("#stop-button")
        page.wait_for_function(
            "['Stopped', 'Done'].some(s => document.querySelector('#status').innerText.includes(s))",
            timeout=SHOW_MS,
        )
        page.wait_for_timeout(2000)  # what a late update of the run would have needed to land
        status = page.locator("#status").inner_text()
        assert status.startswith("Stopped: the answer so far is kept") and "Error" not in status, status
        assert "memories learnt from every token it decoded" in status
        # (studio.js marks the page stopped, so that studio.css hides a badge the cancel may leave, until
        # the next Run: a refusal of that run keeps its badge)
        assert page.evaluate("document.body.dataset.recapStopped") == "1"
        # the steps shown so far are kept as a run's: they scrub and download (both stayed locked)
        slider = page.locator("#step-slider input[type=range]")
        page.wait_for_function(
            "!document.querySelector('#step-slider input[type=range]').disabled", timeout=SHOW_MS
        )
        shown = len(page.evaluate("[...document.querySelectorAll('#answer .token')].map(t => t.innerText)"))
        assert 1 <= int(float(slider.get_attribute("max"))) <= shown
        assert page.locator("#download").is_enabled()
        delay.fill("0")
        delay.press("Enter")
        page.click("#run-button")
        assert page.evaluate("document.body.dataset.recapStopped") is None
        page.wait_for_function(
            "document.querySelector('#status').innerText.startsWith('Done')", timeout=RUN_MS
        )
        # a Stop once the run has ended changes nothing (it said "Stopped" over a finished answer)
        page.click("#stop-button")
        page.wait_for_timeout(1500)
        assert page.locator("#status").inner_text().startswith("Done:")
        # a refused run: its toast says why; the status line keeps its words, under no "Error" badge
        page.fill("#prompt textarea", "x" * 10_500)
        page.click("#run-button")
        page.wait_for_function("document.body.innerText.includes('The prompt is too long')", timeout=SHOW_MS)
        status = page.locator("#status").inner_text()
        assert status.startswith("Done:") and "Error" not in status, status


def test_stop_cancels_a_comparison_and_a_later_one_runs(studio, tmp_path):
    studio_url, _ = studio
    with _page(studio_url, tmp_path) as page:
        _open_tab(page, "Compare")
        page.click("#compare-stop")  # nothing running: nothing changes
        page.wait_for_timeout(1000)
        assert "Stopped" not in page.locator("#compare-status").inner_text()
        page.click("#compare-button")
        page.wait_for_function(
            "document.querySelector('#compare-status').innerText.includes('Warming up')", timeout=RUN_MS
        )
        page.click("#compare-stop")
        page.wait_for_function(
            "document.querySelector('#compare-status').innerText.startsWith('Stopped')", timeout=SHOW_MS
        )
        page.wait_for_timeout(2000)  # a late update of the cancelled comparison would land by now
        status = page.locator("#compare-status").inner_text()
        assert status.startswith("Stopped: the comparison was cancelled") and "Error" not in status, status
        page.click("#compare-button")
        page.wait_for_function(
            "document.querySelector('#compare-status').innerText.includes('Done')", timeout=RUN_MS
        )


def test_a_sampled_run_shows_each_positions_draws(studio, tmp_path):
    studio_url, _ = studio
    with _page(studio_url, tmp_path, 1500) as page:
        page.click("#advanced button")
        slider = page.locator("#temperature input[type=range]")
        slider.wait_for(state="visible", timeout=SHOW_MS)
        for _ in range(20):  # (a page still wiring its components right after start drops an input)
            slider.fill("0.7")
            page.wait_for_timeout(250)
            if page.locator("#temperature input[type=number]").input_value() == "0.7":
                break
        assert page.locator("#temperature input[type=number]").input_value() == "0.7"
        page.click("#run-button")
        page.wait_for_function("document.querySelector('#status').innerText.includes('Done')", timeout=RUN_MS)
        number = page.locator("#step-slider input[type=number]")
        number.fill("2")
        number.press("Enter")
        page.wait_for_function(
            "document.querySelector('#step-words').innerText.startsWith('Step 2:')", timeout=SHOW_MS
        )
        # each verified position: the children tried with the target's p, and what was committed
        draws = page.locator("#step-words table.recap-draws")
        assert draws.count() == 1 and "children tried" in draws.inner_text()
        page.wait_for_timeout(500)
        assert not _entities_shown(page, "run") and _fits(page)
        _save(page, tmp_path, "run-sampled-1500.png")


HOSTILE = '<img src="http://127.0.0.1:9/evil.png"><a href="http://127.0.0.1:9/">link</a><form action=x>'
ENTITIES = ("&lt;", "&gt;", "&amp;", "&#", "&quot;")


def _hostile_copy(trace_file: Path, folder: Path) -> tuple[Path, int]:
    """The downloaded trace with HTML and Markdown in every string a viewer shows; and the index of the
    step whose tree carries the hostile source."""
    data = json.loads(trace_file.read_text(encoding="utf-8"))
    data["settings"]["model"] = HOSTILE
    data["settings"]["method"] = "[click](http://127.0.0.1:9/) *bold* & more"
    index, step = next((i, s) for i, s in enumerate(data["steps"]) if s["nodes"])
    step["method"] = HOSTILE
    step["nodes"][0]["sources"] = [HOSTILE]
    step["nodes"][0]["contributions"] = {HOSTILE: 1.0}
    step["new_sources"] = [HOSTILE] * len(step["new_sources"])
    path = folder / "hostile.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path, index


def test_download_hostile_replay_and_errors_render_as_text(studio, tmp_path):
    studio_url, demo = studio
    fetched: list[str] = []
    with _page(studio_url, tmp_path, on_request=lambda request: fetched.append(request.url)) as page:
        page.click("#run-button")
        page.wait_for_function("document.querySelector('#status').innerText.includes('Done')", timeout=RUN_MS)
        # Download: the trace is written on the click, in a folder of this session only
        assert not demo.trace_exports.sessions()
        with page.expect_download(timeout=SHOW_MS) as download:
            page.click("#download")
        trace_file = tmp_path / "run.json"
        download.value.save_as(trace_file)
        (session,) = demo.trace_exports.sessions()
        folder = demo.trace_exports.folder(session)
        assert [p.name for p in folder.iterdir()] == [download.value.suggested_filename]

        # a replayed trace full of HTML and Markdown: shown as text, nothing fetched, no link or form
        hostile, index = _hostile_copy(trace_file, tmp_path)
        page.set_input_files("#replay-file input[type=file]", str(hostile))
        page.wait_for_function(
            "document.querySelector('#status').innerText.includes('Replaying')", timeout=SHOW_MS
        )
        status = page.locator("#status").inner_text()
        assert "[click](http://127.0.0.1:9/) *bold* & m" in status and HOSTILE[:40] in status
        number = page.locator("#step-slider input[type=number]")
        number.fill(str(index))
        number.press("Enter")
        page.wait_for_function(
            "(text) => document.querySelector('#tree-plot .legend').textContent.includes(text)",
            arg="<img src=",
            timeout=SHOW_MS,
        )
        assert HOSTILE[:30] in page.locator("#answer").inner_text()
        _save(page, tmp_path, "studio_hostile_replay.png")
        assert not page.locator("form, a[href*='127.0.0.1:9'], img[src*='127.0.0.1:9']").count()

        # a broken trace: one plain message in the toast
        page.locator("#replay-file button[aria-label='Clear']").click()
        # (the box renders its file input again once cleared: drop the next file only then)
        page.wait_for_function(
            "(name) => !document.querySelector('#replay-file').innerText.includes(name)",
            arg=hostile.name,
            timeout=SHOW_MS,
        )
        page.wait_for_selector("#replay-file input[type=file]", state="attached", timeout=SHOW_MS)
        broken = tmp_path / "broken.json"
        broken.write_text('{"steps": [{"step": 0}]}', encoding="utf-8")
        page.set_input_files("#replay-file input[type=file]", str(broken))
        toast = page.locator('[data-testid="toast-body"]').first
        toast.wait_for(timeout=SHOW_MS)
        assert "Cannot replay this file: not a RECAP trace: step 0 has no 'committed_len'" in (
            toast.inner_text()
        )
        # the refused file leaves the box: the next one can be dropped at once
        page.wait_for_function(
            "!document.querySelector('#replay-file').innerText.includes('broken.json')", timeout=SHOW_MS
        )
        # (gradio renders the box's file input again a moment after the name goes: wait for it)
        page.wait_for_selector("#replay-file input[type=file]", state="attached", timeout=SHOW_MS)
        assert page.locator("#replay-file input[type=file]").count() == 1

        # a file that is not an image, dropped in the Image box: refused as it lands, box emptied
        notes = tmp_path / "notes.png"
        notes.write_text("not an image", encoding="utf-8")
        page.set_input_files("#input-image input[type=file]", str(notes))
        page.wait_for_function(
            "[...document.querySelectorAll('[data-testid=\"toast-body\"]')]"
            ".some(t => t.innerText.includes('That file cannot be used: not a readable image'))",
            timeout=SHOW_MS,
        )
        page.wait_for_function("!document.querySelector('#input-image img')", timeout=SHOW_MS)
        page.wait_for_timeout(800)  # the toast fades in
        _save(page, tmp_path, "studio_replay_error.png")
        shown = page.locator("body").inner_text()
        assert not [e for e in ENTITIES if e in shown], "an HTML entity shows as text"
        assert not [url for url in fetched if "127.0.0.1:9/" in url]

        # closing the tab ends the session: its downloaded trace (it holds the prompt) goes
        page.close()
        deadline = time.monotonic() + 120  # generous for a busy CPU: gradio notices the closed tab first
        while demo.trace_exports.sessions() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not demo.trace_exports.sessions() and not folder.exists()


#: Entities that would show as text if a renderer escaped something twice (or gradio once more).
VISIBLE_ENTITIES = ("&lt;", "&gt;", "&amp;")
#: Every panel of each tab whose text a visitor reads (plotly's SVG text included).
PANELS = {
    "run": (
        "#status",
        "#answer",
        "#stats",
        "#passes-plot",
        "#step-words",
        "#tree-plot",
        "#fused-plot",
        "#step-table",
        "#memory-state",
    ),
    "compare": ("#compare-status", "#compare-table", "#compare-story", "#compare-strip"),
    "sensitivity": ("#sensitivity-status", "#sensitive-answer", "#sensitivity-table"),
}


def _entities_shown(page, tab: str) -> dict[str, list[str]]:
    shown = {}
    for selector in PANELS[tab]:
        text = page.locator(selector).text_content() or ""
        found = [e for e in VISIBLE_ENTITIES if e in text]
        if found:
            shown[selector] = found
    return shown


def _open_tab(page, name: str) -> None:
    tab = page.get_by_role("tab", name=name)
    if not tab.is_visible():  # gradio moved it into the "More tabs" menu
        page.click('button[aria-label="More tabs"]')
        page.locator(".overflow-dropdown button", has_text=name).click()
    else:
        tab.click()


def _show_step(page, step: int) -> None:
    """Scrub to step ``step`` (>= 1) and wait for its words."""
    number = page.locator("#step-slider input[type=number]")
    number.fill(str(step))
    number.press("Enter")
    page.wait_for_function(
        "(step) => document.querySelector('#step-words').innerText.startsWith(`Step ${step}:`)",
        arg=step,
        timeout=SHOW_MS,
    )


def _tree_scrolls_at(page, step: int) -> bool:
    """Whether step ``step``'s tree is wider than its panel (it must then scroll: `_TREE_HAS_ITS_WIDTH`)."""
    _show_step(page, step)
    page.wait_for_function(_TREE_HAS_ITS_WIDTH, timeout=SHOW_MS)
    return page.evaluate(
        """() => { const panel = document.querySelector('#tree-plot');
          return panel.querySelector('.js-plotly-plot').layout.meta.min_width > panel.clientWidth + 1; }"""
    )


def _fits(page) -> bool:
    """Nothing makes the page scroll sideways."""
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


#: The answer legend's items on show, and those each method's answer may show.
_LEGEND_SHOWN = """() => [...document.querySelectorAll('#answer .legend-item')]
  .filter(item => item.offsetParent !== null).map(item => item.innerText.trim())"""
_LEGEND_OF = {
    "Autoregressive": {"target (bonus)"},
    "Prompt lookup": {"prompt lookup", "target (bonus)"},
    "Token Recycling": {"TR template", "target (bonus)"},
    "RECAP": {
        "ctx3 · 3-token context",
        "ctx2 · 2-token context",
        "persistent · 1-token",
        "suffix match",
        "back-off · the stream's most frequent tokens",
        "target (bonus)",
    },
}

#: The candidate tree has the width its figure asks for (studio.js), and where that is more than its
#: panel has, the panel scrolls sideways to its end.
_TREE_HAS_ITS_WIDTH = """() => {
  const panel = document.querySelector('#tree-plot');
  const plot = panel && panel.querySelector('.js-plotly-plot');
  const svg = plot && plot.querySelector('svg.main-svg');
  if (!svg || !plot.layout || !plot.layout.meta) return false;
  const want = plot.layout.meta.min_width, drawn = svg.getBoundingClientRect().width;
  const ok = plot.style.minWidth === `${want}px` && drawn >= want - 1;
  if (!ok || want <= panel.clientWidth + 1) return ok;
  // wider than the panel: it scrolls sideways to the tree's last column (gradio's style sets none)
  panel.scrollLeft = panel.scrollWidth;
  const reached = panel.scrollLeft > 0 && getComputedStyle(panel).overflowX === "auto";
  panel.scrollLeft = 0;
  return reached;
}"""


#: The right-most tree node (or bonus) whose marker the tree's panel shows, as a point to hover.
_RIGHTMOST_NODE = """() => {
  const panel = document.querySelector('#tree-plot'), seen = panel.getBoundingClientRect();
  const right = Math.min(seen.right, innerWidth);
  const shown = [...panel.querySelectorAll('.scatterlayer .trace .points path')]
    .map(point => point.getBoundingClientRect())
    .filter(r => r.width > 0 && r.left >= seen.left && r.right <= right && r.top >= seen.top
                 && r.bottom <= Math.min(seen.bottom, innerHeight));
  shown.sort((a, b) => b.right - a.right);
  return shown.length ? [shown[0].left + shown[0].width / 2, shown[0].top + shown[0].height / 2] : null;
}"""
#: The hover label shown, wholly inside what the tree's panel shows (studio.js moves it there).
_HOVER_INSIDE = """() => {
  const panel = document.querySelector('#tree-plot'), label = panel.querySelector('.hoverlayer .hovertext');
  if (!label) return false;
  const box = label.getBoundingClientRect(), seen = panel.getBoundingClientRect();
  return box.width > 0 && box.left >= Math.max(seen.left, 0) - 1
    && box.right <= Math.min(seen.right, innerWidth) + 1 && box.top >= Math.max(seen.top, 0) - 1
    && box.bottom <= Math.min(seen.bottom, innerHeight) + 1;
}"""


def _hover_rightmost_node(page) -> None:
    """Hover the right-most node the tree's panel shows; its label must lie inside the panel."""
    page.locator("#tree-plot").scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    point = page.evaluate(_RIGHTMOST_NODE)
    assert point is not None, "no tree node shows in its panel"
    page.mouse.move(*point)
    page.wait_for_function(_HOVER_INSIDE, timeout=SHOW_MS)


@pytest.mark.parametrize("width", [1500, 390])
def test_every_tab_after_runs_of_each_method_shows_no_entity_and_fits(studio, tmp_path, width):
    studio_url, _ = studio
    with _page(studio_url, tmp_path, width) as page:
        # the first example is pre-filled; RECAP twice at the end, so that its persistent memory
        # has seen the answer and the screenshot shows a tree
        for label in ("Autoregressive", "Prompt lookup", "Token Recycling", "RECAP", "RECAP"):
            page.locator("#method label", has_text=label).click()
            page.click("#run-button")
            # each step is shown for the display delay (60 ms), so "Generating" is seen first
            page.wait_for_function(
                "!document.querySelector('#status').innerText.includes('Done')", timeout=SHOW_MS
            )
            page.wait_for_function(
                "document.querySelector('#status').innerText.includes('Done')", timeout=RUN_MS
            )
            page.wait_for_selector("#tree-plot .js-plotly-plot", timeout=SHOW_MS)
            page.wait_for_timeout(300)
            assert not _entities_shown(page, "run"), f"{label}: an HTML entity shows as text"
            # the answer's legend names the sources this method drafts from, no other (studio.css)
            legend = set(page.evaluate(_LEGEND_SHOWN))
            assert "target (bonus)" in legend and legend <= _LEGEND_OF[label], f"{label}: {legend}"
            if label == "Token Recycling":  # its 80-node tree (1400 px) scrolls in a panel of bounded height
                heights = page.evaluate(
                    "(() => { const p = document.querySelector('#tree-plot');"
                    " return [p.clientHeight, p.scrollHeight, p.scrollTop]; })()"
                )
                assert heights[0] <= 660 < heights[1] and heights[2] > 0, heights  # opened on its middle
        assert page.locator("#step-words").inner_text().startswith("Step ")
        # scrubbing updates the words beside the tree
        number = page.locator("#step-slider input[type=number]")
        number.fill("0")
        number.press("Enter")
        page.wait_for_function(
            "document.querySelector('#step-words').innerText.startsWith('Step 0 is the prefill')",
            timeout=SHOW_MS,
        )
        number.fill("1")
        number.press("Enter")
        page.wait_for_function(
            "document.querySelector('#step-words').innerText.startsWith('Step 1:')", timeout=SHOW_MS
        )
        # the last step (how many passes RECAP's second run takes depends on the tree the measured
        # cost curve allows: this machine's, under its load)
        last = int(float(page.locator("#step-slider input[type=range]").get_attribute("max")))
        assert last >= 2, f"RECAP's second run took {last} passes"
        if width < 500:  # a phone: some step's tree is wider than its panel, and scrolls to its end
            assert any(_tree_scrolls_at(page, step) for step in range(1, last + 1))
        _show_step(page, last)
        page.wait_for_timeout(500)
        assert not _entities_shown(page, "run")
        page.wait_for_function(_TREE_HAS_ITS_WIDTH, timeout=SHOW_MS)
        assert _fits(page), "the Run tab scrolls sideways"
        _save(page, tmp_path, f"run-{width}.png")
        # a node's label reads as its token (no space marker); its hover stays inside the panel
        labels = page.evaluate(
            "[...document.querySelectorAll('#tree-plot .scatterlayer .textpoint')].map(t => t.textContent)"
        )
        assert labels and not any("␣" in label for label in labels), labels
        _hover_rightmost_node(page)
        _save(page, tmp_path, f"tree-hover-{width}.png", element="#tree-plot")
        page.mouse.move(0, 0)

        _open_tab(page, "Compare")
        # the held-out figure leads the tab, above this input's table
        for first, then in (("#compare-summary", "#compare-button"), ("#compare-summary", "#compare-table")):
            above = page.evaluate(
                "([a, b]) => document.querySelector(a).getBoundingClientRect().top"
                " < document.querySelector(b).getBoundingClientRect().top",
                [first, then],
            )
            assert above, f"{first} is not above {then}"
        assert "held-out scenes" in page.locator("#compare-summary").inner_text()
        page.click("#compare-button")
        page.wait_for_function(
            "document.querySelector('#compare-status').innerText.includes('Done')", timeout=RUN_MS
        )
        assert not _entities_shown(page, "compare") and _fits(page)
        # the story: a headline, its counts folded
        assert page.locator("#compare-story details").count() == 1
        assert not page.locator("#compare-story details").get_attribute("open")
        _save(page, tmp_path, f"compare-{width}.png")

        _open_tab(page, "Sensitivity")
        assert "held-out scenes" in page.locator("#sensitivity-summary").inner_text()
        page.click("#sensitivity-button")
        page.wait_for_function(
            "document.querySelector('#sensitivity-status').innerText.includes('image-sensitive')",
            timeout=RUN_MS,
        )
        assert not _entities_shown(page, "sensitivity") and _fits(page)
        _save(page, tmp_path, f"sensitivity-{width}.png")

        _open_tab(page, "About")
        page.wait_for_timeout(300)
        assert _fits(page)
        _save(page, tmp_path, f"about-{width}.png")
