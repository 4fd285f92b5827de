"""Step records: the contract between the decode loop and everything that shows or measures it.

One `StepRecord` per target forward pass (the prefill pass is step 0, with an empty tree). A whole run
is a `RunTrace` (settings + steps) with a JSON round-trip, so a run recorded on a GPU can be replayed
in the studio without a model. `summarize` turns steps into the headline figures.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

#: Format version of exported traces; bump when a field changes meaning.
TRACE_VERSION = 1


@dataclass
class NodeRecord:
    """One drafted node as shown in the tree view."""

    id: int
    parent: int
    token: int
    text: str
    depth: int
    score: float
    sources: list[str]
    contributions: dict[str, float]
    accepted: bool
    #: RECAP: a record this request wrote (under its image) proposed the node.
    this_request: bool = False
    #: RECAP: offered in a fan: earlier answers went on this many ways after its context (0: no fan).
    fan: int = 0


@dataclass
class FusedRecord:
    """One token of the drafter's distribution at the root, with each source's share of its probability."""

    token: int
    text: str
    prob: float
    contributions: dict[str, float]


@dataclass
class StepRecord:
    """Everything about one target pass.

    ``new_tokens[i]`` was proposed by ``new_sources[i]`` (the first source of its accepted node, or
    ``target`` for the bonus token / the prefill token). ``target_token`` / ``target_prob``: what the
    target actually predicted at the root, next to ``fused_at_root`` (what the drafter believed).
    """

    step: int
    committed_len: int
    method: str
    nodes: list[NodeRecord] = field(default_factory=list)
    accepted_ids: list[int] = field(default_factory=list)
    bonus_token: int | None = None
    new_tokens: list[int] = field(default_factory=list)
    new_texts: list[str] = field(default_factory=list)
    new_sources: list[str] = field(default_factory=list)
    fused_at_root: list[FusedRecord] = field(default_factory=list)
    target_token: int | None = None
    target_prob: float | None = None
    timing: dict[str, float] = field(default_factory=dict)
    finished: bool = False
    finish_reason: str | None = None
    image_sensitive: list[bool] | None = None
    #: Sampling only: per verified position (root first), the children tried with the target's
    #: probability of each, the committed token, and whether it was drawn from the residual.
    draws: list[dict[str, Any]] | None = None
    #: The drafter's propose + observe in this thread's CPU time, ms (``timing`` holds wall-clock
    #: times, which a busy machine stretches by whatever the scheduler gave to other processes).
    drafter_cpu_ms: float = 0.0
    #: The whole pass (draft, verify and update) in the decoding thread's CPU time, ms: with torch on
    #: that one thread, the pass's own compute, whatever else the machine runs.
    cpu_ms: float = 0.0

    @property
    def accepted_len(self) -> int:
        """Drafted tokens accepted in this pass (bonus excluded)."""
        return len(self.accepted_ids)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """A step from its JSON form (fields this version does not know are ignored)."""
        data = _known(cls, data)
        data["nodes"] = [NodeRecord(**_known(NodeRecord, n)) for n in data.get("nodes", [])]
        data["fused_at_root"] = [FusedRecord(**_known(FusedRecord, f)) for f in data.get("fused_at_root", [])]
        return cls(**data)


def _known(record_type: type, data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in record_type.__dataclass_fields__}


class PackedSteps(Sequence[StepRecord]):
    """Step records kept compressed, one JSON blob each, and rebuilt when read.

    A run kept for scrubbing (the studio's replays) holds its steps in a few percent of the memory their
    records take: the server's memory does not stay grown by a large replay for as long as its session
    lives. Reading a step rebuilds that one record; a slice rebuilds a list.
    """

    def __init__(self, steps: Iterable[StepRecord]) -> None:
        self._blobs = tuple(zlib.compress(json.dumps(step, default=vars).encode(), 1) for step in steps)

    def __len__(self) -> int:
        return len(self._blobs)

    def __getitem__(self, index):  # int -> StepRecord, slice -> list[StepRecord]
        if isinstance(index, slice):
            return [self._read(blob) for blob in self._blobs[index]]
        return self._read(self._blobs[index])

    def __iter__(self) -> Iterator[StepRecord]:
        return (self._read(blob) for blob in self._blobs)

    @property
    def nbytes(self) -> int:
        """The compressed size of the steps."""
        return sum(len(blob) for blob in self._blobs)

    @staticmethod
    def _read(blob: bytes) -> StepRecord:
        return StepRecord.from_dict(json.loads(zlib.decompress(blob)))


@dataclass(frozen=True)
class RunSummary:
    """Headline figures of one run. ``mat``: mean tokens committed per target pass (bonus included)."""

    passes: int
    tokens: int
    mat: float
    seconds: float
    tokens_per_s: float
    draft_ms_per_step: float
    cpu_seconds: float = 0.0
    #: The drafter's propose + update per decoding pass in the decoding thread's CPU time
    #: (`StepRecord.drafter_cpu_ms`): unlike the wall clock, it leaves out time the thread waited for
    #: the interpreter or the machine while other threads or processes ran. 0 when not recorded.
    draft_cpu_ms_per_step: float = 0.0


def summarize(steps: Iterable[StepRecord]) -> RunSummary:
    """Aggregate step records. Wall time is the sum of each step's draft + verify + update time;
    ``cpu_seconds`` the same phases in the decoding thread's CPU time (`StepRecord.cpu_ms`)."""
    steps = list(steps)
    tokens = sum(len(s.new_tokens) for s in steps)
    seconds = sum(sum(s.timing.values()) for s in steps) / 1000.0
    draft_ms = [s.timing.get("draft_ms", 0.0) + s.timing.get("update_ms", 0.0) for s in steps[1:]]
    return RunSummary(
        passes=len(steps),
        tokens=tokens,
        mat=tokens / len(steps) if steps else 0.0,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        draft_ms_per_step=sum(draft_ms) / len(draft_ms) if draft_ms else 0.0,
        cpu_seconds=sum(s.cpu_ms for s in steps) / 1000.0,
        draft_cpu_ms_per_step=sum(s.drafter_cpu_ms for s in steps[1:]) / len(steps[1:]) if steps[1:] else 0.0,
    )


@dataclass
class RunTrace:
    """A whole run: the settings it ran with, its steps, and its output text."""

    settings: dict[str, Any]
    steps: Sequence[StepRecord]  # a list while it is recorded; `PackedSteps` when kept for long
    text: str = ""
    version: int = TRACE_VERSION

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.steps for t in s.new_tokens]

    def to_json(self) -> str:
        data = {"settings": self.settings, "steps": [asdict(step) for step in self.steps], "text": self.text}
        return json.dumps({**data, "version": self.version}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> RunTrace:
        """Parse an exported trace; raises ``ValueError`` with a readable reason if it is not one.

        The text may come from anyone (the studio replays uploads): its size and number of values are
        bounded before it is parsed (`parse_trace`), its shape is checked in full by `check_trace_data`
        before any record is built.
        """
        return cls.from_data(parse_trace(text))

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> RunTrace:
        """The trace of parsed JSON ``data`` (checked by `check_trace_data` first). Each step's JSON is
        dropped from ``data`` once its record is built, so the two never both hold the whole trace."""
        check_trace_data(data)
        raw = data["steps"]
        steps = []
        for index, step in enumerate(raw):
            steps.append(StepRecord.from_dict(step))
            raw[index] = None
        return cls(settings=dict(data.get("settings", {})), steps=steps, text=str(data.get("text", "")))

    def save(self, path: str | Path) -> None:
        """Write the trace as JSON to ``path``, creating its missing folders."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> RunTrace:
        """Read a trace file (refused unread when it is over `MAX_TRACE_BYTES`)."""
        path = Path(path)
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ValueError(f"the trace is too large (over {MAX_TRACE_BYTES >> 20} MiB)")
        data = parse_trace(path.read_text(encoding="utf-8"))  # (the text is freed before records are built)
        return cls.from_data(data)


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
