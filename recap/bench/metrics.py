"""The benchmark's records and metrics: what one method did on one sample, and the sums over samples.

Metrics per method (`MethodResult`):

- ``mat``: mean tokens committed per target pass, bonus included, prefill pass included (AR = 1.00).
- ``mat_no_bonus``: accepted *drafted* tokens per decoding pass (prefill excluded, bonus excluded):
  the "MAT - 1" figure some papers report; AR = 0.00.
- ``speedup``: AR wall time / method wall time over the same samples in the same run (wall time of each
  whole request: prefill, drafting, verification, bookkeeping).
- ``tokens_per_s``, ``draft_ms_per_step`` (propose + recycle per decoding pass, wall clock),
  ``draft_cpu_ms_per_step`` (the same in the thread's CPU time, which other processes' load does not
  stretch), ``verify_ms_per_step`` (target pass, prefill included), ``nodes_per_step`` (draft tree
  size per decoding pass).
- ``match_rate``: generated tokens that agree with AR's (common prefix per sample / the longer output);
  1.0 in float32 is the lossless guarantee.
- ``accepted_length_histogram[n]``: decoding passes that accepted n drafted tokens.
- ``source_acceptance``: accepted drafted tokens per proposing source (RECAP: ctx3, ctx2, persistent,
  suffix; TR: template; PLD: lookup; SuffixDecoding: suffix tree).
- ``accept_sensitive`` / ``accept_insensitive``: share of generated tokens that came from an accepted
  draft, at image-sensitive / insensitive positions (`recap.bench.sensitivity`); the positions come from ONE
  teacher-forced pass of AR's answer per sample with the next sample's image. None for text data.

Per category (`BenchmarkResult.categories`, when the samples carry a ``category`` or ``qtype`` in their
metadata): MAT, MAT w/o bonus and speedup of every method over that category's samples alone.

Pure arithmetic on plain records: nothing here runs a model or reads a clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from recap.bench.coverage import Breakdown, PositionCoverage
from recap.bench.datasets import Sample
from recap.bench.sensitivity import SensitivitySplit, common_prefix, token_sources
from recap.models.cost import CostModel, projected_seconds
from recap.trace import StepRecord


@dataclass
class SampleRun:
    """One method on one sample: what the metrics need, without the full step records."""

    sample_id: str
    tokens: list[int]
    sources: list[str]
    accepted_lengths: list[int]
    draft_ms: list[float]
    verify_ms: float
    seconds: float
    nodes: int = 0
    draft_cpu_ms: list[float] = field(default_factory=list)
    #: Tree nodes of each decoding pass (what a recorded cost curve prices: `recap.models.cost`).
    nodes_per_pass: list[int] = field(default_factory=list)
    #: Each decoding pass's drafting as a projection adds it (`StepRecord.drafting_ms`: CPU time).
    drafting_ms: list[float] = field(default_factory=list)
    #: Per generated token, what the drafter's memories held there (`recap.bench.coverage`); None for
    #: the first token (the prefill's) and for runs made without a probe.
    coverage: list[PositionCoverage | None] = field(default_factory=list)

    @property
    def passes(self) -> int:
        return len(self.accepted_lengths) + 1  # + the prefill pass

    @classmethod
    def from_steps(
        cls,
        sample_id: str,
        steps: Sequence[StepRecord],
        seconds: float,
        coverage: Sequence[PositionCoverage] = (),
    ) -> SampleRun:
        decoding = steps[1:]
        return cls(
            sample_id=sample_id,
            tokens=[t for s in steps for t in s.new_tokens],
            sources=token_sources(steps),
            accepted_lengths=[s.accepted_len for s in decoding],
            draft_ms=[s.timing.get("draft_ms", 0.0) + s.timing.get("update_ms", 0.0) for s in decoding],
            verify_ms=sum(s.timing.get("verify_ms", 0.0) for s in steps),
            seconds=seconds,
            nodes=sum(len(s.nodes) for s in decoding),
            nodes_per_pass=[len(s.nodes) for s in decoding],
            draft_cpu_ms=[s.drafter_cpu_ms for s in decoding],
            drafting_ms=[s.drafting_ms for s in decoding],
            coverage=[None, *coverage] if coverage else [],
        )


@dataclass
class MethodResult:
    """Aggregated metrics of one method over all samples (see the module docstring for definitions)."""

    method: str
    mat: float
    mat_no_bonus: float
    speedup: float | None
    tokens_per_s: float
    draft_ms_per_step: float
    verify_ms_per_step: float
    nodes_per_step: float
    match_rate: float
    identical_outputs: int
    accept_sensitive: float | None
    accept_insensitive: float | None
    sensitive_positions: int
    insensitive_positions: int
    accepted_length_histogram: list[int]
    source_acceptance: dict[str, int]
    passes: int
    tokens: int
    seconds: float
    draft_cpu_ms_per_step: float = 0.0
    #: Covered / drafted / accepted by group (`recap.bench.coverage.GROUPS`); None without sensitivity
    #: flags.
    breakdown: dict[str, dict[str, int]] | None = None
    #: With a recorded cost curve (``--cost-curve``): the decoding passes priced on that curve plus the
    #: drafting measured here (`recap.models.cost.projected_seconds`), and AR's over this method's.
    projected_seconds: float | None = None
    projected_speedup: float | None = None


@dataclass
class CategoryResult:
    """One method on the samples of one category (definitions as in `MethodResult`)."""

    samples: int
    mat: float
    mat_no_bonus: float
    speedup: float | None
    tokens: int
    passes: int


@dataclass
class BenchmarkResult:
    """A whole run: settings, per-method results (AR first), per-sample notes, and per-category figures
    (``categories[category][method]``: `CategoryResult`; empty when samples have no category)."""

    settings: dict[str, Any]
    methods: dict[str, MethodResult]
    samples: list[dict[str, Any]] = field(default_factory=list)
    categories: dict[str, dict[str, CategoryResult]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "methods": {name: asdict(result) for name, result in self.methods.items()},
            "samples": self.samples,
            "categories": {
                name: {method: asdict(r) for method, r in results.items()}
                for name, results in self.categories.items()
            },
        }


def aggregate(
    method: str,
    runs: Sequence[SampleRun],
    ar_runs: Sequence[SampleRun],
    split: SensitivitySplit | None,
    breakdown: Breakdown | None = None,
    projection: CostModel | None = None,
) -> MethodResult:
    """Sum a method's per-sample runs into its `MethodResult` (``ar_runs``: AR on the same samples)."""
    passes = sum(r.passes for r in runs)
    tokens = sum(len(r.tokens) for r in runs)
    seconds = sum(r.seconds for r in runs)
    ar_seconds = sum(r.seconds for r in ar_runs)
    accepted = [n for r in runs for n in r.accepted_lengths]
    draft_ms = [ms for r in runs for ms in r.draft_ms]
    draft_cpu_ms = [ms for r in runs for ms in r.draft_cpu_ms]
    agree = sum(common_prefix(r.tokens, a.tokens) for r, a in zip(runs, ar_runs))
    longer = sum(max(len(r.tokens), len(a.tokens)) for r, a in zip(runs, ar_runs))
    sources = Counter(s for r in runs for s in r.sources if s != "target")
    histogram = [0] * (max(accepted, default=0) + 1)
    projected = ar_projected = None
    if projection is not None:
        projected = sum(projected_seconds(projection, r.nodes_per_pass, r.drafting_ms) for r in runs)
        ar_projected = sum(projected_seconds(projection, a.nodes_per_pass, a.drafting_ms) for a in ar_runs)
    for n in accepted:
        histogram[n] += 1
    return MethodResult(
        method=method,
        mat=tokens / passes if passes else 0.0,
        mat_no_bonus=sum(accepted) / len(accepted) if accepted else 0.0,
        speedup=ar_seconds / seconds if seconds > 0 else None,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        draft_ms_per_step=sum(draft_ms) / len(draft_ms) if draft_ms else 0.0,
        verify_ms_per_step=sum(r.verify_ms for r in runs) / passes if passes else 0.0,
        nodes_per_step=sum(r.nodes for r in runs) / len(accepted) if accepted else 0.0,
        match_rate=agree / longer if longer else 1.0,
        identical_outputs=sum(r.tokens == a.tokens for r, a in zip(runs, ar_runs)),
        accept_sensitive=split.sensitive_rate if split else None,
        accept_insensitive=split.insensitive_rate if split else None,
        sensitive_positions=split.sensitive_total if split else 0,
        insensitive_positions=split.insensitive_total if split else 0,
        accepted_length_histogram=histogram,
        source_acceptance=dict(sources.most_common()),
        passes=passes,
        tokens=tokens,
        seconds=seconds,
        draft_cpu_ms_per_step=sum(draft_cpu_ms) / len(draft_cpu_ms) if draft_cpu_ms else 0.0,
        breakdown=breakdown.to_json() if breakdown is not None else None,
        projected_seconds=projected,
        projected_speedup=ar_projected / projected if projected else None,
    )


