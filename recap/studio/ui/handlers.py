"""The Run tab's events, one handler each: run (streamed), stop, scrub, reset (download and replay:
`recap.studio.ui.traces`).

Handlers are plain: they take checked values, decode (`recap.decode`, through `Studio.stream`) and
draw (`recap.studio.ui.render` / `figures`); they call no piece of the public Space's guard. Each
``wire_*`` function registers its handler with the guard of its kind around it (`Guard.wrap`: checks,
the decode line, tickets, pacing, Stop); `recap.studio.demo` calls them with the studio's `Guard`.
Per-visitor data lives in ``gr.State``: ``session`` (memories by model id) and ``run_state``
(``{"trace", "image", "prompt", "model", "key"}`` of the last run or replay).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import gradio as gr

from recap.bench.sensitivity import token_texts
from recap.inputs import check_integer, shown
from recap.state import DrafterState
from recap.studio.environment import REPLAY_EVENTS, SESSION_SCOPE, SHARED_SCOPE, model_label
from recap.studio.guard.offload import Offscreen
from recap.studio.guard.validation import RunSettings, stopped_status
from recap.studio.guard.wrapper import Checked, Guard
from recap.studio.serving import EMPTIED, Studio, drafter_for
from recap.studio.ui import figures, render, tables
from recap.studio.ui.scene_note import scene_note, with_note
from recap.trace import PackedSteps, RunTrace, StepRecord

log = logging.getLogger("recap.studio")

#: What a session whose memories were dropped while idle (`recap.studio.guard.sessions`) is told.
RESTARTED = (
    "this session's memories had been dropped while it was idle, to keep the server within its memory "
    "budget: this run started again from the model's starting memory"
)
#: The step panel's components, in the order `step_view` returns their values.
STEP_PANEL = ("words", "tree", "fused", "step_table")
#: The outputs /run and /replay share, first in both and in this order: API clients read them by position.
RESULT_OUTPUTS = ("answer", "stats", "passes", "step", "tree", "fused", "step_table", "status")


def input_key(model_id: str, prompt: str, image) -> tuple:
    """What identifies a run's input (the sensitivity tab checks that a comparison used the same)."""
    path = image.get("path") if isinstance(image, dict) else image
    return (model_id, prompt, path if isinstance(path, str) else None)


def step_view(steps: list[StepRecord], index: int) -> tuple:
    """The step panel's values for step ``index`` (clamped): words, tree, fused figure, table."""
    index = max(0, min(int(index), len(steps) - 1))
    step = steps[index]
    root_text = steps[index - 1].new_texts[-1] if index > 0 and steps[index - 1].new_texts else None
    return (
        render.step_words_html(step),
        figures.tree_figure(step, root_text=root_text),
        figures.fused_figure(step),
        tables.step_table(step),
    )


def plotted(figure):
    """``figure`` as gradio sends a plot (its JSON, picklable): serialized by whoever draws it, inside
    its drawing ticket (in the drawing worker, for a replay or a step's view), not after it."""
    global _PLOT
    if _PLOT is None:
        _PLOT = gr.Plot(render=False)
    return _PLOT.postprocess(figure)


_PLOT: gr.Plot | None = None
#: The panels that show a run's newest step, in the order `panel_values` returns their values.
PANELS = ("answer", "stats", "passes", *STEP_PANEL)


def step_panel(steps: Sequence[StepRecord], index: int) -> tuple:
    """`step_view`'s values with the figures `plotted` (what a step's view sends)."""
    words, tree, fused, table = step_view(steps, index)
    return words, plotted(tree), plotted(fused), table


def panel_values(steps: Sequence[StepRecord], draw: Callable = lambda figure: figure) -> tuple:
    """The values of `PANELS` showing the newest of ``steps``; each figure goes through ``draw``
    (`plotted`: what a replay sends)."""
    words, tree, fused, table = step_view(steps, len(steps) - 1)
    answer, stats = render.highlighted_answer(steps), render.stats_html(steps)
    return answer, stats, draw(render.passes_figure(steps)), words, draw(tree), draw(fused), table


