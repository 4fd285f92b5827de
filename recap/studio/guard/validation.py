"""Every value a request carries, checked against the UI's bounds before anything runs.

The HTTP API accepts any JSON, not only what the sliders allow, so each handler's raw values (events
run with ``preprocess=False``) go through the small pure functions here: `parse_settings` for the Run
tab's settings (`RunSettings`), `display_delay_s`, `uploaded_path`, `upload_problem` and `read_image` for
the image. A refusal is a `refusal` message: HTML-escaped, without server paths.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from PIL import Image

from recap.drafters import shared_state
from recap.drafters.recap.config import RecapConfig
from recap.inputs import (
    MAX_IMAGE_PIXELS,
    check_choice,
    check_flag,
    check_integer,
    check_number,
    image_size,
    load_image,
    shown,
)
from recap.runtime import parse_budget
from recap.sampling import SamplingSettings
from recap.studio.environment import METHODS, MODEL_ALIASES, SHARED_SCOPE

log = logging.getLogger("recap.studio")

BUDGET_MODES = ("auto", "fixed")
#: The Run tab's numeric controls as ``(low, high)``: the sliders' ranges, and the bounds the server
#: enforces on every request (an API caller sees no slider).
BUDGET_RANGE = (0, 128)
DEPTH_RANGE = (1, 16)
K_RANGE = (1, 16)
MAX_NEW_TOKENS_RANGE = (1, 512)
DELAY_MS_RANGE = (0, 500)
#: How long a run waits for its uploaded image to be moved into gradio's cache, and how often it looks.
UPLOAD_WAIT_S, UPLOAD_POLL_S = 5.0, 0.02
TEMPERATURE_RANGE = (0.0, 2.0)
TOP_K_RANGE = (0, 1000)
TOP_P_RANGE = (0.01, 1.0)
SEED_RANGE = (0, 2**32 - 1)
#: At most this many seconds of display delay per run: the steps after it stream at full speed, so no
#: request holds one of the run slots for long by asking for a slow display.
MAX_TOTAL_DELAY_S = 20.0


# ------------------------------------------------------------------------------------- messages
_SERVER_PATH = re.compile(r"(?<![\w.:/\\-])(?:[A-Za-z]:)?(?:[/\\][^\s/\\'\"<>|]+){2,}[/\\]?")


def without_paths(message: str) -> str:
    """``message`` with every absolute path of two or more parts shortened to its last part (``…/x.png``),
    so no error shows where the server keeps files (uploads, caches, models)."""
    return _SERVER_PATH.sub(lambda m: "…/" + re.split(r"[/\\]", m.group(0).rstrip("/\\"))[-1], message)


def sentence(message: str) -> str:
    """``message`` as a sentence: its first letter capitalised (not a one-letter name: "k must be …"),
    a full stop at its end where it has none."""
    message = message.strip()
    first = message.split(" ", 1)[0]
    if (len(first) > 1 or first == "a") and first[0].islower():
        message = message[0].upper() + message[1:]
    return message if not message or message[-1] in ".!?…" else message + "."


def toast_text(message: str) -> str:
    """``message`` as a toast shows it: a `sentence`, without server paths, and HTML-escaped, because
    gradio renders toasts (errors and warnings) as HTML and messages echo values that visitors sent."""
    return html.escape(sentence(without_paths(message)) or "Something went wrong.", quote=False)


def refusal(message: str) -> gr.Error:
    """The error a visitor sees for ``message`` (`toast_text`).

    A refusal is the studio answering a request, not a fault: it is logged as one line (``refused:
    ...``; the same refusal again within `REFUSAL_LOG_S` is counted, not logged), and gradio is told
    not to print its traceback."""
    _log_refusal(" ".join(sentence(without_paths(message)).split())[:300])
    return gr.Error(toast_text(message), print_exception=False)


#: The same refusal again within this many seconds of its last log line is counted, not logged (a
#: client sending one refused request again and again would fill the log); the next line says how many.
REFUSAL_LOG_S = 10.0
_refusals: dict[str, tuple[float, int]] = {}  # text -> (time of its last line, refusals since, unlogged)
_refusals_lock = threading.Lock()


def _log_refusal(text: str) -> None:
    now = time.monotonic()
    with _refusals_lock:
        last, unlogged = _refusals.get(text, (-REFUSAL_LOG_S, 0))
        if now - last < REFUSAL_LOG_S:
            _refusals[text] = (last, unlogged + 1)
            return
        if len(_refusals) > 1000:  # forget the refusals not seen lately
            for old in [t for t, (when, _) in _refusals.items() if now - when >= REFUSAL_LOG_S]:
                del _refusals[old]
        _refusals[text] = (now, 0)
    more = f" ({unlogged} more like it in the {now - last:.0f} s before, not logged)" if unlogged else ""
    log.info("refused: %s%s", text, more)


# ------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class RunSettings:
    """What a visitor chose in the Run tab, checked against the UI's bounds by `parse_settings`.

    The field order is the order of the settings in a request (`setting_names`): the layout's inputs
    are listed from these fields, so the two cannot drift apart.
    """

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
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

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

    def sampling(self) -> SamplingSettings:
        """How the target's tokens are chosen (temperature 0: greedy, today's exact path)."""
        return SamplingSettings(self.temperature, self.top_k, self.top_p, self.seed)


def setting_names() -> tuple[str, ...]:
    """The Run tab's settings in request order: `RunSettings`' fields."""
    return tuple(field.name for field in dataclasses.fields(RunSettings))


def with_settings_api(handler: Callable, *after: tuple[str, object]) -> Callable:
    """``handler(image, prompt, *values, request=None)`` (a generator, sync or async) as gradio calls
    an endpoint of the Run tab's settings: its API parameters are the image, the prompt, the settings
    (`RunSettings`' fields, in order; a blank seed by default), then ``after`` as ``(name, default)``,
    then the request (which gradio passes last). The parameters are declared here once, from the
    settings, instead of written out in each handler."""
    empty, keyword = inspect.Parameter.empty, inspect.Parameter.POSITIONAL_OR_KEYWORD
    defaults = {"seed": None, **dict(after)}
    names = ("image", "prompt", *setting_names(), *(name for name, _ in after))
    parameters = [inspect.Parameter(n, keyword, default=defaults.get(n, empty)) for n in names]
    request = inspect.Parameter("request", keyword, default=None, annotation=gr.Request)
    count = len(parameters)  # gradio passes the request after them; a direct call may leave it out

    if inspect.isasyncgenfunction(handler):

        async def api(*values, request=None):
            values, request = (values[:count], values[count]) if len(values) > count else (values, request)
            async for update in handler(*values, request=request):
                yield update

    elif inspect.isgeneratorfunction(handler):

        def api(*values, request=None):
            values, request = (values[:count], values[count]) if len(values) > count else (values, request)
            yield from handler(*values, request=request)

    else:
        raise TypeError(f"{handler!r} is not a generator function")
    api.__signature__ = inspect.Signature([*parameters, request])
    api.__annotations__ = {"request": gr.Request}  # (how gradio finds where to pass the request)
    api.__doc__, api.__name__ = handler.__doc__, handler.__name__
    return api


def check_model(model_id: object, models: list[str]) -> str:
    """``model_id`` if the studio offers it (an API client's old alias, ``embedded``, resolved), else a
    ``ValueError``."""
    if isinstance(model_id, str) and model_id in MODEL_ALIASES and model_id not in models:
        model_id = MODEL_ALIASES[model_id]
    if not isinstance(model_id, str) or model_id not in models:
        raise ValueError(f"unknown model {shown(model_id)}: choose one from the list")
    return model_id


def parse_settings(values: list | tuple, models: list[str], scopes: tuple[str, ...]) -> RunSettings:
    """The Run tab's setting values, in `RunSettings` field order, checked against the UI's bounds.

    Raises ``ValueError`` naming the first bad value: a wrong type, NaN, an infinity, a value outside
    its slider, an unknown model, method or scope, a seed that is not blank or a whole number.
    """
    if not isinstance(values, list | tuple) or len(values) != len(setting_names()):
        raise ValueError("the request does not carry the Run tab's settings")
    raw = dict(zip(setting_names(), values))
    raw["model"] = check_model(raw["model"], models)
    if raw["scope"] == SHARED_SCOPE and raw["scope"] not in scopes:
        raise ValueError("the process-wide memory scope is not offered on this server")
    settings = RunSettings(
        model=raw["model"],
        method=check_choice("method", raw["method"], METHODS),
        budget_mode=check_choice("tree budget", raw["budget_mode"], BUDGET_MODES),
        budget=check_integer("fixed budget", raw["budget"], *BUDGET_RANGE),
        depth=check_integer("max depth", raw["depth"], *DEPTH_RANGE),
        k=check_integer("k", raw["k"], *K_RANGE),
        use_persistent=check_flag("persistent memory", raw["use_persistent"]),
        use_context=check_flag("contextual memories", raw["use_context"]),
        suffix=check_flag("suffix matching", raw["suffix"]),
        max_new_tokens=check_integer("max new tokens", raw["max_new_tokens"], *MAX_NEW_TOKENS_RANGE),
        scope=check_choice("memory scope", raw["scope"], scopes),
        temperature=check_number("temperature", raw["temperature"], *TEMPERATURE_RANGE),
        top_k=check_integer("top-k", raw["top_k"], *TOP_K_RANGE),
        top_p=check_number("top-p", raw["top_p"], *TOP_P_RANGE),
        seed=None if raw["seed"] in (None, "") else check_integer("seed", raw["seed"], *SEED_RANGE),
    )
    settings.sampling()  # the library's own check, so the two can never disagree
    return settings


def display_delay_s(value: object) -> float:
    """The display delay per step in seconds, from the slider's milliseconds (checked against its range)."""
    return check_number("display delay (ms)", value, *DELAY_MS_RANGE) / 1000.0


def stopped_status(delay_ms: object, method: object = "recap") -> str:
    """The status after Stop. With a display delay the decoding runs ahead of what is shown, and a
    method with memories (RECAP's, TR's matrix, SuffixDecoding's tree) learns from every token decoded,
    shown or not: the status says so (a bad delay: none; a bad method: one without memories)."""
    try:
        paced = display_delay_s(delay_ms) > 0 and bool(shared_state(str(method)) - {"cost_model"})
    except ValueError:
        paced = False
    ahead = (
        " The decoding ran ahead of the delayed display: the memories learnt from every token it"
        " decoded, shown or not."
    )
    return "Stopped: the answer so far is kept; press Run to start again." + (ahead if paced else "")


# ------------------------------------------------------------------------------------------ image
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


def _await_upload(path: Path, wait_s: float | None = None) -> None:
    """Wait up to ``wait_s`` (`UPLOAD_WAIT_S`) seconds for ``path`` to exist.

    Gradio answers an upload with the file's place in its cache and moves the file there in a background
    task after the answer, so on a busy server a run can arrive before its image does. A file that never
    arrives is refused by `read_image` as missing.
    """
    deadline = time.monotonic() + (UPLOAD_WAIT_S if wait_s is None else wait_s)
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(UPLOAD_POLL_S)


def upload_problem(value: object, roots: list[Path]) -> str | None:
    """Why the raw ``gr.Image`` value just uploaded cannot be used (the message a visitor sees), or None
    when it can (or the box is empty): checked from the file's header, as the upload lands, so that a
    file that is not an image is refused before any run."""
    try:
        path = uploaded_path(value, roots)
        if path is not None:
            _await_upload(path)
            image_size(path)
    except ValueError as error:
        return f"That file cannot be used: {error}."
    return None


def read_image(path: Path | str | None, needs_image: bool) -> Image.Image | None:
    """The visitor's image, validated; warns (and continues) when it must be downscaled."""
    if not path:
        if needs_image:
            raise refusal(
                "This is a vision model: it needs an image. Upload one or pick an example (an API client "
                "sends image=handle_file(path))."
            )
        return None
    _await_upload(Path(path))
    try:
        width, height = image_size(path)
        if width * height > MAX_IMAGE_PIXELS:
            gr.Warning(f"The image is {width}x{height} pixels: it is first downscaled to about 1 megapixel.")
        return load_image(path)
    except ValueError as error:
        raise refusal(f"That file cannot be used: {error}.") from None
