"""The benchmark: every method on the same samples, in one process, against greedy AR.

``python -m recap.bench --dataset scenes --methods ar,pld,tr,recap --out runs/scenes`` writes
``results.json``, ``results.md`` and three plotly charts into ``--out``.

How a run is organised (so that the numbers mean what they say):

- Samples form ONE stream of requests, in dataset order, as one user would send them, so persistent
  memories (RECAP's token memory, TR's successor matrix) warm up across requests. ``cold=True`` resets
  them before every sample instead.
- Every method starts its stream with FRESH memories of its own: methods never share state.
- Methods are interleaved per sample (the method order rotates from sample to sample) so that load on a
  shared machine hits every method alike. ``ar`` is always run: speedup and match rate are relative to it.
- Warm-up requests (AR on the first samples, plus one short request per method with throwaway
  memories) run before timing and never touch the measured methods' memories.

Metrics per method (`MethodResult`):

- ``mat``: mean tokens committed per target pass, bonus included, prefill pass included (AR = 1.00).
- ``mat_no_bonus``: accepted *drafted* tokens per decoding pass (prefill excluded, bonus excluded):
  the "MAT - 1" figure some papers report; AR = 0.00.
- ``speedup``: AR wall time / method wall time over the same samples in the same run (wall time of each
  whole request: prefill, drafting, verification, bookkeeping).
- ``tokens_per_s``, ``draft_ms_per_step`` (propose + recycle per decoding pass), ``verify_ms_per_step``
  (target pass, prefill included), ``nodes_per_step`` (draft tree size per decoding pass).
- ``match_rate``: generated tokens that agree with AR's (common prefix per sample / the longer output);
  1.0 in float32 is the lossless guarantee.
- ``accepted_length_histogram[n]``: decoding passes that accepted n drafted tokens.
- ``source_acceptance``: accepted drafted tokens per proposing source (RECAP: ctx3, ctx2, persistent,
  suffix; TR: template; PLD: lookup).
- ``accept_sensitive`` / ``accept_insensitive``: share of generated tokens that came from an accepted
  draft, at image-sensitive / insensitive positions (`recap.sensitivity`); the positions come from ONE
  teacher-forced pass of AR's answer per sample with the next sample's image. None for text data.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from recap.config import RecapConfig
from recap.cost import load_curve
from recap.datasets import Sample, load_dataset
from recap.decode import generate
from recap.drafters import METHODS
from recap.drafters.token_recycling import SuccessorMatrix
from recap.memory import PersistentMemory
from recap.runtime import EMBEDDED_MODEL, Runtime, parse_budget
from recap.sensitivity import AcceptanceSplit, acceptance_split, sensitive_flags, token_sources
from recap.trace import StepRecord

log = logging.getLogger(__name__)

#: Memories a RECAP drafter credits for accepted tokens (the per-source acceptance columns).
RECAP_SOURCES = ("ctx3", "ctx2", "persistent", "suffix")
#: Warm-up requests of the non-AR methods are this short (they only exercise the code paths).
WARMUP_TOKENS = 8


# --------------------------------------------------------------------------------------- records
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

    @property
    def passes(self) -> int:
        return len(self.accepted_lengths) + 1  # + the prefill pass

    @classmethod
    def from_steps(cls, sample_id: str, steps: Sequence[StepRecord], seconds: float) -> SampleRun:
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


@dataclass
class BenchmarkResult:
    """A whole run: settings, per-method results (AR first), and per-sample notes."""

    settings: dict[str, Any]
    methods: dict[str, MethodResult]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "methods": {name: asdict(result) for name, result in self.methods.items()},
            "samples": self.samples,
        }


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


@dataclass
class _Stream:
    """A method's drafter and the memories it alone owns for this run."""

    drafter: Any
    persistent: PersistentMemory
    successors: SuccessorMatrix

    def reset(self) -> None:
        self.persistent.reset()
        self.successors.reset()


def _fresh_stream(runtime: Runtime, method: str, budget: str | int | None, config: RecapConfig) -> _Stream:
    vocab = runtime.target.vocab_size
    persistent, successors = PersistentMemory(vocab, config.k), SuccessorMatrix(vocab)
    drafter = runtime.drafter(
        method, budget=budget, config=config, persistent=persistent, successors=successors
    )
    return _Stream(drafter, persistent, successors)