def placed(ui: dict, values: tuple, count: int, scrubbable: bool) -> dict:
    """`panel_values`' ``values`` on their components, and the step slider at the last of ``count``."""
    last = count - 1
    slider = gr.Slider(minimum=0, maximum=max(1, last), value=last, interactive=scrubbable)
    return {**dict(zip((ui[name] for name in PANELS), values)), ui["step"]: slider}


def panels(ui: dict, steps: list[StepRecord], scrubbable: bool) -> dict:
    """The answer, stats and step panel showing the newest of ``steps``."""
    return placed(ui, panel_values(steps), len(steps), scrubbable)


def memory_state(studio: Studio, model_id: object, scope: object, session: object) -> render.MemoryState:
    """The persistent memory the next run of ``model_id`` in ``scope`` drafts from (see
    `render.MemoryState`); values are the visitor's: an unknown model or scope shows the default."""
    scope = scope if isinstance(scope, str) and scope in studio.scopes else SESSION_SCOPE
    runtime = (
        studio.cache.loaded(model_id) if isinstance(model_id, str) and model_id in studio.models else None
    )
    if runtime is None:
        emptied = scope != SHARED_SCOPE and isinstance(session, dict) and session.get(model_id) == EMPTIED
        return render.MemoryState(scope, emptied=emptied)
    start, vocab = studio.cache.start(model_id), runtime.target.vocab_size
    if scope == SHARED_SCOPE:
        state = studio.cache.peek_shared(model_id)
    else:
        state = session.get(model_id) if isinstance(session, dict) else None
    latest = state.latest() if isinstance(state, DrafterState) else None
    if latest is not None:
        memory, origin = latest
        note = state.note
        if origin == "empty" and not state.cleared and not note:
            note = start.note or (f"the starting memory has k={start.k}" if start.warm else "")
        contexts = len(memory.context2) + len(memory.context3)
        return render.MemoryState(scope, len(memory), vocab, origin, note, contexts)
    if state == EMPTIED or (isinstance(state, DrafterState) and state.cleared):
        return render.MemoryState(scope, 0, vocab, "empty")
    origin = start.origin if start.warm else "empty"
    return render.MemoryState(scope, start.tokens if start.warm else 0, vocab, origin, start.note)


def memory_html(studio: Studio, model_id: object, scope: object, session: object) -> str:
    return render.memory_state_html(memory_state(studio, model_id, scope, session))


def wire_image_check(studio: Studio, ui: dict, guard: Guard | None = None) -> None:
    """A file dropped in the Image box that is not a usable image is refused as it lands (the guard's
    kind ``"upload"``: a warning, and the box emptied; the run would refuse it too, with the same
    words); a usable one stays."""

    def kept(value):
        return gr.skip()

    ui["image"].upload(
        (guard or Guard(studio)).wrap(kept, "upload"), [ui["image"]], [ui["image"]], preprocess=False,
        show_progress="hidden",
        api_visibility="private",  # (the queue's default concurrency, one of `OTHER_EVENT_GROUPS`)
    )  # fmt: skip


def wire_memory_view(studio: Studio, ui: dict, session, demo) -> None:
    """The memory line follows the model and scope chosen, and shows the page's start."""
    inputs = [ui["model"], ui["scope"], session]

    def view(model_id, scope, memories):
        return memory_html(studio, model_id, scope, memories)

    common = {"show_progress": "hidden", "preprocess": False, "api_visibility": "private", "queue": False}
    ui["model"].change(view, inputs, ui["memory"], **common)
    ui["scope"].change(view, inputs, ui["memory"], **common)
    demo.load(view, inputs, ui["memory"], **common)


@dataclass
class RunRequest:
    """One admitted run: the visitor's input with its checked settings, the session's memories it
    drafts from, and the run's state (the ``run_state`` value Stop and scrubbing read)."""

    image: object
    prompt: str
    settings: RunSettings
    memories: dict
    state: dict
    restarted: bool
    delay_ms: object = 0

    @property
    def trace(self) -> RunTrace:
        return self.state["trace"]

    @property
    def steps(self) -> list[StepRecord]:
        """The run's steps so far (the guard appends each as it arrives)."""
        return self.state["trace"].steps


