"""The Compare tab: the Run tab's input through every method, a small benchmark in the browser.

Fair by construction: every method starts from fresh memories of its own, and each method that keeps
memories across requests (Token Recycling's matrix, RECAP's memories, SuffixDecoding's global tree) is
first warmed on the SAME warm-up requests (`Studio.warmup_requests`: training scenes for the embedded
model, the other examples otherwise; never the compared input), once for all clicks with the same
settings (`keep_warm`; for an embedded model the server warms those of the page's defaults as it
starts, `prewarm_in_background`, and a click waits for a warm-up under way, `warmed`). AR and prompt
lookup keep nothing between requests. The visitor's own session
memories are neither used nor changed.

Measured like the benchmark (`recap.studio.ui.measure`): equal node budgets by default, the timed phases
of every pass, `measure.REPEATS` interleaved repeats (a method is warmed once and every repeat starts
from a copy of its warmed drafter, so at equal budgets every repeat drafts the same trees; an `auto`
budget also reads the drafting time it measures; the warmed drafter is kept for later clicks with the
same settings, `keep_warm`), the median and range; a projection on an H200 where a curve was recorded;
and the benchmark's held-out summary for the model under the table.

Greedy decoding always (sampling settings apply to the Run tab only, and the tab says so): then every
method's output is identical to AR's, which the table checks. A short AR run first, so the first timed
method does not pay for lazy initialisation.

Above the strip, one line tells the paper's story (`recap.studio.ui.story`): one teacher-forced pass with a
blank image marks the tokens that depend on the image, and the line counts each method's drafts there.

A comparison is a plain handler (`CompareEvents`); the guard around it queues it in the decode line
like a run, and it gives its slot to another client's waiting work between its passes.
"""

from __future__ import annotations

import copy
import gc
import logging
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import gradio as gr
import torch

from recap.bench.coverage import CoverageProbe
from recap.bench.sensitivity import sensitive_flags, token_ids
from recap.drafters import is_recap_method, shared_state
from recap.drafters.suffix_decoding import SuffixConfig
from recap.embedded import embedded_world
from recap.inputs import shown
from recap.studio.environment import offered_methods
from recap.studio.guard.wrapper import Checked, Guard
from recap.studio.serving import Studio, fresh_drafter
from recap.studio.ui import measure, render, story
from recap.studio.ui.examples import BLANK_IMAGE, other_image
from recap.studio.ui.handlers import input_key
from recap.trace import StepRecord

#: The methods compared, in the table's order (AR first: it is the reference); SuffixDecoding where
#: its package is installed.
COMPARED = ("ar", "pld", "tr", "suffix", "recap")
GREEDY_NOTE = " Compare decodes greedily: the sampling settings apply to the Run tab only."
#: The token limit of each warm-up request (how many: `recap.studio.serving.COMPARE_WARMUP`).
WARMUP_MAX_NEW = 64
#: Shared state that outlives a request (what the warm-up fills).
MEMORIES = frozenset({"persistent", "successors", "suffix_cache"})

#: Warmed drafters kept per model across clicks (the least recently used go first).
WARMED_KEPT = 6
_WARMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # runtime -> OrderedDict(key -> drafter)
_WARMING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # runtime -> {key: Event}: under way
_WARMED_LOCK = threading.Lock()

log = logging.getLogger(__name__)


def warm_key(method: str, config, suffix_config, max_new: int, warmup) -> tuple:
    """What a warmed drafter depends on: the method, the settings it reads (RECAP's config,
    SuffixDecoding's; Token Recycling reads neither), the warm-up's token limit and its requests (each
    by its label and prompt)."""
    settings = config if is_recap_method(method) else suffix_config if method == "suffix" else None
    return method, settings, max_new, tuple((request.label, request.prompt) for request in warmup)


def kept_warm(runtime, key: tuple):
    """The drafter kept for ``runtime`` under ``key`` (method, settings, warm-up requests) right after
    its warm-up, or None. Never changed once kept: a click runs a copy of it (`copy.deepcopy`)."""
    with _WARMED_LOCK:
        kept = _WARMED.get(runtime)
        if kept is None or key not in kept:
            return None
        kept.move_to_end(key)
        return kept[key]


