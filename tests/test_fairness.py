"""The decode line is fair across clients: a client (an address, whatever its number of sessions) gets
its turn whatever another client has queued, holds at most its share of the line, and is told so in a
plain message; runs, comparisons and sensitivity passes all go through the line, and a run or a
comparison shares its slot in turns; paced displays are bounded per client too; gradio's own thread
bound never acts before the studio's; a prompt longer than the model's positions is refused.

Nothing here depends on how fast this machine is: work functions wait on events, orders are recorded
as the work runs, and a server test waits for states (a refusal, a count), never for a duration.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import free_port, hard_timeout, noise_image, tiny

TINY = "tiny-llava"
HARD_TIMEOUT_S = 600  # a hang fails the test instead of stalling the suite
WAIT_S = 120.0  # the longest a state is waited for (a busy 2-core machine is slow, never this slow)
STATUS = 7  # /run's status output (the client leaves out the Download button)


@pytest.fixture(autouse=True)
def timeout_each_test():
    with hard_timeout(HARD_TIMEOUT_S):
        yield


def _recorder(order: list, name: str, gate: threading.Event | None = None):
    """Work that records ``name`` when it runs (after ``gate`` opens, if given)."""

    def work(job):
        order.append(name)
        if gate is not None:
            assert gate.wait(WAIT_S), "the gate never opened"
        return name

    return work


def _comparison(order: list, gate: threading.Event):
    """A comparison's work: a generator of three methods (the first waits for ``gate``), recorded."""

    def work(job):
        for method in ("ar", "pld", "recap"):
            order.append(f"A:{method}")
            if method == "ar":
                assert gate.wait(WAIT_S)
            yield
        return "compared"

    return work


def _ended(*jobs) -> None:
    for job in jobs:
        assert job.ended.wait(WAIT_S), "a job never ended"


# ------------------------------------------------------------------------------ the fair line
def test_a_client_with_many_runs_waits_its_turn_behind_another_clients_first_run():
    # One slot. Client A submits four runs (the first holds the slot until the gate opens), then client
    # B submits one: B's run is the second to start, not the fifth. (Whether A's first run has started
    # when the others arrive does not matter: a client whose work has not started yet goes first.)
    from recap.studio.guard.decode_line import DecodeSlots

    slots, order, gate = DecodeSlots(1, 10), [], threading.Event()
    try:
        jobs = [slots.submit(_recorder(order, "A1", gate), "A")]
        jobs += [slots.submit(_recorder(order, f"A{i}"), "A") for i in (2, 3, 4)]
        jobs.append(slots.submit(_recorder(order, "B1"), "B"))
        gate.set()
        _ended(*jobs)
    finally:
        slots.shutdown()
    assert order == ["A1", "B1", "A2", "A3", "A4"]
    assert [job.result for job in jobs] == ["A1", "A2", "A3", "A4", "B1"]


def test_waiting_clients_are_served_in_turns():
    # A holds the slot with two more queued, B has two queued, C one: each waiting client gets one
    # turn per round, the client whose work started least recently first (then who came first).
    from recap.studio.guard.decode_line import DecodeSlots

    slots, order, gate = DecodeSlots(1, 10), [], threading.Event()
    try:
        jobs = [slots.submit(_recorder(order, "A1", gate), "A")]
        assert jobs[0].started.wait(WAIT_S)  # A's work has started: A goes after the others now
        for name in ("A2", "A3", "B1", "B2", "C1"):
            jobs.append(slots.submit(_recorder(order, name), name[0]))
        gate.set()
        _ended(*jobs)
    finally:
        slots.shutdown()
    assert order == ["A1", "B1", "C1", "A2", "B2", "A3"]


@pytest.mark.parametrize(
    ("turn_s", "expected"),
    [
        (0.0, ["A:ar", "B:run", "A:pld", "A:recap"]),
        (600.0, ["A:ar", "A:pld", "A:recap", "B:run"]),
    ],
)
def test_a_comparisons_work_gives_its_slot_to_another_clients_run_between_its_methods(turn_s, expected):
    # Work that is a generator runs in turns: at a yield once its turn is over, if another client waits,
    # it goes back to the head of its own client's queue and the slot serves the other client first.
    # With a turn of 600 s the three methods run back to back though B waits from the first: a short
    # piece of work is not cut into turns (the turn is a lower bound, never waited for).
    from recap.studio.guard.decode_line import DecodeSlots

    slots, order, gate = DecodeSlots(1, 10, turn_s=turn_s), [], threading.Event()
    try:
        compared = slots.submit(_comparison(order, gate), "A")
        assert compared.started.wait(WAIT_S)
        run = slots.submit(_recorder(order, "B:run"), "B")
        gate.set()
        _ended(compared, run)
    finally:
        slots.shutdown()
    assert order == expected
    assert compared.result == "compared" and slots.counts() == (0, 0)
    with pytest.raises(ValueError, match="turn_s >= 0"):
        DecodeSlots(1, 10, turn_s=-1.0)


