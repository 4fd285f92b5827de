"""A trace file from a stranger (the studio's Replay upload), bounded and checked before anything reads it.

`read_trace` is the one way the studio reads an uploaded trace: the file's size and its number of values
are bounded before it is parsed (`parse_trace`: what parsing would allocate), its shape is checked in
full (`check_trace_data`) before any record is built, and every refusal is a ``ValueError`` whose
message names the problem without a server path. The records themselves are `recap.trace`'s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from recap.trace import TRACE_VERSION, RunTrace


def read_trace(path: str | Path) -> RunTrace:
    """An uploaded trace, or a ``ValueError`` saying why it cannot be replayed (no server path in it)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ValueError(f"the trace is too large (over {MAX_TRACE_BYTES >> 20} MiB)")
        trace = trace_from_text(path.read_text(encoding="utf-8"))  # (the text is freed before records)
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    except OSError:
        raise ValueError("it cannot be read") from None
    if not trace.steps:
        raise ValueError("it has no steps")
    return trace


def trace_from_text(text: str) -> RunTrace:
    """The trace of a stranger's JSON ``text``: bounded (`parse_trace`), checked (`check_trace_data`),
    then built; a ``ValueError`` with a readable reason if it is not one."""
    data = parse_trace(text)
    check_trace_data(data)
    return RunTrace.from_data(data)


def parse_trace(text: str) -> dict[str, Any]:
    """The JSON of a trace, parsed; ``ValueError`` when it is over `MAX_TRACE_BYTES`, holds more than
    `MAX_TRACE_VALUES` values (counted in the text, before parsing: what parsing would allocate), or is
    not JSON a trace can hold (NaN, Infinity, nesting too deep, an integer of thousands of digits)."""
    if len(text) > MAX_TRACE_BYTES:
        raise ValueError(f"the trace is too large (over {MAX_TRACE_BYTES >> 20} MiB)")
    values = text.count(",") + text.count(":") + text.count("[") + text.count("{")  # >= values - 1
    if values > MAX_TRACE_VALUES:
        raise ValueError(
            f"the trace holds too many values (about {values:,}; the limit is {MAX_TRACE_VALUES:,})"
        )
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise ValueError(f"not a RECAP trace: invalid JSON ({error.msg} at line {error.lineno})") from None
    except RecursionError:
        raise ValueError("not a RECAP trace: its JSON is nested too deeply") from None
    except _Constant as error:  # NaN/Infinity
        raise ValueError(f"not a RECAP trace: {error}") from None
    except ValueError:  # an integer of thousands of digits (Python's words name its own settings)
        raise ValueError("not a RECAP trace: a number has thousands of digits") from None


# ------------------------------------------------------------------------------- checking a trace's shape
#: Bounds of a trace read from a file, by size and by work. A studio run writes at most 512 tokens in at
#: most 513 steps of at most 128 + 16 nodes, a CLI run at most 4096 tokens in 4097 steps. What a replay
#: costs grows with the values parsed (memory), the tokens drawn in the answer, the nodes kept for the
#: step panel: bounded so that the largest trace within them parses and renders in a few seconds and
#: under 100 MB (`tests/test_space_limits.py`). A studio run of 512 one-token passes with 128-node trees
#: (~1.8M values, 16 MB) is over `MAX_TRACE_VALUES` (~230 such steps fit); runs that stop at the answer's
#: end are far under. At most `MAX_TRACE_SETTINGS` settings.
MAX_TRACE_BYTES = 16 * 1024 * 1024
MAX_TRACE_VALUES = 800_000
MAX_TRACE_STEPS = 4097
MAX_TRACE_TOKENS = 4096
#: Characters of the committed tokens' texts together (the answer a replay draws; ~50 per token).
MAX_TRACE_TEXT = 200_000
#: Drafted nodes, fused entries and sampling draws' tried pairs of all steps together.
MAX_TRACE_NODES = 100_000
MAX_NODES_PER_STEP = 8192
MAX_TRACE_SETTINGS = 256
MAX_TOKEN_ID = 2**31 - 1
MAX_TOKEN_TEXT = 1000
MAX_SETTING_TEXT = 10_000

_FieldKind = Literal["int", "token", "count", "number", "text", "bool", "texts", "shares", "ints", "bools"]