def keep_warm(runtime, key: tuple, drafter) -> None:
    """Keep a warmed ``drafter`` (no click runs it: each runs a copy) for ``runtime``'s later clicks, at most
    `WARMED_KEPT` a model. It holds what the studio's warm-up requests taught it, never a visitor's
    input, so every visitor's clicks may share it; the entries go with the model's runtime."""
    # Two clicks that miss the same key at once both warm, and the last one kept stays: the same
    # drafter either way, only the warm-up done twice.
    with _WARMED_LOCK:
        kept = _WARMED.setdefault(runtime, OrderedDict())
        kept[key] = drafter
        kept.move_to_end(key)
        while len(kept) > WARMED_KEPT:
            kept.popitem(last=False)


def warmed(studio: Studio, runtime, model: str, method: str, config, suffix_config, warmup, max_new, check):
    """``method``'s drafter warmed on the ``warmup`` requests (``max_new`` tokens each): the one kept for
    these settings (`kept_warm`), else the one another thread is warming (waited for: the server's
    warm-up at start, or another click), else warmed here and kept. ``check()`` runs between passes and
    while waiting (a click's job: it raises when the click is stopped)."""
    key = warm_key(method, config, suffix_config, max_new, warmup)
    while (kept := kept_warm(runtime, key)) is None:
        with _WARMED_LOCK:
            under_way = _WARMING.setdefault(runtime, {})
            event = under_way.get(key)
            mine = event is None and key not in _WARMED.get(runtime, {})  # (kept since the line above?)
            if mine:
                event = under_way[key] = threading.Event()
        if event is None:
            continue
        if not mine:
            while not event.wait(0.25):
                check()
            continue  # kept by the thread that warmed it (or, had it failed, warmed here)
        try:
            drafter = fresh_drafter(runtime, method, config, suffix_config)
            for request in warmup:
                images = list(request.images)
                for _ in studio.stream(runtime, model, drafter, request.prompt, images, max_new, method):
                    check()
            keep_warm(runtime, key, drafter)  # it never runs a visitor's input: every run is a copy
            return drafter
        finally:
            with _WARMED_LOCK:
                under_way.pop(key, None)
            event.set()
    return kept


def prewarm(studio: Studio, values: list) -> int:
    """Warm the Compare tab's drafters for the page's default settings (``values``: the setting inputs'
    defaults, `Studio.page_defaults`), so that the first click finds them warm; for an embedded model
    only, whose warm-up requests are training scenes whatever the input (another model's leave the
    compared example out, so a click's differ). Measures the model's tree-cost curve first where the
    default budget is ``auto`` (`Runtime.cost_model`), and decodes one short request as the Run tab's
    defaults would (a throwaway drafter). Returns how many drafters it warmed."""
    settings = studio.settings(values)
    runtime = studio.runtime(settings.model)
    if settings.config().budget == "auto":
        # measured now, not in the first visitor's run (a second on a CPU), and alone: no pass beside it
        with studio.cache.pass_lock(settings.model):
            runtime.cost_model()
    if embedded_world(runtime.target.name) is None:
        return 0
    warmup = studio.warmup_requests(runtime, None, studio.compare_warmup)
    # one short run as the Run tab's defaults make it, with a throwaway drafter: the first calls of a
    # fresh process (tens of ms) are paid here, not in the first visitor's timed passes
    for request in warmup[:1]:
        first = fresh_drafter(runtime, settings.method, settings.config())
        images, method = list(request.images), settings.method
        for _ in studio.stream(runtime, settings.model, first, request.prompt, images, 16, method):
            pass
    config, suffix_config = budgets(measure.EQUAL, settings.config())
    max_new = min(settings.max_new_tokens, WARMUP_MAX_NEW)
    methods = [m for m in COMPARED if m in offered_methods() and remembers(m, config)]
    for method in methods:
        warmed(studio, runtime, settings.model, method, config, suffix_config, warmup, max_new, lambda: None)
    return len(methods)


def prewarm_in_background(studio: Studio) -> threading.Thread:
    """`prewarm` in a daemon thread (the server's start: it loads the default model too); its passes
    take the model's pass lock one at a time, as a run's do, so a visitor's run goes on between them. A
    failure is logged, and a click then warms its drafters itself."""

    def run() -> None:
        start = time.perf_counter()
        try:
            count = prewarm(studio, studio.page_defaults)
        except Exception:  # the studio serves without it: each click warms what it lacks
            log.exception("start-up warm-up failed; the first run or comparison loads and warms instead")
            return
        log.info("start-up warm-up done in %.1f s (%d Compare drafters)", time.perf_counter() - start, count)
        gc.freeze()  # what it loaded (the model, the kept drafters) is long-lived too: see `app.main`

    thread = threading.Thread(target=run, name="compare-prewarm", daemon=True)
    thread.start()
    return thread