def test_display_tickets_bound_paced_displays_in_all_and_per_client():
    from recap.studio.guard.tickets import Tickets

    tickets = Tickets(3, per_client=2)
    assert tickets.take("A") and tickets.take("A")
    assert not tickets.take("A")  # A's share
    assert tickets.take("B")
    assert not tickets.take("C")  # the total
    assert (tickets.held("A"), tickets.held("B"), tickets.held()) == (2, 1, 3)
    tickets.give("A")
    assert tickets.take("C") and not tickets.take("A")
    for client in ("A", "B", "C"):
        tickets.give(client)
    assert tickets.held() == 0
    with pytest.raises(RuntimeError, match="never taken"):
        tickets.give("A")
    with pytest.raises(ValueError):
        Tickets(0)


def test_with_a_share_a_client_rests_after_its_work_in_proportion(monkeypatch):
    # Replays: a client whose replay took 1 s to read may take no ticket for 3 s more (share 0.25),
    # so that one client's replays back to back use at most a quarter of the server; others are free.
    from recap.studio.guard import tickets as slots

    now = [100.0]
    monkeypatch.setattr(slots.time, "monotonic", lambda: now[0])
    tickets = slots.Tickets(2, per_client=1, share=0.25)
    assert tickets.take("A")
    tickets.give("A", seconds=1.0)
    assert tickets.resting("A") == pytest.approx(3.0) and not tickets.take("A")
    assert tickets.take("B")  # another client does not wait for A's rest
    tickets.give("B", seconds=0.01)
    now[0] += 2.9
    assert not tickets.take("A")
    now[0] += 0.2
    assert tickets.resting("A") == 0 and tickets.take("A")
    with pytest.raises(ValueError):
        slots.Tickets(1, share=0)


def test_the_per_client_cap_refuses_with_a_plain_message_and_is_released():
    from recap.studio.guard.decode_line import Busy, ClientBusy, DecodeSlots

    slots, order, gate = DecodeSlots(1, 10, per_client=2), [], threading.Event()
    try:
        first = slots.submit(_recorder(order, "A1", gate), "A")
        second = slots.submit(_recorder(order, "A2"), "A")
        with pytest.raises(ClientBusy) as refused:
            slots.submit(_recorder(order, "A3"), "A")
        assert refused.value.message == (
            "You already have 2 runs decoding or waiting: wait for one to finish or press Stop."
        )
        assert isinstance(refused.value, Busy)  # (a handler that only knows Busy still refuses it)
        other = slots.submit(_recorder(order, "B1"), "B")  # another client is not held back
        # a job cancelled while it waits gives its place back at once, without running
        second.cancel("stopped")
        assert second.ended.is_set() and slots.held("A") == 1
        third = slots.submit(_recorder(order, "A3"), "A")
        # a job that ends gives its place back too
        gate.set()
        _ended(first, other, third)
        assert slots.held("A") == 0 and slots.held("B") == 0
        slots.submit(_recorder(order, "A4"), "A")
        slots.submit(_recorder(order, "A5"), "A")
    finally:
        gate.set()
        slots.shutdown()
    assert "A2" not in order


def test_a_replaced_job_does_not_count_against_its_client():
    # A session's newer run replaces its older one: the newer is let in though the client is at its cap.
    from recap.studio.guard.decode_line import ClientBusy, DecodeSlots

    slots, order, gate = DecodeSlots(1, 10, per_client=2), [], threading.Event()
    try:
        running = slots.submit(_recorder(order, "A1", gate), "A")
        older = slots.submit(_recorder(order, "A2"), "A")
        newer = slots.submit(_recorder(order, "A3"), "A", replacing=older)
        older.cancel("replaced")  # (what `SessionJobs.replace` does next)
        assert older.ended.is_set() and slots.held("A") == 2
        with pytest.raises(ClientBusy):
            slots.submit(_recorder(order, "A4"), "A")
        other = slots.submit(_recorder(order, "B1"), "B")
        with pytest.raises(ClientBusy):  # another client's job is no excuse
            slots.submit(_recorder(order, "A4"), "A", replacing=other)
        gate.set()
        _ended(running, newer, other)
    finally:
        gate.set()
        slots.shutdown()
    assert order == ["A1", "B1", "A3"]  # (B's work has not started yet: it goes before A's second)


