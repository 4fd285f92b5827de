"""The studio end to end and under hostile use: importable without a model, one streamed run over HTTP,
every bad input answered with a clear message (no generic error, no server path, no hang).

The app is launched on 127.0.0.1 (a free port) with an injected runtime factory that serves the
in-process tiny LLaVA, and driven through `gradio_client` like an API user, or through raw HTTP where
`gradio_client` cannot send the value (NaN, Infinity, an object where a number goes).
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from conftest import free_port, noise_image, tiny

from recap.drafters.suffix_decoding import suffix_decoding_available
from recap.studio.ui import measure

ROOT = Path(__file__).resolve().parent.parent
TINY = "tiny-llava"
MISSING = "missing-org/missing-model"
PROMPT = "the cat is"
#: Output positions of the /run endpoint.
ANSWER, STATUS, WORDS = 0, 7, 8  # the client leaves out the Download button


def test_import_builds_nothing_and_loads_no_model():
    # A fresh interpreter: importing app must not build Blocks, load a model, or touch torch threads.
    code = (
        "import sys, app, recap.models as m\n"
        "from recap.studio.environment import DEFAULT_MODEL_ID\n"
        "from recap.studio.serving import CACHE\n"
        "assert CACHE.loaded(DEFAULT_MODEL_ID) is None\n"
        "assert 'transformers.models.llava' not in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def _factory(model_id: str):
    from recap.runtime import Runtime

    if model_id == TINY:
        return Runtime(tiny("llava"))
    raise ValueError(f"cannot load model {model_id!r}: not available offline")


@pytest.fixture(scope="module", autouse=True)
def own_gradio_folder(tmp_path_factory):
    """This module's servers keep uploads and downloads in a folder of their own (``GRADIO_TEMP_DIR``,
    read by gradio at every use), so other processes sharing gradio's default folder never show up in them."""
    folder = tmp_path_factory.mktemp("gradio")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def served(tmp_path_factory, own_gradio_folder):
    """A running studio serving the tiny LLaVA: ``(client, image path, folder, url, demo)``."""
    from gradio_client import Client

    import app

    demo = app.build_demo(runtime_factory=_factory, models=[TINY, MISSING])
    demo.studio.replays.share = None  # the hostile replays below come back to back from one client
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    folder = tmp_path_factory.mktemp("inputs")
    image = folder / "noise.png"
    noise_image(0).save(image)
    url = f"http://127.0.0.1:{port}/"
    client = Client(url, verbose=False)
    yield SimpleNamespace(client=client, image=image, folder=folder, url=url, demo=demo)
    client.close()
    demo.close()


def _args(
    image,
    prompt=PROMPT,
    model=TINY,
    method="recap",
    budget_mode="fixed",
    budget=8,
    depth=8,
    k=8,
    persistent=True,
    context=True,
    suffix=True,
    max_new=24,
    scope="per session",
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    seed=None,
    delay_ms=0,
):
    from gradio_client import handle_file

    return [
        handle_file(str(image)) if image else None,
        prompt,
        model,
        method,
        budget_mode,
        budget,
        depth,
        k,
        persistent,
        context,
        suffix,
        max_new,
        scope,
        temperature,
        top_k,
        top_p,
        seed,
        delay_ms,
    ]


def _ar_reference(max_new: int, image_seed: int = 0, prompt: str = PROMPT):
    from recap.decode import generate
    from recap.runtime import Runtime

    target = tiny("llava")
    result = generate(target, Runtime(target).drafter("ar"), prompt, [noise_image(image_seed)], max_new)
    return result.tokens, result.text


def _download(client):
    from recap.trace import RunTrace

    return RunTrace.load(client.predict(api_name="/download"))


def _no_server_path(message: str) -> None:
    for fragment in ("/tmp/", "/root/", "/work/", "/etc/", "gradio/", "pytest-"):
        assert fragment not in message, f"a server path leaks into {message!r}"


def test_run_streams_steps_and_matches_autoregressive(served):
    job = served.client.submit(*_args(served.image, delay_ms=5), api_name="/run")
    updates = list(job)
    assert len(updates) >= 3, "the answer should arrive in several streamed updates"
    final = job.outputs()[-1]
    assert final[ANSWER] and final[STATUS].startswith("Done")
    trace = _download(served.client)
    tokens, text = _ar_reference(24)
    assert trace.tokens == tokens and trace.text == text
    assert trace.settings["method"] == "recap" and trace.steps[0].step == 0


