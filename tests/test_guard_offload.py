"""The drawing worker (`recap.studio.guard.offload`): drawing from a trace in another process, at a
lower priority, with the same values as in the server; a worker that dies is replaced."""

from __future__ import annotations

import os

import pytest

from recap.studio.guard.offload import WORKER_NICENESS, DrawingWorker, Offscreen, WorkerLost
from recap.trace import PackedSteps, StepRecord


def _step(i: int) -> StepRecord:
    return StepRecord(step=i, committed_len=i, method="recap", new_tokens=[i], new_texts=[f"t{i}"])


@pytest.fixture(scope="module")
def worker():
    worker = DrawingWorker(modules=("recap.studio.ui.handlers",))
    worker.start()
    yield worker
    worker.shutdown()


def test_offscreen_work_runs_in_a_worker_process_at_a_lower_priority(worker):
    assert worker.run(Offscreen(os.getpid)) != os.getpid()
    assert worker.run(Offscreen(os.nice, (0,))) == os.nice(0) + WORKER_NICENESS
    # other work (a closure: it would not pickle) runs in the caller's thread
    assert worker.run(lambda: os.getpid()) == os.getpid()


def test_a_step_view_drawn_in_the_worker_is_the_one_drawn_here(worker):
    from recap.studio.ui.handlers import step_panel

    steps = PackedSteps([_step(0), _step(1), _step(2)])  # a replay's kept steps go compressed
    here = step_panel(steps, 2)
    there = worker.run(Offscreen(step_panel, (steps, 2)))
    assert there[0] == here[0] and there[3] == here[3]
    assert [p.model_dump() for p in there[1:3]] == [p.model_dump() for p in here[1:3]]


def test_a_worker_that_dies_is_replaced_and_its_drawing_refused_not_redone_here():
    worker = DrawingWorker()
    try:
        first = worker.run(Offscreen(os.getpid))
        with pytest.raises(WorkerLost):
            worker.run(Offscreen(os._exit, (1,)))  # (a drawing that kills its worker)
        second = worker.run(Offscreen(os.getpid))
    finally:
        worker.shutdown()
    assert second not in (first, os.getpid())


def _spin(seconds: float) -> int:
    """CPU work for about ``seconds`` of this thread's CPU time."""
    import time

    end, count = time.thread_time() + seconds, 0
    while time.thread_time() < end:
        count += 1
    return count


def test_a_drawing_is_charged_the_cpu_time_it_cost_not_the_time_it_waited(worker):
    import time

    for where in (worker, DrawingWorker(processes=0)):
        _, slept = where.timed(Offscreen(time.sleep, (0.3,)))
        assert slept < 0.1  # waiting (for a CPU, beside busy processes) costs the server nothing
        count, spent = where.timed(Offscreen(_spin, (0.2,)))
        assert count > 0 and spent >= 0.2
    _, here = DrawingWorker(processes=0).timed(lambda: _spin(0.1))  # (a closure: in this thread)
    assert here >= 0.1
