"""`build_demo`: the studio's Blocks, laid out (`layout`) and wired (`handlers`, `compare`,
`sensitivity`), each handler inside the studio's one `Guard` (`recap.studio.guard.wrapper`). Building
loads no model: a model loads on its first run (`serving.RuntimeCache`).
"""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path
from typing import Any

import gradio as gr
import pydantic
from gradio.exceptions import InvalidPathError
from gradio.route_utils import FnIndexInferError
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from recap.studio.environment import (
    configure_environment,
    default_runtime_factory,
    memory_plan,
    memory_scopes,
    offered_models,
)
from recap.studio.guard.bodylimit import BodyLimit
from recap.studio.guard.validation import setting_names
from recap.studio.guard.wrapper import Guard
from recap.studio.serving import CACHE, RuntimeCache, RuntimeFactory, Studio
from recap.studio.ui import handlers, layout, traces
from recap.studio.ui.compare import wire_compare
from recap.studio.ui.examples import EXAMPLE_ROOTS, wire_examples
from recap.studio.ui.sensitivity_tab import wire_sensitivity
from recap.studio.ui.traces import TraceExports

logger = logging.getLogger(__name__)

#: Per-visitor state (memories, the last run) is freed after this long without a change.
SESSION_TTL_S = 2 * 3600
#: What the API documents as an example of each file parameter (gradio's own examples are files on
#: GitHub, which a client offline, or a server without internet, cannot fetch).
API_FILE_EXAMPLES = {"Image": "scene.png", "File": "recap-run.json"}
#: What a call with fewer values than its endpoint's inputs is told.
TOO_FEW_VALUES = 'This endpoint takes {needed} values and the call sent {got} ("Use via API" lists them).'
#: What a call whose image or file value is not an uploaded file is told.
UNREADABLE_FILE = (
    "An image or file value must be a file uploaded to this studio (through the API: handle_file(path));"
    " this call sent something else."
)
#: What a call of an API name the studio does not have is told.
UNKNOWN_ENDPOINT = (
    'This studio has no API endpoint of that name; its endpoints are {names} ("Use via API" below the page).'
)


def _unreadable_path(path: str) -> str | None:
    """Why a file object's ``path`` is refused before gradio looks at it (None: it may look): a URL
    (gradio downloads those; the studio reads uploads only), or a path no file system takes (a NUL byte,
    a lone surrogate: gradio's own checks fail on them with a traceback per call)."""
    if "://" in path:
        return "a URL"
    if "\0" in path:
        return "a NUL byte in its path"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "a path that is not valid Unicode"
    return None


def _file_value_problem(value: Any, depth: int = 0) -> str | None:
    """Why a call's values hold a file object gradio must not be given (`_unreadable_path`), or None."""
    if depth > 8:  # (a call's values are shallow: a file object in a list at most)
        return None
    if isinstance(value, dict):
        path = value.get("path")
        if isinstance(path, str) and (problem := _unreadable_path(path)):
            return problem
        items = value.values()
    elif isinstance(value, list | tuple):
        items = value
    else:
        return None
    return next(filter(None, (_file_value_problem(item, depth + 1) for item in items)), None)


