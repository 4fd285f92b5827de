"""The studio in a real browser: headless Chromium picks an example, runs it, and sees every panel.

Needs the Debian ``chromium`` package (``/usr/bin/chromium``) and the ``playwright`` Python package
(never ``playwright install``: it downloads a browser). Skipped with the reason when either is missing.
Screenshots go to pytest's tmp dir and, if set, to ``$RECAP_SCREENSHOT_DIR``.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
from conftest import tiny

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

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing: apt-get install chromium"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def studio_url():
    """URL of a running studio: the embedded model when it ships, else the in-process tiny LLaVA."""
    import app
    from recap.runtime import Runtime

    def factory(model_id: str) -> Runtime:
        if model_id == "tiny-llava":
            return Runtime(tiny("llava"))
        return app.default_runtime_factory(model_id)

    embedded = (app.EMBEDDED_MODEL / "config.json").is_file()
    demo = app.build_demo(runtime_factory=factory, models=["embedded" if embedded else "tiny-llava"])
    port = _free_port()
    kwargs = {**app.launch_kwargs(), "server_name": "127.0.0.1", "server_port": port}
    demo.queue().launch(**kwargs, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def _save(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("RECAP_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)
    return path


def test_example_run_shows_answer_tree_and_fused_distribution(studio_url, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user-data-dir per run
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = context.new_page()
            page.goto(studio_url)
            page.wait_for_selector("#run-button", timeout=60_000)
            # the second example (the first one is pre-filled): clicking it must fill the prompt
            import app

            if len(app.examples()) < 2:
                pytest.skip("assets/examples holds fewer than two examples")
            expected = app.examples()[1][1]
            page.locator('#examples [data-testid="dataset-cell-1-0"]').click()
            page.wait_for_function(
                "(text) => document.querySelector('#prompt textarea').value === text",
                arg=expected,
                timeout=10_000,
            )
            page.click("#run-button")
            page.wait_for_selector("#answer .token", timeout=60_000)
            page.wait_for_function(
                "document.querySelector('#status').innerText.includes('Done')", timeout=60_000
            )
            assert page.locator("#answer .token").count() >= 2
            page.wait_for_selector("#tree-plot .js-plotly-plot", timeout=10_000)
            page.wait_for_selector("#fused-plot .js-plotly-plot", timeout=10_000)
            # the tree has its root and at least one point per trace; the fused view has its title
            assert page.locator("#tree-plot .scatterlayer .point").count() >= 1
            assert "fused distribution" in page.locator("#fused-plot .gtitle").text_content()
            assert _save(page, tmp_path, "studio_after_run.png").stat().st_size > 10_000
        finally:
            context.close()
