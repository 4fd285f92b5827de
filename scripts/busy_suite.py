"""Run the test suite beside CPU-bound processes: no test may depend on timing, so it must pass there too.

Usage (from the repository root)::

    python scripts/busy_suite.py --busy 3 --runs 3 [-- extra pytest args]

Starts ``--busy`` N busy processes (plain Python loops, one CPU each), then runs ``python -m pytest`` with
the extra arguments ``--runs`` R times in a row, and prints one line per run: its exit code, its duration
and pytest's summary line (and, for a failed run, pytest's FAILED / ERROR lines). Exits with 1 if any run
failed, else 0.

The busy processes are stopped when the script ends, on Ctrl-C and on any error; each also stops by
itself when this script's process is gone or after ``--max-busy-s`` seconds, so none outlives a killed
script for long. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

#: One busy process: count until the time is up or the script that started it is gone.
BUSY_LOOP = """
import os, sys, time
parent, stop = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
n = 0
while os.getppid() == parent and time.monotonic() < stop:
    for _ in range(200_000):
        n += 1
"""
#: pytest's summary line ("3 passed, 1 skipped in 2.10s", "no tests ran in 0.01s", "1 failed ...").
SUMMARY = re.compile(r"\b(passed|failed|errors?|skipped|deselected|xfailed|xpassed|no tests ran)\b")


@dataclass
class Run:
    """One pytest run: exit code, wall-clock seconds, pytest's summary line and its FAILED/ERROR lines."""

    code: int
    seconds: float
    summary: str
    failures: list[str] = field(default_factory=list)


def start_busy(count: int, max_seconds: float) -> list[subprocess.Popen]:
    """``count`` busy processes, each stopping by itself after ``max_seconds`` or once this process ends."""
    command = [sys.executable, "-c", BUSY_LOOP, str(os.getpid()), str(max_seconds)]
    return [subprocess.Popen(command, stdin=subprocess.DEVNULL) for _ in range(count)]


def stop_busy(processes: Sequence[subprocess.Popen], grace: float = 5.0) -> None:
    """Terminate ``processes`` and wait for them (killed if one is still there after ``grace`` seconds)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def summary_line(output: str) -> str:
    """pytest's last summary line in ``output`` without its ``=`` padding ("" when there is none)."""
    for line in reversed(output.splitlines()):
        text = line.strip().strip("=").strip()
        if SUMMARY.search(text) and not text.startswith(("FAILED", "ERROR")):
            return text
    return ""


def run_pytest(args: Sequence[str], show_output: bool = False) -> Run:
    """``python -m pytest *args`` in the current directory; its output is echoed if ``show_output``."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if show_output:
                sys.stdout.write(line)
        code = process.wait()
    finally:  # Ctrl-C or an error here: the pytest run does not go on without us
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    output = "".join(lines)
    failures = [line.rstrip() for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return Run(code, time.perf_counter() - start, summary_line(output), failures)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python scripts/busy_suite.py",
        description="Run python -m pytest several times beside CPU-bound busy processes.",
        epilog="Arguments after -- go to pytest, e.g. -- tests/test_bench.py -x -q",
    )
    parser.add_argument("--busy", type=int, default=3, help="busy processes to start (default 3)")
    parser.add_argument("--runs", type=int, default=3, help="pytest runs, one after another (default 3)")
    parser.add_argument(
        "--max-busy-s",
        type=float,
        default=4 * 3600.0,
        help="a busy process stops by itself after this many seconds (default 4 hours)",
    )
    parser.add_argument("--show-output", action="store_true", help="echo pytest's output as it runs")
    argv = list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    options = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if options.busy < 0 or options.runs < 1 or options.max_busy_s <= 0:
        parser.error("--busy must be 0 or more, --runs 1 or more, --max-busy-s more than 0")
    options.pytest_args = extra
    return options


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    busy = start_busy(options.busy, options.max_busy_s)
    runs = []
    try:
        print(f"{options.busy} busy processes; pytest {' '.join(options.pytest_args)}".rstrip(), flush=True)
        for index in range(1, options.runs + 1):
            run = run_pytest(options.pytest_args, options.show_output)
            runs.append(run)
            line = f"run {index}/{options.runs}: exit {run.code} in {run.seconds:.1f} s: {run.summary}"
            print(line, flush=True)
            for failure in run.failures:
                print(f"    {failure}", flush=True)
    finally:
        stop_busy(busy)
    failed = sum(run.code != 0 for run in runs)
    print(f"{failed} of {len(runs)} runs failed" if failed else f"all {len(runs)} runs passed", flush=True)
    return 1 if failed else 0


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally, which stops the busy processes


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the busy processes and the pytest run are stopped already
        print("interrupted", file=sys.stderr)
        sys.exit(130)