@pytest.mark.skipif(not suffix_decoding_available(), reason="arctic-inference is not installed")
def test_suffix_decoding_runs_in_the_studio_with_this_sessions_own_tree(served):
    # The second identical request is drafted from this session's global suffix tree.
    served.client.predict(*_args(served.image, method="suffix"), api_name="/run")
    served.client.predict(*_args(served.image, method="suffix"), api_name="/run")
    trace = _download(served.client)
    assert (trace.tokens, trace.text) == _ar_reference(24)
    assert trace.settings["method"] == "suffix"
    assert sum(s.accepted_len for s in trace.steps) >= 10
    assert {src for s in trace.steps for n in s.nodes for src in n.sources} == {"suffix tree"}


def test_suffix_without_its_package_is_refused_with_the_install_command(monkeypatch):
    import gradio as gr

    from recap.drafters import suffix_decoding
    from recap.drafters.recap.config import RecapConfig
    from recap.runtime import Runtime
    from recap.studio.environment import offered_methods
    from recap.studio.serving import drafter_for

    # As on a machine without the package: its module cannot be found.
    monkeypatch.setattr(suffix_decoding, "_MODULE", "arctic_inference_not_installed.suffix_decoding")
    assert "suffix" not in offered_methods()
    runtime = Runtime(tiny("llava"))
    settings = SimpleNamespace(scope="per session", model=TINY)

    with pytest.raises(gr.Error, match="install_suffix"):
        drafter_for(runtime, settings, "suffix", RecapConfig(), {})


def _raw_call(url: str, api: str, data_json: str, ours: bool = True) -> str:
    """Call ``api`` with a hand-written JSON ``data`` list; the error message, or "" if it succeeded.

    ``ours``: the refusal must come from the studio (a message), not gradio's generic error (none).
    """
    base = f"{url}gradio_api/call/{api}"
    body = '{"data": ' + data_json + "}"
    response = httpx.post(base, content=body, headers={"content-type": "application/json"}, timeout=30)
    response.raise_for_status()
    event = response.json()["event_id"]
    with httpx.stream("GET", f"{base}/{event}", timeout=60) as stream:
        lines = list(stream.iter_lines())
    errors = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == "event: error"]
    if not errors:
        return ""
    payload = json.loads(errors[-1].removeprefix("data: ")) or {}
    if ours:
        assert payload.get("error"), f"gradio's generic error, not the studio's message: {lines[-4:]}"
    return payload.get("error") or "error"


_RUN_JSON = [
    "null",
    json.dumps(PROMPT),
    json.dumps(TINY),
    '"recap"',
    '"fixed"',
    "8",
    "8",
    "8",
    "true",
    "true",
    "true",
    "6",
    '"per session"',
    "0",
    "0",
    "1",
    "null",
    "0",
]
_FIELDS = ["image", "prompt", "model", "method", "budget_mode", "budget", "depth", "k"]
_FIELDS += ["persistent", "context", "suffix", "max_new", "scope", "temperature", "top_k", "top_p", "seed"]
_FIELDS += ["delay_ms"]


@pytest.mark.parametrize(
    ("field", "raw", "message"),
    [
        # numbers: NaN, infinities, huge, negative, fractional, wrong types
        ("delay_ms", "1e9", "display delay (ms) must be a number from 0 to 500"),
        ("delay_ms", "Infinity", "display delay (ms) must be a number from 0 to 500, got inf"),
        ("delay_ms", "NaN", "display delay (ms) must be a number"),
        ("delay_ms", '"slow"', "display delay (ms) must be a number"),
        ("k", "NaN", "k must be a whole number from 1 to 16"),
        ("k", "1000000", "k must be a whole number from 1 to 16, got 1000000"),
        ("k", "8.5", "k must be a whole number"),
        ("k", "true", "k must be a whole number"),
        ("budget", "-Infinity", "fixed budget must be a whole number from 0 to 128"),
        ("budget", "1e999", "fixed budget must be a whole number"),
        ("depth", '{"a": 1}', "max depth must be a whole number from 1 to 16"),
        ("depth", "[8]", "max depth must be a whole number"),
        ("max_new", "0", "max new tokens must be a whole number from 1 to 512"),
        ("max_new", "100000", "max new tokens must be a whole number from 1 to 512"),
        ("max_new", '"24"', "max new tokens must be a whole number"),
        # sampling: the API bypasses the sliders
        ("temperature", "NaN", "temperature must be a number from 0 to 2"),
        ("temperature", "-1", "temperature must be a number from 0 to 2"),
        ("temperature", '"hot"', "temperature must be a number"),
        ("top_k", "1e9", "top-k must be a whole number from 0 to 1000"),
        ("top_k", "1e308", "top-k must be a whole number from 0 to 1000, got 1e+308"),  # as sent
        ("top_k", "2.5", "top-k must be a whole number"),
        ("top_p", "0", "top-p must be a number from 0.01 to 1"),
        ("top_p", "1.5", "top-p must be a number from 0.01 to 1"),
        ("seed", "-1", "seed must be a whole number from 0 to 4294967295"),
        ("seed", "1.5", "seed must be a whole number"),
        ("seed", '"lucky"', "seed must be a whole number"),
        # choices and flags
        ("method", '"medusa"', "method must be one of"),
        ("method", "null", "method must be one of"),
        ("budget_mode", '"infinite"', "tree budget must be one of"),
        ("scope", '"process-wide"', "process-wide memory scope is not offered"),
        ("scope", '"everyone"', "memory scope must be one of"),
        ("model", '"/etc/passwd"', "unknown model"),
        ("model", "42", "unknown model"),
        ("persistent", '"yes"', "persistent memory must be true or false"),
        ("suffix", "1", "suffix matching must be true or false"),
        ("prompt", '["a", "b"]', "the prompt must be text"),
        ("prompt", "null", "the prompt must be text"),
        # files the request names instead of uploading
        ("image", '{"path": "/etc/passwd"}', "image must be a file uploaded to this studio"),
        ("image", '{"path": "../../../../etc/hostname"}', "image must be a file uploaded to this studio"),
    ],
)
def test_hostile_api_values_get_clear_messages(served, field, raw, message):
    data = list(_RUN_JSON)
    data[_FIELDS.index(field)] = raw
    error = _raw_call(served.url, "run", "[" + ", ".join(data) + "]")
    assert message.lower() in error.lower()
    _no_server_path(error)