class RunEvents:
    """Answer the prompt about the image, streaming every target pass (answer, stats, the step's tree);
    the settings are the Run tab's (a blank seed draws one), delay_ms paces the display. Its API
    parameters: the settings', then ``delay_ms`` and ``memories``.

    The Run button's plain handler (`recap.studio.guard.wrapper.PacedHandler`): `admit` a checked
    request, `work` (decode it: status lines and step records) and the updates that show it; the guard
    around it (`Guard.wrap`, kind ``"run"``) queues the work in the decode line, paces its steps and
    handles Stop. A session has one run at a time (a newer one replaces it).
    """

    event = "run"
    replaced = "This run was replaced by a newer run of the same session."
    extras = (("memories", None),)

    def __init__(self, studio: Studio, ui: dict, session, run_state) -> None:
        self.studio, self.ui, self.session, self.run_state = studio, ui, session, run_state
        names = (*RESULT_OUTPUTS, "download", "words", "memory")
        self.outputs = [ui[n] for n in names] + [run_state, session]

    def admit(self, checked: Checked, memories) -> RunRequest:
        """The run ``checked`` asks for, drafting from the session's ``memories``."""
        settings, prompt = checked.settings, checked.prompt
        memories = memories if isinstance(memories, dict) else {}
        restarted = checked.restarted and settings.model not in memories
        trace = RunTrace(settings={**asdict(settings), "prompt": prompt}, steps=[])
        key = input_key(settings.model, prompt, checked.image)
        state = {"trace": trace, "image": None, "prompt": prompt, "model": settings.model, "key": key}
        restarted = restarted and settings.scope == SESSION_SCOPE
        return RunRequest(checked.image, prompt, settings, memories, state, restarted, checked.delay_ms)

    def update(self, steps, status: str, run: RunRequest) -> dict:
        """Every panel showing ``steps``, with ``status``, the controls locked while the run goes on."""
        settings = run.settings
        return {
            **panels(self.ui, steps, scrubbable=False),
            self.ui["status"]: status,
            self.ui["download"]: gr.Button(interactive=False),
            self.ui["memory"]: memory_html(self.studio, settings.model, settings.scope, run.memories),
            self.run_state: run.state,
            self.session: run.memories,
        }

    def work(self, run: RunRequest):
        """Load, check, decode at full speed: yields status lines and the step records; returns the
        answer's text. Between two records the slot may go to another client's waiting work."""
        studio, settings = self.studio, run.settings
        if studio.cache.loaded(settings.model) is None:
            warm = studio.plan.warmup_s
            then = f"; a model with no memory of its own warms it up for up to {warm:.0f} s" if warm else ""
            yield f"Loading {model_label(settings.model)} (first use, once per server{then})…"
        runtime, config, prompt, images = studio.prepare(run.image, run.prompt, settings)
        drafter = drafter_for(runtime, settings, settings.method, config, run.memories, studio.cache)
        if run.restarted and isinstance(run.memories.get(settings.model), DrafterState):
            run.memories[settings.model].note = RESTARTED
        run.state["image"] = images[0] if images else None
        # an embedded model given an image not of its world: said before the first step, kept in each status
        run.state["note"] = note = scene_note(settings.model, run.state["image"], studio.models)
        if note:
            yield with_note("Generating…", note)
        tokens: list[int] = []
        first, started = True, time.perf_counter()
        steps = studio.stream(
            runtime, settings.model, drafter, prompt, images, settings.max_new_tokens, settings.method,
            settings.sampling(),
        )  # fmt: skip
        with contextlib.closing(steps):
            for record in steps:
                if first:
                    log.info("first token after %.0f ms", 1000 * (time.perf_counter() - started))
                    first = False
                tokens += record.new_tokens
                yield record
        return runtime.target.decode(tokens)

    def started(self, run: RunRequest) -> dict:
        """The first update: the run's state (Stop reads it), scrubbing and Download locked."""
        ui = self.ui
        return {
            self.run_state: run.state,
            ui["step"]: gr.Slider(interactive=False),
            ui["download"]: gr.Button(interactive=False),
        }

    def status(self, run: RunRequest, line) -> dict:
        return {self.ui["status"]: line}

    def progress(self, run: RunRequest, shown: int) -> dict:
        """Every panel showing the first ``shown`` steps (what Stop keeps)."""
        steps = run.steps
        status = with_note(f"Generating… step {steps[shown - 1].step}", run.state.get("note"))
        run.state["shown"] = shown
        return self.update(steps[:shown], status, run)

    def ended(self, run: RunRequest, text, stopped: bool, hurried: str) -> dict:
        """The run's last update: after a Stop, its status; else every panel and the Done status."""
        run.trace.text = text or ""
        if stopped:  # a Stop before the end: its status, after every update of the run
            return self.after_stop(run.delay_ms, run.settings.method, run.state)
        return self.final(run, hurried)

    def final(self, run: RunRequest, hurried: str) -> dict:
        """Every panel, the Done status, scrubbing and Download unlocked."""
        steps, settings = run.trace.steps, run.settings
        reason = steps[-1].finish_reason if steps else None
        done = (
            f"Done: {len(run.trace.tokens)} tokens in {len(steps)} target passes ({reason or 'stopped'}), "
            f"with {render.markdown_text(model_label(settings.model))}."  # (true once another is chosen)
        )
        done += hurried
        if run.restarted:
            done += f" {RESTARTED[0].upper()}{RESTARTED[1:]}."
        done = with_note(done, run.state.get("note"))
        run.state["ended"] = done  # a Stop from now on has nothing to stop (it shows this status again)
        final = self.update(steps, done, run)
        final[self.ui["download"]] = gr.Button(interactive=True)
        last = len(steps) - 1
        final[self.ui["step"]] = gr.Slider(minimum=0, maximum=max(1, last), value=last, interactive=True)
        return final

    def after_stop(self, delay_ms, method, state):
        """The status after Stop, and the steps shown so far kept as a run's: scrubbable, downloadable.
        A Stop when no run is in flight changes nothing: after a run's end it shows that run's final
        status and controls again (the same, unless the Stop cancelled the final update on its way)."""
        ui = self.ui
        ended = state.get("ended", False) if isinstance(state, dict) else True  # (True: a replay, or none)
        if ended is True:
            return {ui["status"]: gr.skip()}
        if isinstance(done := ended, str):
            last = len(state["trace"].steps) - 1
            return {
                ui["status"]: done,
                ui["step"]: gr.Slider(0, max(1, last), value=last, interactive=True),
                ui["download"]: gr.Button(interactive=True),
            }
        shown = min(int(state.get("shown", 0)), len(state["trace"].steps))
        out = {ui["status"]: with_note(stopped_status(delay_ms, method), state.get("note"))}
        if shown:
            trace = state["trace"]
            steps = trace.steps[:shown]
            kept = RunTrace(settings=trace.settings, steps=steps, text="".join(token_texts(steps)))
            out[self.run_state] = {**state, "trace": kept}
            out[ui["step"]] = gr.Slider(0, max(1, shown - 1), value=shown - 1, interactive=True)
            out[ui["download"]] = gr.Button(interactive=True)
        return out

    def wire(self, guard: Guard, setting_inputs: list) -> None:
        """Register Run and Stop on the page's components."""
        ui = self.ui
        ui["run"].click(
            guard.wrap(self, "run"),
            [ui["image"], ui["prompt"], *setting_inputs, ui["delay_ms"], self.session],
            self.outputs,
            # no gradio limit: the handler waits for one of `Studio.slots` (a bounded line), no thread
            concurrency_limit=None,
            api_name="run",
            preprocess=False,  # raw values reach the guard's checks, which answer every bad one clearly
            # progress and a refusal show on the status line (and its toast), not as an "Error" on every panel
            show_progress_on=[ui["status"]],
        )
        # the status after Stop, set at once (the run's own last update says the same). Stop's event is
        # not cancelled: on a busy server a cancelled event's last update could reach the page after
        # the Stopped status and overwrite it
        private = {"queue": False, "api_visibility": "private"}
        stopped = ui["stop"].click(guard.stop(self.event), None, None, **private)
        stopped.then(
            self.after_stop, [ui["delay_ms"], ui["method"], self.run_state],
            [ui["status"], self.run_state, ui["step"], ui["download"]], **private,
        )  # fmt: skip