def run_benchmark(
    runtime: Runtime,
    samples: Sequence[Sample],
    methods: str | Sequence[str],
    max_new_tokens: int = 128,
    warmup: int = 1,
    budget: str | int | None = None,
    config: RecapConfig | None = None,
    cold: bool = False,
    progress: bool = True,
    settings: dict[str, Any] | None = None,
) -> BenchmarkResult:
    """Run every method on every sample (one stream per method) and aggregate the metrics.

    ``settings`` (e.g. the command line) are merged into the result's settings.
    """
    from tqdm import tqdm

    if not samples:
        raise ValueError("no samples to benchmark")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    methods = normalize_methods(methods)
    config = config or RecapConfig()
    target = runtime.target
    # Built before timing: a cost-aware budget measures the model's tree-cost curve here.
    streams = {m: _fresh_stream(runtime, m, budget, config) for m in methods}
    _warm_up(runtime, samples, methods, warmup, max_new_tokens, budget, config)

    runs: dict[str, list[SampleRun]] = {m: [] for m in methods}
    splits: dict[str, AcceptanceSplit] = {m: AcceptanceSplit(0, 0, 0, 0) for m in methods}
    notes = []
    bar = tqdm(total=len(samples) * len(methods), desc="bench", unit="req", disable=not progress)
    for index, sample in enumerate(samples):
        shift = index % len(methods)
        for method in methods[shift:] + methods[:shift]:
            bar.set_postfix_str(f"{sample.id} {method}")
            if cold:
                streams[method].reset()
            runs[method].append(_run_one(target, streams[method].drafter, sample, max_new_tokens, method))
            bar.update()
        ar_tokens = runs["ar"][-1].tokens
        flags = _sensitivity_flags(target, samples, index, ar_tokens)
        if flags is not None:
            for method in methods:
                splits[method] += split_for(runs[method][-1], ar_tokens, flags)
        notes.append(_sample_note(sample, target.decode(ar_tokens), ar_tokens, flags))
    bar.close()

    has_split = any(n["sensitive_positions"] is not None for n in notes)
    results = {m: aggregate(m, runs[m], runs["ar"], splits[m] if has_split else None) for m in methods}
    run_settings = {
        "model": target.name,
        "family": target.family,
        "samples": len(samples),
        "methods": methods,
        "max_new_tokens": max_new_tokens,
        "warmup": warmup,
        "budget": budget if budget is not None else config.budget,
        "cold": cold,
        "recap_config": asdict(config),
        **_cost_curve(runtime),
        **environment(target),
        **(settings or {}),
    }
    return BenchmarkResult(run_settings, results, notes)


def _cost_curve(runtime: Runtime) -> dict[str, Any]:
    """The tree-cost curve the cost-aware budget used (ms per T, measured and fitted), if one was measured."""
    cost = runtime.measured_cost()
    return {} if cost is None else {"cost_curve_ms": cost.to_ms()}


def _run_one(target: Any, drafter: Any, sample: Sample, max_new_tokens: int, method: str) -> SampleRun:
    start = time.perf_counter()
    # details=False: no display-only work (token texts, the drafter's root distribution) in the timing.
    result = generate(target, drafter, sample.prompt, sample.images, max_new_tokens, method, details=False)
    run = SampleRun.from_steps(sample.id, result.steps, time.perf_counter() - start)
    log.info(
        "%s %s: %d tokens, %d passes, %.2f s", sample.id, method, len(run.tokens), run.passes, run.seconds
    )
    return run


def _warm_up(
    runtime: Runtime,
    samples: Sequence[Sample],
    methods: Sequence[str],
    warmup: int,
    max_new_tokens: int,
    budget: str | int | None,
    config: RecapConfig,
) -> None:
    """AR on the first ``warmup`` samples, then one short request per method, all with throwaway memories."""
    if warmup == 0:
        return
    log.info("warm-up: %d AR request(s) + one short request per method", warmup)
    for i in range(warmup):
        stream = _fresh_stream(runtime, "ar", budget, config)
        _run_one(runtime.target, stream.drafter, samples[i % len(samples)], max_new_tokens, "ar")
    for method in methods:
        if method != "ar":
            stream = _fresh_stream(runtime, method, budget, config)
            _run_one(runtime.target, stream.drafter, samples[0], min(WARMUP_TOKENS, max_new_tokens), method)


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