@pytest.mark.parametrize(
    "raw",
    [
        '{"path": 5}',  # not a file object
        '"/etc/passwd"',  # a bare path
        "42",
        '{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}',  # a file object outside the uploads
        '{"url": "http://127.0.0.1:9/x.png", "path": "x.png", "meta": {"_type": "gradio.FileData"}}',  # a URL
        # a URL as the path: gradio would fetch it (a loopback one failed its validation, with no message)
        '{"path": "http://127.0.0.1:9/x.png", "meta": {"_type": "gradio.FileData"}}',
        '{"path": "https://example.invalid/x.png", "meta": {"_type": "gradio.FileData"}}',
        # paths no file system takes: a NUL byte (gradio answered "error: None" and logged a traceback
        # per call), a lone surrogate (no encoding), a NUL in the name it would show
        '{"path": "/tmp/gradio/x\\u0000.png", "meta": {"_type": "gradio.FileData"}}',
        '{"path": "/tmp/gradio/\\ud800.png", "meta": {"_type": "gradio.FileData"}}',
        '{"path": "x.png", "orig_name": "a\\u0000b", "meta": {"_type": "gradio.FileData"}}',
    ],
)
def test_malformed_file_values_are_refused_in_one_line_before_the_app(served, raw, capfd, caplog):
    # gradio checks a file slot's value before any app code runs; it answered {"error": null} and
    # logged a traceback per call (with the server's paths): the studio words it, and logs one line
    from recap.studio.demo import UNREADABLE_FILE

    data = list(_RUN_JSON)
    data[0] = raw
    error = _raw_call(served.url, "run", "[" + ", ".join(data) + "]")
    assert error == UNREADABLE_FILE
    assert "Traceback" not in capfd.readouterr().err and "refused a call's file value" in caplog.text


def test_a_valid_raw_call_succeeds(served):
    # the table above is only meaningful if the unmodified request goes through
    data = list(_RUN_JSON)
    data[0] = json.dumps(
        {"path": str(_uploaded(served)), "meta": {"_type": "gradio.FileData"}, "orig_name": "noise.png"}
    )
    assert _raw_call(served.url, "run", "[" + ", ".join(data) + "]") == ""