def wire_run(
    studio: Studio, ui: dict, setting_inputs: list, session, run_state, guard: Guard | None = None
) -> None:
    """Run (streamed) and Stop (`RunEvents`)."""
    RunEvents(studio, ui, session, run_state).wire(guard or Guard(studio), setting_inputs)


def wire_scrub(studio: Studio, ui: dict, run_state, guard: Guard | None = None) -> None:
    """Moving the step slider shows that step in the step panel: drawn under a drawing ticket of its
    client (the guard's kind ``"view"``: the ticket replays take, a few at once, one per client, each
    client resting as long as its drawing took), and bounded by `recap.studio.ui.drawing`."""
    outputs = [ui[name] for name in STEP_PANEL]

    def scrub(state, index):
        """The drawing of step ``index`` of the session's run or replay (a ValueError: refused)."""
        if not isinstance(state, dict) or not state["trace"].steps:  # (the page's slider is locked then)
            raise ValueError(NO_RUN_YET)
        index = check_integer("step", index, 0, len(state["trace"].steps) - 1)

        # drawn in the drawing worker: a replay's steps go compressed, as kept (rebuilt there); a run's,
        # the step and the one before it (its root's text)
        steps = state["trace"].steps
        if isinstance(steps, PackedSteps):
            return Offscreen(step_panel, (steps, index))
        first = max(0, index - 1)
        return Offscreen(step_panel, (steps[first : index + 1], index - first))

    guarded = (guard or Guard(studio)).wrap(scrub, "view")
    # the drawing tickets answer a flood at once: the step's gradio concurrency is the replays' (above them)
    common = {
        "show_progress": "hidden",
        "preprocess": False,
        "concurrency_limit": REPLAY_EVENTS,
        "concurrency_id": "replay",
    }
    # while dragging, render the latest position, not every one
    ui["step"].input(
        guarded, [run_state, ui["step"]], outputs, api_name="step", trigger_mode="always_last", **common
    )
    ui["step"].release(guarded, [run_state, ui["step"]], outputs, api_visibility="private", **common)


