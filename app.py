"""RECAP Studio: a Gradio app that shows every step of speculative decoding for vision-language models.

Layout and wiring only: decoding lives in `recap.decode`, pictures in `recap.viz`. Importing this
module builds nothing and loads no model; ``python app.py`` builds the Blocks and serves them.

Every value reaching a handler is treated as hostile (the HTTP API accepts any JSON, not only what the
sliders allow): it is checked against the UI's bounds by small pure functions (`parse_settings`,
`uploaded_path`, `read_image`, ...), and every refusal is a `refusal` message without HTML or server
paths. Per-visitor data (memories, the last run) lives in ``gr.State``; a downloaded trace is written
when Download is clicked and removed when the session ends (`TraceExports`).

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
- ``RECAP_SHARED_MEMORY``: if ``1``, visitors may also choose the process-wide persistent memory, which
  every visitor of a model reads and writes (its drafts then show words from other visitors' answers).
  Unset (the default), every browser session has its own memories and nothing else;
- ``GRADIO_SERVER_NAME`` / ``GRADIO_SERVER_PORT``: where to listen (default 127.0.0.1:7860).
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import torch
from PIL import Image

from recap.config import RecapConfig
from recap.decode import generate_steps
from recap.drafters.token_recycling import SuccessorMatrix
from recap.inputs import (
    MAX_IMAGE_PIXELS,
    check_choice,
    check_flag,
    check_integer,
    check_number,
    check_prompt,
    image_size,
    load_image,
    shown,
)
from recap.memory import PersistentMemory
from recap.runtime import EMBEDDED_MODEL, Runtime, parse_budget
from recap.sensitivity import mark_steps, sensitive_flags
from recap.studio import figures
from recap.studio import render as viz
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
BUDGET_MODES = ("auto", "fixed")
SESSION_SCOPE, SHARED_SCOPE = "per session", "process-wide"
BLANK_IMAGE = "blank (grey)"
#: The Run tab's numeric controls as ``(low, high)``: the sliders' ranges, and the bounds the server
#: enforces on every request (an API caller sees no slider).
BUDGET_RANGE = (0, 128)
DEPTH_RANGE = (1, 16)
K_RANGE = (1, 16)
MAX_NEW_TOKENS_RANGE = (1, 512)
DELAY_MS_RANGE = (0, 500)
#: At most this many seconds of display delay per run: the steps after it stream at full speed, so no
#: request holds one of the run slots for long by asking for a slow display.
MAX_TOTAL_DELAY_S = 20.0
#: Minimum seconds between two streamed UI updates when no display delay is asked for.
MIN_UPDATE_INTERVAL = 0.1
#: Per-visitor state (memories, the last run) is freed after this long without a run.
SESSION_TTL_S = 2 * 3600
#: Exported traces older than this are deleted at the next export, for sessions that never end
#: cleanly (API clients); a browser session's exports go when its tab closes.
TRACE_MAX_AGE_S = 3600

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


def memory_scopes() -> tuple[str, ...]:
    """Persistent-memory scopes visitors may choose: their session's, and the shared one only when the
    operator sets ``RECAP_SHARED_MEMORY=1`` (a shared memory shows visitors each other's words)."""
    shared = os.environ.get("RECAP_SHARED_MEMORY", "").strip().lower() in ("1", "true", "yes")
    return (SESSION_SCOPE, SHARED_SCOPE) if shared else (SESSION_SCOPE,)


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


# ------------------------------------------------------------------------------------- messages
_SERVER_PATH = re.compile(r"(?<![\w.:/\\-])(?:[A-Za-z]:)?(?:[/\\][^\s/\\'\"<>|]+){2,}[/\\]?")


def without_paths(message: str) -> str:
    """``message`` with every absolute path of two or more parts shortened to its last part (``…/x.png``),
    so no error shows where the server keeps files (uploads, caches, models)."""
    return _SERVER_PATH.sub(lambda m: "…/" + re.split(r"[/\\]", m.group(0).rstrip("/\\"))[-1], message)


def refusal(message: str) -> gr.Error:
    """The error a visitor sees for ``message``: without server paths, and HTML-escaped, because gradio
    renders error toasts as HTML and messages echo values that visitors sent."""
    message = without_paths(message.strip()) or "Something went wrong."
    return gr.Error(html.escape(message, quote=False))


_MARKDOWN_PUNCTUATION = re.compile(r"([!-%'-/:<-@\[-`{-~])")  # ASCII punctuation except & and ;


def markdown_text(text: object, limit: int = 80) -> str:
    """``text`` (from a visitor or a trace) shown literally inside ``gr.Markdown``: one line, cut to
    ``limit`` characters, HTML-escaped and with Markdown punctuation backslash-escaped, so no tag,
    link, image or emphasis survives."""
    visible = viz.visible_token(str(text))
    visible = visible if len(visible) <= limit else visible[: limit - 1] + "…"
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(visible, quote=False))


