"""Step records: the contract between the decode loop and everything that shows or measures it.

One `StepRecord` per target forward pass (the prefill pass is step 0, with an empty tree). A whole run
is a `RunTrace` (settings + steps) with a JSON round-trip, so a run recorded on a GPU can be replayed
in the studio without a model. `summarize` turns steps into the headline figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
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

    @property
    def accepted_len(self) -> int:
        """Drafted tokens accepted in this pass (bonus excluded)."""
        return len(self.accepted_ids)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        data = dict(data)
        data["nodes"] = [NodeRecord(**n) for n in data.get("nodes", [])]
        data["fused_at_root"] = [FusedRecord(**f) for f in data.get("fused_at_root", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class RunSummary:
    """Headline figures of one run. ``mat``: mean tokens committed per target pass (bonus included)."""

    passes: int
    tokens: int
    mat: float
    seconds: float
    tokens_per_s: float
    draft_ms_per_step: float


def summarize(steps: Iterable[StepRecord]) -> RunSummary:
    """Aggregate step records. Wall time is the sum of each step's draft + verify + update time."""
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
    )


@dataclass
class RunTrace:
    """A whole run: the settings it ran with, its steps, and its output text."""

    settings: dict[str, Any]
    steps: list[StepRecord]
    text: str = ""
    version: int = TRACE_VERSION

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.steps for t in s.new_tokens]

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> RunTrace:
        """Parse an exported trace; raises ``ValueError`` with a readable reason if it is not one."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"not a RECAP trace: invalid JSON ({error.msg} at line {error.lineno})"
            ) from None
        if not isinstance(data, dict) or "steps" not in data or not isinstance(data["steps"], list):
            raise ValueError("not a RECAP trace: expected a JSON object with a 'steps' list")
        if data.get("version", 0) > TRACE_VERSION:
            raise ValueError(f"trace version {data['version']} is newer than this RECAP ({TRACE_VERSION})")
        try:
            steps = [StepRecord.from_dict(s) for s in data["steps"]]
        except (TypeError, KeyError) as error:
            raise ValueError(f"not a RECAP trace: malformed step ({error})") from None
        return cls(settings=dict(data.get("settings", {})), steps=steps, text=str(data.get("text", "")))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> RunTrace:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
