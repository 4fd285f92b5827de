"""What the operator decides: environment variables, the models offered, and ``launch()`` options.

Read here and nowhere else in the studio:

- ``RECAP_MODEL``: the model selected at start (``embedded-v2`` = the embedded model v2 in assets/,
  the default; ``embedded-v1`` = the embedded model v1 beside it, the small world; both are always
  offered; ``embedded`` names the default, v2);
- ``RECAP_MODELS``: comma-separated extra hub ids / local directories to offer (the paper's models are
  offered anyway when a GPU is present);
- ``RECAP_CPU_HUB_MODEL``: the real VLM offered after the embedded models on a server without a GPU
  that reaches the hub (default `CPU_HUB_MODEL`, SmolVLM-256M-Instruct; a hub id or a local folder;
  ``off``: none). Whether the hub is reachable is judged once, at start (`hub_reachable`): never under
  ``RECAP_OFFLINE`` / ``HF_HUB_OFFLINE`` unless the model is in the local hub cache; always on a
  Hugging Face Space (``SPACE_ID`` set) and for a local folder; elsewhere by one HEAD request to the
  hub's API with a `HUB_PROBE_S`-second timeout. It loads with images as one 512-pixel tile (no
  image splitting: a tile costs the vision encoder a few seconds on 2 CPU cores, a split photo 17);
- ``RECAP_OFFLINE``: if set, never contact the Hugging Face hub (``HF_HUB_OFFLINE=1``), so an unknown
  id fails at once with a clear message instead of waiting on the network;
- ``RECAP_DTYPE``: model dtype (float32/bfloat16/float16; default bf16 on GPU, fp32 on CPU);
- ``RECAP_THREADS``: torch CPU threads (default 1: faster than 2 on small shared machines);
- ``RECAP_CONCURRENCY``: decode slots: runs, comparisons and sensitivity passes served at once
  (default 4; a model still computes one pass at a time: the passes of concurrent visitors interleave);
- ``RECAP_WAITING``: work that may wait for a decode slot (default 32; beyond, it is refused with
  "the studio is busy"); gradio's queue holds at most 8 times as many events of every kind;
- ``RECAP_PER_CLIENT``: runs, comparisons and sensitivity passes one client (one address, whatever its
  number of sessions) may have decoding or waiting at once (default 2; beyond, refused with a message
  saying so); the line serves its clients in turns (`recap.studio.guard.decode_line.DecodeSlots`);
- ``RECAP_PROXY_HOPS``: trusted reverse proxies in front of the server (default 1 on a Hugging Face
  Space, where ``SPACE_ID`` is set, else 0): a client is the address the outermost of them appended
  to ``X-Forwarded-For`` (with 0, the peer address);
- ``RECAP_SESSIONS_MB`` / ``RECAP_MAX_SESSIONS``: what the server keeps for its sessions (memories,
  last run, last comparison) in all, and how many sessions (default 128 MB and 1000); the least
  recently used sessions are dropped beyond either (`recap.studio.guard.sessions`);
- ``RECAP_SHARED_MEMORY``: if ``1``, visitors may also choose the process-wide persistent memory, which
  every visitor of a model reads and writes (its drafts then show words from other visitors' answers).
  Unset (the default), every browser session has its own memories and nothing else;
- ``RECAP_MEMORY``: a persistent-memory file (``python -m recap generate --memory FILE`` or
  ``python -m scripts.build_memory --model ... --out FILE`` make one) that the default model's memories
  start from, instead of its shipped memory; a file made for another model is not loaded (logged);
- ``RECAP_WARMUP_S``: seconds of warm-up on the examples (the photos first) when a model with no
  shipped memory and no ``RECAP_MEMORY`` file loads (default 60 on a GPU and on a CPU that offers the
  CPU hub model, else 0 = off); every scope starts from it. The warm-up's RECAP drafter measures the
  model's tree-cost curve, so the curve is measured at load too;
- ``GRADIO_SERVER_NAME`` / ``GRADIO_SERVER_PORT``: where to listen (default 127.0.0.1:7860).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from recap.runtime import EMBEDDED_MODEL_V1, EMBEDDED_MODEL_V2, Runtime

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
STATIC_DIR = ROOT / "assets" / "static"

EMBEDDED_V2_ID = "embedded-v2"
EMBEDDED_V1_ID = "embedded-v1"
#: The model the studio opens on (unless ``RECAP_MODEL`` names another): the embedded model v2.
DEFAULT_MODEL_ID = EMBEDDED_V2_ID
#: ``RECAP_MODEL`` values that name a model by another id (``embedded``: the default embedded model).
MODEL_ALIASES = {"embedded": DEFAULT_MODEL_ID}
#: The embedded models by their studio id, the default first: the folders under assets/models, and the
#: visitors' labels.
EMBEDDED_FOLDERS = {EMBEDDED_V2_ID: EMBEDDED_MODEL_V2, EMBEDDED_V1_ID: EMBEDDED_MODEL_V1}
EMBEDDED_LABELS = {
    EMBEDDED_V2_ID: "Embedded VLM v2 (wider world)",
    EMBEDDED_V1_ID: "Embedded VLM v1 (small world)",
}
PAPER_MODELS = (
    "Qwen/Qwen2.5-VL-7B-Instruct",
    "Qwen/Qwen2.5-VL-3B-Instruct",
    "llava-hf/llava-v1.6-vicuna-7b-hf",
)
#: The real VLM a server without a GPU offers when it reaches the hub (``RECAP_CPU_HUB_MODEL``): the
#: smallest SmolVLM, 256M parameters (about 1 GB in float32). SmolVLM-500M-Instruct, the same family, also
#: fits a 2-vCPU, 16 GB Space's memory, but its passes cost about twice as much (docs/studio.md).
CPU_HUB_MODEL = "HuggingFaceTB/SmolVLM-256M-Instruct"
#: Seconds the start waits for the hub's answer to `hub_reachable`'s HEAD request.
HUB_PROBE_S = 3.0
#: The CPU hub model's processor settings: an image is one tile (see ``RECAP_CPU_HUB_MODEL``).
CPU_HUB_PROCESSOR = {"do_image_splitting": False}
HUB_LABELS = {CPU_HUB_MODEL: "SmolVLM-256M (real photos, CPU)"}
SESSION_SCOPE, SHARED_SCOPE = "per session", "process-wide"


@dataclass(frozen=True)
class MemoryPlan:
    """The operator's choice of starting memories: ``files`` (model id -> memory file, `RECAP_MEMORY`)
    and ``warmup_s`` (seconds of warm-up on the examples for a model with no file of its own)."""

    files: dict[str, Path] = field(default_factory=dict)
    warmup_s: float = 0.0


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
    """Model ids for the dropdown: the embedded models (v2, the default, first), the paper's models on
    a GPU or else the CPU hub model where the hub is reachable (`cpu_hub_model`), ``RECAP_MODELS``;
    ``RECAP_MODEL`` (if set; `MODEL_ALIASES` resolved) first, as the default."""
    models = list(EMBEDDED_FOLDERS)
    if torch.cuda.is_available():
        models += PAPER_MODELS
    elif (hub_model := cpu_hub_model()) is not None and hub_reachable(hub_model):
        models.append(hub_model)
    models += [resolve_alias(m.strip()) for m in os.environ.get("RECAP_MODELS", "").split(",") if m.strip()]
    default = os.environ.get("RECAP_MODEL", "").strip()
    if default:
        models.insert(0, resolve_alias(default))
    return list(dict.fromkeys(models))


def cpu_hub_model() -> str | None:
    """The model ``RECAP_CPU_HUB_MODEL`` names (default `CPU_HUB_MODEL`), or None for ``off``."""
    raw = os.environ.get("RECAP_CPU_HUB_MODEL", "").strip()
    if raw.lower() in ("off", "none", "0"):
        return None
    return raw or CPU_HUB_MODEL


def hub_reachable(model_id: str) -> bool:
    """Whether ``model_id`` can be loaded from here: a local folder, a model in the local hub cache, or
    (not offline) on a Space or where the hub answers a HEAD request for it (`HUB_PROBE_S` seconds at
    most, asked once per process). Logged, with how it was judged."""
    from huggingface_hub import constants

    if model_id.startswith((".", "/", "~")) or model_id.count("/") > 1:  # a folder (as TargetModel.load)
        reachable = Path(model_id).expanduser().is_dir()
        reason = "a local folder" if reachable else "no such folder"
    elif _in_hub_cache(model_id):
        reason, reachable = "in the local hub cache", True
    elif os.environ.get("RECAP_OFFLINE") or constants.HF_HUB_OFFLINE:
        reason, reachable = "offline (RECAP_OFFLINE or HF_HUB_OFFLINE)", False
    elif os.environ.get("SPACE_ID"):
        reason, reachable = "on a Hugging Face Space", True
    else:
        reachable = _hub_answers(f"{constants.ENDPOINT}/api/models/{model_id}")
        reason = "the hub answered" if reachable else f"no answer from the hub within {HUB_PROBE_S:g} s"
    log.info("%s %s: %s", "offering" if reachable else "not offering", model_id, reason)
    return reachable


def _in_hub_cache(model_id: str) -> bool:
    """Whether ``model_id``'s configuration is in the local hub cache (False for an id the hub refuses)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except ValueError:
        return False