def remembers(method: str, config) -> bool:
    """Whether ``method`` keeps memories across requests (so it is warmed before it is timed)."""
    return bool(MEMORIES & shared_state(method, config))


def fairness_note(count: int, source: str, methods: list[str]) -> str:
    warmed = [render.method_label(m) for m in methods if m in ("tr", "suffix", "recap")]
    if not warmed:
        return "No compared method keeps memories across requests; your session's memory was not used."
    names = ", ".join(warmed[:-1]) + (" and " if len(warmed) > 1 else "") + warmed[-1]
    return (
        f"{names} started from empty memories warmed on the same {count} requests "
        f"({source}, not this input); your session's memory was not used."
    )


def budgets(choice: str, config):
    """RECAP's config and SuffixDecoding's settings for the visitor's budget ``choice``."""
    if choice == measure.EQUAL:
        nodes = measure.EQUAL_NODES
        return replace(config, budget=nodes, max_budget=None), SuffixConfig(max_spec_tokens=nodes)
    return replace(config, budget="auto", max_budget=None), SuffixConfig()


@dataclass
class CompareRequest:
    """One admitted comparison: the checked input and settings, the budget choice, the greedy note."""

    checked: Checked
    choice: str
    note: str


class CompareEvents:
    """The Run tab's input through every method (greedy), timed as the benchmark times them. Its API
    parameters: the settings', then ``budgets``.

    The Compare button's plain handler (`recap.studio.guard.wrapper.StreamedHandler`): `admit` a
    checked request, `work` (the comparison's updates) and the updates around it; the guard (kind
    ``"compare"``) queues the work and handles Stop. One comparison a session (a newer one replaces it).
    """

    event = "compare"
    replaced = "This comparison was replaced by a newer one of the same session."
    extras = (("budgets", None),)

    def __init__(self, studio: Studio, cmp: dict, compare_state) -> None:
        self.studio, self.cmp, self.compare_state = studio, cmp, compare_state

    def admit(self, checked: Checked, budgets) -> CompareRequest:
        """The comparison ``checked`` asks for, at the budget choice ``budgets`` (None: the radio's
        default; an unknown one: a ValueError)."""
        choice = measure.EQUAL if budgets is None else budgets
        if not isinstance(choice, str) or choice not in measure.BUDGET_CHOICES:
            raise ValueError(f"Unknown budget choice {shown(choice)}: choose one from the list.")
        note = GREEDY_NOTE if not checked.settings.sampling().greedy else ""
        return CompareRequest(checked, choice, note)

    def work(self, request: CompareRequest, check):
        """The comparison (`_measured`): its updates, and None between two passes of a timed run."""
        return _measured(self.studio, self.cmp, self.compare_state, check, request)

    def started(self, request: CompareRequest, line: str) -> dict:
        """The previous input's table, story and strip go at once: nothing on the tab is stale."""
        return _cleared(self.cmp, line + request.note)

    def status(self, request: CompareRequest, line: str | None) -> dict:
        return {self.cmp["status"]: line + request.note if line else gr.skip()}


def wire_compare(
    studio: Studio, ui: dict, cmp: dict, setting_inputs: list, compare_state, guard: Guard | None = None
) -> None:
    """The Compare button (`CompareEvents`, in the guard's kind ``"compare"``) and its Stop."""
    guard = guard or Guard(studio)
    event = cmp["button"].click(
        guard.wrap(CompareEvents(studio, cmp, compare_state), "compare"),
        [ui["image"], ui["prompt"], *setting_inputs, cmp["budgets"]],
        [cmp["status"], cmp["table"], cmp["story"], cmp["strip"], compare_state],
        # no gradio limit: the handler waits in the studio's decode line (bounded, fair across clients)
        concurrency_limit=None,
        api_name="compare",
        preprocess=False,
        show_progress_on=[cmp["status"]],  # progress and a refusal on the status line, not every panel
    )

    _wire_stop(guard, cmp, event)

    ui["model"].change(measure.held_out_line, [ui["model"]], [cmp["summary"]], api_name=False)


