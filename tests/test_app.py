"""The studio end to end: importable without a model, one streamed run over HTTP, bad inputs answered.

The app is launched on 127.0.0.1 (a free port) with an injected runtime factory that serves the
in-process tiny LLaVA, and driven through `gradio_client` like any API user would.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import noise_image, tiny

ROOT = Path(__file__).resolve().parent.parent
TINY = "tiny-llava"
MISSING = "missing-org/missing-model"
PROMPT = "the cat is"


def test_import_builds_nothing_and_loads_no_model():
    # A fresh interpreter: importing app must not build Blocks, load a model, or touch torch threads.
    code = (
        "import sys, app, recap.models as m\n"
        "assert app._CACHE.loaded('embedded') is None\n"
        "assert 'transformers.models.llava' not in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _factory(model_id: str):
    from recap.runtime import Runtime

    if model_id == TINY:
        return Runtime(tiny("llava"))
    raise ValueError(f"cannot load model {model_id!r}: not available offline")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(client, image path)`` of a running studio serving the tiny LLaVA."""
    from gradio_client import Client

    import app

    demo = app.build_demo(runtime_factory=_factory, models=[TINY, MISSING])
    port = _free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    folder = tmp_path_factory.mktemp("inputs")
    image = folder / "noise.png"
    noise_image(0).save(image)
    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
    yield client, image, folder
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
        delay_ms,
    ]


def _ar_reference(max_new: int):
    from recap.decode import generate
    from recap.runtime import Runtime

    target = tiny("llava")
    result = generate(target, Runtime(target).drafter("ar"), PROMPT, [noise_image(0)], max_new)
    return result.tokens, result.text


def test_run_streams_steps_and_matches_autoregressive(served):
    from recap.trace import RunTrace

    client, image, _ = served
    job = client.submit(*_args(image, delay_ms=5), api_name="/run")
    updates = list(job)
    assert len(updates) >= 3, "the answer should arrive in several streamed updates"
    final = job.outputs()[-1]
    answer, download = final[0], final[8]
    assert answer, "the highlighted answer is empty"
    trace = RunTrace.load(download["value"] if isinstance(download, dict) else download)
    tokens, text = _ar_reference(24)
    assert trace.tokens == tokens and trace.text == text
    assert trace.settings["method"] == "recap" and trace.steps[0].step == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"image": None}, "upload an image"),
        ({"prompt": "   "}, "prompt is empty"),
        ({"prompt": "x" * 9000}, "too long"),
        ({"persistent": False, "context": False, "suffix": False}, "at least one of"),
        ({"model": MISSING}, "Cannot load model"),
    ],
)
def test_bad_input_gives_its_message_and_the_server_keeps_serving(served, overrides, message):
    client, image, _ = served
    kwargs = {"image": image, **overrides}
    with pytest.raises(Exception, match=message):
        client.predict(*_args(kwargs.pop("image"), **kwargs), api_name="/run")
    assert client.predict(*_args(image, method="pld", max_new=6), api_name="/run")[0]


def test_not_an_image_is_refused(served):
    client, image, folder = served
    fake = folder / "notes.png"
    fake.write_text("this is text, not pixels")
    with pytest.raises(Exception, match="not an image"):
        client.predict(*_args(fake), api_name="/run")
    assert client.predict(*_args(image, method="ar", max_new=4), api_name="/run")[0]


def test_huge_image_warns_and_continues(monkeypatch, tmp_path):
    import app
    from recap.inputs import MAX_IMAGE_PIXELS

    warnings = []
    monkeypatch.setattr(app.gr, "Warning", warnings.append)
    big = tmp_path / "big.png"
    noise_image(1, size=(1500, 1000)).save(big)
    image = app.read_image(str(big), needs_image=True)
    assert image.width * image.height <= MAX_IMAGE_PIXELS
    assert warnings and "downscaled" in warnings[0]


def test_compare_sensitivity_and_replay(served, tmp_path):
    from gradio_client import handle_file

    client, image, _ = served
    client.predict(*_args(image, max_new=16), api_name="/run")
    _status, table, strip = client.predict(*_args(image, max_new=16)[:-1], api_name="/compare")
    rows = table["data"] if isinstance(table, dict) else table
    assert [r[0] for r in rows] == ["Autoregressive", "Prompt lookup", "Token Recycling", "RECAP"]
    assert all(r[6] == "yes" for r in rows)
    assert "<table>" in strip
    _answer, sens_table, sens_status = client.predict("blank (grey)", api_name="/sensitivity")
    assert "image-sensitive" in sens_status
    assert len(sens_table["data"] if isinstance(sens_table, dict) else sens_table) == 4

    final = client.predict(*_args(image, max_new=8), api_name="/run")
    trace_file = final[8]["value"] if isinstance(final[8], dict) else final[8]
    replayed = client.predict(handle_file(trace_file), api_name="/replay")
    assert replayed[0] == final[0] and "Replaying" in replayed[7]

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(Exception, match="Cannot replay"):
        client.predict(handle_file(str(bad)), api_name="/replay")