def split_for(run: SampleRun, ar_tokens: Sequence[int], flags: Sequence[bool]) -> AcceptanceSplit:
    """A method's acceptance split on one sample; flags hold only where its output agrees with AR's.

    Example: AR ``[5, 8, 2]``, flags ``[F, T, F]``, method sources ``[target, ctx2, ctx3]`` with the
    same tokens -> 1/1 drafted at sensitive positions, 1/1 at insensitive (the first token never counts).
    """
    agree = common_prefix(run.tokens, ar_tokens)
    return acceptance_split(run.sources[:agree], list(flags)[:agree])


def _sample_note(
    sample: Sample, text: str, tokens: Sequence[int], flags: Sequence[bool] | None
) -> dict[str, Any]:
    return {
        "id": sample.id,
        "prompt": sample.prompt,
        "images": len(sample.images),
        "ar_tokens": len(tokens),
        "ar_text": text,
        "sensitive_positions": sum(flags) if flags is not None else None,
        "meta": {k: v for k, v in sample.meta.items() if isinstance(v, str | int | float | bool)},
    }


# ------------------------------------------------------------------------------------- metrics
def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def aggregate(
    method: str, runs: Sequence[SampleRun], ar_runs: Sequence[SampleRun], split: AcceptanceSplit | None
) -> MethodResult:
    """Sum a method's per-sample runs into its `MethodResult` (``ar_runs``: AR on the same samples)."""
    passes = sum(r.passes for r in runs)
    tokens = sum(len(r.tokens) for r in runs)
    seconds = sum(r.seconds for r in runs)
    ar_seconds = sum(r.seconds for r in ar_runs)
    accepted = [n for r in runs for n in r.accepted_lengths]
    draft_ms = [ms for r in runs for ms in r.draft_ms]
    agree = sum(common_prefix(r.tokens, a.tokens) for r, a in zip(runs, ar_runs))
    longer = sum(max(len(r.tokens), len(a.tokens)) for r, a in zip(runs, ar_runs))
    sources = Counter(s for r in runs for s in r.sources if s != "target")
    histogram = [0] * (max(accepted, default=0) + 1)
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
    )


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


# -------------------------------------------------------------------------------------- outputs
def markdown_table(result: BenchmarkResult) -> str:
    """The results as a markdown table (plus the per-source table when RECAP methods ran)."""
    header = (
        "| method | MAT | MAT w/o bonus | speedup vs AR | tokens/s | nodes/pass | draft+update ms/step "
        "| match vs AR | accept @ sensitive | accept @ insensitive | passes | tokens | seconds |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = "".join(
        f"| {r.method} | {r.mat:.2f} | {r.mat_no_bonus:.2f} | {_num(r.speedup, 'x')} | {r.tokens_per_s:.1f} "
        f"| {r.nodes_per_step:.1f} | {r.draft_ms_per_step:.2f} | {100 * r.match_rate:.1f}% "
        f"| {_pct(r.accept_sensitive)} | {_pct(r.accept_insensitive)} "
        f"| {r.passes} | {r.tokens} | {r.seconds:.1f} |\n"
        for r in result.methods.values()
    )
    recap = [r for r in result.methods.values() if r.method.startswith("recap")]
    if not recap:
        return header + rows
    sources = "\nAccepted drafted tokens by proposing memory (RECAP methods):\n\n"
    sources += "| method | " + " | ".join(RECAP_SOURCES) + " |\n|---|" + "---|" * len(RECAP_SOURCES) + "\n"
    for r in recap:
        total = sum(r.source_acceptance.values()) or 1
        cells = [
            f"{r.source_acceptance.get(s, 0)} ({100 * r.source_acceptance.get(s, 0) / total:.0f}%)"
            for s in RECAP_SOURCES
        ]
        sources += f"| {r.method} | " + " | ".join(cells) + " |\n"
    return header + rows + sources