def test_the_global_cap_still_refuses_and_a_cancelled_waiting_job_frees_its_place():
    from recap.studio.guard.decode_line import Busy, ClientBusy, DecodeSlots

    slots, order, gate = DecodeSlots(1, 1, per_client=2), [], threading.Event()
    try:
        running = slots.submit(_recorder(order, "A1", gate), "A")
        assert running.started.wait(WAIT_S)  # (it holds the slot)
        waiting = slots.submit(_recorder(order, "B1"), "B")
        with pytest.raises(Busy) as refused:
            slots.submit(_recorder(order, "C1"), "C")
        assert not isinstance(refused.value, ClientBusy)
        assert refused.value.message.startswith("The studio is busy (2 runs are decoding or waiting)")
        waiting.cancel("stopped")
        assert waiting.ended.is_set() and slots.counts() == (1, 0)
        again = slots.submit(_recorder(order, "C1"), "C")
        gate.set()
        _ended(running, again)
    finally:
        gate.set()
        slots.shutdown()
    assert order == ["A1", "C1"]


def test_jobs_keep_the_callers_context_errors_and_shutdown():
    from recap.studio.guard.decode_line import DecodeSlots
    from recap.studio.guard.jobs import Cancelled

    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="none")

    async def scenario():
        slots = DecodeSlots(1, 10)
        gate = threading.Event()
        marker.set("the caller's")
        seen = await slots.submit(lambda job: marker.get(), "A").outcome()
        with pytest.raises(ZeroDivisionError):
            await slots.submit(lambda job: 1 / 0, "A").outcome()
        blocker = slots.submit(lambda job: gate.wait(WAIT_S), "A")
        assert await asyncio.to_thread(blocker.started.wait, WAIT_S)
        left = slots.submit(lambda job: "never", "B")
        slots.shutdown()  # waiting work is cancelled and ends; running work ends on its own
        with pytest.raises(Cancelled, match="shutdown"):
            await left.outcome()
        gate.set()
        assert await blocker.outcome() is True
        with pytest.raises(RuntimeError, match="shut down"):
            slots.submit(lambda job: None, "A")
        return seen

    assert asyncio.run(scenario()) == "the caller's"


# ---------------------------------------------------------------------------- client identity
def _request(host: str | None, forwarded: list[str] | None = None):
    """A gradio request as a handler gets it (from starlette's request: one header line per entry of
    ``forwarded``)."""
    import gradio as gr
    from starlette.requests import Request

    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded or []]
    scope = {"type": "http", "headers": headers, "client": (host, 40000) if host else None}
    return gr.Request(request=Request(scope), session_hash="s")


def test_client_key_reads_the_peer_or_the_trusted_proxys_entry():
    import gradio as gr

    from recap.studio.guard.clients import NO_CLIENT, client_key, key_hash

    # no proxy: the peer address; a forged header is ignored
    assert client_key(_request("203.0.113.5"), 0) == "203.0.113.5"
    assert client_key(_request("203.0.113.5", ["198.51.100.1"]), 0) == "203.0.113.5"
    # one proxy: the entry it appended (the last); what the client sent stays to its left
    forged = ["198.51.100.1, 198.51.100.2", "192.0.2.44"]  # two header lines: the client's, the proxy's
    assert client_key(_request("10.0.0.1", forged), 1) == "192.0.2.44"
    assert client_key(_request("10.0.0.1", ["198.51.100.1, 192.0.2.44"]), 1) == "192.0.2.44"
    # two proxies: the outer one appended the client's address, the inner one the outer's
    assert client_key(_request("10.0.0.1", ["198.51.100.1, 192.0.2.44, 10.0.0.9"]), 2) == "192.0.2.44"
    # fewer entries than proxies (a request that did not come through them): the peer address
    assert client_key(_request("10.0.0.1", ["192.0.2.44"]), 2) == "10.0.0.1"
    assert client_key(_request("10.0.0.1"), 1) == "10.0.0.1"
    # gradio's copy of a request (a plain mapping of headers)
    copied = gr.Request(client={"host": "10.0.0.1"}, headers={"x-forwarded-for": "1.2.3.4, 192.0.2.7"})
    assert client_key(copied, 1) == "192.0.2.7" and client_key(copied, 0) == "10.0.0.1"
    # an IPv6 host counts by its /64; an IPv4-mapped address as the IPv4 one
    assert client_key(_request("2001:db8::1"), 0) == client_key(_request("2001:db8::ffff:2"), 0)
    assert client_key(_request("2001:db8::1"), 0) != client_key(_request("2001:db8:0:1::1"), 0)
    assert client_key(_request("::ffff:192.0.2.1"), 0) == "192.0.2.1"
    assert client_key(None, 1) == NO_CLIENT and client_key(_request(None), 0) == NO_CLIENT
    assert len(key_hash("192.0.2.44")) == 10 and "192.0.2.44" not in key_hash("192.0.2.44")


