"""Step records: the contract between the decode loop and everything that shows or measures it.

One `StepRecord` per target forward pass (the prefill pass is step 0, with an empty tree). A whole run
is a `RunTrace` (settings + steps) with a JSON round-trip, so a run recorded on a GPU can be replayed
in the studio without a model. `summarize` turns steps into the headline figures.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    def drafting_ms(self) -> float:
        """Draft + update (the drafter's propose and observe) in the decoding thread's CPU time, which a
        busy machine does not stretch; the wall-clock time for a record that holds no CPU times
        (``cpu_ms`` 0: saved before they were recorded)."""
        if self.cpu_ms > 0:
            return self.drafter_cpu_ms
        return self.timing.get("draft_ms", 0.0) + self.timing.get("update_ms", 0.0)

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
        """A trace from its JSON (one this library wrote: a file from anyone else goes through
        `recap.studio.guard.trace_files`, which bounds and checks it first)."""
        return cls.from_data(json.loads(text))

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> RunTrace:
        """The trace of parsed JSON ``data``. Each step's JSON is dropped from ``data`` once its record
        is built, so the two never both hold the whole trace."""
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
        """Read a trace file this library wrote (see `from_json`)."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