#: What the step and download endpoints answer before a run or replay has anything to show.
NO_RUN_YET = "Run a generation (or replay one) first."


#: What each reset button brings this session's memories back to, and what it then says.
RESETS = {
    "reset": ("starting", "This session's memories are back to the model's starting memory"),
    "reset_empty": ("empty", "This session's memories are empty (a cold start)"),
}


def wire_reset(studio: Studio, ui: dict, session, guard: Guard | None = None) -> None:
    """Two resets of this session's memories of the chosen model: back to its starting memory (the
    shipped one for the embedded model), or empty. The process-wide ones are never reset from here."""
    guard = guard or Guard(studio)

    def resetter(to: str, message: str):
        def reset(model_id, scope, memories):
            model_id = studio.known_model(model_id)
            if not isinstance(scope, str) or scope not in studio.scopes:
                raise ValueError(f"Unknown memory scope {shown(scope)}: choose one from the list.")
            memories = memories if isinstance(memories, dict) else {}
            memories.pop(model_id, None)  # (drafters of runs in flight keep what they hold)
            if to == "empty":
                memories[model_id] = EMPTIED
            note = (
                " (the process-wide memory is shared with other visitors: it is kept)"
                if scope == SHARED_SCOPE
                else ""
            )
            gr.Info(f"{message}{note}.")
            return memories, memory_html(studio, model_id, scope, memories)

        return reset

    for name, (to, message) in RESETS.items():
        ui[name].click(
            guard.wrap(resetter(to, message), "checked"),
            [ui["model"], ui["scope"], session],
            [session, ui["memory"]],
            api_name=name,
            preprocess=False,
        )