def _wire_stop(guard: Guard, cmp: dict, event) -> None:
    """Compare's Stop: the session's comparison job is cancelled (its worker stops at its next step and
    gives its slot back: a handler waiting in a thread may never see the event's cancel), then its
    event; the status says so."""

    def stopped(status):
        """The status after Stop; none when no comparison was running (it ended, or none ran)."""
        if not isinstance(status, str) or not status.strip() or status.startswith(("Done", "Stopped")):
            return gr.skip()
        return "Stopped: the comparison was cancelled; what it had measured stays shown."

    stop = guard.stop(CompareEvents.event)
    cancel = cmp["stop"].click(stop, None, None, cancels=[event], queue=False, api_visibility="private")
    cancel.then(stopped, [cmp["status"]], [cmp["status"]], queue=False, api_visibility="private")


def _clocks(runtime) -> tuple:
    """How a comparison on ``runtime`` is projected (its device's cost curve, or None) and timed
    (`measure.clock`)."""
    projection = measure.projection_for(runtime.target.name, runtime.target.device.type)
    return projection, measure.clock(runtime.target.device.type, torch.get_num_threads())


def _first_pass(studio: Studio, check, runtime, model, prompt, images, max_new, config) -> None:
    """A short untimed AR run before the timed ones: the model's first passes warm up in no method."""
    first = fresh_drafter(runtime, "ar", config)
    for _ in studio.stream(runtime, model, first, prompt, images, max_new, "ar"):
        check()


@dataclass
class _Timing:
    """What a comparison has measured so far, and how: each method's shown run (the first repeat's),
    what its memories held at every token, each repeat's pass times, the projection and the clock."""

    projection: object
    which: str
    times: dict[str, list[list[float]]]
    runs: dict[str, list[StepRecord]] = field(default_factory=dict)
    coverage: dict[str, list] = field(default_factory=dict)


def _measured(studio: Studio, cmp: dict, compare_state, check, request: CompareRequest):
    """The comparison itself, in a decode slot: every method timed on the input, each after its warm-up;
    yields the updates to show, and None between two passes of a timed run (each yield a point where the
    slot may go to another client's work; a pass's phases are timed within it, so a wait between two
    passes is not timed). ``check`` raises once the comparison is stopped."""
    checked, note = request.checked, request.note
    runtime, config, prompt, images = studio.prepare(checked.image, checked.prompt, checked.settings)
    config, suffix_config = budgets(request.choice, config)
    max_new, model, path = checked.settings.max_new_tokens, checked.settings.model, checked.path
    warmup = studio.warmup_requests(runtime, (str(path) if path else None, prompt), studio.compare_warmup)
    methods = [m for m in COMPARED if m in offered_methods()]
    projection, which = _clocks(runtime)
    _first_pass(studio, check, runtime, model, prompt, images, min(4, max_new), config)
    timing = _Timing(projection, which, {m: [] for m in methods})
    warm_new = min(max_new, WARMUP_MAX_NEW)
    for repeat in range(measure.REPEATS):
        shift = repeat % len(methods)  # interleaved: each repeat starts with another method
        for method in methods[shift:] + methods[:shift]:
            where = f"(repeat {repeat + 1} of {measure.REPEATS})"
            label = render.method_label(method)
            kept, key = None, warm_key(method, config, suffix_config, warm_new, warmup)
            if remembers(method, config) and (kept := kept_warm(runtime, key)) is None:
                yield _progress(cmp, compare_state, timing, f"Warming up {label} {where}…{note}")
                args = (method, config, suffix_config, warmup, warm_new, check)
                kept = warmed(studio, runtime, model, *args)
            # every timed run starts from a copy of the warmed drafter (the same trees in each repeat)
            drafter = copy.deepcopy(kept) if kept is not None else fresh_drafter(runtime, method, config)
            yield _progress(cmp, compare_state, timing, f"Running {label} {where}…{note}")
            run = (runtime, model, drafter, prompt, images, max_new, method)
            yield from _timed(studio, check, run, timing, shown=repeat == 0)
    timing.runs = {m: timing.runs[m] for m in methods}
    fair = fairness_note(len(warmup), studio.warmup_source(runtime), methods)
    how = f"{measure.timing_note(projection, request.choice, which, methods)}"
    how += measure.one_token_gap(projection, timing.times)
    flags = _image_dependent(studio, runtime, model, timing.runs, images, prompt)
    yield _done(cmp, compare_state, request, timing, flags, f"{how} {fair}{note}", warmup, images)