# ------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class RunSettings:
    """What a visitor chose in the Run tab, checked against the UI's bounds by `parse_settings`."""

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
        """The drafter config; raises ValueError for impossible combinations (no memory enabled)."""
        return RecapConfig(
            budget=parse_budget("auto" if self.budget_mode == "auto" else self.budget),
            depth=self.depth,
            k=self.k,
            use_persistent=self.use_persistent,
            use_context=self.use_context,
            suffix=self.suffix,
        )


def parse_settings(values: list | tuple, models: list[str], scopes: tuple[str, ...]) -> RunSettings:
    """The Run tab's setting values, in `RunSettings` field order, checked against the UI's bounds.

    Raises ``ValueError`` naming the first bad value: a wrong type, NaN, an infinity, a value outside
    its slider, an unknown model, method or scope.
    """
    if len(values) != len(RunSettings.__dataclass_fields__):
        raise ValueError("the request does not carry the Run tab's settings")
    model, method, budget_mode, budget, depth, k, persistent, context, suffix, max_new, scope = values
    if not isinstance(model, str) or model not in models:
        raise ValueError(f"unknown model {shown(model)}: choose one from the list")
    if scope == SHARED_SCOPE and scope not in scopes:
        raise ValueError("the process-wide memory scope is not offered on this server")
    return RunSettings(
        model=model,
        method=check_choice("method", method, METHODS),
        budget_mode=check_choice("tree budget", budget_mode, BUDGET_MODES),
        budget=check_integer("fixed budget", budget, *BUDGET_RANGE),
        depth=check_integer("max depth", depth, *DEPTH_RANGE),
        k=check_integer("k", k, *K_RANGE),
        use_persistent=check_flag("persistent memory", persistent),
        use_context=check_flag("contextual memories", context),
        suffix=check_flag("suffix matching", suffix),
        max_new_tokens=check_integer("max new tokens", max_new, *MAX_NEW_TOKENS_RANGE),
        scope=check_choice("memory scope", scope, scopes),
    )


def display_delay_s(value: object) -> float:
    """The display delay per step in seconds, from the slider's milliseconds (checked against its range)."""
    return check_number("display delay (ms)", value, *DELAY_MS_RANGE) / 1000.0


def uploaded_path(value: object, roots: list[Path]) -> Path | None:
    """The file of a raw ``gr.Image`` value (events run with ``preprocess=False``), or None.

    The value is what the request carried: only a path inside one of ``roots`` (gradio's upload cache,
    the bundled examples) is accepted, so a request cannot make the server read a file of its choosing.
    """
    if value is None or value == "":
        return None
    path = value.get("path") if isinstance(value, dict) else value
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError("the image must be a file uploaded to this studio")
    resolved = Path(path).resolve()
    if not any(resolved.is_relative_to(root.resolve()) for root in roots):
        raise ValueError("the image must be a file uploaded to this studio")
    return resolved


def read_image(path: Path | str | None, needs_image: bool) -> Image.Image | None:
    """The visitor's image, validated; warns (and continues) when it must be downscaled."""
    if not path:
        if needs_image:
            raise refusal("This is a vision model: upload an image or pick an example first.")
        return None
    try:
        width, height = image_size(path)
        if width * height > MAX_IMAGE_PIXELS:
            gr.Warning(f"The image is {width}x{height} pixels; it is downscaled to about 1 megapixel.")
        return load_image(path)
    except ValueError as error:
        raise refusal(f"That file cannot be used: {error}.") from None


def drafter_for(runtime: Runtime, settings: RunSettings, method: str, config: RecapConfig, session: dict):
    """A drafter whose persistent memories follow the chosen scope: this session's own (the default),
    or the process-wide ones every visitor shares (only when the operator offers that scope)."""
    persistent = successors = None
    if settings.scope == SESSION_SCOPE:
        memories = session_memories(session, settings.model, config.k, runtime.target.vocab_size)
        persistent, successors = memories["persistent"], memories["successors"]
    try:
        return runtime.drafter(method, config=config, persistent=persistent, successors=successors)
    except ValueError as error:
        hint = (
            " (choose the per-session memory scope to use another k)"
            if "holds a memory" in str(error)
            else ""
        )
        raise refusal(f"{error}{hint}") from None