def test_the_bounds_are_read_from_the_environment_and_checked(monkeypatch):
    from recap.studio import environment

    for name in ("RECAP_PROXY_HOPS", "SPACE_ID", "RECAP_PER_CLIENT"):
        monkeypatch.delenv(name, raising=False)
    assert environment.proxy_hops() == 0 and environment.per_client() == 2
    monkeypatch.setenv("SPACE_ID", "someone/recap")  # a Hugging Face Space: one proxy in front
    assert environment.proxy_hops() == 1
    monkeypatch.setenv("RECAP_PROXY_HOPS", "2")
    assert environment.proxy_hops() == 2
    for bad, message in (("two", "whole number"), ("-1", "from 0 to"), ("99", "from 0 to")):
        monkeypatch.setenv("RECAP_PROXY_HOPS", bad)
        with pytest.raises(ValueError, match=f"RECAP_PROXY_HOPS must be .*{message}"):
            environment.proxy_hops()
    monkeypatch.setenv("RECAP_PER_CLIENT", "0")
    with pytest.raises(ValueError, match="RECAP_PER_CLIENT must be at least 1"):
        environment.per_client()
    monkeypatch.delenv("RECAP_TURN_S", raising=False)
    assert environment.turn_s() == environment.TURN_S == 0.5
    for value, expected in (("0", 0.0), ("2.5", 2.5), (" OFF ", float("inf"))):
        monkeypatch.setenv("RECAP_TURN_S", value)
        assert environment.turn_s() == expected
    for bad in ("soon", "-1", "nan", "inf", "1e9"):
        monkeypatch.setenv("RECAP_TURN_S", bad)
        with pytest.raises(ValueError, match="RECAP_TURN_S must be"):
            environment.turn_s()


def _factory(model_id: str):
    from recap.runtime import Runtime

    if model_id == TINY:
        return Runtime(tiny("llava"))
    raise ValueError(f"cannot load model {model_id!r}")


def test_gradios_thread_bound_is_above_everything_the_studio_lets_in(monkeypatch):
    # gradio serves at most max_threads events at once and queues the rest first come, first served,
    # whoever sent them: the studio's own bounds must act first. Runs, comparisons and sensitivity
    # passes have no gradio limit (they wait in the studio's line); every other queued event has one.
    import app
    from recap.studio import environment

    monkeypatch.setenv("RECAP_CONCURRENCY", "3")
    monkeypatch.setenv("RECAP_WAITING", "10")
    demo = app.build_demo(runtime_factory=_factory, models=[TINY])
    queued = [fn for fn in demo.fns.values() if fn.fn is not None and fn.queue]
    by_name = {fn.api_name: fn for fn in queued}
    for name in ("run", "compare", "sensitivity"):
        assert by_name[name].concurrency_limit is None, name
    assert by_name["replay"].concurrency_limit == environment.REPLAY_EVENTS > environment.REPLAY_CONCURRENCY
    # the events that draw from a stored trace share the replay's group (its drawing tickets answer them)
    drawing = [fn for fn in queued if fn.concurrency_id == by_name["replay"].concurrency_id]
    assert {"replay", "step", "download"} <= {fn.api_name for fn in drawing}
    assert all(fn.concurrency_limit == environment.REPLAY_EVENTS for fn in drawing)
    limited = {
        fn.concurrency_id: fn.concurrency_limit
        for fn in queued
        if fn.concurrency_limit is not None and fn not in drawing
    }
    assert len(limited) <= environment.OTHER_EVENT_GROUPS, limited
    assert all(limit in ("default", 3) for limit in limited.values()), limited
    line = 3 + 10
    others = environment.REPLAY_EVENTS + len(limited) * 3
    assert environment.launch_kwargs()["max_threads"] == environment.max_threads()
    assert environment.max_threads() >= line + environment.displays() + others
    tickets = demo.studio.displays
    clients = [f"192.0.2.{i}" for i in range(line)]
    held = sum(tickets.take(c) for c in clients for _ in range(3))  # paced displays it lets in at once
    assert held == environment.displays() == line and tickets.held(clients[0]) == 2
    for client in clients:
        while tickets.held(client):
            tickets.give(client)
    assert tickets.held() == 0


