"""The decode loop, written once: draft, verify in one target pass, accept greedily, commit, recycle.

`decode` yields one `StepRecord` per target pass (the prefill pass first) for a `Generation`;
`generate_steps` takes the generation's fields as arguments and `generate` is the non-streaming wrapper.
The autoregressive baseline is this same loop with the empty drafter. Display and diagnostics (token
texts, the drafter's explanation, the benchmark's coverage probe) are `StepObserver`s the loop calls
outside its timed phases; with none, a record holds what decoding computed and nothing more.

What this module does not know: how a drafter proposes (it only sees `DraftTree`s) and how a model
computes (it only calls the `TargetModel` verbs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from recap.drafters.base import Drafter, Explains, Observation, RequestInfo
from recap.inputs import check_max_new_tokens, check_positions, check_prompt, max_positions
from recap.models import TargetModel
from recap.sampling import (
    GREEDY,
    SampledAcceptance,
    SamplingSettings,
    accept_sampled,
    choose_among,
    processed_probs,
)
from recap.trace import FusedRecord, NodeRecord, RunSummary, RunTrace, StepRecord, summarize
from recap.tree import DraftTree, main_source
from recap.verify import Acceptance, accept_greedy, truncate

log = logging.getLogger(__name__)


@dataclass
class GenerationResult:
    """What `generate` returns: the new tokens, their text, every step, and the summary."""

    tokens: list[int]
    text: str
    steps: list[StepRecord]
    summary: RunSummary

    def trace(self, settings: dict | None = None) -> RunTrace:
        return RunTrace(settings=dict(settings or {}), steps=self.steps, text=self.text)


@dataclass(frozen=True)
class Generation:
    """What one generation asks for: the prompt and its images, at most how many new tokens, the method's
    name in the records (None: the drafter's) and how tokens are chosen."""

    prompt: str
    images: Sequence[Image.Image] = ()
    max_new_tokens: int = 128
    method: str | None = None
    sampling: SamplingSettings = GREEDY


class StepObserver:
    """Watches a generation from outside its timed phases; the base watches nothing.

    The loop calls `verified` after every verification pass, before the drafter learns from it (so the
    drafter's memories are as they were when it proposed the pass's tree), and `recorded` with every
    step record (the prefill's first) just before yielding it. An observer never changes what is
    decoded: it reads the drafter and the pass, and may fill a record's display-only fields.
    """

    def verified(self, drafter: Drafter, observation: Observation, root_logits: torch.Tensor) -> None:
        """One verification pass: what the drafter is about to learn, and the target's logits at the root."""

    def recorded(self, record: StepRecord) -> None:
        """One step's record, complete but for what observers fill, before it is yielded."""


class Details(StepObserver):
    """Fills the records' display-only fields: what a drafter that `Explains` says about its tree (the
    fused distribution at the root, each node's memories), token texts, and the target's probability
    at the root where the pass computed no top-k. The studio's observer; the benchmark runs without."""

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self._root_logits: torch.Tensor | None = None

    def verified(self, drafter: Drafter, observation: Observation, root_logits: torch.Tensor) -> None:
        if isinstance(drafter, Explains):  # before `observe` changes the memories
            drafter.explain(observation.tree)
        self._root_logits = root_logits

    def recorded(self, record: StepRecord) -> None:
        text = self.target.token_text
        record.new_texts = text(record.new_tokens)
        if record.nodes:
            for node, node_text in zip(record.nodes, text([n.token for n in record.nodes])):
                node.text = node_text
        if record.fused_at_root:
            for fused, fused_text in zip(record.fused_at_root, text([f.token for f in record.fused_at_root])):
                fused.text = fused_text
        if record.target_prob is None and self._root_logits is not None:
            probs = torch.softmax(self._root_logits.float(), -1)
            record.target_prob = float(probs[record.target_token])
        self._root_logits = None


def generate_steps(
    target: TargetModel,
    drafter: Drafter,
    prompt: str,
    images: Sequence[Image.Image] = (),
    max_new_tokens: int = 128,
    method: str | None = None,
    sampling: SamplingSettings = GREEDY,
    observers: Sequence[StepObserver] = (),
) -> Iterator[StepRecord]:
    """`decode` with the generation's fields as arguments; records carry no display work unless an
    observer (`Details`) fills it."""
    return decode(target, drafter, Generation(prompt, images, max_new_tokens, method, sampling), observers)


def decode(
    target: TargetModel, drafter: Drafter, generation: Generation, observers: Sequence[StepObserver] = ()
) -> Iterator[StepRecord]:
    """Generation with tree verification; yields a `StepRecord` after every target pass.

    Greedy (``sampling.temperature == 0``, the default): the output equals
    ``model.generate(do_sample=False)`` token for token (in float32), whatever the drafter proposes:
    a drafted token is kept only where it equals the target's own argmax. Sampling: every committed
    token is distributed exactly as ``generate(do_sample=True)`` with the same temperature, top-k and
    top-p would draw it (`recap.sampling.accept_sampled`); a seeded run is reproducible.

    ``observers`` (`StepObserver`) watch every pass and record outside the timed draft, verify and
    update phases: the studio's `Details`, the benchmark's coverage probe.
    """
    prompt, images, max_new_tokens, sampling = (
        check_prompt(generation.prompt),
        generation.images,
        generation.max_new_tokens,
        generation.sampling,
    )
    check_max_new_tokens(max_new_tokens)
    method = generation.method or drafter.name
    k = drafter.record_k

    # 1. Prefill: logits at every prompt text position (recycled), the last one gives token 1.
    cpu, start = time.thread_time(), time.perf_counter()
    inputs = target.prepare(images, prompt)
    prompt_ids = inputs["input_ids"][0].tolist()
    limit = max_positions(getattr(target, "text_config", None))  # (None: the config does not say)
    check_positions(len(prompt_ids), max_new_tokens, limit, len(images))
    last = len(prompt_ids) - 1
    keep = [i for i, t in enumerate(prompt_ids[:last]) if t not in target.excluded_ids] if k else []
    keep.append(last)
    state, logits = target.prefill(inputs, keep)
    rng = None if sampling.greedy else sampling.generator()
    if rng is None:
        first = int(logits[-1].argmax())
    else:
        first = choose_among(_distribution(logits[-1], sampling), (), float(rng.random()))[1]
    verify_ms = _ms_since(start)

    start = time.perf_counter()
    drafter.begin(RequestInfo(tuple(prompt_ids), target.excluded_ids, target.vocab_size, target.eos_ids))
    topk_ids, topk_probs = _topk(logits, k)
    drafter.observe(Observation(prompt_ids, np.asarray(keep), DraftTree(), topk_ids, topk_probs))
    prefill_cpu_ms = (time.thread_time() - cpu) * 1000.0
    context = [*prompt_ids, first]
    finished = first in target.eos_ids or max_new_tokens == 1
    record = StepRecord(
        step=0,
        committed_len=len(prompt_ids),
        method=method,
        bonus_token=first,
        new_tokens=[first],
        new_texts=[],
        new_sources=["target"],
        target_token=first,
        timing={"draft_ms": 0.0, "verify_ms": verify_ms, "update_ms": _ms_since(start)},
        finished=finished,
        finish_reason=_reason(first, target) if finished else None,
        cpu_ms=prefill_cpu_ms,
    )
    for observer in observers:
        observer.recorded(record)
    yield record
    generated = 1
    pending = [first]

    step = 0
    while not finished:
        step += 1
        # 2. Draft: a tree under the last committed token.
        cpu, start = time.thread_time(), time.perf_counter()
        tree = drafter.propose(context)
        draft_ms = _ms_since(start)
        draft_cpu = time.thread_time() - cpu
        _check_order(tree, drafter)

        # 3. Verify: one pass over pending + nodes; greedy tokens at the root and at every node.
        verify_cpu, start = time.thread_time(), time.perf_counter()
        logits = target.forward_tree(state, pending, tree)
        tree_logits = logits[len(pending) - 1 :]
        draws = None
        if rng is None:
            greedy = tree_logits.argmax(-1).tolist()
            acceptance = accept_greedy(tree, greedy)
            root_token, root_prob = greedy[0], None
        else:  # sampling: the root token's probability comes with its draw
            acceptance, root_prob = _verify_sampled(tree, tree_logits, sampling, rng)
            draws = [_draw_record(d) for d in acceptance.draws]
            root_token = acceptance.draws[0].token
        acceptance, finished = truncate(acceptance, target.eos_ids, max_new_tokens - generated)
        if draws is not None:  # one draw a committed position: none after an end of text or the limit
            draws = draws[: len(acceptance.tokens)]
        target.commit(state, len(tree), acceptance.nodes)
        topk_ids, topk_probs = _topk(logits, k)
        commit_probs = None if rng is None else _commit_probs(logits, topk_ids, sampling)
        verify_ms = _ms_since(start)
        verify_cpu = time.thread_time() - verify_cpu
        if root_prob is None and topk_probs is not None:
            root_prob = float(topk_probs[len(pending) - 1, 0])  # the greedy token's probability, computed

        # 4. Recycle: the drafter learns from every computed position, rejected nodes included.
        positions = np.arange(len(context) - len(pending), len(context))
        observation = Observation(context, positions, tree, topk_ids, topk_probs, acceptance, commit_probs)
        for observer in observers:  # untimed, before the memories learn from this pass
            observer.verified(drafter, observation, tree_logits[0])
        cpu, start = time.thread_time(), time.perf_counter()
        drafter.observe(observation)
        update_ms = _ms_since(start)
        drafter_cpu_ms = (draft_cpu + time.thread_time() - cpu) * 1000.0

        # 5. Commit and report.
        record = _step_record(
            step,
            len(context),
            method,
            tree,
            acceptance,
            root_token,
            root_prob,
            {"draft_ms": draft_ms, "verify_ms": verify_ms, "update_ms": update_ms},
        )
        context.extend(acceptance.tokens)
        generated += len(acceptance.tokens)
        pending = [acceptance.tokens[-1]]
        record.draws = draws
        record.drafter_cpu_ms = drafter_cpu_ms
        record.cpu_ms = drafter_cpu_ms + verify_cpu * 1000.0
        if finished:
            record.finished = True
            record.finish_reason = _reason(acceptance.tokens[-1], target)
        for observer in observers:
            observer.recorded(record)
        yield record


def generate(
    target: TargetModel,
    drafter: Drafter,
    prompt: str,
    images: Sequence[Image.Image] = (),
    max_new_tokens: int = 128,
    method: str | None = None,
    sampling: SamplingSettings = GREEDY,
    details: bool = True,
    observers: Sequence[StepObserver] = (),
) -> GenerationResult:
    """Run `generate_steps` to the end and collect the result; ``details``: with `Details` first among
    the observers (token texts, the drafter's explanation; the benchmark passes False)."""
    observers = (Details(target), *observers) if details else tuple(observers)
    steps = list(generate_steps(target, drafter, prompt, images, max_new_tokens, method, sampling, observers))
    tokens = [t for s in steps for t in s.new_tokens]
    return GenerationResult(tokens, target.decode(tokens), steps, summarize(steps))


def _check_order(tree: DraftTree, drafter: Drafter) -> None:
    """Refuse a tree whose parents do not precede their children: its positions and attention mask
    (derived in one sweep) would be wrong, and so, silently, would the output."""
    if not tree.parents:  # the empty tree (autoregressive steps)
        return
    parents = np.asarray(tree.parents, dtype=np.int64)
    if np.any(parents >= np.arange(len(parents))) or np.any(parents < -1):
        raise RuntimeError(
            f"drafter {drafter.name!r} proposed a tree whose parents do not precede their children"
        )


def _verify_sampled(
    tree: DraftTree, tree_logits: torch.Tensor, sampling: SamplingSettings, rng: np.random.Generator
) -> tuple[SampledAcceptance, float]:
    """Sampling acceptance of ``tree`` (rows: root, then nodes) and the root token's probability.

    Only the rows the walk visits are turned into distributions (at most depth + 1 of them).
    """
    rows: dict[int, np.ndarray] = {}

    def distribution(row: int) -> np.ndarray:
        if row not in rows:
            rows[row] = _distribution(tree_logits[row], sampling)
        return rows[row]

    acceptance = accept_sampled(tree, distribution, rng)
    return acceptance, float(rows[0][acceptance.draws[0].token])


def _distribution(logits: torch.Tensor, sampling: SamplingSettings) -> np.ndarray:
    """The target's processed next-token distribution at one position, as float64 numpy."""
    return processed_probs(logits[None], sampling)[0].cpu().numpy()


def _commit_probs(
    logits: torch.Tensor, topk_ids: np.ndarray | None, sampling: SamplingSettings
) -> np.ndarray | None:
    """The target's processed probability of each top-k token per row ``(rows, k)``: what a drafted
    child's acceptance is worth under sampling (`Observation.commit_probs`)."""
    if topk_ids is None:
        return None
    probs = processed_probs(logits, sampling)
    return probs.gather(-1, torch.from_numpy(topk_ids).to(probs.device)).cpu().numpy()


def _draw_record(draw) -> dict:
    """A `PositionDraw` as plain JSON data for the step record."""
    return {"tried": [[t, p] for t, p in draw.tried], "token": draw.token, "residual": draw.residual}


def _topk(logits: torch.Tensor, k: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Top-k softmax predictions per row, as numpy ``(rows, k)`` int64 ids / float32 probs."""
    if not k:
        return None, None
    probs, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    return ids.cpu().numpy(), probs.cpu().numpy()


def _step_record(
    step: int,
    committed_len: int,
    method: str,
    tree: DraftTree,
    acceptance: Acceptance,
    root_token: int,
    root_prob: float | None,
    timing: dict[str, float],
) -> StepRecord:
    """One verification pass's record, texts left empty (`Details` fills them)."""
    accepted = set(acceptance.nodes)
    depths = tree.depths
    nodes = [
        NodeRecord(
            id=i,
            parent=tree.parents[i],
            token=tree.tokens[i],
            text="",
            depth=int(depths[i]),
            score=tree.scores[i],
            sources=list(tree.sources[i]),
            contributions=dict(tree.contributions[i]),
            accepted=i in accepted,
            this_request=bool(tree.this_request[i]) if tree.this_request else False,
            fan=int(tree.fans[i]) if tree.fans else 0,
        )
        for i in range(len(tree))
    ]
    fused = [
        FusedRecord(token=c.token, text="", prob=float(c.prob), contributions=dict(c.contributions))
        for c in tree.root_candidates
    ]
    sources = [main_source(tree.sources[n], tree.contributions[n]) for n in acceptance.nodes]
    sources += ["target"] * (len(acceptance.tokens) - len(sources))
    has_bonus = len(acceptance.tokens) > len(acceptance.nodes)
    return StepRecord(
        step=step,
        committed_len=committed_len,
        method=method,
        nodes=nodes,
        accepted_ids=list(acceptance.nodes),
        bonus_token=acceptance.tokens[-1] if has_bonus else None,
        new_tokens=list(acceptance.tokens),
        new_texts=[],
        new_sources=sources,
        fused_at_root=fused,
        target_token=root_token,
        target_prob=root_prob,
        timing=timing,
    )


def _reason(token: int, target: TargetModel) -> str:
    return "eos" if token in target.eos_ids else "length"


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