def session_memories(session: dict, model_id: str, k: int, vocab_size: int) -> dict:
    """This session's persistent memory and Token Recycling matrix for ``model_id`` (created on first
    use; the persistent memory is renewed when k changes)."""
    memories = session.setdefault(model_id, {})
    if memories.get("k") != k:
        memories.update(k=k, persistent=PersistentMemory(vocab_size, k))
    memories.setdefault("successors", SuccessorMatrix(vocab_size))
    return memories


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


def check_other_image(choice: object) -> str:
    """The sensitivity tab's replacement image choice, if it is one the dropdown offers."""
    return check_choice("replacement image", choice, other_image_choices())


class TraceExports:
    """Trace files written for the Download button: one unguessable folder per session under ``root``.

    A trace holds the visitor's prompt, so it is written only when Download is clicked (`write`), and
    its folder goes when the session ends (`remove`, called by ``demo.unload`` when the tab closes), or
    `TRACE_MAX_AGE_S` after the session's last download (a ``gr.State`` expiring calls `remove_session`;
    `prune` at each export does the same for any session the state missed).
    """

    def __init__(self, root: Path, max_age_s: float = TRACE_MAX_AGE_S) -> None:
        self.root = Path(root)
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._folders: dict[str, tuple[Path, float]] = {}  # session -> (folder, time of the last export)

    def write(self, session: str, trace: RunTrace) -> Path:
        """Write ``trace`` for ``session`` (replacing its earlier export of the same method)."""
        self.prune()
        with self._lock:
            folder = self._folders.get(session, (self.root / secrets.token_hex(16), 0.0))[0]
            self._folders[session] = (folder, time.time())
        folder.mkdir(parents=True, exist_ok=True)
        method = re.sub(r"[^a-z0-9-]", "", str(trace.settings.get("method", "")))[:20] or "run"
        path = folder / f"recap-run-{method}.json"
        trace.save(path)
        return path

    def remove(self, session: str) -> None:
        """Delete ``session``'s exports (nothing if it has none)."""
        with self._lock:
            folder = self._folders.pop(session, (None, 0.0))[0]
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def remove_session(self, session: object) -> None:
        """`remove`, as a ``gr.State`` delete callback (its value: a session id, or None)."""
        if isinstance(session, str):
            self.remove(session)

    def prune(self) -> None:
        """Delete the exports of sessions whose last export is older than ``max_age_s``."""
        now = time.time()
        with self._lock:
            old = [s for s, (_, at) in self._folders.items() if now - at > self.max_age_s]
        for session in old:
            self.remove(session)

    def sessions(self) -> list[str]:
        """Sessions that have exports on disk."""
        with self._lock:
            return list(self._folders)

    def folder(self, session: str) -> Path | None:
        """The folder of ``session``'s exports, if it has any."""
        with self._lock:
            return self._folders[session][0] if session in self._folders else None