# ------------------------------------------------------------------------------ prompt length
def test_positions_check_names_both_numbers():
    from recap.inputs import check_positions, max_positions

    check_positions(1000, 24, 1024)
    check_positions(10, 512, None)  # a model that does not say: no check
    with pytest.raises(ValueError) as refused:
        check_positions(1573, 512, 1024, images=1)
    message = str(refused.value)
    assert "1573 tokens (the image's included)" in message and "512 new tokens" in message
    assert "maximum of 1024" in message and "shorten the prompt" in message
    with pytest.raises(ValueError, match="ask for at most 24 new tokens"):
        check_positions(1000, 64, 1024)
    assert max_positions(SimpleNamespace(max_position_embeddings=1024)) == 1024
    assert max_positions(SimpleNamespace(n_positions=2048)) == 2048
    assert max_positions(SimpleNamespace()) is None and max_positions(None) is None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The studio as ``python app.py`` serves it (its queue and thread bounds), on the tiny LLaVA,
    behind one trusted proxy (each test client says its address in ``X-Forwarded-For``); a run whose
    prompt starts with "greedy" decodes only once ``gate`` is open."""
    import app
    from recap.studio.environment import max_threads, queue_kwargs

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
        patch.setenv("RECAP_PROXY_HOPS", "1")
        for name in ("RECAP_PER_CLIENT", "RECAP_CONCURRENCY", "RECAP_WAITING"):
            patch.delenv(name, raising=False)
        demo = app.build_demo(runtime_factory=_factory, models=[TINY])
        studio, gate = demo.studio, threading.Event()
        stream = studio.stream

        def gated(runtime, model_id, drafter, prompt, *args, **kwargs):
            if prompt.startswith("greedy"):
                assert gate.wait(WAIT_S), "the gate never opened"
            yield from stream(runtime, model_id, drafter, prompt, *args, **kwargs)

        studio.stream = gated
        port = free_port()
        demo.queue(**queue_kwargs()).launch(
            server_name="127.0.0.1",
            server_port=port,
            prevent_thread_lock=True,
            quiet=True,
            max_threads=max_threads(),
        )
        image = tmp_path_factory.mktemp("fair") / "noise.png"
        noise_image(0).save(image)
        yield SimpleNamespace(
            url=f"http://127.0.0.1:{port}/", demo=demo, studio=studio, image=image, gate=gate
        )
        gate.set()
        demo.close()


def _args(image, prompt="the cat is", max_new=8, method="ar"):
    from gradio_client import handle_file

    settings = [TINY, method, "fixed", 8, 8, 8, True, True, True, max_new, "per session", 0.0, 0, 1.0, None]
    return [handle_file(str(image)), prompt, *settings]


def _client(url: str, address: str):
    from gradio_client import Client

    return Client(url, verbose=False, headers={"X-Forwarded-For": address})


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S:.0f} s for {what}"
        time.sleep(0.05)


def _error(job) -> str:
    try:
        job.result(timeout=WAIT_S)
    except Exception as error:
        return str(error)
    return ""


def test_one_client_with_many_sessions_holds_its_share_and_another_client_is_served(server):
    # A greedy client opens five sessions: one comparison and four runs, all held at the gate. It gets
    # its share of the line (2: the comparison counts), the three others are refused with the message;
    # another client's run is accepted and served meanwhile.
    from recap.studio.ui.measure import EQUAL

    key, visitor_address = "203.0.113.66", "198.51.100.7"
    greedy = [_client(server.url, f"10.9.9.9, {key}") for _ in range(5)]  # (it forges an entry too)
    visitor = _client(server.url, visitor_address)
    jobs = []
    try:
        jobs.append(greedy[0].submit(*_args(server.image, "greedy compare"), EQUAL, api_name="/compare"))
        _wait(lambda: server.studio.slots.held(key) == 1, "the comparison to be in the line")
        jobs += [
            c.submit(*_args(server.image, f"greedy run {i}"), 0, api_name="/run")
            for i, c in enumerate(greedy[1:])
        ]
        _wait(lambda: sum(j.done() for j in jobs) == 3, "three of the greedy client's runs to be refused")
        refused = [_error(j) for j in jobs if j.done()]
        assert all("You already have 2 runs decoding or waiting" in e for e in refused), refused
        assert not jobs[0].done() and server.studio.slots.held(key) == 2
        final = visitor.predict(*_args(server.image, "a visitor", max_new=8), 0, api_name="/run")
        assert final[STATUS].startswith("Done: 8 tokens"), final[STATUS]
        assert server.studio.slots.held(key) == 2 and sum(not j.done() for j in jobs) == 2
    finally:
        server.gate.set()
        for job in jobs:
            if not job.done():
                job.result(timeout=WAIT_S)
        for client in (*greedy, visitor):
            client.close()
    _wait(lambda: server.studio.slots.counts() == (0, 0), "the line to empty")
    assert server.studio.slots.held(key) == 0
    server.gate.clear()


def test_a_run_gives_its_slot_to_another_clients_run_between_its_passes(server, monkeypatch):
    # One slot, turns as short as can be: A's run (held at the gate before its first pass) and B's run,
    # queued meanwhile, alternate pass by pass once the gate opens, instead of B waiting for all of A.
    from recap.studio.guard.decode_line import DecodeSlots

    studio, passes = server.studio, []
    inner = studio.stream

    def logged(runtime, model_id, drafter, prompt, *args, **kwargs):
        for record in inner(runtime, model_id, drafter, prompt, *args, **kwargs):
            passes.append(prompt.split()[0])
            yield record

    one = DecodeSlots(1, 10, per_client=2, turn_s=0.0)
    monkeypatch.setattr(studio, "stream", logged)
    monkeypatch.setattr(studio, "slots", one)
    first, second = _client(server.url, "192.0.2.31"), _client(server.url, "192.0.2.32")
    try:
        long = first.submit(*_args(server.image, "greedy long run", max_new=8), 0, api_name="/run")
        _wait(lambda: one.counts() == (1, 0), "the first run to hold the slot")
        short = second.submit(*_args(server.image, "visitor", max_new=4), 0, api_name="/run")
        _wait(lambda: one.counts() == (1, 1), "the second run to wait")
        server.gate.set()
        assert short.result(timeout=WAIT_S)[STATUS].startswith("Done: 4 tokens")
        assert long.result(timeout=WAIT_S)[STATUS].startswith("Done: 8 tokens")
    finally:
        server.gate.set()
        one.shutdown()
        for client in (first, second):
            client.close()
    server.gate.clear()
    assert passes[:4] == ["greedy", "visitor", "greedy", "visitor"], passes
    assert passes.count("visitor") == 4 and passes.count("greedy") == 8, passes


def test_a_clients_third_paced_display_is_shown_at_once_and_says_why(server):
    # Two runs at a 500 ms display delay (two sessions of one client) decode at once and are then paced
    # for 20 s, holding the client's two display tickets but no place in the line: the client's third
    # run is let in, and shown without the delay, with the reason in its status.
    tickets, key = server.studio.displays, "192.0.2.41"
    clients = [_client(server.url, key) for _ in range(3)]
    try:
        slow = [c.submit(*_args(server.image, max_new=40), 500, api_name="/run") for c in clients[:2]]
        _wait(lambda: tickets.held(key) == 2, "both displays to be paced")
        _wait(lambda: server.studio.slots.held(key) == 0, "both runs to have decoded")
        final = clients[2].predict(*_args(server.image, max_new=8), 500, api_name="/run")
        assert final[STATUS].startswith("Done: 8 tokens"), final[STATUS]
        assert "Shown without the display delay" in final[STATUS] and "(2 a visitor)" in final[STATUS]
        for job in slow:
            assert "Shown without" not in job.result(timeout=WAIT_S)[STATUS]
    finally:
        for client in clients:
            client.close()
    _wait(lambda: tickets.held(key) == 0, "the tickets to come back")


def test_a_prompt_longer_than_the_models_positions_is_refused_and_the_server_keeps_serving(server):
    # The tiny LLaVA has 512 positions: a 3300-character prompt is 935 tokens with its image's.
    from recap.studio.ui.measure import EQUAL

    client = _client(server.url, "192.0.2.200")
    try:
        with pytest.raises(Exception) as refused:
            client.predict(*_args(server.image, "the cat is " * 300, max_new=8), 0, api_name="/run")
        message = str(refused.value)
        assert "935 tokens (the image's included) and 8 new tokens" in message, message
        assert "over this model's maximum of 512" in message, message
        with pytest.raises(Exception, match="maximum of 512"):  # the Compare tab checks it too
            client.predict(*_args(server.image, "the cat is " * 300), EQUAL, api_name="/compare")
        final = client.predict(*_args(server.image, max_new=8), 0, api_name="/run")
        assert final[STATUS].startswith("Done: 8 tokens"), final[STATUS]
    finally:
        client.close()


# ------------------------------------------------------------------------------------ sessions
def test_the_sessions_of_the_client_holding_the_most_are_dropped_first():
    # Five sessions of a greedy client, then a visitor's one (the least recently used of all), then a
    # session that never decoded: over the count, the greedy client's go first (its least recently used
    # first), the visitor's stays.
    from recap.studio.guard.sessions import SESSION_BYTES, ClientLedger

    owners = {f"greedy{i}": "203.0.113.66" for i in range(5)} | {"visitor": "198.51.100.7"}
    order = ["visitor", *(f"greedy{i}" for i in range(5)), "fresh"]  # least recently used first
    data = {sid: SimpleNamespace(state_data={}) for sid in order}
    holder = SimpleNamespace(
        lock=threading.Lock(), session_data=data, time_last_used={}, delete_state=lambda sid: None
    )
    ledger = ClientLedger(1 << 30, 4, busy=lambda sid: sid == "greedy1", owner=owners.get)
    ledger.attach(SimpleNamespace(state_holder=holder), SimpleNamespace(_id=1))
    assert [sid for sid, _ in ledger.sizes()] == [*(f"greedy{i}" for i in range(5)), "visitor", "fresh"]
    assert all(size == SESSION_BYTES for _, size in ledger.sizes())
    assert ledger.sweep(force=True) == 3
    assert set(data) == {"visitor", "greedy1", "greedy4", "fresh"}  # (greedy1 is busy: never dropped)


def test_heartbeats_come_only_without_news_and_never_hold_back_an_item():
    # A handler waiting for its job gets a None (values, waits) or an idle Update (paced) after every
    # heartbeat without news, and the job's items as they come.
    from recap.studio.guard.jobs import DecodeJob, paced

    job = DecodeJob()
    values = job.values(heartbeat_s=0.01)
    assert next(values) is None and next(values) is None
    job.put("step", "a")
    assert next(values) == "a"
    job.put("end")
    assert list(values) == []

    async def paced_updates() -> list:
        job = DecodeJob(asyncio.get_running_loop())
        steps, seen = [], []
        async for update in paced(job, steps, 0.0, 0.0, 0.0, heartbeat_s=0.01):
            seen.append("idle" if update.idle else (update.shown, update.final))
            if len(seen) == 2:
                job.put("step", "a")
                job.put("end")
        return seen

    assert asyncio.run(paced_updates()) == ["idle", "idle", (1, False), (1, True)]

    async def waits() -> tuple:
        job = DecodeJob(asyncio.get_running_loop())
        beats = 0
        async for _ in job.waits(0.01):
            beats += 1
            if beats == 2:
                job.result = "done"
                job.put("end")
        return beats, job.result

    assert asyncio.run(waits()) == (2, "done")


def test_a_waiting_line_never_outlives_the_wait():
    # At each heartbeat: the line's length while the job waits; once it has its slot, "Starting…" once
    # in place of the stale line, and nothing after another update replaced it.
    from recap.studio.guard.decode_line import WaitingLine

    told = iter(["Waiting: 2 ahead", "Waiting: 1 ahead", None, None, "Waiting: 1 ahead", None])
    line = WaitingLine(lambda: next(told))
    assert [line.status(), line.status(), line.status(), line.status()] == [
        "Waiting: 2 ahead",
        "Waiting: 1 ahead",
        "Starting…",
        None,
    ]
    assert line.status() == "Waiting: 1 ahead"
    line.shown_other()  # (a step was shown)
    assert line.status() is None


def _raw_post(url: str, api: str, data_json: str, address: str) -> str:
    """Start ``api`` through gradio's /call API as the client at ``address``; its event id."""
    import httpx

    body = '{"data": ' + data_json + "}"
    headers = {"content-type": "application/json", "X-Forwarded-For": address}
    response = httpx.post(f"{url}gradio_api/call/{api}", content=body, headers=headers, timeout=60)
    response.raise_for_status()
    return response.json()["event_id"]


