"""RECAP Studio: a Gradio app that shows every step of speculative decoding for vision-language models.

Layout and wiring only: decoding lives in `recap.decode`, pictures in `recap.viz`. Importing this
module builds nothing and loads no model; ``python app.py`` builds the Blocks and serves them.

Environment (read here and nowhere else):
- ``RECAP_MODEL``: the model selected by default (``embedded`` = the tiny model shipped in assets/);
- ``RECAP_MODELS``: comma-separated extra hub ids / local directories to offer (the paper's models are
  offered anyway when a GPU is present);
- ``RECAP_OFFLINE``: if set, never contact the Hugging Face hub (``HF_HUB_OFFLINE=1``), so an unknown
  id fails at once with a clear message instead of waiting on the network;
- ``RECAP_DTYPE``: model dtype (float32/bfloat16/float16; default bf16 on GPU, fp32 on CPU);
- ``RECAP_THREADS``: torch CPU threads (default 1: faster than 2 on small shared machines);
- ``RECAP_CONCURRENCY``: runs served at once per event (default 4; a model still computes one pass at
  a time: the passes of concurrent visitors interleave);
- ``GRADIO_SERVER_NAME`` / ``GRADIO_SERVER_PORT``: where to listen (default 127.0.0.1:7860).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import torch
from PIL import Image, UnidentifiedImageError

from recap import viz
from recap.config import RecapConfig
from recap.decode import generate_steps
from recap.drafters.token_recycling import SuccessorMatrix
from recap.inputs import MAX_IMAGE_PIXELS, check_max_new_tokens, check_prompt, load_image
from recap.memory import PersistentMemory
from recap.runtime import EMBEDDED_MODEL, Runtime, parse_budget
from recap.sensitivity import mark_steps, sensitive_flags
from recap.trace import RunTrace, StepRecord

log = logging.getLogger("recap.app")

ROOT = Path(__file__).resolve().parent
EXAMPLES_DIR = ROOT / "assets" / "examples"
STATIC_DIR = ROOT / "assets" / "static"

EMBEDDED_ID = "embedded"
PAPER_MODELS = (
    "Qwen/Qwen2.5-VL-7B-Instruct",
    "Qwen/Qwen2.5-VL-3B-Instruct",
    "llava-hf/llava-v1.6-vicuna-7b-hf",
)
#: Methods offered in the Run tab, in the order of the radio buttons; Compare runs them all.
METHODS = ("recap", "tr", "pld", "ar")
SCOPES = ("process-wide", "per session")
BLANK_IMAGE = "blank (grey)"
#: Minimum seconds between two streamed UI updates when no display delay is asked for.
MIN_UPDATE_INTERVAL = 0.1

RuntimeFactory = Callable[[str], Runtime]


# ------------------------------------------------------------------------------------ environment
def configure_environment() -> None:
    """Apply ``RECAP_OFFLINE`` and ``RECAP_THREADS``. Idempotent; called by `build_demo`."""
    if os.environ.get("RECAP_OFFLINE"):
        os.environ["HF_HUB_OFFLINE"] = "1"
        import huggingface_hub.constants as hub_constants

        # The hub library read the variable at import time (gradio imported it): update the constant too.
        hub_constants.HF_HUB_OFFLINE = True
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, int(os.environ.get("RECAP_THREADS", "1"))))


def offered_models() -> list[str]:
    """Model ids for the dropdown: the embedded model, the paper's models on a GPU, ``RECAP_MODELS``."""
    models = [EMBEDDED_ID]
    if torch.cuda.is_available():
        models += PAPER_MODELS
    models += [m.strip() for m in os.environ.get("RECAP_MODELS", "").split(",") if m.strip()]
    default = os.environ.get("RECAP_MODEL")
    if default:
        models.insert(0, default)
    return list(dict.fromkeys(models))


def default_runtime_factory(model_id: str) -> Runtime:
    """Load ``model_id`` (``embedded`` = the model in assets/) on the default device and dtype."""
    path = str(EMBEDDED_MODEL) if model_id == EMBEDDED_ID else model_id
    if model_id == EMBEDDED_ID and not (EMBEDDED_MODEL / "config.json").is_file():
        raise ValueError(
            f"the embedded model is missing from {EMBEDDED_MODEL} "
            "(train it with python -m recap.train_embedded)"
        )
    return Runtime.load(path, dtype=os.environ.get("RECAP_DTYPE"))