@functools.cache
def _hub_answers(url: str) -> bool:
    """Whether a HEAD request to ``url`` succeeds within `HUB_PROBE_S` seconds, name lookup included
    (asked once per url, in a thread that is left behind if it takes longer)."""
    answers: list[bool] = []

    def ask() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HUB_PROBE_S):
                answers.append(True)
        except (OSError, ValueError):
            answers.append(False)

    thread = threading.Thread(target=ask, name="recap-hub-probe", daemon=True)
    thread.start()
    thread.join(HUB_PROBE_S)
    return bool(answers and answers[0])


#: Methods offered in the Run tab, in the order of the radio buttons; Compare runs them all.
METHODS = ("recap", "tr", "pld", "suffix", "ar")


def offered_methods() -> tuple[str, ...]:
    """The methods the Run tab offers: SuffixDecoding only where its authors' package is installed
    (a request for it elsewhere is answered with the install command)."""
    from recap.drafters.suffix_decoding import suffix_decoding_available

    return tuple(m for m in METHODS if m != "suffix" or suffix_decoding_available())


def resolve_alias(model_id: str) -> str:
    """``model_id`` with `MODEL_ALIASES` resolved; an alias is logged with what it means now (``embedded``
    meant v1 until v2 became the default: whoever wants v1 says ``embedded-v1``)."""
    if model_id in MODEL_ALIASES:
        log.warning(
            "model id %r is an alias of %r (the default embedded model; v1 is %r)",
            model_id, MODEL_ALIASES[model_id], EMBEDDED_V1_ID,
        )  # fmt: skip
        return MODEL_ALIASES[model_id]
    return model_id