def _uploaded(served) -> str:
    """Upload the test image through gradio's upload route; its path in the server's upload cache."""
    with open(served.image, "rb") as handle:
        response = httpx.post(f"{served.url}gradio_api/upload", files={"files": handle}, timeout=30)
    response.raise_for_status()
    return response.json()[0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"image": None}, "it needs an image. Upload one"),
        ({"prompt": "   "}, "prompt is empty"),
        ({"prompt": "x" * 9000}, "too long"),
        ({"persistent": False, "context": False, "suffix": False}, "at least one of"),
        ({"model": MISSING}, "Cannot load model"),
        ({"model": "<img src=x onerror=alert(1)>"}, "unknown model '&lt;img src=x"),
    ],
)
def test_bad_input_gives_its_message_and_the_server_keeps_serving(served, overrides, message):
    kwargs = {"image": served.image, **overrides}
    with pytest.raises(Exception, match=f"(?i){message}"):  # (refusals read as sentences: capitalised)
        served.client.predict(*_args(kwargs.pop("image"), **kwargs), api_name="/run")
    assert served.client.predict(*_args(served.image, method="pld", max_new=6), api_name="/run")[ANSWER]


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width x height`` grey pixels but holds one row: what a decompression bomb
    looks like to a reader of the header (the pixels are never decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("notes.png", b"this is text, not pixels", "not a readable image"),
        ("bomb.png", _png_header(50_000, 50_000), "image is too large (2500 megapixels; the limit is 67"),
        ("huge.png", _png_header(12_000, 12_000), "12000x12000 pixels, 144 megapixels; the limit is 67"),
        ("empty.png", b"", "not a readable image"),
        ("scene.eps", b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "not a readable image"),
    ],
)
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's, before ours
def test_unusable_images_are_refused_without_server_paths(served, name, content, message):
    path = served.folder / name
    path.write_bytes(content)
    with pytest.raises(Exception, match="That file cannot be used") as caught:
        served.client.predict(*_args(path), api_name="/run")
    assert message in str(caught.value)
    _no_server_path(str(caught.value))
    assert served.client.predict(*_args(served.image, method="ar", max_new=4), api_name="/run")[ANSWER]


def test_huge_image_warns_and_continues(monkeypatch, tmp_path):
    from recap.inputs import MAX_IMAGE_PIXELS
    from recap.studio.guard import validation

    warnings = []
    monkeypatch.setattr(validation.gr, "Warning", warnings.append)
    big = tmp_path / "big.png"
    noise_image(1, size=(1500, 1000)).save(big)
    image = validation.read_image(str(big), needs_image=True)
    assert image.width * image.height <= MAX_IMAGE_PIXELS
    assert warnings and "downscaled" in warnings[0]


def test_an_upload_that_is_not_an_image_is_refused_as_it_lands(tmp_path):
    from recap.studio.guard import validation

    (tmp_path / "notes.png").write_text("not an image", encoding="utf-8")
    noise_image(3).save(tmp_path / "scene.png")
    problem = validation.upload_problem({"path": str(tmp_path / "notes.png")}, [tmp_path])
    assert problem.startswith("That file cannot be used: not a readable image")
    assert str(tmp_path) not in problem
    assert validation.upload_problem({"path": str(tmp_path / "scene.png")}, [tmp_path]) is None
    assert validation.upload_problem(None, [tmp_path]) is None  # the box emptied
    outside = validation.upload_problem({"path": "/etc/hostname"}, [tmp_path])
    assert outside == "That file cannot be used: the image must be a file uploaded to this studio."


def test_an_upload_still_being_moved_into_place_is_waited_for(monkeypatch, tmp_path):
    # gradio answers an upload before its background task moves the file into the cache: a run that
    # arrives first waits for the file (and a file that never arrives is refused as missing)
    import threading

    from recap.studio.guard import validation

    late = tmp_path / "late.png"
    noise_image(2).save(tmp_path / "staging.png")
    mover = threading.Timer(0.3, (tmp_path / "staging.png").rename, args=(late,))
    mover.start()
    try:
        assert validation.read_image(late, needs_image=True).size == noise_image(2).size
    finally:
        mover.join()
    monkeypatch.setattr(validation, "UPLOAD_WAIT_S", 0.1)
    with pytest.raises(validation.gr.Error, match="image file not found"):
        validation.read_image(tmp_path / "never.png", needs_image=True)


def test_display_delay_is_capped_per_run(served, monkeypatch):
    from recap.studio.guard import validation
    from recap.studio.guard.jobs import _due

    # 24 steps at the slider's largest delay would take 12 s to show; the cap bounds a run's display:
    # step i is due min(i * delay, cap) after the first, so once the cap has passed every step is due.
    # (The schedule is checked as computed, not timed, so the check does not depend on the machine.)
    assert [_due(24, t, 0.5, 1.2) for t in (0.0, 0.6, 1.0, 1.19, 1.2)] == [1, 2, 3, 3, 24]
    monkeypatch.setattr(validation, "MAX_TOTAL_DELAY_S", 1.2)
    final = served.client.predict(*_args(served.image, method="ar", delay_ms=500), api_name="/run")
    assert final[STATUS].startswith("Done: 24 tokens")
    assert final[STATUS].split("), ")[1].startswith(r"with tiny\-llava.")  # the model named, Markdown-escaped