def _num(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def write_outputs(result: BenchmarkResult, out_dir: str | Path) -> list[Path]:
    """Write results.json, results.md and the three charts into ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n")
    settings = result.settings
    head = (
        f"# RECAP benchmark: {settings.get('model')} on {settings.get('dataset', '?')}\n\n"
        f"{settings['samples']} samples, max {settings['max_new_tokens']} new tokens, "
        f"{settings['device']} {settings['dtype']}, {settings['torch_threads']} thread(s), "
        f"{settings['date']}\n\n"
    )
    command = f"\n```\n{settings['command']}\n```\n" if settings.get("command") else ""
    (out / "results.md").write_text(head + markdown_table(result) + command)
    paths = [out / "results.json", out / "results.md"]
    for name, figure in charts(result).items():
        path = out / f"{name}.html"
        figure.write_html(path, include_plotlyjs="directory")  # one shared plotly.min.js, works offline
        paths.append(path)
    return paths


def charts(result: BenchmarkResult) -> dict[str, Any]:
    """Plotly figures: ``speedup_mat``, ``sensitivity``, ``accept_hist``."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(result.methods)
    rows = list(result.methods.values())
    titles = ("Speedup over AR (wall clock)", "MAT (bonus incl.)")
    speed = make_subplots(rows=1, cols=2, subplot_titles=titles)
    speed.add_bar(x=names, y=[r.speedup or 0.0 for r in rows], name="speedup", row=1, col=1)
    speed.add_bar(x=names, y=[r.mat for r in rows], name="MAT", row=1, col=2)
    speed.update_layout(title=f"{result.settings.get('model')}", showlegend=False)

    sens = go.Figure()
    sens.add_bar(x=names, y=[r.accept_sensitive for r in rows], name="image-sensitive positions")
    sens.add_bar(x=names, y=[r.accept_insensitive for r in rows], name="insensitive positions")
    sens.update_layout(
        barmode="group", title="Share of tokens drafted and accepted", yaxis={"tickformat": ".0%"}
    )

    hist = go.Figure()
    for r in rows:
        total = sum(r.accepted_length_histogram) or 1
        hist.add_bar(
            x=list(range(len(r.accepted_length_histogram))),
            y=[n / total for n in r.accepted_length_histogram],
            name=r.method,
        )
    hist.update_layout(
        barmode="group",
        title="Accepted drafted tokens per decoding pass",
        xaxis_title="accepted length",
        yaxis={"title": "share of passes", "tickformat": ".0%"},
    )
    return {"speedup_mat": speed, "sensitivity": sens, "accept_hist": hist}


# ------------------------------------------------------------------------------------------ CLI
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recap.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(EMBEDDED_MODEL), help="hub id or local directory")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --model (text models)")
    parser.add_argument("--dataset", default="scenes", help="scenes, photos, mtbench or a .jsonl file")
    parser.add_argument(
        "--methods", default="ar,pld,tr,recap", help=f"comma-separated: {', '.join(METHODS)}, all"
    )
    parser.add_argument("--limit", type=int, default=None, help="use the first K samples")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1, help="untimed AR warm-up requests")
    parser.add_argument("--budget", default=None, help="RECAP tree budget: 'auto' or a node count")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--cold", action="store_true", help="reset persistent memories between samples")
    parser.add_argument(
        "--cost-curve",
        default=None,
        metavar="FILE",
        help="replay a recorded tree-cost curve instead of measuring this device's: a JSON list of "
        "[tokens, milliseconds] or a results.json that recorded one (e.g. a GPU's, on a CPU)",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry; returns the exit code (2 for bad arguments or inputs)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return _bench(args, "python -m recap.bench " + shlex.join(argv))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace, command: str) -> int:
    import torch

    from recap.inputs import check_max_new_tokens

    # Check everything cheap before loading a model.
    methods = normalize_methods(args.methods)
    check_max_new_tokens(args.max_new_tokens)
    budget = parse_budget(args.budget) if args.budget is not None else None
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    samples = load_dataset(args.dataset, args.limit)
    curve = load_curve(args.cost_curve) if args.cost_curve is not None else None
    runtime = Runtime.load(
        args.model,
        device=args.device,
        dtype=args.dtype,
        attn_implementation=args.attn,
        gguf_file=args.gguf_file,
    )
    if curve is not None:
        runtime.use_cost_model(curve)
    result = run_benchmark(
        runtime,
        samples,
        methods,
        max_new_tokens=args.max_new_tokens,
        warmup=args.warmup,
        budget=budget,
        cold=args.cold,
        progress=not args.no_progress,
        settings={
            "dataset": args.dataset,
            "limit": args.limit,
            "command": command,
            **({"cost_curve_file": args.cost_curve} if args.cost_curve else {}),
        },
    )
    write_outputs(result, args.out)
    print(markdown_table(result))
    print(f"wrote {args.out}/results.json, results.md and charts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