def sample_category(sample: Sample) -> str | None:
    """A sample's category: its ``category`` metadata (Spec-Bench, MT-Bench, JSONL), else ``qtype``
    (scenes), else None."""
    value = sample.meta.get("category", sample.meta.get("qtype"))
    return None if value is None or value == "" else str(value)


def per_category(
    samples: Sequence[Sample], runs: dict[str, list[SampleRun]]
) -> dict[str, dict[str, CategoryResult]]:
    """Every method's figures per category, categories in order of first appearance ({} if none has one).

    ``runs[method][i]`` is the method's run on ``samples[i]``; ``runs["ar"]`` is the speedup reference.
    """
    groups: dict[str, list[int]] = {}
    for index, sample in enumerate(samples):
        category = sample_category(sample)
        if category is not None:
            groups.setdefault(category, []).append(index)
    results = {}
    for category, indices in groups.items():
        results[category] = {}
        for method, method_runs in runs.items():
            total = aggregate(
                method, [method_runs[i] for i in indices], [runs["ar"][i] for i in indices], None
            )
            results[category][method] = CategoryResult(
                len(indices), total.mat, total.mat_no_bonus, total.speedup, total.tokens, total.passes
            )
    return results


class SampleWins(NamedTuple):
    """Samples where one method accepted more, as many or fewer drafts at image-sensitive positions
    than a reference method (`sample_wins`)."""

    more: int
    tied: int
    fewer: int

    @property
    def samples(self) -> int:
        return self.more + self.tied + self.fewer

    @property
    def at_least(self) -> int:
        """Samples where the method accepted at least as many as the reference."""
        return self.more + self.tied


def sample_wins(samples: Sequence[dict[str, Any]], method: str, reference: str) -> SampleWins | None:
    """How many samples ``method`` accepted more, as many or fewer drafts than ``reference`` at
    image-sensitive positions (`BenchmarkResult.samples`' ``sensitive_accepted``); None without such samples.

    The spread behind the overall shares: how often a single request (the Compare tab shows one) goes
    either way.

    Example: counts ``{tr: 3, recap: 5}``, ``{tr: 2, recap: 2}``, ``{tr: 4, recap: 1}`` ->
    ``SampleWins(more=1, tied=1, fewer=1)``.
    """
    more = tied = fewer = 0
    for sample in samples:
        counts = sample.get("sensitive_accepted") or {}
        if not sample.get("sensitive_positions") or method not in counts or reference not in counts:
            continue
        mine, theirs = counts[method], counts[reference]
        more += mine > theirs
        tied += mine == theirs
        fewer += mine < theirs
    return SampleWins(more, tied, fewer) if more + tied + fewer else None
