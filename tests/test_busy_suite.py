"""scripts/busy_suite.py, cheaply: one busy process beside one pytest run of a one-test file; the busy
processes are gone afterwards, and a failing run makes the script's exit code non-zero."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "busy_suite.py"


@pytest.fixture(scope="module")
def busy_suite():
    spec = importlib.util.spec_from_file_location("busy_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture
def started(busy_suite, monkeypatch):
    """The busy processes `main` starts, kept to look at afterwards."""
    processes = []
    original = busy_suite.start_busy

    def start_busy(count, max_seconds):
        processes.extend(original(count, max_seconds))
        return processes

    monkeypatch.setattr(busy_suite, "start_busy", start_busy)
    return processes


def _test_file(folder: Path, body: str) -> str:
    path = folder / "test_trivial.py"
    path.write_text(f"def test_trivial():\n    {body}\n")
    return str(path)


@pytest.mark.parametrize(
    ("body", "code", "summary"), [("assert True", 0, "1 passed"), ("assert False", 1, "1 failed")]
)
def test_a_run_beside_a_busy_process_reports_its_result_and_leaves_no_busy_process(
    busy_suite, started, tmp_path, capsys, body, code, summary
):
    target = _test_file(tmp_path, body)
    pytest_args = [target, "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    assert busy_suite.main(["--busy", "1", "--runs", "1", "--", *pytest_args]) == code
    assert len(started) == 1 and all(process.poll() is not None for process in started)
    out = capsys.readouterr().out
    assert f"run 1/1: exit {code} in " in out and summary in out
    assert ("FAILED" in out) == bool(code)


def test_ctrl_c_during_a_run_stops_the_busy_processes(busy_suite, started, monkeypatch):
    def interrupted(args, show_output=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(busy_suite, "run_pytest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        busy_suite.main(["--busy", "2", "--runs", "1"])
    assert len(started) == 2 and all(process.poll() is not None for process in started)


def test_a_busy_process_is_busy_until_stopped(busy_suite):
    (process,) = busy_suite.start_busy(1, 600)
    try:
        time.sleep(0.2)
        assert process.poll() is None  # still counting
    finally:
        busy_suite.stop_busy([process])
    assert process.returncode is not None


def test_a_busy_process_stops_by_itself_after_its_time(busy_suite):
    (process,) = busy_suite.start_busy(1, 0.1)
    try:
        assert process.wait(timeout=120) == 0  # 120 s: generous for a busy CPU; it ends after 0.1 s
    finally:
        busy_suite.stop_busy([process])


@pytest.mark.parametrize(
    ("output", "line"),
    [
        ("x\n========== 3 passed, 1 skipped in 2.10s ==========\n", "3 passed, 1 skipped in 2.10s"),
        ("FAILED t.py::test_a - assert 0\n1 failed in 0.1s\n", "1 failed in 0.1s"),
        ("collected 0 items\n\nno tests ran in 0.01s\n", "no tests ran in 0.01s"),
        ("Traceback\nImportError: x\n", ""),
    ],
)
def test_summary_line(busy_suite, output, line):
    assert busy_suite.summary_line(output) == line


def test_pytest_arguments_come_after_the_double_dash(busy_suite):
    options = busy_suite.parse_args(["--busy", "2", "--", "tests/x.py", "-x", "--runs", "9"])
    assert (options.busy, options.runs, options.pytest_args) == (2, 3, ["tests/x.py", "-x", "--runs", "9"])
    with pytest.raises(SystemExit):
        busy_suite.parse_args(["--runs", "0"])