# ------------------------------------------------------------------------------------------ studio
class Studio:
    """What every visitor's requests share: the model factory and cache, the offered models and memory
    scopes, the folders an image may come from. Per-visitor data is in gr.State."""

    def __init__(
        self,
        runtime_factory: RuntimeFactory,
        models: list[str],
        cache: RuntimeCache = _CACHE,
        scopes: tuple[str, ...] = (SESSION_SCOPE,),
    ) -> None:
        self.factory = runtime_factory
        self.models = list(models)
        self.cache = cache
        self.scopes = scopes
        #: Folders an image may come from: gradio's upload cache (set by `build_demo`) and the examples.
        self.upload_roots: list[Path] = [EXAMPLES_DIR]

    def runtime(self, model_id: str) -> Runtime:
        try:
            return self.cache.get(model_id, self.factory)
        except ValueError as error:
            message = str(error)
            if not message.lower().startswith("cannot load model"):
                message = f"cannot load model {model_id!r}: {message}"
            raise refusal("C" + message[1:]) from None

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
                    raise refusal(str(error)) from None
                except Exception as error:  # keep serving: log the details, end this request only
                    log.exception("generation failed")
                    raise refusal(
                        f"Generation failed ({type(error).__name__}); the server log has the details."
                    ) from None
            yield record

    def settings(self, values) -> RunSettings:
        """`parse_settings` with this studio's models and scopes; a refusal for the visitor if bad."""
        try:
            return parse_settings(values, self.models, self.scopes)
        except ValueError as error:
            raise refusal(str(error)) from None

    def check_request(self, image, prompt, settings: RunSettings) -> tuple[Path | None, str, RecapConfig]:
        """Everything about a request that needs no model: ``(image file, prompt, drafter config)``."""
        try:
            if not isinstance(prompt, str):
                raise ValueError(f"the prompt must be text, got {shown(prompt)}")
            return uploaded_path(image, self.upload_roots), check_prompt(prompt), settings.config()
        except ValueError as error:
            raise refusal(str(error)) from None

    def prepare(self, image, prompt, settings: RunSettings):
        """Validate everything, then load the model: ``(runtime, config, prompt, images)``."""
        path, prompt, config = self.check_request(image, prompt, settings)
        runtime = self.runtime(settings.model)
        if config.k > runtime.target.vocab_size:
            raise refusal(f"k must be at most the model's vocabulary size ({runtime.target.vocab_size}).")
        image = read_image(path, needs_image=runtime.target.family != "text")
        return runtime, config, prompt, [image] if image is not None else []


def build_demo(runtime_factory: RuntimeFactory | None = None, models: list[str] | None = None) -> gr.Blocks:
    """Build the studio's Blocks (nothing is loaded until a visitor runs something).

    ``runtime_factory(model_id) -> Runtime`` replaces the hub/disk loader (tests inject tiny models);
    ``models`` replaces the offered model ids (the first is the default).
    """
    configure_environment()
    models = models or offered_models()
    studio = Studio(runtime_factory or default_runtime_factory, models, scopes=memory_scopes())
    # delete_cache: gradio's copies of uploads and downloads older than a day go, checked hourly
    with gr.Blocks(title="RECAP Studio", delete_cache=(3600, 86400)) as demo:
        # Per visitor, freed after SESSION_TTL_S without a change (and an hour after the tab closes).
        session = gr.State({}, time_to_live=SESSION_TTL_S)  # this visitor's memories, by model id
        run_state = gr.State(None, time_to_live=SESSION_TTL_S)  # {"trace": RunTrace, "image", ...}
        compare_state = gr.State(None, time_to_live=SESSION_TTL_S)  # {"runs": {method: steps}, ...}
        gr.Markdown(
            "# RECAP Studio\nSpeculative decoding that **recycles** the target model's own predictions: "
            "a tree of guesses is verified in one pass, and the answer is exactly what greedy decoding "
            "would write. Every token below is coloured by what proposed it.",
            elem_id="recap-header",
        )
        with gr.Tabs():
            with gr.Tab("Run", id="run"):
                ui = _run_tab(models, studio.scopes)
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
        # An image must come from gradio's upload cache (where uploads and examples land) or the examples.
        studio.upload_roots = [Path(ui["image"].GRADIO_CACHE), EXAMPLES_DIR]
        exports = TraceExports(Path(ui["download_file"].GRADIO_CACHE) / "recap-traces")
        _wire_run(studio, ui, setting_inputs, session, run_state)
        _wire_download(ui, run_state, exports)
        _wire_compare(studio, ui, cmp, setting_inputs, session, compare_state)
        _wire_sensitivity(studio, ui, sens, run_state, compare_state)
        _wire_replay(ui, ui["replay"], run_state)
        demo.unload(_forget_exports(exports))
    demo.trace_exports = exports  # for tests and operators: where this demo's downloads are
    return demo


def _forget_exports(exports: TraceExports) -> Callable[[gr.Request], None]:
    def forget(request: gr.Request) -> None:
        """The tab closed: its downloaded traces (they hold its prompts) go now."""
        if request is not None and request.session_hash:
            exports.remove(request.session_hash)

    return forget


