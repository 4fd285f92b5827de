"""Many visitors at once: 6 clients x 3 runs each, concurrently, one run cancelled mid-stream.

Every answer must equal the one the same visitor gets alone (and greedy decoding's), and with the
default per-session memory no visitor's drafts may show another visitor's tokens. The second check is
exact: a visitor's drafted trees (every node's token and parent, every accepted path) must equal the
trees of the same runs made alone in a fresh session, which holds only if nothing from the other
visitors reached its memories. A control with the shared scope shows that the check can fail.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import free_port, noise_image, tiny

from recap.studio.ui import render
from recap.trace import RunTrace

TINY = "tiny-llava"
SHARED = "tiny-llava-shared"  # its own runtime, so the control's shared memory starts empty
CLIENTS = 6
#: Each visitor's three runs: (prompt, method). Methods with memories across requests: recap and tr.
RUNS = [("the cat is", "recap"), ("what colour is the square?", "tr"), ("the cat is black and", "recap")]
MAX_NEW = 20
CANCELLED = (0, 1)  # (client, run): this run is cancelled mid-stream
CANCELLED_MAX_NEW = 64  # the cancelled run is longer and slowed down (300 ms per step), to be caught
# before it ends: seconds are left for the cancel to arrive, even on a busy CPU


def _factory(model_id: str):
    from recap.runtime import Runtime

    if model_id in (TINY, SHARED):
        return Runtime(tiny("llava"))
    raise ValueError(f"cannot load model {model_id!r}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A studio offering the shared scope too (the operator's choice), on the tiny LLaVA."""
    import app

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RECAP_SHARED_MEMORY", "1")
        patch.setenv("RECAP_PROXY_HOPS", "1")  # (each visitor says its address: `_visit`)
        demo = app.build_demo(runtime_factory=_factory, models=[TINY, SHARED])
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    folder = tmp_path_factory.mktemp("visitors")
    for client in range(CLIENTS):
        noise_image(10 + client).save(folder / f"visitor{client}.png")
    yield f"http://127.0.0.1:{port}/", folder
    demo.close()


def _run_args(image, prompt, method, model=TINY, scope="per session", max_new=MAX_NEW, delay_ms=0):
    """The /run arguments: a fixed budget (the auto budget depends on timings, so trees would too)."""
    from gradio_client import handle_file

    settings = [model, method, "fixed", 8, 8, 8, True, True, True, max_new, scope, 0.0, 0, 1.0, None]
    return [handle_file(str(image)), prompt, *settings, delay_ms]


def _drafts(trace: RunTrace) -> list:
    """What a run drafted and committed, step by step (timings left out)."""
    return [
        (
            [(n.token, n.parent, tuple(n.sources)) for n in s.nodes],
            s.accepted_ids,
            s.new_tokens,
            s.new_sources,
        )
        for s in trace.steps
    ]


def _visit(
    url: str,
    image,
    runs,
    model=TINY,
    scope="per session",
    long_run: int | None = None,
    cancel: bool = False,
    address: str = "192.0.2.1",
) -> list:
    """One visitor (one session, from ``address``) making ``runs`` in order: each run's trace, or for the
    cancelled run the answer tokens it had shown when it was cancelled. ``long_run``: the run index made
    with `CANCELLED_MAX_NEW` tokens (and cancelled mid-stream if ``cancel``)."""
    from gradio_client import Client

    # the server trusts one proxy: the address in X-Forwarded-For is the visitor's (each visitor its own
    # share of the decode line, as visitors from different addresses have)
    client = Client(url, verbose=False, headers={"X-Forwarded-For": address})
    results = []
    try:
        for index, (prompt, method) in enumerate(runs):
            if index == long_run and cancel:
                results.append(_cancelled_run(client, image, prompt, method, model, scope))
                continue
            max_new = CANCELLED_MAX_NEW if index == long_run else MAX_NEW
            client.predict(*_run_args(image, prompt, method, model, scope, max_new), api_name="/run")
            results.append(RunTrace.load(client.predict(api_name="/download")))
    finally:
        client.close()
    return results


def _cancelled_run(client, image, prompt, method, model, scope) -> list[str]:
    args = _run_args(image, prompt, method, model, scope, CANCELLED_MAX_NEW, delay_ms=300)
    job = client.submit(*args, api_name="/run")
    seen = 0
    deadline = time.monotonic() + 240  # generous for a busy CPU, within the 300 s a hang is given
    while seen < 3 and time.monotonic() < deadline:
        seen = len(job.outputs())
        time.sleep(0.02)
    job.cancel()
    return [span["token"] for span in job.outputs()[-1][0]]


def test_concurrent_visitors_get_their_isolated_answers_and_only_their_own_drafts(server):
    from recap.decode import generate
    from recap.runtime import Runtime

    url, folder = server
    images = [folder / f"visitor{c}.png" for c in range(CLIENTS)]
    long_run = {CANCELLED[0]: CANCELLED[1]}
    alone = [_visit(url, images[c], RUNS, long_run=long_run.get(c)) for c in range(CLIENTS)]  # one at a time

    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [
            pool.submit(
                _visit,
                url,
                images[c],
                RUNS,
                long_run=long_run.get(c),
                cancel=True,
                address=f"192.0.2.{10 + c}",
            )
            for c in range(CLIENTS)
        ]
        together = [f.result(timeout=300) for f in futures]  # a hang fails here

    target = tiny("llava")
    for c in range(CLIENTS):
        for r, (prompt, _method) in enumerate(RUNS):
            max_new = CANCELLED_MAX_NEW if (c, r) == CANCELLED else MAX_NEW
            greedy = generate(target, Runtime(target).drafter("ar"), prompt, [noise_image(10 + c)], max_new)
            assert alone[c][r].tokens == greedy.tokens, f"visitor {c} run {r}: alone differs from greedy"
            if (c, r) == CANCELLED:  # what it showed before the cancel is the start of the full answer
                shown = together[c][r]
                full = [text for text, _ in render.highlighted_answer(alone[c][r].steps)]
                assert 0 < len(shown) < len(full) and shown == full[: len(shown)]
                continue
            assert together[c][r].tokens == alone[c][r].tokens, f"visitor {c} run {r}: answer differs"
            if c != CANCELLED[0] or r < CANCELLED[1]:  # after a cancelled run the memories differ
                assert _drafts(together[c][r]) == _drafts(alone[c][r]), f"visitor {c} run {r}: drafts differ"


def test_the_shared_scope_control_does_leak(server):
    # The same comparison with the process-wide scope: a second visitor's drafts change after a first
    # visitor's run, so equal drafts above really mean separate memories.
    url, folder = server
    first, second = folder / "visitor0.png", folder / "visitor1.png"
    runs = [RUNS[0]]
    alone = _visit(url, second, runs, model=SHARED, scope="per session")[0]
    _visit(url, first, RUNS, model=SHARED, scope="process-wide")
    after = _visit(url, second, runs, model=SHARED, scope="process-wide")[0]
    assert after.tokens == alone.tokens  # lossless either way
    assert _drafts(after) != _drafts(alone), (
        "the shared memory should have changed the second visitor's drafts"
    )
