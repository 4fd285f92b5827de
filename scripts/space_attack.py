"""A hostile stranger's attacks on a running studio, by hand: how long a visitor waits, what a replay
costs, how the server's memory grows with sessions. Loopback only.

    GRADIO_SERVER_PORT=7961 RECAP_OFFLINE=1 python app.py &
    python -m scripts.space_attack delay --pid PID [--visitor-delay 60]
    python -m scripts.space_attack replay --pid PID [--shape SHAPE | --file F] [--times N | --flood N]
        [--after SECONDS]
    python -m scripts.space_attack draw --pid PID [--shape sources] [--copies 4]    # (hops 1)
    python -m scripts.space_attack steps --pid PID [--shape wide] [--calls 8]       # (hops 1)
    python -m scripts.space_attack cost --pid PID [--shape sources]                 # (hops 1)
    python -m scripts.space_attack sessions --pid PID [-n 1000]
    RECAP_PROXY_HOPS=1 ... python app.py &   # (each client says its address in X-Forwarded-For)
    python -m scripts.space_attack crowd --pid PID [--seconds 110] [--comparisons]

``--pid``: the server's process (its RSS is read from /proc); ``--url`` (default
http://127.0.0.1:7961/) must be on 127.0.0.1. Every call goes through gradio's plain HTTP API
(``/gradio_api/call``), one session per call, as a script would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import httpx

from scripts.hostile_traces import SHAPES, crafted

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "assets" / "examples-v2" / "scene_1.png"
DETAILED = "Describe the image in detail."


class Server:
    def __init__(self, url: str, pid: int) -> None:
        if urllib.parse.urlparse(url).hostname != "127.0.0.1":
            raise SystemExit("only a studio on 127.0.0.1 may be attacked")
        self.url, self.pid = url.rstrip("/") + "/", pid

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        """The server's CPU time so far (user + system, all its threads), seconds."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def watch_rss(self) -> tuple[list[float], threading.Event]:
        """Sample the RSS every 20 ms in a thread until the event is set: ``([peak], stop)``."""
        peak, done = [self.rss_mb()], threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], self.rss_mb())
                time.sleep(0.02)

        threading.Thread(target=watch, daemon=True).start()
        return peak, done

    def upload(self, path: Path) -> dict:
        with open(path, "rb") as handle:
            response = httpx.post(f"{self.url}gradio_api/upload", files={"files": handle}, timeout=120)
        response.raise_for_status()
        return {"path": response.json()[0], "meta": {"_type": "gradio.FileData"}, "orig_name": path.name}

    def call(
        self, api: str, data: list, timeout: float = 600, address: str | None = None
    ) -> tuple[float, str, int]:
        """One call in its own session: ``(seconds, last event, bytes received)``; ``address``: the
        client it says it is (``X-Forwarded-For``, for a server behind `RECAP_PROXY_HOPS`)."""
        start = time.perf_counter()
        headers = {"X-Forwarded-For": address} if address else {}
        response = httpx.post(
            f"{self.url}gradio_api/call/{api}", json={"data": data}, headers=headers, timeout=60
        )
        if response.status_code == 503:  # gradio's queue is full
            return time.perf_counter() - start, "503", 0
        response.raise_for_status()
        kind, size = "", 0
        with httpx.stream(
            "GET",
            f"{self.url}gradio_api/call/{api}/{response.json()['event_id']}",
            headers=headers,
            timeout=timeout,
        ) as s:
            for line in s.iter_lines():
                size += len(line)
                if line.startswith("event:"):
                    kind = line.removeprefix("event: ")
        return time.perf_counter() - start, kind, size


def run_args(image: dict, prompt: str, method: str = "ar", max_new: int = 512, delay: int = 500) -> list:
    settings = [
        "embedded-v2",
        method,
        "fixed",
        8,
        8,
        8,
        True,
        True,
        True,
        max_new,
        "per session",
        0.0,
        0,
        1.0,
    ]
    return [image, prompt, *settings, None, delay]