def _run_tab(models: list[str], scopes: tuple[str, ...]) -> dict[str, Any]:
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
                    ui["budget"] = gr.Slider(*BUDGET_RANGE, value=16, step=1, label="Fixed budget (nodes)")
                with gr.Row():
                    ui["depth"] = gr.Slider(*DEPTH_RANGE, value=8, step=1, label="Max depth")
                    ui["k"] = gr.Slider(*K_RANGE, value=8, step=1, label="k (top-k per record)")
                    ui["max_new_tokens"] = gr.Slider(
                        *MAX_NEW_TOKENS_RANGE, value=64, step=1, label="Max new tokens"
                    )
                with gr.Row():
                    ui["use_persistent"] = gr.Checkbox(True, label="persistent memory (1-token)")
                    ui["use_context"] = gr.Checkbox(True, label="contextual memories (2/3-token)")
                    ui["suffix"] = gr.Checkbox(True, label="suffix matching")
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
            with gr.Row():
                ui["download"] = gr.Button("Download run (JSON)", interactive=False, elem_id="download")
                # the trace is written on click (it holds the prompt); the browser then fetches it
                ui["download_file"] = gr.File(visible=False, elem_id="download-file")
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
    return figures.tree_figure(step, root_text=root_text), figures.fused_figure(step), viz.step_table(step)


def _wire_run(studio: Studio, ui: dict, setting_inputs: list, session, run_state) -> None:
    outputs = [
        ui[n]
        for n in ("answer", "stats", "passes", "step", "tree", "fused", "step_table", "status", "download")
    ] + [run_state, session]

    def run(image, prompt, *rest):
        *values, delay_ms, memories = rest
        settings = studio.settings(values)
        try:
            delay_s = display_delay_s(delay_ms)
        except ValueError as error:
            raise refusal(str(error)) from None
        studio.check_request(image, prompt, settings)  # refuse bad input before saying "loading"
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
            "key": _input_key(settings.model, prompt, image),
        }
        delay_left = MAX_TOTAL_DELAY_S
        last_update = 0.0
        started = time.perf_counter()
        for record in studio.stream(
            runtime, settings.model, drafter, prompt, images, settings.max_new_tokens, settings.method
        ):
            steps.append(record)
            now = time.perf_counter()
            pause = min(delay_s, delay_left)
            if pause or record.finished or now - last_update >= MIN_UPDATE_INTERVAL or len(steps) == 1:
                if len(steps) == 1:
                    log.info("first token after %.0f ms", 1000 * (now - started))
                yield _run_update(
                    ui, steps, f"Generating… step {record.step}", state, memories, run_state, session
                )
                last_update = time.perf_counter()
                if pause:
                    time.sleep(pause)
                    delay_left -= pause
        trace.text = runtime.target.decode(trace.tokens)
        reason = steps[-1].finish_reason if steps else None
        done = f"Done: {len(trace.tokens)} tokens in {len(steps)} target passes ({reason or 'stopped'})."
        update = _run_update(ui, steps, done, state, memories, run_state, session)
        update[ui["download"]] = gr.Button(interactive=True)
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
        preprocess=False,  # raw values reach the checks above, which answer every bad one clearly
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
        if not isinstance(state, dict) or not state["trace"].steps:
            return gr.skip(), gr.skip(), gr.skip()
        try:
            index = check_integer("step", index, 0, len(state["trace"].steps) - 1)
        except ValueError as error:
            raise refusal(str(error)) from None
        return _step_view(state["trace"].steps, index)

    ui["step"].input(
        scrub,
        [run_state, ui["step"]],
        [ui["tree"], ui["fused"], ui["step_table"]],
        api_name="step",
        show_progress="hidden",
        trigger_mode="always_last",  # while dragging, render the latest position, not every one
        preprocess=False,
    )
    ui["step"].release(
        scrub,
        [run_state, ui["step"]],
        [ui["tree"], ui["fused"], ui["step_table"]],
        api_visibility="private",
        show_progress="hidden",
        preprocess=False,
    )

    def reset(model_id, scope, memories):
        """Clear this session's memories of ``model_id``; the shared ones are never reset from here."""
        if not isinstance(model_id, str) or model_id not in studio.models:
            raise refusal(f"Unknown model {shown(model_id)}: choose one from the list.")
        memories = memories if isinstance(memories, dict) else {}
        memories.pop(model_id, None)
        note = (
            " (the process-wide memory is shared with other visitors: it is kept)"
            if scope == SHARED_SCOPE
            else ""
        )
        gr.Info(f"This session's persistent memories are cleared{note}.")
        return memories

    ui["reset"].click(
        reset, [ui["model"], ui["scope"], session], [session], api_name="reset", preprocess=False
    )