def _upload(url: str, path) -> str:
    import httpx

    with open(path, "rb") as handle:
        response = httpx.post(f"{url}gradio_api/upload", files={"files": handle}, timeout=60)
    response.raise_for_status()
    return response.json()[0]


@pytest.mark.parametrize("api", ["run", "compare"])
def test_work_waiting_in_line_whose_visitor_left_leaves_the_line(server, monkeypatch, api):
    # One slot, held by A's run at the gate. B's run (or comparison) waits in line; its handler says the
    # line's length, then B closes the connection (a closed tab). Before, a waiting handler yielded
    # nothing, so gradio could not stop it: the work kept its place, and B's share, until A's run ended.
    # Now it yields every heartbeat, and gradio stops it and it leaves the line while the gate is shut.
    import json

    import httpx

    from recap.studio.guard import wrapper
    from recap.studio.guard.decode_line import DecodeSlots
    from recap.studio.ui.measure import EQUAL

    monkeypatch.setattr(wrapper, "HEARTBEAT_S", 0.2)  # (the guard's waits, around runs and comparisons)
    one = DecodeSlots(1, 10, per_client=2, turn_s=0.0)
    monkeypatch.setattr(server.studio, "slots", one)
    holder, leaver = "192.0.2.41", "192.0.2.42"
    first = _client(server.url, holder)
    try:
        held = first.submit(*_args(server.image, "greedy holder", max_new=4), 0, api_name="/run")
        _wait(lambda: one.counts() == (1, 0), "the first run to hold the slot")
        image = json.dumps({"path": _upload(server.url, server.image), "meta": {"_type": "gradio.FileData"}})
        settings = [TINY, "ar", "fixed", 8, 8, 8, True, True, True, 4, "per session", 0, 0, 1, None]
        last = 0 if api == "run" else EQUAL  # the display delay, or the budgets
        data = json.dumps([None, "a visitor", *settings, last]).replace("null", image, 1)
        event = _raw_post(server.url, api, data, leaver)
        seen = []
        with httpx.stream("GET", f"{server.url}gradio_api/call/{api}/{event}", timeout=WAIT_S) as stream:
            for line in stream.iter_lines():
                seen.append(line)
                assert not line.startswith("event: error"), seen
                if "Waiting for a decode slot: 1 decoding and 1 waiting" in line:
                    break  # the visitor saw where it stands, and leaves
        assert one.held(leaver) == 1
        _wait(lambda: one.held(leaver) == 0, "the work of the visitor who left to leave the line")
        assert one.counts() == (1, 0) and not held.done()
        server.gate.set()
        assert held.result(timeout=WAIT_S)[STATUS].startswith("Done: 4 tokens")
    finally:
        server.gate.set()
        one.shutdown()
        first.close()
    server.gate.clear()