class StudioBlocks(gr.Blocks):
    """The studio's Blocks: its API documents file parameters without remote URLs (`get_api_info`),
    and every server it starts bounds the request bodies it reads (`launch`)."""

    def launch(self, *args, **kwargs):
        """gradio's ``launch``, with `guard.bodylimit.BodyLimit` in front of its app, and a call to
        an API name the studio does not have answered 404 with its names (gradio answers 500 and logs a
        traceback per call, which a client could flood the log with); the studio's drawing worker
        starts beside it."""
        app_kwargs = dict(kwargs.get("app_kwargs") or {})
        app_kwargs["middleware"] = [*app_kwargs.get("middleware", ()), Middleware(BodyLimit)]
        handlers_ = dict(app_kwargs.get("exception_handlers") or {})
        handlers_[FnIndexInferError] = self.unknown_endpoint
        handlers_[KeyError] = self.missing_key  # gradio's /call/v2/<name> looks the name up unchecked
        app_kwargs["exception_handlers"] = handlers_
        if (studio := getattr(self, "studio", None)) is not None:  # (the first replay need not wait)
            threading.Thread(target=studio.drawing.start, name="drawing-worker-start", daemon=True).start()
        return super().launch(*args, **{**kwargs, "app_kwargs": app_kwargs})

    @functools.cached_property
    def endpoint_names(self) -> frozenset[str]:
        """The API's endpoint names (``/run``, …), fixed once the Blocks are built."""
        return frozenset(self.get_api_info().get("named_endpoints", {}))

    async def unknown_endpoint(self, request: Request, error: Exception) -> PlainTextResponse:
        """The answer to a call of an API name this studio does not have (no name echoed back)."""
        names = ", ".join(sorted(self.endpoint_names))
        return PlainTextResponse(UNKNOWN_ENDPOINT.format(names=names), status_code=404)

    async def missing_key(self, request: Request, error: Exception) -> PlainTextResponse:
        """`unknown_endpoint` for gradio's ``/call/v2/<name>``; any other KeyError a route raises is
        logged with its traceback and answered 500, as without this handler."""
        path = request.url.path.rstrip("/")
        name = f"/{path.rsplit('/', 1)[-1]}"
        if "/call/v2/" in path and name not in self.endpoint_names:
            return await self.unknown_endpoint(request, error)
        logger.error("KeyError in %s", path, exc_info=error)
        return PlainTextResponse("Internal Server Error", status_code=500)

    def validate_inputs(self, block_fn: Any, inputs: list[Any]) -> None:
        """gradio's check that a call sent a value for every input, its refusal told to the client in one
        line (how many values the endpoint takes) instead of a traceback in the log that repeats every
        value sent, once per call."""
        try:
            super().validate_inputs(block_fn, inputs)
        except ValueError:
            needed = sum(not getattr(block, "skip_api", False) for block in block_fn.inputs)  # no State
            message = TOO_FEW_VALUES.format(needed=needed, got=len(inputs))
            raise gr.Error(message, print_exception=False) from None

    async def preprocess_data(self, *args, **kwargs):
        """gradio's reading of a call's values, its refusals told to the client in one line and logged in
        one: gradio answers a file value that is not an upload (a path, a URL, a number) with no message
        and logs a traceback per call, which a client could flood the log with. Anything else (a fault
        inside a component's processing) keeps gradio's handling: a traceback in the log."""
        inputs = kwargs.get("inputs", args[1] if len(args) > 1 else ())
        problem = _file_value_problem(inputs)
        if problem:  # a URL: gradio would fetch it (a request from this server), or fail validating
            logger.warning("refused a call's file value (%s)", problem)
            raise gr.Error(UNREADABLE_FILE, print_exception=False)
        try:
            return await super().preprocess_data(*args, **kwargs)
        except gr.Error as error:  # gradio's own refusal (a file type): its words, without a traceback
            if error.print_exception:
                logger.warning("refused a call's values: %s", error.message)
                error.print_exception = False
            raise
        except (pydantic.ValidationError, InvalidPathError) as error:  # not a file object; not an upload
            logger.warning("refused a call's file value (%s)", type(error).__name__)
            raise gr.Error(UNREADABLE_FILE, print_exception=False) from None

    def get_api_info(self, all_endpoints: bool = False, page: str | None = None):
        """gradio's API description, where an image parameter defaults to no image (a client passes
        one with ``handle_file(path)``; gradio would show a picture on GitHub, or a server path) and
        each file parameter's example is a local file name."""
        info = super().get_api_info(all_endpoints=all_endpoints, page=page)
        for endpoint in info.get("named_endpoints", {}).values():
            for parameter in endpoint.get("parameters", []):
                name = API_FILE_EXAMPLES.get(parameter.get("component", ""))
                if name is None:
                    continue
                example = {"path": name, "orig_name": name, "meta": {"_type": "gradio.FileData"}}
                parameter["example_input"] = example
                if parameter["component"] == "Image":
                    parameter["parameter_has_default"], parameter["parameter_default"] = True, None
                if isinstance(parameter.get("python_type"), dict):  # (gradio's says "or … URL": refused)
                    parameter["python_type"]["description"] = (
                        "A local file, sent with handle_file(path); a URL is refused."
                    )
        return info


