"""The Image sensitivity tab: which answer tokens depend on the image, and who drafted them.

One teacher-forced pass with a replacement image (`recap.bench.sensitivity.sensitive_flags`) over the last
comparison's reference answer (AR's), or the last run's; each method's drafting is then split at the
flagged positions where its answer agrees with the reference
(`recap.bench.sensitivity.split_against_reference`,
the benchmark's rule). The pass decodes in the studio's decode line, like a run.
"""

from __future__ import annotations

import asyncio

import gradio as gr

from recap.bench.sensitivity import mark_steps, sensitive_flags, token_ids
from recap.studio.guard.jobs import HEARTBEAT_S
from recap.studio.guard.validation import refusal
from recap.studio.serving import Studio
from recap.studio.ui import render, tables
from recap.studio.ui.examples import check_other_image, other_image


def wire_sensitivity(studio: Studio, ui: dict, sens: dict, run_state, compare_state) -> None:
    """The Sensitivity button: its pass is one job of the studio's decode line (`Studio.submit`: fair
    across clients, counted against its client's share); a session has one at a time."""

    async def sensitivity(state, compared, choice, request: gr.Request = None):
        try:
            choice = check_other_image(choice)
        except ValueError as error:
            raise refusal(str(error)) from None
        if compared and state and compared["key"] != state.get("key"):
            compared = None  # the comparison was made on another input than the last run
        if not (compared or state):  # a hint, not an error: nothing to analyse yet
            yield {sens["status"]: "Run a generation (or a comparison) first: this tab analyses its answer."}
            return
        coverage = None
        if compared:
            runs, image, prompt = compared["runs"], compared["image"], compared["prompt"]
            model_id, coverage = compared["key"][0], compared.get("coverage")
            source = "the last comparison's runs (every method, on the Run tab's input)"
        else:
            method = state["trace"].settings.get("method", "run")
            runs = {method: state["trace"].steps}
            image, prompt, model_id = state["image"], state["prompt"], state.get("model")
            source = f"the last run ({render.method_label(method)})"
        # hints on the tab's status line, like the one above: what the last run lets this tab do
        runtime = studio.cache.loaded(model_id) if model_id else None
        if not model_id:  # a replayed trace: the file holds neither the image nor a model to run
            hint = (
                "A replayed run holds no image, so nothing in it can be compared with another image: "
                "run a generation (or a comparison) first."
            )
        elif runtime is None:
            hint = "The model that made the run is no longer loaded: run the generation again."
        elif image is None:
            hint = "The run had no image, so nothing can depend on it."
        else:
            hint = None
        if hint is not None:
            yield {sens["status"]: hint}
            return
        reference = next(iter(runs.values()))
        answer = token_ids(reference)

        def work(job):
            replacement = other_image(choice, image, model_id)
            with studio.cache.pass_lock(model_id):
                return sensitive_flags(runtime.target, [replacement], prompt, answer)

        job = studio.submit(request, "sensitivity", work)
        with studio.awaiting(
            request, "sensitivity", job, "This check was replaced by a newer one of the same session."
        ):
            waiting = studio.waiting_line(job)
            if line := waiting.status():
                yield {sens["status"]: line}
            async for _ in job.waits(HEARTBEAT_S):  # yields, so that gradio can stop the event if its
                yield {sens["status"]: waiting.status() or gr.skip()}  # visitor left
        flags = job.result

        def shown():
            for steps in runs.values():
                mark_steps(steps, flags)
            count = sum(flags[1:])  # (the first token comes from the prefill: nothing drafts it)
            status = (
                f"{count} of the {max(0, len(flags) - 1)} tokens after the first are image-sensitive (the "
                f"first comes from the prompt pass, where nothing is drafted). Analysed: {source}."
            )
            if not coverage:  # only a comparison probes what the memories held at each token
                status += " What a memory held there is known after a comparison (Compare tab): \"-\" here."
            rows = tables.sensitivity_rows(runs, flags, coverage)
            return render.sensitivity_answer(reference, flags), rows, status

        yield await asyncio.to_thread(shown)

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