def test_a_sensitivity_pass_waiting_in_line_leaves_it_when_its_handler_is_closed(server, monkeypatch):
    # gradio closes a handler whose visitor left at its next yield (the test above, for runs and
    # comparisons); the sensitivity pass's handler yields the line's length while it waits, and closing
    # it there takes its work out of the line.
    from recap.studio.guard.clients import NO_CLIENT
    from recap.studio.guard.decode_line import DecodeSlots
    from recap.studio.ui import sensitivity_tab

    one = DecodeSlots(1, 10, per_client=2, turn_s=0.0)
    monkeypatch.setattr(server.studio, "slots", one)
    monkeypatch.setattr(sensitivity_tab, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(server.studio.cache, "loaded", lambda model_id: object())
    gate = threading.Event()
    holder = one.submit(lambda job: gate.wait(WAIT_S), "192.0.2.51")
    _wait(lambda: one.counts() == (1, 0), "the holder to take the slot")
    handler = next(fn for fn in server.demo.fns.values() if fn.api_name == "sensitivity").fn
    trace = SimpleNamespace(settings={"method": "ar"}, steps=[])
    state = {"trace": trace, "image": noise_image(1), "prompt": "a visitor", "model": TINY}

    async def wait_then_leave() -> list:
        updates = handler(state, None, "blank (grey)", None)
        shown = [await updates.__anext__(), await updates.__anext__()]  # at once, then a heartbeat
        assert one.held(NO_CLIENT) == 1
        await updates.aclose()  # what gradio does once the visitor is gone
        return shown

    try:
        shown = asyncio.run(wait_then_leave())
        assert all("Waiting for a decode slot: 1 decoding and 1 waiting" in str(u) for u in shown), shown
        assert one.held(NO_CLIENT) == 0 and one.counts() == (1, 0)
    finally:
        gate.set()
        holder.take(WAIT_S)
        one.shutdown()
