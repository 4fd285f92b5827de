"""The Image sensitivity tab: which answer tokens depend on the image, and who drafted them.

It leads with the held-out figure (`recap.studio.ui.measure.held_out_line`, following the chosen
model): one answer's image-sensitive tokens are a handful, the held-out scenes the steadier measure.

One teacher-forced pass with a replacement image (`recap.bench.sensitivity.sensitive_flags`) over the last
comparison's reference answer (AR's), or the last run's; each method's drafting is then split at the
flagged positions where its answer agrees with the reference
(`recap.bench.sensitivity.split_against_reference`,
the benchmark's rule). The pass decodes in the studio's decode line, like a run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import gradio as gr

from recap.bench.sensitivity import mark_steps, sensitive_flags, token_ids
from recap.studio.guard.jobs import HEARTBEAT_S
from recap.studio.guard.validation import refusal
from recap.studio.serving import Studio
from recap.studio.ui import measure, render, tables
from recap.studio.ui.examples import check_other_image, other_image


@dataclass
class Analysed:
    """What the tab analyses: the runs (by method; the first is the reference answer), their input, the
    model that made them, what the memories held at each token (a comparison's probe, else None), and
    a phrase naming where they come from."""

    runs: dict
    image: object
    prompt: str
    model_id: str | None
    coverage: dict | None
    source: str


def analysed(state, compared) -> Analysed | None:
    """The last comparison's runs when it was made on the last run's input, else the last run's; None
    when there is neither."""
    if compared and state and compared["key"] != state.get("key"):
        compared = None  # the comparison was made on another input than the last run
    if compared:
        source = "the last comparison's runs (every method, on the Run tab's input)"
        runs, key = compared["runs"], compared["key"]
        return Analysed(runs, compared["image"], compared["prompt"], key[0], compared.get("coverage"), source)
    if state:
        method = state["trace"].settings.get("method", "run")
        runs, source = {method: state["trace"].steps}, f"the last run ({render.method_label(method)})"
        return Analysed(runs, state["image"], state["prompt"], state.get("model"), None, source)
    return None


def unanalysable(what: Analysed, runtime) -> str | None:
    """Why ``what`` cannot be analysed (a hint on the tab's status line), or None."""
    if not what.model_id:  # a replayed trace: the file holds neither the image nor a model to run
        return (
            "A replayed run holds no image, so nothing in it can be compared with another image: "
            "run a generation (or a comparison) first."
        )
    if runtime is None:
        return "The model that made the run is no longer loaded: run the generation again."
    if what.image is None:
        return "The run had no image, so nothing can depend on it."
    return None


def shown(what: Analysed, flags: list[bool]) -> tuple:
    """The tab's answer, table and status once the pass flagged the image-sensitive tokens."""
    for steps in what.runs.values():
        mark_steps(steps, flags)
    count = sum(flags[1:])  # (the first token comes from the prefill: nothing drafts it)
    status = (
        f"{count} of the {max(0, len(flags) - 1)} tokens after the first are image-sensitive (the "
        f"first comes from the prompt pass, where nothing is drafted). Analysed: {what.source}."
    )
    if not what.coverage:  # only a comparison probes what the memories held at each token
        status += ' What a memory held there is known after a comparison (Compare tab): "-" here.'
    rows = tables.sensitivity_rows(what.runs, flags, what.coverage)
    return render.sensitivity_answer(next(iter(what.runs.values())), flags), rows, status


def wire_sensitivity(studio: Studio, ui: dict, sens: dict, run_state, compare_state) -> None:
    """The Sensitivity button: its pass is one job of the studio's decode line (`Studio.submit`: fair
    across clients, counted against its client's share); a session has one at a time."""

    async def sensitivity(state, compared, choice, request: gr.Request = None):
        try:
            choice = check_other_image(choice)
        except ValueError as error:
            raise refusal(str(error)) from None
        what = analysed(state, compared)
        if what is None:  # a hint, not an error: nothing to analyse yet
            yield {sens["status"]: "Run a generation (or a comparison) first: this tab analyses its answer."}
            return
        runtime = studio.cache.loaded(what.model_id) if what.model_id else None
        if (hint := unanalysable(what, runtime)) is not None:
            yield {sens["status"]: hint}
            return
        answer = token_ids(next(iter(what.runs.values())))

        def work(job):
            replacement = other_image(choice, what.image, what.model_id)
            with studio.cache.pass_lock(what.model_id):
                return sensitive_flags(runtime.target, [replacement], what.prompt, answer)

        job = studio.submit(request, "sensitivity", work)
        with studio.awaiting(
            request, "sensitivity", job, "This check was replaced by a newer one of the same session."
        ):
            waiting = studio.waiting_line(job)
            if line := waiting.status():
                yield {sens["status"]: line}
            async for _ in job.waits(HEARTBEAT_S):  # yields, so that gradio can stop the event if its
                yield {sens["status"]: waiting.status() or gr.skip()}  # visitor left
        yield await asyncio.to_thread(shown, what, job.result)

    # the held-out figure that leads the tab follows the chosen model, as the Compare tab's does
    ui["model"].change(measure.held_out_line, [ui["model"]], [sens["summary"]], api_name=False)
    sens["button"].click(
        sensitivity,
        [run_state, compare_state, sens["other"]],
        [sens["answer"], sens["table"], sens["status"]],
        api_name="sensitivity",
        # no gradio limit: the handler waits in the studio's decode line (bounded, fair across clients)
        concurrency_limit=None,
        preprocess=False,  # the choice is checked above (gradio's own check echoes it unescaped)
        show_progress_on=[sens["status"]],  # progress and a refusal on the status line, not every panel
    )
