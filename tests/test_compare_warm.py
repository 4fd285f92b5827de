"""The Compare tab's warmed drafters: warmed once at the server's start for the default embedded model,
and a click that comes while they are being warmed waits for them instead of warming them again."""

from __future__ import annotations

import threading

import pytest
from conftest import tiny

import app
from recap.runtime import EMBEDDED_MODEL_V2, Runtime
from recap.studio.serving import RuntimeCache
from recap.studio.ui import compare
from recap.studio.ui.examples import OTHER_SET, examples
from recap.studio.ui.measure import EQUAL, EQUAL_NODES


@pytest.fixture(scope="module")
def embedded():
    return Runtime.load(str(EMBEDDED_MODEL_V2))


def counting(monkeypatch) -> dict[str, int]:
    """How many fresh drafters each method gets at Compare's equal budget (a warm-up starts from one; so
    does each AR/PLD run); at another budget, counted as ``method@budget`` (the start-up's Run-tab run)."""
    made: dict[str, int] = {}
    fresh = compare.fresh_drafter

    def count(runtime, method, config, *args, **kwargs):
        name = method if config.budget == EQUAL_NODES else f"{method}@{config.budget}"
        made[name] = made.get(name, 0) + 1
        return fresh(runtime, method, config, *args, **kwargs)

    monkeypatch.setattr(compare, "fresh_drafter", count)
    return made


def studio_of(runtime) -> tuple:
    model = runtime.target.name
    demo = app.build_demo(runtime_factory=lambda _: runtime, models=[model], cache=RuntimeCache())
    demo.studio.compare_warmup = 2
    handler = next(fn.fn for fn in demo.fns.values() if fn.api_name == "compare")
    return demo.studio, handler


def click(handler, studio, example: int) -> list[str]:
    """The status lines (and other text) a click on the default model's example ``example`` shows."""
    image, prompt = examples(studio.page_defaults[0])[example]
    updates = handler({"path": str(image)}, prompt, *studio.page_defaults, EQUAL)
    return [value for update in updates for value in update.values() if isinstance(value, str)]


def test_the_server_warms_compares_drafters_at_start_and_a_click_meanwhile_waits_for_them(
    embedded, monkeypatch
):
    made = counting(monkeypatch)
    studio, handler = studio_of(embedded)
    assert studio.page_defaults[0] == embedded.target.name  # the page's default settings, in order
    warming = compare.prewarm_in_background(studio)
    statuses = click(handler, studio, 0)
    warming.join(timeout=120)
    assert not warming.is_alive()
    assert embedded.measured_cost() is not None  # the default auto budget's curve, measured at start
    remembering = [m for m in ("tr", "suffix", "recap") if m in made]
    assert set(remembering) >= {"tr", "recap"}
    # one warm-up for each method with memories, whoever came first: the start's or the click's
    assert {m: made[m] for m in remembering} == dict.fromkeys(remembering, 1)
    assert made.get("recap@auto") == 1  # and one short run as the Run tab's defaults make it
    assert any(s.startswith("Done") for s in statuses)
    # a later click, on another input, finds them all warm: no warm-up at all
    made.clear()
    statuses = click(handler, studio, 1)
    assert not any("Warming up" in s for s in statuses)
    assert not any(m in made for m in remembering)


def test_a_click_waiting_for_a_warm_up_stops_when_it_is_stopped(embedded):
    studio, _ = studio_of(embedded)
    config, suffix = compare.budgets(EQUAL, studio.settings(studio.page_defaults).config())
    warmup = studio.warmup_requests(embedded, None, 2)
    key = compare.warm_key("tr", config, suffix, 8, warmup)
    event = threading.Event()  # a warm-up under way elsewhere that never ends
    with compare._WARMED_LOCK:
        compare._WARMING.setdefault(embedded, {})[key] = event

    class Stopped(Exception):
        pass

    def stop():
        raise Stopped

    try:
        with pytest.raises(Stopped):
            compare.warmed(studio, embedded, embedded.target.name, "tr", config, suffix, warmup, 8, stop)
    finally:
        with compare._WARMED_LOCK:
            compare._WARMING[embedded].pop(key, None)


def test_no_warm_up_at_start_for_a_model_whose_warm_up_depends_on_the_input(monkeypatch):
    # a hub model warms on the studio's other examples, leaving the compared one out: a click's differ
    made = counting(monkeypatch)
    runtime = Runtime(tiny("llava"))
    studio, _ = studio_of(runtime)
    assert examples(OTHER_SET)  # (what such a model would warm on)
    assert compare.prewarm(studio, studio.page_defaults) == 0
    assert made == {}


def test_a_failed_start_up_warm_up_is_logged_and_the_studio_serves_on(caplog):
    def broken(_model):
        raise ValueError("cannot load model 'x': no such folder")

    demo = app.build_demo(runtime_factory=broken, models=["tiny-broken"], cache=RuntimeCache())
    with caplog.at_level("ERROR", logger="recap.studio.ui.compare"):
        compare.prewarm_in_background(demo.studio).join(timeout=30)
    assert "start-up warm-up failed" in caplog.text  # (the thread ended: the server is not affected)


def test_a_new_comparison_clears_the_last_ones_table_story_and_strip(embedded):
    # the previous input's table and story stayed on screen while a new comparison ran
    studio, handler = studio_of(embedded)
    image, prompt = examples(studio.page_defaults[0])[0]
    updates = handler({"path": str(image)}, prompt, *studio.page_defaults, EQUAL)
    first = next(updates)
    updates.close()
    values = list(first.values())
    assert values[0].startswith("Starting")  # the status, then the cleared panels
    assert values[1] == [] and values[2] == "" and "recap-strip-empty" in values[3]