_NODE_FIELDS: dict[str, _FieldKind] = {
    "id": "int",
    "parent": "int",
    "token": "token",
    "text": "text",
    "depth": "int",
    "score": "number",
    "sources": "texts",
    "contributions": "shares",
    "accepted": "bool",
}
#: Node fields a trace may leave out (traces written before they existed).
_OPTIONAL_NODE_FIELDS: dict[str, _FieldKind] = {"this_request": "bool", "fan": "count"}
_FUSED_FIELDS: dict[str, _FieldKind] = {
    "token": "token",
    "text": "text",
    "prob": "number",
    "contributions": "shares",
}
#: Step fields: kind and whether ``null`` is allowed; ``step``, ``committed_len``, ``method`` are required.
_STEP_FIELDS: dict[str, tuple[_FieldKind, bool]] = {
    "step": ("count", False),
    "committed_len": ("count", False),
    "method": ("text", False),
    "accepted_ids": ("ints", False),
    "bonus_token": ("token", True),
    "new_tokens": ("ints", False),
    "new_texts": ("texts", False),
    "new_sources": ("texts", False),
    "target_token": ("token", True),
    "target_prob": ("number", True),
    "timing": ("shares", False),
    "finished": ("bool", False),
    "finish_reason": ("text", True),
    "image_sensitive": ("bools", True),
    "drafter_cpu_ms": ("number", False),
    "cpu_ms": ("number", False),
}
_REQUIRED_STEP_FIELDS = ("step", "committed_len", "method")
_LIST_ITEMS: dict[str, _FieldKind] = {"texts": "text", "ints": "token", "bools": "bool"}


class _Constant(ValueError):
    """A JSON constant (NaN, Infinity) that no trace holds."""


def _refuse_constant(name: str) -> None:
    raise _Constant(f"{name} is not a number a trace can hold")


def check_trace_data(data: Any) -> None:
    """Raise ``ValueError`` naming the first problem if ``data`` (parsed JSON) is not a well-formed trace.

    Checked: the top-level object, the version, settings (a flat object of short scalars), the number
    of steps and of nodes per step, every field's type and range (finite numbers, token ids in
    ``[0, 2**31)``, bounded strings), that node ``i`` has id ``i`` and a parent drafted before it
    (``-1`` = the root), so the tree has no cycle, that each depth is its parent's plus one, that
    accepted ids name nodes, and that the committed tokens, texts and sources have one entry each.
    """
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise ValueError("not a RECAP trace: expected a JSON object with a 'steps' list")
    version = data.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError("not a RECAP trace: 'version' must be a whole number")
    if version > TRACE_VERSION:
        raise ValueError(f"trace version {version} is newer than this RECAP ({TRACE_VERSION})")
    settings = data.get("settings", {})
    if not isinstance(settings, dict) or len(settings) > MAX_TRACE_SETTINGS:
        raise ValueError(f"not a RECAP trace: 'settings' must be an object of at most {MAX_TRACE_SETTINGS}")
    for name, value in settings.items():
        if len(name) > 100 or not (value is None or isinstance(value, bool | int | float | str)):
            raise ValueError("not a RECAP trace: 'settings' must map short names to plain values")
        if isinstance(value, str) and len(value) > MAX_SETTING_TEXT:
            raise ValueError(f"not a RECAP trace: setting {name[:40]!r} is too long")
        _check_unicode(name, "a setting's name")
        if isinstance(value, str):
            _check_unicode(value, f"setting {name[:40]!r}")
    if not isinstance(data.get("text", ""), str):
        raise ValueError("not a RECAP trace: 'text' must be a string")
    _check_unicode(data.get("text", ""), "'text'")
    steps = data["steps"]
    if len(steps) > MAX_TRACE_STEPS:
        raise ValueError(f"the trace has {len(steps)} steps; the limit is {MAX_TRACE_STEPS}")
    tokens = nodes = chars = 0
    for index, step in enumerate(steps):
        _check_step(step, f"step {index}")
        tokens += len(step.get("new_tokens", []))
        chars += sum(map(len, step.get("new_texts", [])))
        if chars > MAX_TRACE_TEXT:
            raise ValueError(
                f"the trace's answer is over {MAX_TRACE_TEXT:,} characters (the limit) by step {index}"
            )
        nodes += len(step.get("nodes", [])) + len(step.get("fused_at_root", []))
        nodes += sum(len(d["tried"]) for d in step.get("draws") or [])
        if tokens > MAX_TRACE_TOKENS:
            raise ValueError(f"the trace commits over {MAX_TRACE_TOKENS} tokens (the limit) by step {index}")
        if nodes > MAX_TRACE_NODES:
            raise ValueError(
                f"the trace holds over {MAX_TRACE_NODES:,} drafted nodes (the limit, with the fused entries "
                f"and sampling draws) by step {index}"
            )