def delay_attack(server: Server, visitor_delay: int) -> None:
    image = server.upload(IMAGE)
    server.call("run", run_args(image, "Describe the image.", max_new=4, delay=0))  # the model loads
    results: list = []
    hostile = [
        threading.Thread(target=lambda: results.append(server.call("run", run_args(image, DETAILED))))
        for _ in range(12)
    ]
    for thread in hostile:
        thread.start()
    time.sleep(5)
    seconds, kind, _ = server.call(
        "run", run_args(image, "Describe the image.", max_new=32, delay=visitor_delay)
    )
    print(f"visitor's 32-token run (delay {visitor_delay} ms): {seconds:.1f} s ({kind})", flush=True)
    for thread in hostile:
        thread.join()
    print("hostile runs:", sorted(round(s, 1) for s, _, _ in results), sorted({k for _, k, _ in results}))


def crowd_attack(server: Server, seconds: float, comparisons: bool = False) -> None:
    """Six clients with five sessions each send costly runs back to back (RECAP, 512 new tokens,
    temperature 2, budget 128) and two clients send comparisons, for ``seconds`` (``comparisons``: six
    clients with three sessions each send comparisons of up to 512 new tokens instead); meanwhile a
    visitor sends a 16-token run every 15 s (or when its last one ends). Prints the visitor's first
    output and end times and what the crowd got (served, refused)."""
    import statistics

    from gradio_client import Client, handle_file

    from recap.studio.ui.measure import EQUAL

    def settings(max_new: int, temperature: float, budget: int) -> list:
        return ["embedded-v2", "recap", "fixed", budget, 16, 8, True, True, True, max_new, "per session",
                temperature, 0, 1.0, None]  # fmt: skip

    def client(address: str) -> Client:
        return Client(server.url, verbose=False, headers={"X-Forwarded-For": address})

    stop, lock, jobs = threading.Event(), threading.Lock(), []
    counts = {"runs served": 0, "runs refused": 0, "comparisons served": 0, "comparisons refused": 0}
    image = handle_file(str(IMAGE))

    def loop(c: Client, args: list, api: str, kind: str) -> None:
        while not stop.is_set():
            job = c.submit(*args, api_name=api)
            with lock:
                jobs.append(job)
            try:
                job.result(timeout=seconds + 60)
                outcome = "served"
            except Exception:
                outcome = "refused"
                if stop.wait(2):
                    return
            if not stop.is_set():
                with lock:
                    counts[f"{kind} {outcome}"] += 1

    crowd = []
    for g in range(6 if comparisons else 0):
        for _ in range(3):
            args = [image, DETAILED, *settings(512, 0.0, 128), EQUAL]
            crowd.append((client(f"203.0.113.{g + 1}"), args, "/compare", "comparisons"))
    for g in range(0 if comparisons else 6):
        for _ in range(5):
            args = [image, DETAILED, *settings(512, 2.0, 128), 0]
            crowd.append((client(f"203.0.113.{g + 1}"), args, "/run", "runs"))
    for i in range(0 if comparisons else 2):
        args = [image, DETAILED, *settings(128, 0.0, 128), EQUAL]
        crowd.append((client(f"203.0.113.{100 + i}"), args, "/compare", "comparisons"))
    threads = [threading.Thread(target=loop, args=a, daemon=True) for a in crowd]
    for thread in threads:
        thread.start()
    visitor, start, firsts, ends = client("198.51.100.7"), time.monotonic(), [], []
    n = 0
    while time.monotonic() - start < seconds:
        if stop.wait(max(0.0, start + 10 + 15 * n - time.monotonic())):
            break
        sent = time.monotonic()
        job = visitor.submit(image, "What is in the scene?", *settings(16, 0.0, 16), 0, api_name="/run")
        first = None
        while not job.done() and time.monotonic() - sent < 180:
            if first is None and job.outputs():
                first = time.monotonic() - sent
            time.sleep(0.05)
        firsts.append(round(first if first is not None else time.monotonic() - sent, 1))
        ends.append(round(time.monotonic() - sent, 1))
        n += 1
    stop.set()
    print(f"visitor's first output after (s): {firsts}, median {statistics.median(firsts)}")
    print(f"visitor's run done after (s): {ends}, median {statistics.median(ends)}")
    print("the crowd:", counts, flush=True)
    with lock:
        for job in jobs:
            if not job.done():
                with contextlib.suppress(Exception):  # (a busy server may not answer the cancel in time)
                    job.cancel()


