"""The benchmark's run: every method on the same samples, sample-interleaved and timed.

How a run is organised (so that the numbers mean what they say):

- Samples form ONE stream of requests, in dataset order, as one user would send them, so persistent
  memories (RECAP's token memory, TR's successor matrix, SuffixDecoding's global suffix tree) warm up
  across requests. ``cold=True`` (`StreamSettings`) resets them before every sample instead.
- Every method starts its stream with FRESH memories of its own: methods never share state. They are
  empty (a cold start) unless a saved persistent memory is given (``start``, ``--memory FILE``): then
  every RECAP variant's token memory starts as a copy of it and TR's matrix from the same records
  (`recap.drafters.token_recycling.seed_successors`, as the studio does); SuffixDecoding's tree is not in
  the file and starts empty. With ``cold=True`` too, every sample starts from the file again.
- Methods are interleaved per sample (the method order rotates from sample to sample) so that load on a
  shared machine hits every method alike. ``ar`` is always run: speedup and match rate are relative to it.
- Warm-up requests (AR on the first samples, plus one short request per method with throwaway
  memories) run before timing and never touch the measured methods' memories.

It fills the records of `recap.bench.metrics`; `recap.bench.report` writes them out.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from recap.bench.coverage import Breakdown, CoverageProbe
from recap.bench.datasets import Sample
from recap.bench.metrics import BenchmarkResult, SampleRun, aggregate, per_category
from recap.bench.sensitivity import SensitivitySplit, common_prefix, sensitive_flags, split_against_reference
from recap.decode import generate
from recap.drafters import METHODS
from recap.drafters.recap.config import RecapConfig
from recap.drafters.suffix_decoding import SuffixConfig
from recap.hotstart import EMPTY_START
from recap.memory.persistent import PersistentMemory
from recap.models.cost import CostModel
from recap.runtime import Runtime
from recap.sampling import GREEDY, SamplingSettings
from recap.state import DrafterState

log = logging.getLogger(__name__)

#: Warm-up requests of the non-AR methods are this short (they only exercise the code paths).
WARMUP_TOKENS = 8


# ------------------------------------------------------------------------------------ the run
def normalize_methods(methods: str | Sequence[str]) -> list[str]:
    """Method names in order, ``ar`` first (added if missing), duplicates dropped; ``all`` = every method."""
    names = [m.strip() for m in methods.split(",")] if isinstance(methods, str) else list(methods)
    names = [n for n in names if n]
    if names == ["all"]:
        names = list(METHODS)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from: {', '.join(METHODS)}, all")
    return list(dict.fromkeys(["ar", *names]))


@dataclass(frozen=True)
class StreamSettings:
    """How each method's stream of requests runs: how it drafts, decodes, and what it starts from.

    Drafting: ``budget`` (RECAP's tree budget, its ablations' too; None: the config's), ``config``
    (RECAP's; None: the defaults), ``suffix_config`` (the ``suffix`` method's; None: its authors'
    defaults; ``budget`` does not apply to it). Decoding: ``sampling``, greedy, or sample ``i`` drawn
    with seed ``sampling.seed + i`` (``seed`` None counts as 0) for every method, each of which must
    produce AR's tokens there too (one uniform draw per committed position, `recap.sampling`). Memories:
    ``start``, a saved persistent memory of this model (k = ``config.k``) that every measured stream's
    RECAP memory and TR matrix start from (``--memory FILE``; None: a cold start); ``cold``, back to the
    start before every sample."""

    budget: str | int | None = None
    config: RecapConfig | None = None
    suffix_config: SuffixConfig | None = None
    sampling: SamplingSettings = GREEDY
    start: PersistentMemory | None = None
    cold: bool = False


class _Stream(NamedTuple):
    """A method's drafter and the state it alone shares for this run (started from the run's start)."""

    drafter: Any
    state: DrafterState

    def reset(self) -> None:
        """Back to the start: empty memories, then a copy of the start if there is one."""
        self.state.reset()


def _fresh_stream(
    runtime: Runtime,
    method: str,
    budget: str | int | None,
    config: RecapConfig,
    suffix_config: SuffixConfig | None = None,
    start: PersistentMemory | None = None,
) -> _Stream:
    vocab = runtime.target.vocab_size
    state = DrafterState(vocab, start if start is not None else EMPTY_START, suffix_config)
    drafter = runtime.drafter(method, budget=budget, config=config, state=state)
    return _Stream(drafter, state)


def run_benchmark(
    runtime: Runtime,
    samples: Sequence[Sample],
    methods: str | Sequence[str],
    max_new_tokens: int = 128,
    warmup: int = 1,
    setup: StreamSettings = StreamSettings(),
    progress: bool = True,
    settings: dict[str, Any] | None = None,
    projection: CostModel | None = None,
    coverage: bool = True,
) -> BenchmarkResult:
    """Run every method on every sample (one stream per method) and aggregate the metrics.

    ``setup``: how each method's stream drafts and decodes and what its memories start from
    (`StreamSettings`). ``settings`` (e.g. the command line) are merged into the result's settings.
    ``projection``: a recorded cost curve (``--cost-curve``) that prices each method's decoding passes (its
    ``projected_seconds`` and ``projected_speedup``). ``coverage``: probe the drafters' memories at every
    committed position (`recap.bench.coverage`; untimed, but it reads the memories just before the
    drafter's update, so a run that measures drafting cost may turn it off).
    """
    from tqdm import tqdm

    if not samples:
        raise ValueError("no samples to benchmark")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    methods = normalize_methods(methods)
    budget, sampling, start, cold = setup.budget, setup.sampling, setup.start, setup.cold
    config = setup.config or RecapConfig()
    suffix_config = setup.suffix_config or SuffixConfig()
    target = runtime.target
    # Built before timing: a cost-aware budget measures the model's tree-cost curve here.
    new_stream = partial(_fresh_stream, runtime, budget=budget, config=config, suffix_config=suffix_config)
    if start is not None and (start.vocab_size, start.k) != (target.vocab_size, config.k):
        raise ValueError(
            f"the starting memory has vocabulary {start.vocab_size} and k={start.k}; this run needs "
            f"{target.vocab_size} and k={config.k}"
        )
    streams = {m: new_stream(m, start=start) for m in methods}  # the warm-up's streams start empty
    _warm_up(target, samples, methods, warmup, max_new_tokens, new_stream)

    runs: dict[str, list[SampleRun]] = {m: [] for m in methods}

    def seeded(index: int) -> SamplingSettings:
        return sampling if sampling.greedy else replace(sampling, seed=(sampling.seed or 0) + index)

    splits: dict[str, SensitivitySplit] = {m: SensitivitySplit(0, 0, 0, 0) for m in methods}
    breakdowns: dict[str, Breakdown] = {m: Breakdown() for m in methods}
    notes = []
    bar = tqdm(total=len(samples) * len(methods), desc="bench", unit="req", disable=not progress)
    for index, sample in enumerate(samples):
        shift = index % len(methods)
        for method in methods[shift:] + methods[:shift]:
            bar.set_postfix_str(f"{sample.id} {method}")
            if cold:
                streams[method].reset()
            runs[method].append(
                _run_one(
                    target, streams[method].drafter, sample, max_new_tokens, method, seeded(index), coverage
                )
            )
            bar.update()
        ar_tokens = runs["ar"][-1].tokens
        flags = _sensitivity_flags(target, samples, index, ar_tokens)
        accepted = {}  # per method: drafts accepted at this sample's image-sensitive positions
        if flags is not None:
            for method in methods:
                run = runs[method][-1]
                split = split_against_reference(run.tokens, run.sources, ar_tokens, flags)
                splits[method] += split
                accepted[method] = split.sensitive_drafted
                if run.coverage:
                    agree = common_prefix(run.tokens, ar_tokens)
                    breakdowns[method].add(run.coverage[:agree], run.sources[:agree], flags[:agree])
        passes = {m: runs[m][-1].passes for m in methods}
        notes.append(_sample_note(sample, target.decode(ar_tokens), ar_tokens, flags, passes, accepted))
    bar.close()

    has_split = any(n["sensitive_positions"] is not None for n in notes)
    results = {
        m: aggregate(
            m,
            runs[m],
            runs["ar"],
            splits[m] if has_split else None,
            breakdowns[m] if has_split else None,
            projection,
        )
        for m in methods
    }
    run_settings = {
        # A local folder by its name only: results carry no machine path.
        "model": Path(target.name).name if Path(target.name).is_absolute() else target.name,
        "family": target.family,
        "samples": len(samples),
        "methods": methods,
        "max_new_tokens": max_new_tokens,
        "warmup": warmup,
        "budget": budget if budget is not None else config.budget,
        "cold": cold,
        "start_memory_tokens": len(start) if start is not None else 0,
        "recap_config": asdict(config),
        "sampling": asdict(sampling),
        **({"suffix_config": asdict(suffix_config)} if "suffix" in methods else {}),
        **_cost_curve(runtime),
        **environment(target),
        **(settings or {}),
    }
    return BenchmarkResult(run_settings, results, notes, per_category(samples, runs))


def _cost_curve(runtime: Runtime) -> dict[str, Any]:
    """The tree-cost curve the cost-aware budget used (ms per T, measured and fitted), if one was measured."""
    cost = runtime.measured_cost()
    return {} if cost is None else {"cost_curve_ms": cost.to_ms()}


def _run_one(
    target: Any,
    drafter: Any,
    sample: Sample,
    max_new_tokens: int,
    method: str,
    sampling: SamplingSettings = GREEDY,
    coverage: bool = True,
) -> SampleRun:
    # The coverage probe looks at the drafter's memories outside the timed phases (`recap.decode`).
    probe = CoverageProbe(drafter if coverage else None)
    start = time.perf_counter()
    # details=False: no display-only work (token texts, the drafter's root distribution) in the timing.
    result = generate(
        target,
        drafter,
        sample.prompt,
        sample.images,
        max_new_tokens,
        method=method,
        sampling=sampling,
        details=False,
        observers=(probe,) if probe.coverage is not None else (),
    )
    seconds = time.perf_counter() - start - probe.seconds
    run = SampleRun.from_steps(sample.id, result.steps, seconds, probe.positions)
    log.info(
        "%s %s: %d tokens, %d passes, %.2f s", sample.id, method, len(run.tokens), run.passes, run.seconds
    )
    return run


def _warm_up(
    target: Any,
    samples: Sequence[Sample],
    methods: Sequence[str],
    warmup: int,
    max_new_tokens: int,
    new_stream: Callable[[str], _Stream],
) -> None:
    """AR on the first ``warmup`` samples, then one short request per method, each on a throwaway stream
    from ``new_stream(method)`` (so the measured streams' memories stay cold)."""
    if warmup == 0:
        return
    log.info("warm-up: %d AR request(s) + one short request per method", warmup)
    for i in range(warmup):
        _run_one(target, new_stream("ar").drafter, samples[i % len(samples)], max_new_tokens, "ar")
    for method in methods:
        if method != "ar":
            tokens = min(WARMUP_TOKENS, max_new_tokens)
            _run_one(target, new_stream(method).drafter, samples[0], tokens, method)


# ----------------------------------------------------------------------------------- sensitivity
def other_images(samples: Sequence[Sample], index: int) -> list | None:
    """The images of the next sample (cyclically) that has images, or None if no other sample has one."""
    for step in range(1, len(samples)):
        other = samples[(index + step) % len(samples)]
        if other.images:
            return other.images
    return None


def _sensitivity_flags(
    target: Any, samples: Sequence[Sample], index: int, ar_tokens: Sequence[int]
) -> list[bool] | None:
    """Image-sensitive flags of AR's answer to ``samples[index]`` (None: no image, or no other image)."""
    sample = samples[index]
    images = other_images(samples, index) if sample.images else None
    if images is None or not ar_tokens:
        return None
    return sensitive_flags(target, images, sample.prompt, ar_tokens)


def _sample_note(
    sample: Sample,
    text: str,
    tokens: Sequence[int],
    flags: Sequence[bool] | None,
    passes: dict[str, int] | None = None,
    sensitive_accepted: dict[str, int] | None = None,
) -> dict[str, Any]:
    """What results.json keeps of one sample: its AR answer, its image-sensitive positions (None
    without images), each method's passes and, where positions were flagged, each method's drafts
    accepted there (counted where its output agrees with AR's, as the totals are)."""
    return {
        "id": sample.id,
        "prompt": sample.prompt,
        "images": len(sample.images),
        "ar_tokens": len(tokens),
        "ar_text": text,
        "sensitive_positions": sum(flags) if flags is not None else None,
        "passes": dict(passes or {}),
        "sensitive_accepted": dict(sensitive_accepted or {}),
        "meta": {k: v for k, v in sample.meta.items() if isinstance(v, str | int | float | bool)},
    }


# ------------------------------------------------------------------------------------- record
def environment(target: Any) -> dict[str, Any]:
    """Versions, device, dtype and date, for the record."""
    import torch
    import transformers

    return {
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