def test_k_larger_than_the_vocabulary_is_refused():
    import gradio as gr

    from recap.studio.guard.validation import parse_settings
    from recap.studio.serving import Studio

    small = SimpleNamespace(target=SimpleNamespace(vocab_size=4, family="text", name="small"))
    studio = Studio(lambda model_id: small, ["small"])
    values = ["small", "recap", "auto", 8, 8, 8, True, True, True, 8, "per session", 0.0, 0, 1.0, None]
    settings = parse_settings(values, studio.models, studio.scopes)
    with pytest.raises(gr.Error, match=r"k must be at most the model's vocabulary size \(4\)"):
        studio.prepare(None, "hi", settings)


@pytest.mark.parametrize(
    ("api", "data", "message"),
    [
        ("sensitivity", '["../../../etc/passwd"]', "replacement image must be one of"),
        ("sensitivity", '["/etc/hostname"]', "replacement image must be one of"),
        ("sensitivity", "[null]", "replacement image must be one of"),
        ("reset", '["<b>x</b>", "per session"]', "Unknown model '&lt;b&gt;x&lt;/b&gt;'"),
        ("reset", "[[1], null]", "Unknown model"),
        ("step", "[NaN]", "Run a generation (or replay one) first."),  # no run in this session
    ],
)
def test_other_endpoints_refuse_hostile_values(served, api, data, message):
    error = _raw_call(served.url, api, data)
    assert (message.lower() in error.lower()) if message else error == ""  # (refusals read as sentences)


def test_step_index_is_checked(served):
    import gradio as gr

    state = {"trace": SimpleNamespace(steps=[object(), object()])}
    for bad in (float("nan"), float("inf"), "1", 7, -1):
        with pytest.raises(gr.Error, match=r"Step must be a whole number from 0 to 1, got [^ ]*\."):
            asyncio.run(_scrub(served.demo)(state, bad))


def _scrub(demo):
    """The /step handler (a coroutine function: it waits for its drawing ticket)."""
    return next(fn.fn for fn in demo.fns.values() if fn.api_name == "step")


def test_reset_clears_only_this_sessions_memories(served):
    import gradio as gr

    from recap.runtime import Runtime

    reset = next(fn.fn for fn in served.demo.fns.values() if fn.api_name == "reset")
    shared = Runtime(tiny("llava")).state.persistent()  # a shared memory is never touched here
    mine = {TINY: {"k": 8}, MISSING: {"k": 8}}
    infos = []
    original = gr.Info
    gr.Info = infos.append
    try:
        left, line = reset(TINY, "per session", mine)
    finally:
        gr.Info = original
    assert left == {MISSING: {"k": 8}} and "session" in infos[0] and len(shared) == 0
    assert "RECAP's memory</b> (per session)" in line


def test_download_and_step_before_a_run_are_refused(served):
    from gradio_client import Client

    fresh = Client(served.url, verbose=False)
    with pytest.raises(Exception, match="Run a generation"):
        fresh.predict(api_name="/download")
    with pytest.raises(Exception, match="Run a generation"):  # (it answered nothing before)
        fresh.predict(3, api_name="/step")
    fresh.close()


def test_trace_is_written_on_download_only_and_removed_with_the_session(served, own_gradio_folder):
    from gradio_client import Client

    exports = served.demo.trace_exports
    assert exports.root.is_relative_to(own_gradio_folder)  # no other process writes there
    visitor = Client(served.url, verbose=False)
    before = sorted(exports.root.rglob("*")) if exports.root.exists() else []
    visitor.predict(*_args(served.image, method="ar", max_new=6), api_name="/run")
    after = sorted(exports.root.rglob("*")) if exports.root.exists() else []
    assert after == before and exports.folder(visitor.session_hash) is None, "a run alone writes no trace"
    downloaded = visitor.predict(api_name="/download")
    assert Path(downloaded).read_text(encoding="utf-8").count(PROMPT) == 1
    folder = exports.folder(visitor.session_hash)
    assert [p.name for p in folder.iterdir()] == ["recap-run-ar.json"]
    exports.remove(visitor.session_hash)  # what demo.unload does when the tab closes
    assert not folder.exists() and exports.folder(visitor.session_hash) is None
    visitor.close()