def replay_attack(server: Server, path: Path, times: int = 1, after_s: float = 2.0) -> None:
    """One replay of ``path``: its time, the server's CPU time, its answer's size, the server's RSS
    before, at its peak and ``after_s`` seconds later; then ``times - 1`` more, a session each."""
    print(f"trace: {path.stat().st_size / 2**20:.2f} MiB")
    file = server.upload(path)
    # the server's first figures load plotly's modules and tables (kept for good): a small replay first
    server.call("replay", [server.upload(crafted(Path(tempfile.mkdtemp()) / "tokens.json", "tokens"))])
    time.sleep(1)
    before, cpu = server.rss_mb(), server.cpu_s()
    peak, done = server.watch_rss()
    seconds, kind, size = server.call("replay", [file])
    cpu = server.cpu_s() - cpu
    done.set()
    time.sleep(after_s)
    print(
        f"replay: {seconds:.1f} s, {kind}, server CPU {cpu:.1f} s, answer {size / 1e6:.1f} MB; "
        f"RSS {before:.0f} MB, peak +{max(peak[0] - before, 0):.0f} MB, "
        f"{after_s:.0f} s later {server.rss_mb() - before:+.0f} MB",
        flush=True,
    )
    kinds: dict[str, int] = {}
    for i in range(1, times):  # more replays, one after the other, each in a session of its own
        kind = server.call("replay", [file])[1]
        kinds[kind] = kinds.get(kind, 0) + 1
        if (i + 1) % 25 == 0:
            print(f"{i + 1} replays: RSS {server.rss_mb() - before:+.0f} MB", flush=True)
    if times > 1:
        print(f"{times} replays in {times} sessions: RSS {server.rss_mb() - before:+.0f} MB {kinds}")


def visitor_run(server: Server, image: dict, address: str = "198.51.100.200") -> float:
    """A visitor's 32-token RECAP run (no display delay): seconds until it is done."""
    args = run_args(image, "Describe the image.", "recap", 32, 0)
    seconds, kind, _ = server.call("run", args, 600, address)
    if kind != "complete":
        raise SystemExit(f"the visitor's run ended with {kind!r}")
    return seconds


def draw_attack(server: Server, path: Path, copies: int = 4) -> None:
    """``copies`` replays of ``path`` from one address at once (0.3 s apart, each in a session of its
    own) while a visitor (another address, sent with the first) runs 32 tokens, against the visitor's
    run alone before.
    Needs the server behind ``RECAP_PROXY_HOPS=1``."""
    from concurrent.futures import ThreadPoolExecutor

    image, file = server.upload(IMAGE), server.upload(path)
    visitor_run(server, image)  # the model loads
    baseline = [visitor_run(server, image) for _ in range(3)]
    before, cpu = server.rss_mb(), server.cpu_s()
    peak, done = server.watch_rss()
    with ThreadPoolExecutor(copies + 1) as pool:
        replays = [pool.submit(server.call, "replay", [file], 600, "203.0.113.77")]
        visitor = pool.submit(visitor_run, server, image)  # (sent with the first replay)
        for _ in range(copies - 1):
            time.sleep(0.3)
            replays.append(pool.submit(server.call, "replay", [file], 600, "203.0.113.77"))
        during = visitor.result()
        outcomes = [future.result() for future in replays]
    done.set()
    print(f"visitor's 32-token run alone: {', '.join(f'{b:.2f}' for b in baseline)} s; "
          f"during {copies} replays of {path.name} from one address: {during:.2f} s")  # fmt: skip
    print(f"the {copies} replays: {[(round(t, 1), k) for t, k, _ in outcomes]}; server CPU "
          f"{server.cpu_s() - cpu:.1f} s; RSS {before:.0f} MB, peak +{peak[0] - before:.0f} MB")  # fmt: skip