def _check_step(step: Any, where: str) -> None:
    if not isinstance(step, dict):
        raise ValueError(f"not a RECAP trace: {where} is not an object")
    for name in _REQUIRED_STEP_FIELDS:
        if name not in step:
            raise ValueError(f"not a RECAP trace: {where} has no {name!r}")
    for name, (kind, nullable) in _STEP_FIELDS.items():
        if name in step and not (nullable and step[name] is None):
            _check_value(step[name], kind, f"{where}, {name!r}")
    nodes, fused = step.get("nodes", []), step.get("fused_at_root", [])
    if not isinstance(nodes, list) or not isinstance(fused, list):
        raise ValueError(f"not a RECAP trace: {where}: 'nodes' and 'fused_at_root' must be lists")
    if len(nodes) > MAX_NODES_PER_STEP or len(fused) > MAX_NODES_PER_STEP:
        raise ValueError(
            f"not a RECAP trace: {where} has {max(len(nodes), len(fused))} nodes; "
            f"the limit is {MAX_NODES_PER_STEP}"
        )
    depths: list[int] = []
    for i, node in enumerate(nodes):
        _check_record(node, _NODE_FIELDS, f"{where}, node {i}")
        for name, kind in _OPTIONAL_NODE_FIELDS.items():
            if name in node:
                _check_value(node[name], kind, f"{where}, node {i}, {name!r}")
        if node["id"] != i:
            raise ValueError(
                f"not a RECAP trace: {where}, node {i} has id {node['id']} (ids must be 0, 1, …)"
            )
        parent = node["parent"]
        if not -1 <= parent < i:
            raise ValueError(
                f"not a RECAP trace: {where}, node {i} has parent {parent} "
                "(a parent must be -1, the root, or a node listed before it)"
            )
        depths.append(1 if parent == -1 else depths[parent] + 1)
        if node["depth"] != depths[-1]:
            raise ValueError(
                f"not a RECAP trace: {where}, node {i} has depth {node['depth']}, not {depths[-1]}"
            )
    for i, record in enumerate(fused):
        _check_record(record, _FUSED_FIELDS, f"{where}, fused entry {i}")
    accepted = step.get("accepted_ids", [])
    if any(not 0 <= a < len(nodes) for a in accepted) or len(set(accepted)) != len(accepted):
        raise ValueError(f"not a RECAP trace: {where}: 'accepted_ids' must name distinct nodes of the step")
    draws = step.get("draws")
    if draws is not None:
        _check_draws(draws, where)
    lengths = {len(step.get(name, [])) for name in ("new_tokens", "new_texts", "new_sources")}
    if len(lengths) > 1:
        raise ValueError(f"not a RECAP trace: {where}: new_tokens, new_texts, new_sources differ in length")


def _check_draws(draws: Any, where: str) -> None:
    """Sampling draws: a list of ``{"tried": [[token, p], ...], "token": id, "residual": bool}``."""
    if not isinstance(draws, list) or len(draws) > MAX_NODES_PER_STEP:
        raise ValueError(f"not a RECAP trace: {where}, 'draws' must be a list")
    for i, draw in enumerate(draws):
        here = f"{where}, draw {i}"
        _check_record(draw, {"token": "token", "residual": "bool"}, here)
        tried = draw.get("tried")
        if not isinstance(tried, list) or len(tried) > MAX_NODES_PER_STEP:
            raise ValueError(f"not a RECAP trace: {here}, 'tried' must be a list")
        for pair in tried:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"not a RECAP trace: {here}, 'tried' holds [token, probability] pairs")
            _check_value(pair[0], "token", here)
            _check_value(pair[1], "number", here)


def _check_record(record: Any, fields: dict[str, _FieldKind], where: str) -> None:
    if not isinstance(record, dict):
        raise ValueError(f"not a RECAP trace: {where} is not an object")
    for name, kind in fields.items():
        if name not in record:
            raise ValueError(f"not a RECAP trace: {where} has no {name!r}")
        _check_value(record[name], kind, f"{where}, {name!r}")


def _check_unicode(text: str, where: str) -> None:
    """Raise if ``text`` holds a lone surrogate (JSON's ``"\\ud800"`` parses to one): no UTF-8 can
    carry it, so nothing could show or send it."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"not a RECAP trace: {where} is not valid Unicode (a lone surrogate)") from None


def _check_value(value: Any, kind: _FieldKind, where: str) -> None:
    """Raise if ``value`` is not of ``kind`` (see `_FieldKind`)."""
    if kind in ("texts", "ints", "bools"):
        if not isinstance(value, list) or len(value) > MAX_NODES_PER_STEP:
            raise ValueError(f"not a RECAP trace: {where} must be a list")
        for entry in value:
            _check_value(entry, _LIST_ITEMS[kind], where)
        return
    if kind == "shares":
        if not isinstance(value, dict) or len(value) > 64:
            raise ValueError(f"not a RECAP trace: {where} must be an object of numbers")
        for name, share in value.items():
            _check_value(name, "text", where)
            _check_value(share, "number", where)
        return
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "text":
        ok = isinstance(value, str) and len(value) <= MAX_TOKEN_TEXT
        if ok:
            _check_unicode(value, where)
    elif kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    else:
        low = {"int": -1, "token": 0, "count": 0}[kind]
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_TOKEN_ID
    if not ok:
        expected = {
            "bool": "true or false",
            "text": f"a string of at most {MAX_TOKEN_TEXT} characters",
            "number": "a finite number",
            "int": "a whole number from -1 to 2**31 - 1",
            "token": "a whole number from 0 to 2**31 - 1",
            "count": "a whole number from 0 to 2**31 - 1",
        }[kind]
        raise ValueError(f"not a RECAP trace: {where} must be {expected}")