def default_runtime_factory(model_id: str) -> Runtime:
    """Load ``model_id`` (``embedded-v2`` / ``embedded-v1`` = the models in assets/) on the default device
    and dtype. A missing embedded folder is a ValueError naming the command that trains it (the folder's
    name only: no server path reaches a visitor)."""
    folder = EMBEDDED_FOLDERS.get(model_id)
    if folder is not None and not (folder / "config.json").is_file():
        world = " --world v2" if model_id == EMBEDDED_V2_ID else ""
        raise ValueError(
            f"the embedded model {folder.name} is missing from assets/models "
            f"(train it with python -m training.train{world})"
        )
    path = str(folder) if folder is not None else model_id
    options = {}
    if model_id == cpu_hub_model() and not torch.cuda.is_available():
        options["processor_options"] = CPU_HUB_PROCESSOR
    return Runtime.load(path, dtype=os.environ.get("RECAP_DTYPE"), **options)


def memory_plan(models: list[str]) -> MemoryPlan:
    """Where each offered model's memories start: ``RECAP_MEMORY`` for the default (first) model, the
    shipped memory of a model folder, or a warm-up of ``RECAP_WARMUP_S`` seconds on the examples (by
    default 60 s on a GPU or when the CPU hub model is offered, else none)."""
    memory = os.environ.get("RECAP_MEMORY", "").strip()
    files = {models[0]: Path(memory).expanduser()} if memory and models else {}
    warm = torch.cuda.is_available() or cpu_hub_model() in models
    default_s = 60.0 if warm else 0.0
    raw = os.environ.get("RECAP_WARMUP_S", "").strip()
    warmup_s = default_s
    if raw:
        warmup_s = _in_range("RECAP_WARMUP_S", raw, float, 0.0, 3600.0, "a number of seconds")
    return MemoryPlan(files=files, warmup_s=warmup_s)