def steps_attack(server: Server, path: Path, calls: int = 8) -> None:
    """One session replays ``path`` (the largest tree: ``wide``), then sends ``calls`` step views of it
    at once, while a visitor (another address) runs 32 tokens; against the visitor's run alone before."""
    from concurrent.futures import ThreadPoolExecutor

    from gradio_client import Client, handle_file

    image = server.upload(IMAGE)
    visitor_run(server, image)
    baseline = [visitor_run(server, image) for _ in range(3)]
    client = Client(server.url, verbose=False, headers={"X-Forwarded-For": "203.0.113.88"})
    try:
        client.predict(handle_file(str(path)), api_name="/replay")
        time.sleep(5)  # (the client's rest after its replay)
        before, cpu = server.rss_mb(), server.cpu_s()
        peak, done = server.watch_rss()
        with ThreadPoolExecutor(2) as pool:
            jobs = [client.submit(i % 2, api_name="/step") for i in range(calls)]
            during = pool.submit(visitor_run, server, image).result()
        outcomes: dict[str, int] = {}
        for job in jobs:
            try:
                job.result(timeout=600)
                outcome = "drawn"
            except Exception as error:
                outcome = str(error)[:60]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        done.set()
    finally:
        client.close()
    print(f"visitor's 32-token run alone: {', '.join(f'{b:.2f}' for b in baseline)} s; "
          f"during {calls} step views of {path.name}: {during:.2f} s")  # fmt: skip
    print(f"the step views: {outcomes}; server CPU {server.cpu_s() - cpu:.1f} s; "
          f"RSS {before:.0f} MB, peak +{peak[0] - before:.0f} MB")  # fmt: skip


def server_cost(server: Server, path: Path, calls: int = 4) -> None:
    """The server process's CPU seconds for each of ``calls`` replays of ``path`` (each from an address
    of its own, so that no rest refuses it), then for each of ``calls`` step views of it from one
    session (6 s apart: its rest): what a drawing from a trace costs the interpreter a visitor's run
    shares (a drawing worker's time is not the server's). Needs the server behind ``RECAP_PROXY_HOPS=1``."""
    from gradio_client import Client, handle_file

    file, replays, views = server.upload(path), [], []
    for i in range(calls):
        cpu = server.cpu_s()
        seconds, kind, _ = server.call("replay", [file], 600, f"203.0.113.{100 + i}")
        time.sleep(0.5)  # (the reply's last bytes)
        replays.append(f"{server.cpu_s() - cpu:.2f} s CPU in {seconds:.2f} s ({kind})")
    client = Client(server.url, verbose=False, headers={"X-Forwarded-For": "203.0.113.140"})
    try:
        client.predict(handle_file(str(path)), api_name="/replay")
        for i in range(calls):
            time.sleep(6)
            cpu, start = server.cpu_s(), time.perf_counter()
            client.predict(i % 2, api_name="/step")
            seconds = time.perf_counter() - start
            time.sleep(0.5)
            views.append(f"{server.cpu_s() - cpu:.2f} s CPU in {seconds:.2f} s")
    finally:
        client.close()
    print(f"replays of {path.name}: {'; '.join(replays)}")
    print(f"step views of {path.name}: {'; '.join(views)}")


