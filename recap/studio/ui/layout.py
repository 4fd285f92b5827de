"""The studio's components, tab by tab: what a visitor sees, and nothing that runs.

Each ``*_tab`` function creates its components inside the current ``gr.Blocks`` and returns them in
a dict by name; `recap.studio.demo` wires them to handlers. Initial values come from the pure
renderers, so an empty panel looks like a filled one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from recap.drafters.recap.config import RecapConfig
from recap.studio.environment import (
    DEFAULT_MODEL_ID,
    EMBEDDED_V1_ID,
    EMBEDDED_V2_ID,
    SESSION_SCOPE,
    SHARED_SCOPE,
    model_label,
    offered_methods,
)
from recap.studio.guard.validation import (
    BUDGET_MODES,
    BUDGET_RANGE,
    DELAY_MS_RANGE,
    DEPTH_RANGE,
    K_RANGE,
    MAX_NEW_TOKENS_RANGE,
    MAX_TOTAL_DELAY_S,
    SEED_RANGE,
    TEMPERATURE_RANGE,
    TOP_K_RANGE,
    TOP_P_RANGE,
)
from recap.studio.ui import measure, render, tables
from recap.studio.ui.examples import BLANK_IMAGE, example_sets, other_image_choices

HEADER = (
    "# RECAP Studio\nSpeculative decoding that **recycles** the target model's own predictions: "
    "a tree of guesses is verified in one pass, and the answer is exactly what greedy decoding "
    "would write (or, with a temperature, exactly what sampling would draw). Every token below is "
    "coloured by what proposed it."
)

ABOUT = """
### What you are looking at
- **Answer**: each token is coloured by what proposed it, as the legend names them: *ctx3 · 3-token
  context* and *ctx2 · 2-token context* (the contextual memories, keyed by the last 3/2 tokens: what
  the model predicted under this request's image, and where this one has none yet a consensus of what
  it predicted there under earlier requests' images), *persistent · 1-token* (the memory keyed by the
  last token, kept across your requests), *suffix match* (a continuation copied from an earlier
  occurrence of the last tokens), *back-off · the stream's most frequent tokens* (where no memory knows
  the context), *TR template* (Token Recycling's fixed tree filled from its matrix), *prompt lookup*
  (a continuation copied from earlier in the prompt or answer), *SuffixDecoding tree* (its authors'
  suffix trees over this request and earlier answers), or *target (bonus)*: the token the model
  produced itself in a pass.
- **Inspect a step**: the step in plain words; the candidate tree the drafter proposed (x = depth;
  colour = main source, outline = a second source; thick line = accepted path; faded = rejected;
  ◆ = bonus token; a node's tooltip says when it came in a *fan*: where earlier answers, under other
  images, went on in different ways, RECAP offers its best candidate and the words they chose
  together), the fused
  distribution at the root stacked by source (★ = the token the target
  actually chose), and the step's timings. With a temperature, each verified position lists the
  children tried with the target's probability `p` of each, and marks a token drawn from the residual.
- **Memory**: the line under Run says what the next run drafts from. The embedded model's memory
  starts warm, from a memory shipped with the studio (built on training scenes, never the examples);
  *Reset: empty* shows the paper's cold start.
- **Compare**: the same input through every method, greedy; outputs are identical to greedy decoding
  (fp32). Every method with memories is first warmed on the same requests; the line above the strip
  tells the paper's story at the tokens that depend on the image.
- **Sensitivity**: tokens whose greedy prediction changes when the image is replaced.
- **Replay**: upload a downloaded run (at the foot of the Run tab) to inspect it without a model.

### Sampling
Temperature 0 is greedy decoding (the default). Above 0 the target's distribution is processed like
transformers' `generate(do_sample=True)` (temperature, then top-k, then top-p), and the tree is
verified so that every token is drawn exactly from it: at each position the children are tried in
order, child `c` accepted with probability `p(c)`, and a rejected child removed from `p`; if none is
accepted the token is drawn from what is left (the *residual*). A seed makes a run reproducible.

### The embedded models
`tiny-scenes-llava-v2` (v2, the default) is a 3.7M-parameter LLaVA trained by this project on
synthetic 96x96 scenes of up to five shapes in 12 colours and 8 kinds. On held-out scenes it answers
"Describe the image.", "What colour is the X?", "How many shapes are there?", "Where is the X?", where
one shape is relative to another, and "Describe the image in detail." (60-150 tokens, where each
shape's colour and kind recur), so its answers really depend on the image: every fact right in
0.98-1.00 of the questions of every type worded as in training, and in wordings kept out of its
training too, except relation questions (0.75-0.85 there). *v1* (`tiny-scenes-llava`, 2.4M parameters),
kept for the project's earlier results, sees a smaller world: 64x64 scenes of 1-3 shapes in 6 colours
and 4 kinds, and the first four questions. Each model has its own examples and keeps its own memories.
Neither knows anything else: a photo or another question gets a scene-style answer (the Run tab
says so when the image does not look like a scene). The paper's models (on a GPU) are general
vision-language models.
"""


def run_tab(models: list[str], scopes: tuple[str, ...]) -> dict[str, Any]:
    """The Run tab: inputs, controls and the answer on the left, the step panel on the right; the
    examples, the advanced settings, download and replay below both."""
    ui: dict[str, Any] = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=320):
            _inputs(ui, models)
            with gr.Row():
                ui["run"] = gr.Button("Run", variant="primary", elem_id="run-button")
                ui["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-button")
            ui["memory"] = gr.HTML(
                render.memory_state_html(render.MemoryState(SESSION_SCOPE)),
                label="Memory",  # (labels name the API's outputs; none is shown)
                elem_id="memory-state",
            )
            with gr.Row(elem_id="memory-row"):
                ui["reset"] = gr.Button(
                    "Reset: back to the shipped memory", size="sm", min_width=160, elem_id="reset-button"
                )
                ui["reset_empty"] = gr.Button(
                    "Reset: empty", size="sm", min_width=100, elem_id="reset-empty-button"
                )
            ui["status"] = gr.Markdown("", label="Status", show_label=False, elem_id="status")
            ui["answer"] = gr.HighlightedText(
                label="Answer: each token coloured by what proposed it",
                color_map=render.highlight_color_map(),
                show_legend=True,
                combine_adjacent=False,
                elem_id="answer",
            )
            ui["stats"] = gr.HTML(render.stats_html([]), label="Stats", elem_id="stats")
            ui["passes"] = gr.Plot(label="Tokens per target pass", elem_id="passes-plot")
        with gr.Column(scale=4, min_width=320, elem_id="step-panel"):
            gr.Markdown("### Inspect a step")
            ui["step"] = gr.Slider(
                0, 1, value=0, step=1, label="Step", interactive=False, elem_id="step-slider"
            )
            ui["words"] = gr.HTML(render.step_words_html(None), label="Step in words", elem_id="step-words")
            ui["tree"] = gr.Plot(label="Candidate tree", elem_id="tree-plot")
            ui["fused"] = gr.Plot(label="Drafter's distribution at the root", elem_id="fused-plot")
            ui["step_table"] = gr.Dataframe(
                headers=tables.STEP_TABLE_HEADERS,
                interactive=False,
                wrap=True,
                # on a phone both columns show, the names wrapped; the value column fits "Autoregressive"
                column_widths=["56%", "44%"],
                max_height=900,  # all eleven rows, wrapped on a phone (gradio's 500 px hid the last)
                label="Step table",
                show_label=False,
                elem_id="step-table",
            )
    # below both columns: on a phone, where the columns stack, the step panel follows the answer
    _examples(ui, models)
    with gr.Accordion("Advanced settings", open=False, elem_id="advanced"):
        _advanced(ui, scopes)
    with gr.Row():
        ui["download"] = gr.Button("Download run (JSON)", interactive=False, elem_id="download")
        # the trace is written on click (it holds the prompt); the browser then fetches it
        ui["download_file"] = gr.File(visible=False, label="Trace", show_label=False, elem_id="download-file")
        ui["replay"] = gr.File(
            label="Replay a run (JSON, no model)",
            file_types=[".json"],
            type="filepath",
            height=120,
            elem_id="replay-file",
        )
    return ui


def _inputs(ui: dict[str, Any], models: list[str]) -> None:
    with gr.Row():
        ui["example_sets"] = example_sets(models)
        rows = next(iter(ui["example_sets"].values()), [])  # the default model's
        first = rows[0] if rows else [None, ""]  # filled in: one click on Run shows everything
        ui["image"] = gr.Image(
            value=first[0], type="filepath", label="Image", height=230, elem_id="input-image"
        )
        with gr.Column(min_width=240):
            ui["prompt"] = gr.Textbox(
                value=first[1], label="Prompt", lines=2, placeholder="Ask about the image…", elem_id="prompt"
            )
            ui["model"] = gr.Dropdown(
                [(model_label(m), m) for m in models], value=models[0], label="Model", elem_id="model"
            )
            ui["method"] = gr.Radio(
                [(render.method_label(m), m) for m in offered_methods()],
                value="recap",
                label="Method",
                elem_id="method",
            )


#: The label above each example set.
EXAMPLE_LABELS = {EMBEDDED_V2_ID: "Examples (v2 scenes)", EMBEDDED_V1_ID: "Examples (v1 scenes)"}


def _examples(ui: dict[str, Any], models: list[str]) -> None:
    """One group of examples per example set; only the default model's is visible (the examples follow
    the chosen model: `recap.studio.ui.examples.wire_examples`). The default's group is ``#examples``."""
    ui["example_groups"] = {}
    for index, (key, rows) in enumerate(ui["example_sets"].items()):
        with gr.Column(visible=index == 0, elem_id=f"examples-group-{index}") as group:
            if rows:
                gr.Examples(
                    rows,
                    inputs=[ui["image"], ui["prompt"]],
                    label=EXAMPLE_LABELS.get(key, "Examples"),
                    elem_id="examples" if index == 0 else f"examples-{index}",
                    examples_per_page=4,
                )
        ui["example_groups"][key] = group


#: Above a table wider than a phone's screen (shown on narrow screens only: studio.css).
NARROW_HINT = '<p class="recap-hint">The table is wider than the screen: swipe it sideways.</p>'


def blank_seed(demo: gr.Blocks, ui: dict[str, Any]) -> None:
    """Blank the seed box as the page loads, in the browser (no server call, no API endpoint):
    gradio's number box shows and sends 0 for a None value, which would seed every sampled run."""
    demo.load(None, None, ui["seed"], js="() => null", queue=False, api_visibility="private")


def fixed_budget_slider(mode: object) -> gr.Slider:
    """The fixed budget's slider, usable only when the tree budget is fixed."""
    return gr.Slider(interactive=mode == "fixed")


def _advanced(ui: dict[str, Any], scopes: tuple[str, ...]) -> None:
    with gr.Row():
        ui["budget_mode"] = gr.Radio(
            list(BUDGET_MODES),
            value="auto",
            label="Tree budget",
            info="auto: sized from the measured cost of a tree pass and of drafting (timings: two runs "
            "may grow different trees, with the same answer)",
        )
        ui["budget"] = gr.Slider(
            *BUDGET_RANGE, value=16, step=1, label="Fixed budget (nodes)", info="with a fixed tree budget",
            interactive=False, elem_id="fixed-budget",
        )  # fmt: skip
    # the slider is read only in fixed mode: usable only then (the API's value is checked either way)
    ui["budget_mode"].change(
        fixed_budget_slider, ui["budget_mode"], ui["budget"], queue=False, api_visibility="private"
    )
    with gr.Row():
        ui["depth"] = gr.Slider(*DEPTH_RANGE, value=RecapConfig().depth, step=1, label="Max depth")
        ui["k"] = gr.Slider(*K_RANGE, value=RecapConfig().k, step=1, label="k (top-k per record)")
        ui["max_new_tokens"] = gr.Slider(*MAX_NEW_TOKENS_RANGE, value=64, step=1, label="Max new tokens")
    with gr.Row(elem_id="memories-used"):  # (studio.css: a phone's row wraps them, labels whole)
        ui["use_persistent"] = gr.Checkbox(True, label="persistent memory (1-token)")
        ui["use_context"] = gr.Checkbox(True, label="contextual memories (2/3-token)")
        ui["suffix"] = gr.Checkbox(True, label="suffix matching")
    with gr.Row(elem_id="sampling"):
        ui["temperature"] = gr.Slider(
            *TEMPERATURE_RANGE,
            value=0.0,
            step=0.05,
            label="Temperature",
            info="0 = greedy",
            elem_id="temperature",
        )
        ui["top_k"] = gr.Slider(*TOP_K_RANGE, value=0, step=1, label="Top-k", info="0 = off", elem_id="top-k")
    with gr.Row():  # two a row: four in one cut the sliders' end labels (top-k's 1000 read "10")
        ui["top_p"] = gr.Slider(
            *TOP_P_RANGE, value=1.0, step=0.01, label="Top-p", info="1 = off", elem_id="top-p"
        )
        ui["seed"] = gr.Number(
            value=None,  # (gradio's box shows and sends 0 for None: `blank_seed` blanks it on load)
            precision=0,
            minimum=SEED_RANGE[0],
            maximum=SEED_RANGE[1],
            label="Seed",
            info="blank = random",
            elem_id="seed",
        )
    with gr.Row():
        ui["scope"] = gr.Radio(
            list(scopes),
            value=SESSION_SCOPE,
            label="Persistent memory scope",
            info="per session: yours alone"
            + ("; process-wide: shared by every visitor" if SHARED_SCOPE in scopes else ""),
            interactive=len(scopes) > 1,
            elem_id="scope",
        )
        ui["delay_ms"] = gr.Slider(
            *DELAY_MS_RANGE,
            value=60,
            step=10,
            label="Display delay per step (ms)",
            info=f"to watch the steps (the first {MAX_TOTAL_DELAY_S:.0f} s of a run); "
            "not counted in tokens/s",
            elem_id="delay",
        )


def _led_by_held_out(elem_id: str, intro: str) -> gr.Markdown:
    """The head of the Compare and Sensitivity tabs: the held-out figure (`measure.held_out_line`), the
    distribution over held-out scenes first, so that the input below reads as one sample of it; then
    the tab's ``intro`` on this input. Returns the figure's component, which follows the chosen model
    (`recap.studio.ui.compare`, `recap.studio.ui.sensitivity_tab`)."""
    summary = gr.Markdown(measure.held_out_line(DEFAULT_MODEL_ID), label="Held-out summary", elem_id=elem_id)
    gr.Markdown(intro)
    return summary


def _wide_table(headers: list[str], elem_id: str) -> gr.Dataframe:
    """A table of methods that may be wider than a phone's screen, with the hint to swipe it."""
    gr.HTML(NARROW_HINT, elem_classes="recap-narrow-only", padding=False)
    return gr.Dataframe(
        headers=headers, interactive=False, label="Methods", show_label=False, elem_id=elem_id, wrap=True
    )


def compare_tab() -> dict[str, Any]:
    with gr.Column():
        summary = _led_by_held_out(
            "compare-summary",
            "**This input, every method:** AR, PLD, TR, SuffixDecoding (where installed) and RECAP on the "
            "Run tab's image, prompt and model, greedy, timed like the benchmark. Every method starts "
            "empty and those with memories are warmed on the *same* few requests (never this input); "
            "your session's memory is not used.",
        )
        with gr.Row():
            budgets = gr.Radio(
                list(measure.BUDGET_CHOICES),
                value=measure.EQUAL,
                label="Tree budgets",
                info="equal: the same node count for every tree method (Token Recycling's template "
                "size); or each method's own choice on this device (RECAP auto, SuffixDecoding its "
                "authors' default)",
                elem_id="compare-budgets",
            )
            button = gr.Button("Compare methods", variant="primary", elem_id="compare-button")
            stop = gr.Button("Stop", variant="stop", elem_id="compare-stop", scale=0, min_width=90)
        status = gr.Markdown("", label="Status", show_label=False, elem_id="compare-status")
        table = _wide_table(measure.HEADERS, "compare-table")
        story = gr.HTML("", label="Story", elem_id="compare-story")
        gr.HTML(NARROW_HINT.replace("table", "strip"), elem_classes="recap-narrow-only", padding=False)
        strip = gr.HTML(render.compare_strip_html({}), label="Strip", elem_id="compare-strip")
    return {
        "button": button,
        "stop": stop,
        "budgets": budgets,
        "status": status,
        "table": table,
        "summary": summary,
        "story": story,
        "strip": strip,
    }


def sensitivity_tab() -> dict[str, Any]:
    with gr.Column():
        summary = _led_by_held_out(
            "sensitivity-summary",
            "**This input:** one pass over the same answer with **another image** marks the tokens whose "
            "greedy prediction depends on the image; then each method's drafting is split at those "
            "tokens, counted where its answer agrees with the first one. It reads the last run of the Run "
            "tab (or the last comparison, when it matches that run): run a generation first.",
        )
        with gr.Row():
            other = gr.Dropdown(
                # "scene_3.png" is shown as "example scene 3"; the value sent stays the file's name
                [
                    (c if c == BLANK_IMAGE else f"example {Path(c).stem.replace('_', ' ')}", c)
                    for c in other_image_choices()
                ],
                value=BLANK_IMAGE,
                label="Replace the image with",
                elem_id="other-image",
            )
            button = gr.Button("Find image-sensitive tokens", variant="primary", elem_id="sensitivity-button")
        status = gr.Markdown("", label="Status", show_label=False, elem_id="sensitivity-status")
        answer = gr.HighlightedText(
            label="Answer: image-sensitive tokens",
            color_map=render.highlight_color_map(sensitivity=True),
            show_legend=True,
            combine_adjacent=False,
            elem_id="sensitive-answer",
        )
        table = _wide_table(tables.SENSITIVITY_HEADERS, "sensitivity-table")
    return {
        "other": other,
        "button": button,
        "status": status,
        "answer": answer,
        "table": table,
        "summary": summary,
    }
