"""The Compare tab: the Run tab's input through every method, a small benchmark in the browser.

Greedy decoding always (sampling settings apply to the Run tab only, and the tab says so): then every
method's output is identical to AR's, which the table checks. A short warm-up first, so the first timed
method does not pay for lazy initialisation; wall times include drafting.
"""

from __future__ import annotations

import time

import gradio as gr

from recap.studio import render
from recap.studio.environment import concurrency
from recap.studio.handlers import input_key
from recap.studio.serving import Studio, drafter_for
from recap.studio.validation import offered_methods
from recap.trace import StepRecord

#: The methods compared, in the table's order (AR first: it is the reference); SuffixDecoding where
#: its package is installed.
COMPARED = ("ar", "pld", "tr", "suffix", "recap")
GREEDY_NOTE = " Compare decodes greedily: the sampling settings apply to the Run tab only."


def wire_compare(studio: Studio, ui: dict, cmp: dict, setting_inputs: list, session, compare_state) -> None:
    def compare(image, prompt, *values_and_session):
        *values, memories = values_and_session
        settings = studio.settings(values)
        note = GREEDY_NOTE if not settings.sampling().greedy else ""
        memories = memories if isinstance(memories, dict) else {}
        runtime, config, prompt, images = studio.prepare(image, prompt, settings)
        max_new = settings.max_new_tokens
        warm = drafter_for(runtime, settings, "ar", config, memories)
        for _ in studio.stream(runtime, settings.model, warm, prompt, images, min(4, max_new), "ar"):
            pass
        runs: dict[str, list[StepRecord]] = {}
        walls: dict[str, float] = {}
        for method in (m for m in COMPARED if m in offered_methods()):
            yield {
                cmp["status"]: f"Running {render.method_label(method)}…{note}",
                compare_state: gr.skip(),
                cmp["table"]: render.compare_rows(runs, walls) if runs else gr.skip(),
                cmp["strip"]: gr.skip(),
            }
            drafter = drafter_for(runtime, settings, method, config, memories)
            start = time.perf_counter()
            runs[method] = list(
                studio.stream(runtime, settings.model, drafter, prompt, images, max_new, method)
            )
            walls[method] = time.perf_counter() - start
        yield {
            cmp["status"]: "Done. Wall times include drafting; speedup is AR's time over each method's."
            + note,
            cmp["table"]: render.compare_rows(runs, walls),
            cmp["strip"]: render.compare_strip_html(runs),
            compare_state: {
                "runs": runs,
                "key": input_key(settings.model, prompt, image),
                "image": images[0] if images else None,
                "prompt": prompt,
            },
        }

    cmp["button"].click(
        compare,
        [ui["image"], ui["prompt"], *setting_inputs, session],
        [cmp["status"], cmp["table"], cmp["strip"], compare_state],
        concurrency_limit=concurrency(),
        concurrency_id="decode",
        api_name="compare",
        preprocess=False,
    )