def _timed(studio: Studio, check, run: tuple, timing: _Timing, shown: bool):
    """One timed run of a method (``run``: what `Studio.stream` takes), its pass times added to
    ``timing``; a None after every pass. ``shown``: the run shown (and its coverage probed, untimed)."""
    runtime, model, drafter, prompt, images, max_new, method = run
    probe = CoverageProbe(drafter) if shown else None  # untimed: outside the phases
    steps, observers = [], (probe,) if probe is not None else ()
    for step in studio.stream(runtime, model, drafter, prompt, images, max_new, method, observers=observers):
        check()
        steps.append(step)
        # between two passes: the slot may go to another client (each pass times its own phases)
        yield None
    timing.times[method].append(measure.pass_seconds(steps, timing.which))
    if probe is not None:  # every repeat drafts the same trees; the first is shown
        timing.runs[method] = steps
        if probe.coverage is not None:
            timing.coverage[method] = [None, *probe.positions]


def _done(
    cmp: dict, compare_state, request: CompareRequest, timing: _Timing, flags, how: str, warmup, images
):
    """The comparison's last update: status, table, story, strip, and the state the other tabs read."""
    runs, which = timing.runs, timing.which
    line = "No image: no token of this answer can depend on one."
    if flags is not None:
        line = story.story_line(runs, flags, render.METHOD_LABELS, coverage=timing.coverage)
    checked = request.checked
    return {
        cmp["status"]: done_status(runs, how, which),
        cmp["table"]: measure.rows(runs, timing.times, timing.projection),
        cmp["story"]: story.story_html(line),
        cmp["strip"]: render.compare_strip_html(runs, flags=flags),
        compare_state: {
            "runs": runs,
            "key": input_key(checked.settings.model, checked.prompt, checked.image),
            "image": images[0] if images else None,
            "prompt": checked.prompt,
            "warmup": [r.label for r in warmup],
            "coverage": timing.coverage,
            "times": timing.times,  # each repeat's pass seconds (`measure.pass_seconds`), as in the table
            "clock": which,
        },
    }


def done_status(runs: dict[str, list[StepRecord]], how: str, which: str = "cpu") -> str:
    """The status after a comparison: one line on the answers and the clock the times were read on
    (``which``: `measure.clock`), then what was timed and how the methods were warmed, folded (a phone
    showed about 290 words before the table)."""
    answers = {m: token_ids(steps) for m, steps in runs.items()}
    differ = [render.method_label(m) for m, a in answers.items() if a != answers.get("ar", a)]
    head = "Done: every method's answer is identical to AR's; the table compares their passes and times."
    if differ:  # (greedy float32 never differs; lower precisions can, at near ties)
        head = f"Done: {', '.join(differ)} answered differently from AR (near ties at this precision)."
    clock = f"Times: the median of {measure.REPEATS} repeats, {measure.CLOCK_WORDS[which]}."
    return f"{head} {clock}\n\n<details><summary>What was timed, and how</summary>\n\n{how}\n\n</details>"


def _cleared(cmp: dict, status: str) -> dict:
    """The tab as a new comparison starts: ``status``, and no table, story or strip of the last one."""
    return {
        cmp["status"]: status,
        cmp["table"]: [],
        cmp["story"]: "",
        cmp["strip"]: render.compare_strip_html({}),
    }


def _progress(cmp: dict, compare_state, timing: _Timing, status: str) -> dict:
    runs = timing.runs
    return {
        cmp["status"]: status,
        compare_state: gr.skip(),
        cmp["table"]: measure.rows(runs, timing.times, timing.projection) if runs else gr.skip(),
        cmp["story"]: gr.skip(),
        cmp["strip"]: gr.skip(),
    }


def _image_dependent(studio: Studio, runtime, model: str, runs: dict, images: list, prompt: str):
    """The reference answer's image-dependent tokens (one pass with a blank image), None without an image."""
    if not images:
        return None
    answer = token_ids(runs["ar"])
    with studio.cache.pass_lock(model):
        return sensitive_flags(runtime.target, [other_image(BLANK_IMAGE, images[0])], prompt, answer)