def test_an_api_clients_trace_goes_after_the_age_limit(monkeypatch, tmp_path):
    # an API client never closes a tab: its export goes when gradio expires the session's state
    from gradio_client import Client

    import app
    from recap.studio.ui import traces as exports

    monkeypatch.setattr(exports, "TRACE_MAX_AGE_S", 1)
    demo = app.build_demo(runtime_factory=_factory, models=[TINY])
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        image = tmp_path / "noise.png"
        noise_image(0).save(image)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        client.predict(*_args(image, method="ar", max_new=4), api_name="/run")
        client.predict(api_name="/download")
        folder = demo.trace_exports.folder(client.session_hash)
        assert folder is not None and folder.exists()
        deadline = time.monotonic() + 120  # gone in ~2 s (gradio checks each second); generous for a busy CPU
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not folder.exists() and demo.trace_exports.folder(client.session_hash) is None
        client.close()
    finally:
        demo.close()


def test_trace_exports_are_per_session_and_pruned_by_age(tmp_path):
    from recap.studio.ui.traces import TraceExports
    from recap.trace import RunTrace

    exports = TraceExports(tmp_path / "traces", max_age_s=60)
    trace = RunTrace(settings={"method": "<b>recap</b>/../x"}, steps=[])
    first, second = exports.write("a", trace), exports.write("b", trace)
    assert first.parent != second.parent and first.name == "recap-run-brecapbx.json"
    assert exports.write("a", trace) == first  # the same session reuses its folder
    exports.remove("a")
    assert not first.exists() and second.exists()
    exports._folders["b"] = (second.parent, time.time() - 120)  # last export two minutes ago
    exports.write("c", trace)
    assert not second.exists() and exports.sessions() == ["c"]


def test_the_sensitivity_line_says_which_run_it_analysed(served):
    from gradio_client import Client

    visitor = Client(served.url, verbose=False)  # a session of its own: no comparison made
    # before any run: a hint on the status line, not an error
    _answer, _table, status = visitor.predict("blank (grey)", api_name="/sensitivity")
    assert status.startswith("Run a generation (or a comparison) first")
    visitor.predict(*_args(served.image, max_new=8, method="tr"), api_name="/run")
    _answer, _table, status = visitor.predict("blank (grey)", api_name="/sensitivity")
    assert "Analysed: the last run (Token Recycling)." in status
    assert "known after a comparison" in status  # why the memory column reads "-"


def test_compare_sensitivity_and_replay(served, tmp_path):
    from gradio_client import handle_file

    client = served.client
    client.predict(*_args(served.image, max_new=16), api_name="/run")
    compare_args = [*_args(served.image, max_new=16)[:-1], measure.EQUAL]
    status, table, _story, strip = client.predict(*compare_args, api_name="/compare")
    rows = table["data"] if isinstance(table, dict) else table
    compared = ["Autoregressive", "Prompt lookup", "Token Recycling", "SuffixDecoding", "RECAP"]
    if not suffix_decoding_available():  # offered only where its authors' package is installed
        compared.remove("SuffixDecoding")
        assert "SuffixDecoding" not in status
    assert [r[0] for r in rows] == compared
    assert all(r[measure.HEADERS.index("identical to AR")] == "yes" for r in rows)
    # equal budgets: no tree method grows more than the budget (the tiny model's repeated successor ids
    # merge some of TR's template nodes, so its trees are a little smaller here)
    nodes = {r[0]: float(r[measure.HEADERS.index(measure.NODES)]) for r in rows}
    assert nodes["Autoregressive"] == 0
    assert 0.75 * measure.EQUAL_NODES <= nodes["Token Recycling"] <= measure.EQUAL_NODES
    assert 0 < nodes["RECAP"] <= measure.EQUAL_NODES
    assert "draft, verify and update phases" in status and f"{measure.REPEATS} times" in status
    assert all(" (" in r[measure.HEADERS.index(measure.HEADERS[5])] for r in rows)  # fastest (range)
    assert "<table>" in strip
    _answer, sens_table, sens_status = client.predict("blank (grey)", api_name="/sensitivity")
    assert "image-sensitive" in sens_status and "Analysed: the last comparison's runs" in sens_status
    assert "known after a comparison" not in sens_status
    sens_rows = sens_table["data"] if isinstance(sens_table, dict) else sens_table
    assert len(sens_rows) == len(compared)
    held = {row[0]: row[3] for row in sens_rows}  # the compared runs' coverage, where the method has one
    # the line counts what the table divides: the tokens after the first (the prefill's)
    counts = re.match(r"(\d+) of the (\d+) tokens after the first", sens_status)
    sensitive, after_first = int(counts[1]), int(counts[2])
    ar = next(row for row in sens_rows if row[0] == "Autoregressive")
    assert f"/{sensitive} (" in ar[1] and ar[1].startswith("0/") and f"/{after_first - sensitive} (" in ar[2]
    assert held["Autoregressive"] == "-" and held["Prompt lookup"] == "-"
    assert "from this image" in held["RECAP"] and "from this image" in held["Token Recycling"]

    final = client.predict(*_args(served.image, max_new=8), api_name="/run")
    trace_file = client.predict(api_name="/download")
    replayed = client.predict(handle_file(trace_file), api_name="/replay")
    assert replayed[0] == final[0] and "Replaying" in replayed[7]
    # the Sensitivity tab after a replay: a hint on its status line (the trace holds no image)
    _answer, _table, sens_status = client.predict("blank (grey)", api_name="/sensitivity")
    assert sens_status.startswith("A replayed run holds no image"), sens_status