def memory_scopes() -> tuple[str, ...]:
    """Persistent-memory scopes visitors may choose: their session's, and the shared one only when the
    operator sets ``RECAP_SHARED_MEMORY=1`` (a shared memory shows visitors each other's words)."""
    shared = os.environ.get("RECAP_SHARED_MEMORY", "").strip().lower() in ("1", "true", "yes")
    return (SESSION_SCOPE, SHARED_SCOPE) if shared else (SESSION_SCOPE,)


def concurrency() -> int:
    """Decode slots: runs, comparisons and sensitivity passes at once (``RECAP_CONCURRENCY``, default 4);
    also gradio's concurrency of every other queued event."""
    return _positive("RECAP_CONCURRENCY", 4)


def waiting() -> int:
    """Work that may wait for a decode slot (``RECAP_WAITING``, 32; gradio's queue holds 8 x as many)."""
    return _positive("RECAP_WAITING", 32)


def per_client() -> int:
    """Work one client may have decoding or waiting (``RECAP_PER_CLIENT``, default 2)."""
    return _positive("RECAP_PER_CLIENT", 2)


#: The default ``RECAP_TURN_S``: a short run ends within its turn, a costly one is shared.
TURN_S = 0.5
#: The most ``RECAP_TURN_S`` may say (beyond: ``off``).
MAX_TURN_S = 3600.0


def turn_s() -> float:
    """The least time a run or a comparison keeps its decode slot before another client's waiting work
    gets it (``RECAP_TURN_S``, default `TURN_S`; ``off``: work keeps its slot to its end, e.g. on
    ZeroGPU, where a run waiting between turns keeps its GPU allocation running)."""
    raw = os.environ.get("RECAP_TURN_S", "").strip().lower()
    if not raw:
        return TURN_S
    if raw == "off":
        return math.inf
    return _in_range("RECAP_TURN_S", raw, float, 0.0, MAX_TURN_S, "off or a number of seconds")


#: The most ``RECAP_PROXY_HOPS`` may say.
MAX_PROXY_HOPS = 16


def proxy_hops() -> int:
    """Trusted reverse proxies in front of the server (``RECAP_PROXY_HOPS``; default 1 on a Hugging Face
    Space, which sets ``SPACE_ID``, else 0): how `guard.clients.client_key` tells clients apart."""
    raw = os.environ.get("RECAP_PROXY_HOPS", "").strip()
    if not raw:
        return 1 if os.environ.get("SPACE_ID") else 0
    return _in_range("RECAP_PROXY_HOPS", raw, int, 0, MAX_PROXY_HOPS, "a whole number of proxies")