def _input_key(model_id: str, prompt: str, image) -> tuple:
    """What identifies a run's input (the sensitivity tab checks that a comparison used the same)."""
    path = image.get("path") if isinstance(image, dict) else image
    return (model_id, prompt, path if isinstance(path, str) else None)


#: Run in the browser after the Download click's handler: fetch the file it wrote, as a download.
_DOWNLOAD_JS = """
(file) => {
  if (file && file.url) {
    const link = document.createElement("a");
    link.href = file.url;
    link.download = file.orig_name || "recap-run.json";
    document.body.appendChild(link);
    link.click();
    link.remove();
  }
  return [];
}
"""


def _wire_download(ui: dict, run_state, exports: TraceExports) -> None:
    # Holds the session's id after a download; gradio deletes it TRACE_MAX_AGE_S after the last one
    # and calls back, so the exports of a session that never closes a tab (an API client) go too.
    owner = gr.State(None, time_to_live=TRACE_MAX_AGE_S, delete_callback=exports.remove_session)

    def download(state, request: gr.Request):
        """Write the last run's trace for this session (it is removed when the session ends)."""
        if not isinstance(state, dict) or not state["trace"].steps:
            raise refusal("Run a generation (or replay one) first.")
        session = request.session_hash or "no-session"
        return str(exports.write(session, state["trace"])), session

    ui["download"].click(download, [run_state], [ui["download_file"], owner], api_name="download").then(
        None, [ui["download_file"]], None, js=_DOWNLOAD_JS
    )


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
        ui["download"]: gr.Button(interactive=False),
        run_state: state,
        session: memories,
    }


def _wire_compare(studio: Studio, ui: dict, cmp: dict, setting_inputs: list, session, compare_state) -> None:
    def compare(image, prompt, *values_and_session):
        *values, memories = values_and_session
        settings = studio.settings(values)
        memories = memories if isinstance(memories, dict) else {}
        runtime, config, prompt, images = studio.prepare(image, prompt, settings)
        max_new = settings.max_new_tokens
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
        key = _input_key(settings.model, prompt, image)
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
        try:
            choice = check_other_image(choice)
        except ValueError as error:
            raise refusal(str(error)) from None
        if compared and state and compared["key"] != state.get("key"):
            compared = None  # the comparison was made on another input than the last run
        if not (compared or state):
            raise refusal("Run a generation (or a comparison) first.")
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
            raise refusal("This needs the model that made the run (a replayed run has none loaded).")
        if image is None:
            raise refusal("The run had no image, so nothing can depend on it.")
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
        preprocess=False,  # the choice is checked above (gradio's own check echoes it unescaped)
    )


def read_trace(path: str | Path) -> RunTrace:
    """An uploaded trace, or a ``ValueError`` saying why it cannot be replayed (no server path in it)."""
    try:
        trace = RunTrace.load(path)
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    except OSError:
        raise ValueError("it cannot be read") from None
    if not trace.steps:
        raise ValueError("it has no steps")
    return trace


def replay_status(trace: RunTrace) -> str:
    """The status line of a replayed trace (its method and model are the uploader's text: escaped)."""
    method = viz.method_label(str(trace.settings.get("method", "?")))
    model = trace.settings.get("model", "?")
    return (
        f"Replaying a recorded {markdown_text(method, 40)} run of {markdown_text(model)} "
        f"({len(trace.steps)} steps): scrub the steps on the right."
    )


def _wire_replay(ui: dict, replay_file, run_state) -> None:
    def replay(path):
        if not path:
            return {run_state: gr.skip()}
        try:
            trace = read_trace(path)
        except ValueError as error:
            raise refusal(f"Cannot replay this file: {error}") from None
        steps = trace.steps
        return {
            **_panels(ui, steps, scrubbable=True),
            ui["status"]: replay_status(trace),
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
    replay_file.upload(
        replay, [replay_file], [*(ui[n] for n in names), run_state], api_name="replay", show_progress="hidden"
    )


_ABOUT = """
### What you are looking at
- **Answer**: each token is coloured by what proposed it: `ctx3`/`ctx2` (this request's contextual
  memories, keyed by the last 3/2 tokens), `persistent` (the 1-token memory kept across your requests),
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
        # uploads over this are refused by gradio itself (images are capped at 50 MiB, traces at 16 MiB)
        "max_file_size": "50mb",
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    build_demo().queue(default_concurrency_limit=int(os.environ.get("RECAP_CONCURRENCY", "4"))).launch(
        **launch_kwargs()
    )