def model_label(model_id: str) -> str:
    return "tiny-scenes-llava (embedded, CPU)" if model_id == EMBEDDED_ID else model_id


# ---------------------------------------------------------------------------------- shared models
class RuntimeCache:
    """Loaded models, shared by all visitors: each loads once (concurrent first requests wait for it),
    and each has a lock so that one target pass runs at a time per model.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtimes: dict[str, Runtime] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._passes: dict[str, threading.Lock] = {}

    def loaded(self, model_id: str) -> Runtime | None:
        with self._lock:
            return self._runtimes.get(model_id)

    def get(self, model_id: str, factory: RuntimeFactory) -> Runtime:
        """The runtime of ``model_id``, loading it with ``factory`` on first use (ValueError if it can't)."""
        with self._lock:
            loading = self._loading.setdefault(model_id, threading.Lock())
        with loading:
            runtime = self.loaded(model_id)
            if runtime is None:
                start = time.perf_counter()
                runtime = factory(model_id)
                log.info("loaded %s in %.1f s", model_id, time.perf_counter() - start)
                with self._lock:
                    self._runtimes[model_id] = runtime
                    self._passes[model_id] = threading.Lock()
            return runtime

    def pass_lock(self, model_id: str) -> threading.Lock:
        with self._lock:
            return self._passes.setdefault(model_id, threading.Lock())


_CACHE = RuntimeCache()

try:  # ZeroGPU: a no-op decorator unless the Space runs on ZeroGPU hardware
    import spaces

    _gpu = spaces.GPU
except ImportError:  # pragma: no cover - depends on the host

    def _gpu(function):
        return function


@_gpu
def decode_steps(runtime: Runtime, drafter, prompt: str, images: list, max_new_tokens: int, method: str):
    """The GPU-bound generator: `generate_steps` on ``runtime``'s model (yields picklable StepRecords)."""
    yield from generate_steps(runtime.target, drafter, prompt, images, max_new_tokens, method)


# ------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class RunSettings:
    """What a visitor chose in the Run tab (validated by `config` / `validate`)."""

    model: str
    method: str
    budget_mode: str
    budget: int
    depth: int
    k: int
    use_persistent: bool
    use_context: bool
    suffix: bool
    max_new_tokens: int
    scope: str

    def config(self) -> RecapConfig:
        """The drafter config; raises ValueError for impossible combinations."""
        budget = parse_budget("auto" if self.budget_mode == "auto" else int(self.budget))
        return RecapConfig(
            budget=budget,
            depth=int(self.depth),
            k=int(self.k),
            use_persistent=bool(self.use_persistent),
            use_context=bool(self.use_context),
            suffix=bool(self.suffix),
        )

    def validate(self) -> RecapConfig:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.scope not in SCOPES:
            raise ValueError(f"unknown memory scope {self.scope!r}")
        check_max_new_tokens(int(self.max_new_tokens))
        return self.config()


def image_path(value: str | dict | None) -> str | None:
    """The file path of a raw ``gr.Image`` value (events run with ``preprocess=False``, see `_wire_run`)."""
    if isinstance(value, dict):
        return value.get("path")
    return value or None


def read_image(path: str | None, needs_image: bool) -> Image.Image | None:
    """The visitor's image, validated; warns (and continues) when it must be downscaled."""
    if not path:
        if needs_image:
            raise gr.Error("This is a vision model: upload an image or pick an example first.")
        return None
    try:
        with Image.open(path) as opened:
            width, height = opened.size
    except (UnidentifiedImageError, OSError):
        raise gr.Error("That file is not an image this app can read (use PNG, JPEG or WebP).") from None
    if width * height > MAX_IMAGE_PIXELS:
        gr.Warning(f"The image is {width}x{height} pixels; it is downscaled to about 1 megapixel.")
    try:
        return load_image(path)
    except ValueError as error:
        raise gr.Error(str(error)) from None


def drafter_for(runtime: Runtime, settings: RunSettings, method: str, config: RecapConfig, session: dict):
    """A drafter whose persistent memories follow the chosen scope (process-wide or this session's)."""
    persistent = successors = None
    if settings.scope == "per session":
        memories = session.setdefault(settings.model, {})
        if memories.get("k") != config.k:
            memories.update(k=config.k, persistent=PersistentMemory(runtime.target.vocab_size, config.k))
        memories.setdefault("successors", SuccessorMatrix(runtime.target.vocab_size))
        persistent, successors = memories["persistent"], memories["successors"]
    try:
        return runtime.drafter(method, config=config, persistent=persistent, successors=successors)
    except ValueError as error:
        hint = (
            " (choose the per-session memory scope to use another k)"
            if "holds a memory" in str(error)
            else ""
        )
        raise gr.Error(f"{error}{hint}") from None


def examples() -> list[list[str]]:
    """``[image path, prompt]`` rows from assets/examples/prompts.json (empty if it is not there yet)."""
    try:
        entries = json.loads((EXAMPLES_DIR / "prompts.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [
        [str(EXAMPLES_DIR / e["image"]), e["prompt"]]
        for e in entries
        if (EXAMPLES_DIR / e["image"]).is_file()
    ]


def photo_examples() -> list[list[str]]:
    """A few real photos (scikit-image's public-domain data) for real models; empty without skimage."""
    try:
        from skimage import data
    except ImportError:
        return []
    folder = Path(tempfile.gettempdir()) / "recap-studio-photos"
    folder.mkdir(exist_ok=True)
    rows = []
    for name, prompt in (
        ("astronaut", "Describe this image."),
        ("coffee", "What is on the table?"),
        ("chelsea", "What animal is this and what colour is it?"),
    ):
        path = folder / f"{name}.png"
        if not path.is_file():
            Image.fromarray(getattr(data, name)()).save(path)
        rows.append([str(path), prompt])
    return rows


def other_image_choices() -> list[str]:
    return [BLANK_IMAGE] + [Path(row[0]).name for row in examples()]


def other_image(choice: str, like: Image.Image | None) -> Image.Image:
    """The replacement image of the sensitivity pass: an example scene, or a blank grey image."""
    if choice != BLANK_IMAGE and (EXAMPLES_DIR / choice).is_file():
        return load_image(EXAMPLES_DIR / choice)
    return Image.new("RGB", like.size if like is not None else (64, 64), (128, 128, 128))


#: Exported traces older than this are deleted at the next export (gradio keeps its own copy).
TRACE_MAX_AGE_S = 3600


def export_trace(trace: RunTrace) -> str:
    """Write ``trace`` to a fresh file for the download button, after pruning old exports."""
    folder = Path(tempfile.gettempdir()) / "recap-studio-traces"
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.json"):
        if time.time() - old.stat().st_mtime > TRACE_MAX_AGE_S:
            old.unlink(missing_ok=True)
    handle, path = tempfile.mkstemp(
        prefix=f"recap-run-{trace.settings.get('method', 'run')}-", suffix=".json", dir=folder
    )
    os.close(handle)
    trace.save(path)
    return path


# ------------------------------------------------------------------------------------------ studio
class Studio:
    """Event handlers. Holds only shared things (the model factory); per-visitor data is in gr.State."""

    def __init__(
        self, runtime_factory: RuntimeFactory, models: list[str], cache: RuntimeCache = _CACHE
    ) -> None:
        self.factory = runtime_factory
        self.models = list(models)
        self.cache = cache

    def runtime(self, model_id: str) -> Runtime:
        try:
            return self.cache.get(model_id, self.factory)
        except ValueError as error:
            message = str(error)
            if not message.lower().startswith("cannot load model"):
                message = f"cannot load model {model_id!r}: {message}"
            raise gr.Error(message[0].upper() + message[1:]) from None

    def stream(
        self, runtime: Runtime, model_id: str, drafter, prompt: str, images: list, max_new: int, method: str
    ) -> Iterator[StepRecord]:
        """Steps of one generation; the model's pass lock is held during each pass only (interleaving)."""
        lock = self.cache.pass_lock(model_id)
        steps = decode_steps(runtime, drafter, prompt, images, max_new, method)
        while True:
            with lock:
                try:
                    record = next(steps)
                except StopIteration:
                    return
                except ValueError as error:
                    raise gr.Error(str(error)) from None
                except Exception as error:  # keep serving: report, log, and end this request only
                    log.exception("generation failed")
                    raise gr.Error(f"Generation failed: {type(error).__name__}: {error}") from None
            yield record

    def prepare(self, image, prompt, settings: RunSettings):
        """Validate everything, then load the model: ``(runtime, config, prompt, images)``."""
        if settings.model not in self.models:
            raise gr.Error(f"Unknown model {settings.model!r}: choose one from the list.")
        try:
            config = settings.validate()
            prompt = check_prompt(prompt)
        except ValueError as error:
            raise gr.Error(str(error)) from None
        runtime = self.runtime(settings.model)
        image = read_image(image_path(image), needs_image=runtime.target.family != "text")
        return runtime, config, prompt, [image] if image is not None else []


def _settings(*values) -> RunSettings:
    return RunSettings(*values)


def build_demo(runtime_factory: RuntimeFactory | None = None, models: list[str] | None = None) -> gr.Blocks:
    """Build the studio's Blocks (nothing is loaded until a visitor runs something).

    ``runtime_factory(model_id) -> Runtime`` replaces the hub/disk loader (tests inject tiny models);
    ``models`` replaces the offered model ids (the first is the default).
    """
    configure_environment()
    models = models or offered_models()
    studio = Studio(runtime_factory or default_runtime_factory, models)
    # delete_cache: gradio's copies of uploads and downloads older than a day go, checked hourly
    with gr.Blocks(title="RECAP Studio", delete_cache=(3600, 86400)) as demo:
        session = gr.State({})  # this visitor's per-session memories, by model id
        run_state = gr.State(None)  # {"trace": RunTrace, "image": PIL | None, "prompt": str}
        compare_state = gr.State(None)  # {"runs": {method: steps}, "key": (...)}
        gr.Markdown(
            "# RECAP Studio\nSpeculative decoding that **recycles** the target model's own predictions: "
            "a tree of guesses is verified in one pass, and the answer is exactly what greedy decoding "
            "would write. Every token below is coloured by what proposed it.",
            elem_id="recap-header",
        )
        with gr.Tabs():
            with gr.Tab("Run", id="run"):
                ui = _run_tab(models)
            with gr.Tab("Compare", id="compare"):
                cmp = _compare_tab()
            with gr.Tab("Image sensitivity", id="sensitivity"):
                sens = _sensitivity_tab()
            with gr.Tab("About", id="about"):
                gr.Markdown(_ABOUT)
        setting_inputs = [
            ui[name]
            for name in (
                "model",
                "method",
                "budget_mode",
                "budget",
                "depth",
                "k",
                "use_persistent",
                "use_context",
                "suffix",
                "max_new_tokens",
                "scope",
            )
        ]
        _wire_run(studio, ui, setting_inputs, session, run_state)
        _wire_compare(studio, ui, cmp, setting_inputs, session, compare_state)
        _wire_sensitivity(studio, ui, sens, run_state, compare_state)
        _wire_replay(ui, ui["replay"], run_state)
    return demo


def _run_tab(models: list[str]) -> dict[str, Any]:
    ui: dict[str, Any] = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=420):
            with gr.Row():
                rows = examples() + (photo_examples() if len(models) > 1 else [])
                first = rows[0] if rows else [None, ""]  # start filled in: one click on Run shows everything
                ui["image"] = gr.Image(
                    value=first[0], type="filepath", label="Image", height=230, elem_id="input-image"
                )
                with gr.Column():
                    ui["prompt"] = gr.Textbox(
                        value=first[1],
                        label="Prompt",
                        lines=2,
                        placeholder="Ask about the image…",
                        elem_id="prompt",
                    )
                    ui["model"] = gr.Dropdown(
                        [(model_label(m), m) for m in models], value=models[0], label="Model", elem_id="model"
                    )
                    ui["method"] = gr.Radio(
                        [(viz.method_label(m), m) for m in METHODS],
                        value="recap",
                        label="Method",
                        elem_id="method",
                    )
            with gr.Row():
                ui["run"] = gr.Button("Run", variant="primary", elem_id="run-button")
                ui["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-button")
                ui["reset"] = gr.Button("Reset persistent memory", elem_id="reset-button")
            ui["status"] = gr.Markdown("", elem_id="status")
            ui["answer"] = gr.HighlightedText(
                label="Answer: each token coloured by what proposed it",
                color_map=viz.highlight_color_map(),
                show_legend=True,
                combine_adjacent=False,
                elem_id="answer",
            )
            ui["stats"] = gr.HTML(viz.stats_html([]), elem_id="stats")
            ui["passes"] = gr.Plot(label="Tokens per target pass", elem_id="passes-plot")
            if rows:
                gr.Examples(
                    rows,
                    inputs=[ui["image"], ui["prompt"]],
                    label="Examples",
                    elem_id="examples",
                    examples_per_page=4,
                )
            with gr.Accordion("Advanced settings", open=False):
                with gr.Row():
                    ui["budget_mode"] = gr.Radio(
                        ["auto", "fixed"],
                        value="auto",
                        label="Tree budget",
                        info="auto: sized from the measured cost of a tree pass",
                    )
                    ui["budget"] = gr.Slider(0, 128, value=16, step=1, label="Fixed budget (nodes)")
                with gr.Row():
                    ui["depth"] = gr.Slider(1, 16, value=8, step=1, label="Max depth")
                    ui["k"] = gr.Slider(1, 16, value=8, step=1, label="k (top-k per record)")
                    ui["max_new_tokens"] = gr.Slider(1, 512, value=64, step=1, label="Max new tokens")
                with gr.Row():
                    ui["use_persistent"] = gr.Checkbox(True, label="persistent memory (1-token)")
                    ui["use_context"] = gr.Checkbox(True, label="contextual memories (2/3-token)")
                    ui["suffix"] = gr.Checkbox(True, label="suffix matching")
                with gr.Row():
                    ui["scope"] = gr.Radio(list(SCOPES), value=SCOPES[0], label="Persistent memory scope")
                    ui["delay_ms"] = gr.Slider(
                        0,
                        500,
                        value=60,
                        step=10,
                        label="Display delay per step (ms)",
                        info="to watch the steps; not counted in tokens/s",
                        elem_id="delay",
                    )
            with gr.Row():
                ui["download"] = gr.DownloadButton(
                    "Download run (JSON)", interactive=False, elem_id="download"
                )
                ui["replay"] = gr.File(
                    label="Replay a run (JSON, no model)",
                    file_types=[".json"],
                    type="filepath",
                    height=90,
                    elem_id="replay-file",
                )
        with gr.Column(scale=4, min_width=380, elem_id="step-panel"):
            gr.Markdown("### Inspect a step")
            ui["step"] = gr.Slider(
                0, 1, value=0, step=1, label="Step", interactive=False, elem_id="step-slider"
            )
            ui["tree"] = gr.Plot(label="Candidate tree", elem_id="tree-plot")
            ui["fused"] = gr.Plot(label="Drafter's distribution at the root", elem_id="fused-plot")
            ui["step_table"] = gr.Dataframe(
                headers=viz.STEP_TABLE_HEADERS, interactive=False, elem_id="step-table"
            )
    return ui


def _compare_tab() -> dict[str, Any]:
    with gr.Column():
        gr.Markdown(
            "Runs the Run tab's image, prompt and model through **AR, PLD, TR and RECAP** "
            "(after a short warm-up) and compares them."
        )
        button = gr.Button("Compare methods", variant="primary", elem_id="compare-button")
        status = gr.Markdown("")
        table = gr.Dataframe(headers=viz.COMPARE_HEADERS, interactive=False, elem_id="compare-table")
        strip = gr.HTML(viz.compare_strip_html({}), elem_id="compare-strip")
    return {"button": button, "status": status, "table": table, "strip": strip}


def _sensitivity_tab() -> dict[str, Any]:
    with gr.Column():
        gr.Markdown(
            "One teacher-forced pass with **another image** marks the tokens whose greedy prediction "
            "depends on the image; then each method's drafting is split at those tokens "
            "(uses the last comparison when it matches the last run)."
        )
        with gr.Row():
            other = gr.Dropdown(
                other_image_choices(),
                value=BLANK_IMAGE,
                label="Replace the image with",
                elem_id="other-image",
            )
            button = gr.Button("Find image-sensitive tokens", variant="primary", elem_id="sensitivity-button")
        status = gr.Markdown("")
        answer = gr.HighlightedText(
            label="Answer: image-sensitive tokens",
            color_map=viz.highlight_color_map(sensitivity=True),
            show_legend=True,
            combine_adjacent=False,
            elem_id="sensitive-answer",
        )
        table = gr.Dataframe(headers=viz.SENSITIVITY_HEADERS, interactive=False, elem_id="sensitivity-table")
    return {"other": other, "button": button, "status": status, "answer": answer, "table": table}


# ----------------------------------------------------------------------------------------- wiring
def _step_view(steps: list[StepRecord], index: int) -> tuple:
    """Tree figure, fused figure and table of step ``index`` (clamped)."""
    index = max(0, min(int(index), len(steps) - 1))
    step = steps[index]
    root_text = steps[index - 1].new_texts[-1] if index > 0 and steps[index - 1].new_texts else None
    return viz.tree_figure(step, root_text=root_text), viz.fused_figure(step), viz.step_table(step)


def _wire_run(studio: Studio, ui: dict, setting_inputs: list, session, run_state) -> None:
    outputs = [
        ui[n]
        for n in ("answer", "stats", "passes", "step", "tree", "fused", "step_table", "status", "download")
    ] + [run_state, session]

    def run(image, prompt, *rest):
        *values, delay_ms, memories = rest
        settings = _settings(*values)
        memories = memories if isinstance(memories, dict) else {}
        if studio.cache.loaded(settings.model) is None:
            yield {ui["status"]: f"Loading {model_label(settings.model)} (first use, once per server)…"}
        runtime, config, prompt, images = studio.prepare(image, prompt, settings)
        drafter = drafter_for(runtime, settings, settings.method, config, memories)
        steps: list[StepRecord] = []
        trace = RunTrace(settings={**asdict(settings), "prompt": prompt}, steps=steps)
        state = {
            "trace": trace,
            "image": images[0] if images else None,
            "prompt": prompt,
            "model": settings.model,
            "key": (settings.model, prompt, image_path(image)),
        }
        last_update = 0.0
        started = time.perf_counter()
        for record in studio.stream(
            runtime, settings.model, drafter, prompt, images, int(settings.max_new_tokens), settings.method
        ):
            steps.append(record)
            now = time.perf_counter()
            if delay_ms or record.finished or now - last_update >= MIN_UPDATE_INTERVAL or len(steps) == 1:
                if len(steps) == 1:
                    log.info("first token after %.0f ms", 1000 * (now - started))
                yield _run_update(
                    ui, steps, f"Generating… step {record.step}", state, memories, run_state, session
                )
                last_update = time.perf_counter()
                if delay_ms:
                    time.sleep(float(delay_ms) / 1000)
        trace.text = runtime.target.decode(trace.tokens)
        reason = steps[-1].finish_reason if steps else None
        done = f"Done: {len(trace.tokens)} tokens in {len(steps)} target passes ({reason or 'stopped'})."
        update = _run_update(ui, steps, done, state, memories, run_state, session)
        update[ui["download"]] = gr.DownloadButton(value=export_trace(trace), interactive=True)
        update[ui["step"]] = gr.Slider(
            minimum=0, maximum=max(1, len(steps) - 1), value=len(steps) - 1, interactive=True
        )
        yield update

    event = ui["run"].click(
        run,
        [ui["image"], ui["prompt"], *setting_inputs, ui["delay_ms"], session],
        outputs,
        concurrency_limit=int(os.environ.get("RECAP_CONCURRENCY", "4")),
        concurrency_id="decode",
        api_name="run",
        preprocess=False,  # so that a file that is not an image reaches read_image and gets a clear message
    )
    ui["stop"].click(
        lambda: "Stopped: the answer so far is kept; press Run to start again.",
        None,
        ui["status"],
        cancels=[event],
        queue=False,
        api_visibility="private",
    )

    def scrub(state, index):
        if not state or not state["trace"].steps:
            return gr.skip(), gr.skip(), gr.skip()
        return _step_view(state["trace"].steps, index)

    ui["step"].input(
        scrub,
        [run_state, ui["step"]],
        [ui["tree"], ui["fused"], ui["step_table"]],
        api_name="step",
        show_progress="hidden",
        trigger_mode="always_last",  # while dragging, render the latest position, not every one
    )
    ui["step"].release(
        scrub,
        [run_state, ui["step"]],
        [ui["tree"], ui["fused"], ui["step_table"]],
        api_visibility="private",
        show_progress="hidden",
    )

    def reset(model_id, scope, k, memories):
        memories = memories if isinstance(memories, dict) else {}
        if scope == "per session":
            memories.pop(model_id, None)
            gr.Info("This session's persistent memories are cleared.")
            return memories
        runtime = studio.cache.loaded(model_id)
        if runtime is None:
            gr.Info("The model has not run yet: its memories are empty.")
            return memories
        try:
            runtime.persistent_memory(int(k)).reset()
        except ValueError as error:
            raise gr.Error(str(error)) from None
        runtime.successor_matrix().reset()
        gr.Info("The process-wide persistent memory and Token Recycling matrix are cleared.")
        return memories

    ui["reset"].click(reset, [ui["model"], ui["scope"], ui["k"], session], [session], api_name="reset")


def _panels(ui: dict, steps: list[StepRecord], scrubbable: bool) -> dict:
    """The answer, stats and step panel showing the newest of ``steps``."""
    tree, fused, table = _step_view(steps, len(steps) - 1)
    return {
        ui["answer"]: viz.highlighted_answer(steps),
        ui["stats"]: viz.stats_html(steps),
        ui["passes"]: viz.passes_figure(steps),
        ui["step"]: gr.Slider(
            minimum=0, maximum=max(1, len(steps) - 1), value=len(steps) - 1, interactive=scrubbable
        ),
        ui["tree"]: tree,
        ui["fused"]: fused,
        ui["step_table"]: table,
    }


def _run_update(ui, steps, status, state, memories, run_state, session) -> dict:
    return {
        **_panels(ui, steps, scrubbable=False),
        ui["status"]: status,
        ui["download"]: gr.DownloadButton(interactive=False),
        run_state: state,
        session: memories,
    }


def _wire_compare(studio: Studio, ui: dict, cmp: dict, setting_inputs: list, session, compare_state) -> None:
    def compare(image, prompt, *values_and_session):
        *values, memories = values_and_session
        settings = _settings(*values)
        memories = memories if isinstance(memories, dict) else {}
        runtime, config, prompt, images = studio.prepare(image, prompt, settings)
        max_new = int(settings.max_new_tokens)
        # Warm-up, so the first timed method does not pay for lazy initialisation.
        warm = drafter_for(runtime, settings, "ar", config, memories)
        for _ in studio.stream(runtime, settings.model, warm, prompt, images, min(4, max_new), "ar"):
            pass
        runs: dict[str, list[StepRecord]] = {}
        walls: dict[str, float] = {}
        for method in ("ar", "pld", "tr", "recap"):
            yield {
                cmp["status"]: f"Running {viz.method_label(method)}…",
                compare_state: gr.skip(),
                cmp["table"]: viz.compare_rows(runs, walls) if runs else gr.skip(),
                cmp["strip"]: gr.skip(),
            }
            drafter = drafter_for(runtime, settings, method, config, memories)
            start = time.perf_counter()
            runs[method] = list(
                studio.stream(runtime, settings.model, drafter, prompt, images, max_new, method)
            )
            walls[method] = time.perf_counter() - start
        key = (settings.model, prompt, image_path(image))
        yield {
            cmp["status"]: "Done. Wall times include drafting; speedup is AR's time over each method's.",
            cmp["table"]: viz.compare_rows(runs, walls),
            cmp["strip"]: viz.compare_strip_html(runs),
            compare_state: {
                "runs": runs,
                "key": key,
                "image": images[0] if images else None,
                "prompt": prompt,
            },
        }

    cmp["button"].click(
        compare,
        [ui["image"], ui["prompt"], *setting_inputs, session],
        [cmp["status"], cmp["table"], cmp["strip"], compare_state],
        concurrency_limit=int(os.environ.get("RECAP_CONCURRENCY", "4")),
        concurrency_id="decode",
        api_name="compare",
        preprocess=False,
    )


def _wire_sensitivity(studio: Studio, ui: dict, sens: dict, run_state, compare_state) -> None:
    def sensitivity(state, compared, choice):
        if compared and state and compared["key"] != state.get("key"):
            compared = None  # the comparison was made on another input than the last run
        if not (compared or state):
            raise gr.Error("Run a generation (or a comparison) first.")
        if compared:
            runs, image, prompt, model_id = (
                compared["runs"],
                compared["image"],
                compared["prompt"],
                compared["key"][0],
            )
        else:
            runs = {state["trace"].settings.get("method", "run"): state["trace"].steps}
            image, prompt, model_id = state["image"], state["prompt"], state.get("model")
        runtime = studio.cache.loaded(model_id) if model_id else None
        if runtime is None:
            raise gr.Error("This needs the model that made the run (a replayed run has none loaded).")
        if image is None:
            raise gr.Error("The run had no image, so nothing can depend on it.")
        reference = next(iter(runs.values()))
        answer = [t for s in reference for t in s.new_tokens]
        with studio.cache.pass_lock(model_id):
            flags = sensitive_flags(runtime.target, [other_image(choice, image)], prompt, answer)
        for steps in runs.values():
            mark_steps(steps, flags)
        count = sum(flags)
        status = f"{count} of {len(flags)} tokens are image-sensitive (the first token is not counted below)."
        return viz.sensitivity_answer(reference, flags), viz.sensitivity_rows(runs, flags), status

    sens["button"].click(
        sensitivity,
        [run_state, compare_state, sens["other"]],
        [sens["answer"], sens["table"], sens["status"]],
        api_name="sensitivity",
    )


def _wire_replay(ui: dict, replay_file, run_state) -> None:
    def replay(path):
        if not path:
            return {run_state: gr.skip()}
        try:
            trace = RunTrace.load(path)
        except (ValueError, OSError, UnicodeDecodeError) as error:
            raise gr.Error(f"Cannot replay this file: {error}") from None
        if not trace.steps:
            raise gr.Error("Cannot replay this file: it has no steps.")
        steps = trace.steps
        method = viz.method_label(str(trace.settings.get("method", "?")))
        return {
            **_panels(ui, steps, scrubbable=True),
            ui["status"]: f"Replaying a recorded {method} run of {trace.settings.get('model', '?')} "
            f"({len(steps)} steps): scrub the steps on the right.",
            run_state: {
                "trace": trace,
                "image": None,
                "prompt": trace.settings.get("prompt", ""),
                "model": None,
            },
            # the trace holds no pixels: clear the image so it does not pose as the replayed run's input
            ui["image"]: None,
            ui["prompt"]: str(trace.settings.get("prompt", "")),
        }

    names = ("answer", "stats", "passes", "step", "tree", "fused", "step_table", "status", "image", "prompt")
    replay_file.upload(replay, [replay_file], [*(ui[n] for n in names), run_state], api_name="replay")


_ABOUT = """
### What you are looking at
- **Answer**: each token is coloured by what proposed it: `ctx3`/`ctx2` (this request's contextual
  memories, keyed by the last 3/2 tokens), `persistent` (the 1-token memory shared across requests),
  `suffix` (a continuation copied from an earlier occurrence), Token Recycling's `template`, prompt
  lookup's `lookup`, or `target`: the bonus token the model produced itself in a pass.
- **Inspect a step**: the candidate tree the drafter proposed (x = depth; colour = main source, outline =
  a second source; thick line = accepted path; faded = rejected; ◆ = bonus token), the fused distribution
  at the root stacked by source (★ = the token the target actually chose), and the step's timings.
- **Compare**: the same input through every method; outputs are identical to greedy decoding (fp32).
- **Image sensitivity**: tokens whose greedy prediction changes when the image is replaced.
- **Replay**: upload a downloaded run (below the answer) to inspect it without a model.

### The embedded model
`tiny-scenes-llava` (the CPU default) is a 2.4M-parameter LLaVA trained by this project on synthetic
64x64 scenes of 1-3 coloured shapes. On held-out scenes it answers "Describe the image.", "What colour
is the X?", "How many shapes are there?" and "Where is the X?" correctly (99-100%), so its answers
really depend on the image. It knows nothing else: a photo or another question gets a scene-style
answer. The paper's models (on a GPU) answer anything.
"""


def launch_kwargs() -> dict[str, Any]:
    """Theme, CSS and address for ``launch()`` (in Gradio 6, theme and css belong there)."""
    css_path = STATIC_DIR / "studio.css"
    return {
        "theme": gr.themes.Soft(primary_hue="blue"),
        "css": css_path.read_text(encoding="utf-8") if css_path.is_file() else None,
        "server_name": os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        "server_port": int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    build_demo().queue(default_concurrency_limit=int(os.environ.get("RECAP_CONCURRENCY", "4"))).launch(
        **launch_kwargs()
    )