def replay_flood(server: Server, path: Path, calls: int) -> None:
    """One address sends ``calls`` replays of ``path`` at once, each in a session of its own; then three
    visitors (other addresses) each run 32 tokens and replay the ``tokens`` trace (a 4096-token answer).
    Needs the server behind
    ``RECAP_PROXY_HOPS=1`` (each client says its address)."""
    from concurrent.futures import ThreadPoolExecutor

    file, before = server.upload(path), server.rss_mb()
    with ThreadPoolExecutor(64) as pool:
        flood = [pool.submit(server.call, "replay", [file], 600, "203.0.113.66") for _ in range(calls)]
        time.sleep(2)
        image = server.upload(IMAGE)
        recorded = server.upload(crafted(Path(tempfile.mkdtemp()) / "tokens.json", "tokens"))
        for i in range(3):
            address = f"198.51.100.{i + 1}"
            args = run_args(image, "Describe the image.", "recap", 32, 0)
            seconds, kind, _ = server.call("run", args, 600, address)
            print(f"visitor {i + 1}: 32-token run {kind} in {seconds:.1f} s", flush=True)
            seconds, kind, _ = server.call("replay", [recorded], 600, address)
            print(f"visitor {i + 1}: replay {kind} in {seconds:.1f} s", flush=True)
        outcomes: dict[str, int] = {}
        for future in flood:
            kind = future.result()[1]
            outcomes[kind] = outcomes.get(kind, 0) + 1
    print(f"the flood's {calls} replays: {outcomes}; RSS {server.rss_mb() - before:+.0f} MB")


def sessions_attack(server: Server, n: int) -> None:
    image = server.upload(IMAGE)
    for _ in range(3):  # the model loads, lazy imports happen: outside the measure
        server.call("run", run_args(image, "Describe the image.", method="recap", max_new=1, delay=0))
    before, start, kinds = server.rss_mb(), time.perf_counter(), {}
    for i in range(n):
        _, kind, _ = server.call(
            "run", run_args(image, "Describe the image.", method="recap", max_new=1, delay=0)
        )
        kinds[kind] = kinds.get(kind, 0) + 1
        if (i + 1) % 100 == 0:
            print(f"{i + 1} sessions: RSS {server.rss_mb():.0f} MB ({server.rss_mb() - before:+.0f}), "
                  f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    grown = server.rss_mb() - before
    print(
        f"{n} sessions: RSS {before:.0f} -> {server.rss_mb():.0f} MB ({grown / n:+.2f} MB a session) {kinds}"
    )
    seconds, kind, _ = server.call("run", run_args(image, "Describe the image.", max_new=32, delay=0))
    print(f"then a 32-token run: {seconds:.1f} s ({kind})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.space_attack", description=__doc__.splitlines()[0]
    )
    parser.add_argument("attack", choices=["delay", "replay", "sessions", "crowd", "draw", "steps", "cost"])
    parser.add_argument("--url", default="http://127.0.0.1:7961/")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id (for its RSS)")
    parser.add_argument("--visitor-delay", type=int, default=0, help="the visitor's display delay (ms)")
    parser.add_argument("--shape", default="largest", choices=SHAPES)
    parser.add_argument("--file", type=Path, default=None, help="replay this trace instead of a crafted one")
    parser.add_argument("-n", type=int, default=1000, help="sessions")
    parser.add_argument("--times", type=int, default=1, help="replays, one after the other, a session each")
    parser.add_argument("--flood", type=int, default=0, help="replays at once from one address (hops 1)")
    parser.add_argument("--after", type=float, default=2.0, help="seconds after a replay to read the RSS")
    parser.add_argument("--copies", type=int, default=4, help="draw: replays at once from one address")
    parser.add_argument("--calls", type=int, default=8, help="steps: step views at once from one session")
    parser.add_argument("--seconds", type=float, default=110.0, help="how long the crowd sends work")
    parser.add_argument("--comparisons", action="store_true", help="a crowd sending comparisons only")
    args = parser.parse_args(argv)
    server = Server(args.url, args.pid)
    if args.attack == "delay":
        delay_attack(server, args.visitor_delay)
    elif args.attack == "crowd":
        crowd_attack(server, args.seconds, args.comparisons)
    elif args.attack in ("replay", "draw", "steps", "cost"):
        target = Path(tempfile.gettempdir()) / f"recap-crafted-{args.shape}.json"
        trace = args.file or crafted(target, args.shape)
        if args.attack == "draw":
            draw_attack(server, trace, args.copies)
        elif args.attack == "cost":
            server_cost(server, trace)
        elif args.attack == "steps":
            steps_attack(server, trace, args.calls)
        elif args.flood:
            replay_flood(server, trace, args.flood)
        else:
            replay_attack(server, trace, args.times, args.after)
    else:
        sessions_attack(server, args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