#: Replays read at once (each is bounded by `guard.trace_files`' limits: a few seconds, under 100 MB), at
#: most one per client (`recap.studio.serving.Studio.replays`); more are refused.
REPLAY_CONCURRENCY = 2
#: The share of the server's time one client's replays may take back to back (a replay that took t s to
#: read makes its client wait ``t / share - t`` s before the next; a usual trace reads in ~0.05 s).
REPLAY_SHARE = 0.5
#: The gradio concurrency of the events that draw from a stored trace (replay, the step's views,
#: download: one group): above `REPLAY_CONCURRENCY`, so that a flood of them is answered (refused) at
#: once instead of filling gradio's queue, which every visitor's events share.
REPLAY_EVENTS = 16 * REPLAY_CONCURRENCY
#: Queued events of the studio other than runs, comparisons, sensitivity passes and the drawing group
#: above (the two resets, the image check, the held-out line, the tab's unload), each with gradio's
#: default concurrency (`concurrency`); a margin over those the page has (a test counts them).
OTHER_EVENT_GROUPS = 8


def displays() -> int:
    """Paced displays at once (runs whose steps are shown at a delay after their slot was freed): as
    many as the line holds; beyond, a run's steps are shown as they come."""
    return concurrency() + waiting()


def max_threads() -> int:
    """gradio's bound on events in progress at once (``launch(max_threads=...)``: its queue's workers and
    its threads for sync handlers), above everything the studio lets in, so that the studio's own
    bounds, which answer with a message, always act before gradio's, which only makes events wait in
    its queue (first come, first served, whoever sent them). An event in progress is one of:

    - decoding work in the line: runs, comparisons and sensitivity passes waiting for a slot or
      decoding, at most ``concurrency() + waiting()`` (beyond, refused as busy);
    - a run's paced display after its slot was freed: at most `displays`;
    - a request between its arrival and the line (its checks, a refusal), over in milliseconds: a
      margin of ``concurrency() + waiting()`` more;
    - replays (`REPLAY_EVENTS`: those read and those being refused) and the other queued events
      (`OTHER_EVENT_GROUPS`, each at most `concurrency` at once).
    """
    line = concurrency() + waiting()
    return 2 * line + displays() + REPLAY_EVENTS + OTHER_EVENT_GROUPS * concurrency()


def session_budget() -> tuple[int, int]:
    """``(bytes, sessions)`` the sessions may hold together (``RECAP_SESSIONS_MB``, default 128, and
    ``RECAP_MAX_SESSIONS``, default 1000)."""
    return _positive("RECAP_SESSIONS_MB", 128) << 20, _positive("RECAP_MAX_SESSIONS", 1000)


def queue_kwargs() -> dict[str, Any]:
    """``Blocks.queue()`` options: `concurrency` per event, a queue of at most 8 x `waiting` events."""
    return {"default_concurrency_limit": concurrency(), "max_size": 8 * waiting()}


def _in_range(name: str, raw: str, parse: Callable[[str], Any], low: float, high: float, what: str) -> Any:
    """An environment variable's text ``raw`` read by ``parse`` and within ``[low, high]``; otherwise a
    ValueError naming the variable, what it must be and what it got."""
    try:
        value = parse(raw)
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be {what} from {low:g} to {high:g}, got {raw}")
    return value


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def model_label(model_id: str) -> str:
    """The name visitors see for ``model_id`` (the embedded models' and the CPU hub model's, else the id)."""
    return EMBEDDED_LABELS.get(model_id) or HUB_LABELS.get(model_id, model_id)


def launch_kwargs() -> dict[str, Any]:
    """Theme, CSS, script, address and bounds for ``launch()`` (in Gradio 6, theme and css belong there)."""
    css_path, js_path = STATIC_DIR / "studio.css", STATIC_DIR / "studio.js"
    return {
        "theme": gr.themes.Soft(primary_hue="blue"),
        "css": css_path.read_text(encoding="utf-8") if css_path.is_file() else None,
        "js": js_path.read_text(encoding="utf-8") if js_path.is_file() else None,
        "server_name": os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        "server_port": int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        # uploads over this are refused by gradio itself (images are capped at 50 MiB, traces at 16 MiB)
        "max_file_size": "50mb",
        # gradio's own bound on sessions (the studio's `SessionLedger` keeps the same count, and a budget)
        "state_session_capacity": session_budget()[1],
        # above the studio's own bounds, which refuse with a message (see `max_threads`)
        "max_threads": max_threads(),
    }
