"""The guard's one wrapper (`recap.studio.guard.wrapper`): what it does around a plain handler, without
a server (the server tests drive every kind through gradio)."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

from recap.studio.guard.jobs import Cancelled, DecodeJob
from recap.studio.guard.wrapper import Guard, _pumped


def _decoding():
    """A handler's decoding: a status line, two steps, a None (a turn point), a result."""
    yield "Loading…"
    yield "step 0"
    yield "step 1"  # (a str is a status line: the steps here are tuples)
    yield ("record", 0)
    yield None
    yield ("record", 1)
    return "the answer"


def _items(job: DecodeJob) -> list:
    items = []
    while (item := job.take(0)) is not None:
        items.append(item)
    return items


def test_pumped_hands_status_lines_at_once_and_steps_with_a_turn_after_each():
    job = DecodeJob()
    turns = 0
    pump = _pumped(job, _decoding())
    with pytest.raises(StopIteration) as end:
        while True:
            next(pump)
            turns += 1
    assert end.value.value == "the answer"
    # three status lines (no turn), two steps (a turn each), a None (a turn)
    assert turns == 3
    assert _items(job) == [
        ("status", "Loading…"), ("status", "step 0"), ("status", "step 1"),
        ("step", ("record", 0)), ("step", ("record", 1)),
    ]  # fmt: skip


def test_pumped_stops_at_the_next_item_once_cancelled_and_closes_the_decoding():
    closed = []

    def decoding():
        try:
            while True:
                yield ("record", 0)
        finally:
            closed.append(True)

    job = DecodeJob()
    pump = _pumped(job, decoding())
    next(pump)
    job.cancel("stopped")
    with pytest.raises(Cancelled):
        next(pump)
    assert closed == [True]


def test_checked_and_upload_kinds_turn_bad_values_into_refusals():
    guard = Guard(SimpleNamespace(upload_roots=[]))

    def reset(model_id):
        if model_id != "tiny":
            raise ValueError(f"unknown model {model_id!r}")
        return model_id

    checked = guard.wrap(reset, "checked")
    assert checked("tiny") == "tiny"
    with pytest.raises(gr.Error, match="Unknown model 'other'"):
        checked("other")
    warned = []
    upload = guard.wrap(lambda value: "kept", "upload")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gr, "Warning", warned.append)
        assert upload({"path": "/etc/passwd"}) is None  # (not in an upload root)
    assert len(warned) == 1
