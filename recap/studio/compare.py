"""The Compare tab: the Run tab's input through every method, a small benchmark in the browser.

Fair by construction: every method starts from fresh memories of its own, and each method that keeps
memories across requests (Token Recycling's matrix, RECAP's memories, SuffixDecoding's global tree) is
first warmed on the SAME warm-up requests (`Studio.warmup_requests`: training scenes for the embedded
model, the other examples otherwise; never the compared input). AR and prompt lookup keep nothing
between requests. The visitor's own session memories are neither used nor changed.

Greedy decoding always (sampling settings apply to the Run tab only, and the tab says so): then every
method's output is identical to AR's, which the table checks. A short AR run first, so the first timed
method does not pay for lazy initialisation; wall times include drafting, not the warm-up.

Above the strip, one line tells the paper's story (`recap.studio.story`): one teacher-forced pass with a
blank image marks the tokens that depend on the image, and the line counts each method's drafts there.
"""

from __future__ import annotations

import time

import gradio as gr

from recap.bench.sensitivity import sensitive_flags
from recap.drafters import shared_state
from recap.studio import render, story
from recap.studio.environment import concurrency
from recap.studio.examples import BLANK_IMAGE, other_image
from recap.studio.handlers import input_key
from recap.studio.serving import Studio, fresh_drafter
from recap.studio.validation import offered_methods
from recap.trace import StepRecord

#: The methods compared, in the table's order (AR first: it is the reference); SuffixDecoding where
#: its package is installed.
COMPARED = ("ar", "pld", "tr", "suffix", "recap")
GREEDY_NOTE = " Compare decodes greedily: the sampling settings apply to the Run tab only."
#: Warm-up requests every method with memories sees before its timed run, and their token limit.
WARMUP_REQUESTS = 8
WARMUP_MAX_NEW = 64
#: Shared state that outlives a request (what the warm-up fills).
MEMORIES = frozenset({"persistent", "successors", "suffix_cache"})


def remembers(method: str, config) -> bool:
    """Whether ``method`` keeps memories across requests (so it is warmed before it is timed)."""
    return bool(MEMORIES & shared_state(method, config))


def fairness_note(count: int, source: str, suffix: bool = True) -> str:
    """``suffix``: SuffixDecoding ran (its package is installed); else it is not named."""
    warmed = "TR, SuffixDecoding and RECAP" if suffix else "TR and RECAP"
    return (
        f"{warmed} started from empty memories warmed on the same {count} requests "
        f"({source}, not this input); your session's memory was not used."
    )


def wire_compare(studio: Studio, ui: dict, cmp: dict, setting_inputs: list, compare_state) -> None:
    def compare(image, prompt, *values):
        settings = studio.settings(values)
        note = GREEDY_NOTE if not settings.sampling().greedy else ""
        path, _, _ = studio.check_request(image, prompt, settings)
        runtime, config, prompt, images = studio.prepare(image, prompt, settings)
        max_new, model = settings.max_new_tokens, settings.model
        warmup = studio.warmup_requests(runtime, exclude=(str(path) if path else None, prompt))
        fair = fairness_note(len(warmup), studio.warmup_source(runtime), "suffix" in offered_methods())
        first = fresh_drafter(runtime, "ar", config)
        for _ in studio.stream(runtime, model, first, prompt, images, min(4, max_new), "ar"):
            pass
        runs: dict[str, list[StepRecord]] = {}
        walls: dict[str, float] = {}
        for method in (m for m in COMPARED if m in offered_methods()):
            label = render.method_label(method)
            drafter = fresh_drafter(runtime, method, config)
            if remembers(method, config):
                yield _progress(cmp, compare_state, runs, walls, f"Warming up {label}…{note}")
                for request in warmup:
                    steps = studio.stream(
                        runtime, model, drafter, request.prompt, list(request.images),
                        min(max_new, WARMUP_MAX_NEW), method,
                    )  # fmt: skip
                    for _ in steps:
                        pass
            yield _progress(cmp, compare_state, runs, walls, f"Running {label}…{note}")
            start = time.perf_counter()
            runs[method] = list(studio.stream(runtime, model, drafter, prompt, images, max_new, method))
            walls[method] = time.perf_counter() - start
        line = _story(studio, runtime, model, runs, images, prompt)
        yield {
            cmp["status"]: "Done. Wall times include drafting (not the warm-up); speedup is AR's time "
            f"over each method's. {fair}{note}",
            cmp["table"]: render.compare_rows(runs, walls),
            cmp["story"]: story.story_html(line),
            cmp["strip"]: render.compare_strip_html(runs),
            compare_state: {
                "runs": runs,
                "key": input_key(model, prompt, image),
                "image": images[0] if images else None,
                "prompt": prompt,
                "warmup": [r.label for r in warmup],
            },
        }

    cmp["button"].click(
        compare,
        [ui["image"], ui["prompt"], *setting_inputs],
        [cmp["status"], cmp["table"], cmp["story"], cmp["strip"], compare_state],
        concurrency_limit=concurrency(),
        concurrency_id="decode",
        api_name="compare",
        preprocess=False,
    )


def _progress(cmp: dict, compare_state, runs, walls, status: str) -> dict:
    return {
        cmp["status"]: status,
        compare_state: gr.skip(),
        cmp["table"]: render.compare_rows(runs, walls) if runs else gr.skip(),
        cmp["story"]: gr.skip(),
        cmp["strip"]: gr.skip(),
    }


def _story(studio: Studio, runtime, model: str, runs: dict, images: list, prompt: str) -> str:
    """The story line: the reference answer's image-dependent tokens (one pass with a blank image)."""
    if not images:
        return "No image: no token of this answer can depend on one."
    answer = [t for s in runs["ar"] for t in s.new_tokens]
    with studio.cache.pass_lock(model):
        flags = sensitive_flags(runtime.target, [other_image(BLANK_IMAGE, images[0])], prompt, answer)
    return story.story_line(runs, flags, render.METHOD_LABELS)