def _timed(cell: str) -> tuple[float, float, float]:
    """A timed cell "median (repeats low-high)" as numbers."""
    median, spread = cell.split(" (repeats ")
    low, high = spread.rstrip(")").split("-")
    return float(median), float(low), float(high)


def test_five_compare_clicks_on_one_input_draft_the_same_and_time_the_same_phases(served):
    # The Compare tab's goal is five clicks on one input. What every method drafts and accepts must be the
    # same on each click (each run starts from the same warmed memory); the timed cells are the median
    # of the repeats' totals and their range, and the speedup is AR's time over the method's. How far
    # the timed speedups move between clicks depends on the machine, not on the code, so no test asserts it:
    # `python -m scripts.compare_spread --runs 5` measures it and the README reports its output.
    compare_args = [*_args(served.image, max_new=12)[:-1], measure.EQUAL]
    counted, column = [], measure.HEADERS.index(measure.HEADERS[5])
    for _ in range(5):
        status, table, _story, _strip = served.client.predict(*compare_args, api_name="/compare")
        assert "Done" in status and "timed" in status
        rows = table["data"] if isinstance(table, dict) else table
        counted.append([row[:5] for row in rows])  # method, nodes / pass, passes, tokens, MAT
        timed = {row[0]: _timed(row[column]) for row in rows}
        for median, low, high in timed.values():
            assert 0 < low <= median + 0.0005 and median <= high + 0.0005  # (rounded to 3 decimals)
        ar, half = timed["Autoregressive"][0], 0.0005  # (seconds are shown to 3 decimals, speedups to 2)
        for row in rows:
            seconds = timed[row[0]][0]
            shown = float(row[measure.HEADERS.index("speedup vs AR (timed)")].rstrip("x"))
            low, high = (ar - half) / (seconds + half), (ar + half) / (seconds - half)
            assert low - 0.005 <= shown <= high + 0.005, row
    assert all(run == counted[0] for run in counted[1:])


def _recorded(served) -> dict:
    served.client.predict(*_args(served.image, max_new=12), api_name="/run")
    return json.loads(Path(served.client.predict(api_name="/download")).read_text(encoding="utf-8"))


def _hostile_trace(data: dict, case: str) -> str:
    if case == "not json":
        return "{not json"
    if case == "nested":
        return '{"steps": ' + "[" * 50_000 + "]" * 50_000 + "}"
    data = json.loads(json.dumps(data))
    step = next(s for s in data["steps"] if s["nodes"])
    if case == "own parent":
        step["nodes"][0]["parent"] = 0
    elif case == "wrong type":
        step["nodes"][0]["score"] = "high"
    elif case == "missing field":
        del step["nodes"][0]["accepted"]
    elif case == "chain":
        node = step["nodes"][0]
        step["nodes"] = [
            {**node, "id": i, "parent": i - 1, "depth": i + 1, "accepted": False} for i in range(20_000)
        ]
        step["accepted_ids"] = []
    elif case == "too large":
        data["text"] = "x" * (17 * 1024 * 1024)
    elif case == "lone surrogate":  # (written as the escape \ud800: its answer could not be sent)
        step["new_texts"][0] = "\ud800"
    return json.dumps(data)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not json", "invalid JSON"),
        ("nested", "nested too deeply"),
        ("own parent", "node 0 has parent 0"),
        ("wrong type", "'score' must be a finite number"),
        ("missing field", "has no 'accepted'"),
        ("chain", "20000 nodes; the limit is 8192"),
        ("too large", "too large (over 16 MiB)"),
        ("lone surrogate", "'new_texts' is not valid Unicode (a lone surrogate)"),
    ],
)
def test_hostile_replays_are_refused_with_the_reason(served, tmp_path, case, message):
    from gradio_client import handle_file

    path = tmp_path / "trace.json"
    path.write_text(_hostile_trace(_recorded(served) if case not in ("not json", "nested") else {}, case))
    with pytest.raises(Exception, match="Cannot replay this file") as caught:
        served.client.predict(handle_file(str(path)), api_name="/replay")
    assert message in str(caught.value)
    _no_server_path(str(caught.value))