def build_demo(
    runtime_factory: RuntimeFactory | None = None,
    models: list[str] | None = None,
    cache: RuntimeCache | None = None,
) -> gr.Blocks:
    """Build the studio's Blocks (nothing is loaded until a visitor runs something).

    ``runtime_factory(model_id) -> Runtime`` replaces the hub/disk loader (tests inject tiny models);
    ``models`` replaces the offered model ids (the first is the default); ``cache`` replaces the
    process's loaded models (a fresh one is a fresh server). The returned Blocks carry
    ``trace_exports`` (where this demo's downloads are, for tests and operators) and ``studio`` (its
    `serving.Studio`: the decode slots, the sessions' ledger).
    """
    configure_environment()
    models = models or offered_models()
    studio = Studio(
        runtime_factory or default_runtime_factory,
        models,
        cache=cache or CACHE,
        scopes=memory_scopes(),
        plan=memory_plan(models),
    )
    # delete_cache: gradio's copies of uploads and downloads older than a day go, checked hourly
    with StudioBlocks(title="RECAP Studio", delete_cache=(3600, 86400)) as demo:
        # Per visitor, freed after SESSION_TTL_S without a change (and an hour after the tab closes).
        session = gr.State({}, time_to_live=SESSION_TTL_S)  # this visitor's memories, by model id
        run_state = gr.State(None, time_to_live=SESSION_TTL_S)  # {"trace": RunTrace, "image", ...}
        compare_state = gr.State(None, time_to_live=SESSION_TTL_S)  # {"runs": {method: steps}, ...}
        gr.Markdown(layout.HEADER, elem_id="recap-header")
        with gr.Tabs():
            with gr.Tab("Run", id="run"):
                ui = layout.run_tab(models, studio.scopes)
            with gr.Tab("Compare", id="compare"):
                cmp = layout.compare_tab()
            with gr.Tab("Sensitivity", id="sensitivity"):  # short: four tab names fit a phone
                sens = layout.sensitivity_tab()
            with gr.Tab("About", id="about"):
                gr.Markdown(layout.ABOUT)
        setting_inputs = [ui[name] for name in setting_names()]  # RunSettings' fields, in order
        studio.page_defaults = [component.value for component in setting_inputs]
        # An image must come from gradio's upload cache (where uploads and examples land) or the examples.
        studio.upload_roots = [Path(ui["image"].GRADIO_CACHE), *EXAMPLE_ROOTS]
        exports = TraceExports(
            Path(ui["download_file"].GRADIO_CACHE) / "recap-traces", max_age_s=traces.TRACE_MAX_AGE_S
        )
        guard = Guard(studio)  # the public Space's guard, around every handler below (by its kind)
        handlers.wire_run(studio, ui, setting_inputs, session, run_state, guard)
        handlers.wire_scrub(studio, ui, run_state, guard)
        handlers.wire_reset(studio, ui, session, guard)
        handlers.wire_memory_view(studio, ui, session, demo)
        layout.blank_seed(demo, ui)
        wire_examples(ui)  # the examples follow the chosen model
        traces.wire_download(studio, ui, run_state, exports, guard)
        traces.wire_replay(studio, ui, run_state, guard)
        handlers.wire_image_check(studio, ui, guard)
        wire_compare(studio, ui, cmp, setting_inputs, compare_state, guard)
        wire_sensitivity(studio, ui, sens, run_state, compare_state)
        demo.unload(traces.forget_exports(exports))
    studio.sessions.attach(demo, session)  # (the sessions' budget: `recap.studio.guard.sessions`)
    demo.trace_exports = exports
    demo.studio = studio
    return demo