def test_html_in_a_replayed_trace_is_shown_as_text(served, tmp_path):
    from gradio_client import handle_file

    data = _recorded(served)
    hostile = '<img src="http://127.0.0.1:9/x.png"><a href="http://evil">link</a><form action=x>'
    data["settings"]["model"] = hostile
    data["settings"]["method"] = "[click](http://evil) *bold*"
    step = next(s for s in data["steps"] if s["nodes"])
    step["nodes"][0]["sources"] = [hostile]
    step["new_sources"] = [hostile] * len(step["new_sources"])
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    replayed = served.client.predict(handle_file(str(path)), api_name="/replay")
    status = replayed[7]
    assert "<img" not in status and "<a " not in status and "<form" not in status
    assert "&lt;img" in status and "\\[click\\]\\(http\\:\\/\\/evil\\)" in status


def test_sampled_runs_are_seeded_exact_and_show_their_draws(served):
    from recap.decode import generate
    from recap.runtime import Runtime
    from recap.sampling import SamplingSettings

    sampled = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 3, "max_new": 12}
    final = served.client.predict(*_args(served.image, **sampled), api_name="/run")
    first = _download(served.client)
    served.client.predict(*_args(served.image, **sampled), api_name="/run")
    # a seeded run commits AR's seeded tokens whichever drafter ran (the library's exactness contract)
    target = tiny("llava")
    settings = SamplingSettings(0.8, 20, 0.9, 3)
    expected = generate(
        target, Runtime(target).drafter("ar"), PROMPT, [noise_image(0)], 12, sampling=settings
    )
    assert first.tokens == _download(served.client).tokens == expected.tokens
    assert first.settings["temperature"] == 0.8 and first.settings["seed"] == 3
    assert all(step.draws for step in first.steps[1:]), "every sampled pass records its draws"
    assert "children tried (target's p)" in final[WORDS]
    # Compare stays greedy, and says so when sampling is set
    compare_args = [*_args(served.image, **sampled)[:-1], measure.DEVICE]
    status, table, _story, _strip = served.client.predict(*compare_args, api_name="/compare")
    assert "Compare decodes greedily" in status
    identical = measure.HEADERS.index("identical to AR")
    assert all(row[identical] == "yes" for row in (table["data"] if isinstance(table, dict) else table))


def test_greedy_runs_record_no_draws_and_explain_each_step(served):
    final = served.client.predict(*_args(served.image, method="recap", max_new=8), api_name="/run")
    trace = _download(served.client)
    assert all(step.draws is None for step in trace.steps)
    assert final[WORDS].startswith('<div class="recap-words"><p>Step ') and "recap-draws" not in final[WORDS]


def test_app_py_help_and_a_bad_port_exit_before_anything_is_built(monkeypatch, capsys):
    import app

    def built():
        raise AssertionError("nothing may be built for --help or a bad option")

    monkeypatch.setattr(app, "compile_kernels", built)
    with pytest.raises(SystemExit) as help_exit:
        app.main(["--help"])
    assert help_exit.value.code == 0 and "--port" in capsys.readouterr().out
    for bad in (["--port", "x"], ["--port", "70000"], ["--nope"]):
        with pytest.raises(SystemExit) as bad_exit:
            app.main(bad)
        assert bad_exit.value.code == 2


def test_app_py_host_and_port_override_the_environment(monkeypatch):
    import app

    launched = {}

    class Demo:
        studio = None

        def queue(self, **_):
            return self

        def launch(self, **options):
            launched.update(options)

    monkeypatch.setenv("GRADIO_SERVER_PORT", "7861")
    monkeypatch.setattr(app, "compile_kernels", lambda: None)
    monkeypatch.setattr(app, "build_demo", Demo)
    monkeypatch.setattr(app, "prewarm_in_background", lambda studio: None)
    import gc

    try:
        app.main([])
        # the built studio's objects are frozen: no full collection scans them (their pauses showed in
        # a visitor's timed verify phase)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert launched["server_port"] == 7861  # the environment, when no option is given
    app.main(["--host", "0.0.0.0", "--port", "8001"])
    gc.unfreeze()
    assert (launched["server_name"], launched["server_port"]) == ("0.0.0.0", 8001)


@pytest.mark.parametrize(
    ("mode", "usable"), [("fixed", True), ("auto", False), (["fixed"], False), (None, False)]
)
def test_the_fixed_budget_slider_is_usable_only_with_a_fixed_budget(mode, usable):
    from recap.studio.ui.layout import fixed_budget_slider

    assert fixed_budget_slider(mode).interactive is usable
