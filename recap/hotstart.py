"""Hot start: the persistent memory a model starts from, so that its first request already drafts.

A cold persistent memory drafts nothing on a visitor's first request (the embedded model's first
example: 20 tokens in 19 passes). So a warmed memory ships for each embedded model (v1 and v2, one file
per model folder), and every memory scope (each studio session, the process-wide scope, the CLI)
starts from its own copy of its model's file.

- `shipped_memory_for` / `SHIPPED_MEMORY_DIR`: the memory that ships for a local model folder
  (``assets/memory/<folder name>.safetensors``, built by ``python -m scripts.build_memory``).
- `warm_up`: run requests (`WarmupRequest`; an embedded model's come from its scene world's training
  distribution, `recap.embedded.training_requests`) through a drafter (its memories learn from every
  pass), optionally bounded in time; `AveragedRecords` averages the target's predictions at their
  committed positions into the records a starting memory ships (not the latest record of each token).
- `StartingMemory`: a model's starting point (a file, or nothing), its origin and one sentence about
  it; `starting_memory` resolves it from a file, with a log line and a cold start when the file is
  missing, damaged or made for another model (`recap.memory.fingerprint`). `StartingMemory.fresh`
  gives each scope its own copy; `StartingMemory.successors` seeds Token Recycling's matrix from it
  (`recap.drafters.token_recycling.seed_successors`).

What a memory file holds is what `PersistentMemory.save` writes: the 1-token records. The drafter's
other learnt state (stream-scope contextual records, acceptance estimates) is not saved.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
from PIL import Image

from recap.memory.fingerprint import model_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.memory.recycling import recycling_keys

if TYPE_CHECKING:
    from recap.drafters.base import Drafter
    from recap.drafters.token_recycling import SuccessorMatrix
    from recap.models import TargetModel

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
#: Where the warmed memories that ship with the repository live (one per local model folder name).
SHIPPED_MEMORY_DIR = ROOT / "assets" / "memory"
#: Top-k of the shipped memories (the drafters' default k).
SHIPPED_K = 8
#: The command that (re)builds the shipped memory of the embedded model.
BUILD_COMMAND = "python -m scripts.build_memory"

Origin = Literal["shipped", "file", "warm-up", "empty"]


def shipped_memory_for(target: TargetModel) -> Path | None:
    """The shipped memory file of ``target``'s local model folder, if one ships (None for hub ids)."""
    folder = Path(target.name)
    if not folder.is_dir():
        return None
    path = SHIPPED_MEMORY_DIR / f"{folder.resolve().name}.safetensors"
    return path if path.is_file() else None


# ---------------------------------------------------------------------------------------- requests
class WarmupRequest(NamedTuple):
    """One warm-up request: a prompt, its images, and a short label saying where it comes from."""

    prompt: str
    images: tuple[Image.Image, ...]
    label: str


@dataclass(frozen=True)
class WarmupReport:
    """What a warm-up did: requests started and finished, tokens generated, seconds spent."""

    started: int
    finished: int
    tokens: int
    seconds: float


def warm_up(
    target: TargetModel,
    drafter: Drafter,
    requests: Iterable[WarmupRequest],
    max_new_tokens: int = 64,
    seconds: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> WarmupReport:
    """Decode ``requests`` greedily with ``drafter``, in order; its memories learn from every pass.

    ``seconds``: stop once this much time has passed (checked after every pass, so a warm-up overruns
    by at most one pass; the interrupted request's passes are learnt). None: run every request.
    """
    from recap.decode import generate_steps

    start = clock()
    started = finished = tokens = 0
    for request in requests:
        if seconds is not None and clock() - start >= seconds:
            break
        started += 1
        steps = generate_steps(target, drafter, request.prompt, list(request.images), max_new_tokens)
        for step in steps:
            tokens += len(step.new_tokens)
            if step.finished:
                finished += 1
            if seconds is not None and clock() - start >= seconds:
                steps.close()
                break
    return WarmupReport(started, finished, tokens, clock() - start)


class AveragedRecords:
    """A drafter wrapper that averages the target's next-token distributions per token over a stream of
    requests, for a shipped `PersistentMemory` (`memory`).

    For every token ``t``: the average of the target's top-k at every committed position ending in ``t``
    (prompt text and answer; rejected tree nodes left out); ``t``'s record is that average's top-k.

    A 1-token memory written as it goes keeps the latest record per token: after the last request of a
    warm-up, ``« The»`` predicts that request's next word with probability 0.99, whatever the question.
    The average over the whole warm-up says how far one token decides the next (``« The»`` -> ``« image»``
    0.4, ``« triangle»`` 0.2, ...), which is what a first request needs from a shipped memory. Every
    committed position's prediction is computed exactly once whatever the drafter proposes, so the
    averages depend on the model and the requests only.

    Example: after token 5 the target said ``{7: 1.0}`` once and ``{8: 0.6, 7: 0.4}`` once -> the record
    of 5 is ``[7, 8]`` with probabilities ``[0.7, 0.3]``.
    """

    def __init__(self, drafter: Drafter, vocab_size: int, k: int = SHIPPED_K) -> None:
        self.inner, self.vocab_size, self.k = drafter, vocab_size, k
        self.name = drafter.name
        self.record_k = max(drafter.record_k, k)
        self._sums: dict[int, dict[int, float]] = {}
        self._counts: dict[int, int] = {}
        self._excluded = np.zeros(0, dtype=np.int64)

    def begin(self, request) -> None:
        self._excluded = np.fromiter(request.excluded_tokens, dtype=np.int64)
        self.inner.begin(request)

    def propose(self, context):
        return self.inner.propose(context)

    def observe(self, observation) -> None:
        self.inner.observe(observation)
        if observation.topk_ids is None or observation.topk_probs is None:
            return
        tree = observation.tree
        accepted = tuple(observation.acceptance.nodes) if observation.acceptance is not None else ()
        rows, keys, lengths = recycling_keys(
            observation.context, observation.positions, tree.parents, tree.tokens, accepted, self._excluded
        )
        committed = len(observation.positions) + np.asarray(accepted, dtype=np.int64)
        keep = (lengths >= 1) & ((rows < len(observation.positions)) | np.isin(rows, committed))
        for row, key in zip(rows[keep].tolist(), keys[keep, 2].tolist()):
            sums = self._sums.setdefault(key, {})
            for token, prob in zip(observation.topk_ids[row].tolist(), observation.topk_probs[row].tolist()):
                sums[token] = sums.get(token, 0.0) + prob
            self._counts[key] = self._counts.get(key, 0) + 1

    def memory(self) -> PersistentMemory:
        """A persistent memory holding each seen token's averaged record (top-k, best first)."""
        memory = PersistentMemory(self.vocab_size, self.k)
        keys = sorted(self._sums)
        if not keys:
            return memory
        ids = np.zeros((len(keys), self.k), dtype=np.int64)
        probs = np.zeros((len(keys), self.k), dtype=np.float32)
        for row, key in enumerate(keys):
            best = sorted(self._sums[key].items(), key=lambda item: (-item[1], item[0]))[: self.k]
            ids[row, : len(best)] = [token for token, _ in best]
            ids[row, len(best) :] = best[-1][0]  # padding: the last id again, probability 0
            probs[row, : len(best)] = [total / self._counts[key] for _, total in best]
        memory.write_many(np.array(keys, dtype=np.int64), ids, probs)
        return memory


# ---------------------------------------------------------------------------------- starting point
@dataclass(frozen=True)
class StartingMemory:
    """Where a model's persistent memories start: a file each scope reads its own copy from, or
    nothing (an empty memory). ``tokens``: tokens the file knows. ``note``: one sentence for visitors
    (no server paths), e.g. why a file was not loaded."""

    origin: Origin = "empty"
    path: Path | None = None
    tokens: int = 0
    k: int = SHIPPED_K
    note: str = ""
    fingerprint: str = ""

    @property
    def warm(self) -> bool:
        return self.path is not None and self.tokens > 0

    def fresh(self, vocab_size: int, k: int = SHIPPED_K) -> PersistentMemory:
        """A new memory for one scope: a copy of the file (empty when there is none, when ``k`` differs
        from the file's, or when the file no longer loads: logged)."""
        if self.path is None or k != self.k:
            return PersistentMemory(vocab_size, k)
        return PersistentMemory.load(self.path, self.fingerprint, vocab_size, k)

    def successors(self, memory: PersistentMemory, vocab_size: int) -> SuccessorMatrix:
        """A Token Recycling matrix holding the ids of ``memory``'s records (empty rows elsewhere)."""
        from recap.drafters.token_recycling import SuccessorMatrix, seed_successors

        matrix = SuccessorMatrix(vocab_size)
        seed_successors(matrix, memory)
        return matrix


EMPTY_START = StartingMemory()

_WHAT = {"shipped": "the shipped memory", "file": "the memory file", "warm-up": "the warm-up memory"}


def starting_memory(target: TargetModel, path: str | Path, origin: Origin, note: str = "") -> StartingMemory:
    """``target``'s starting memory from the file at ``path`` (``origin``: how it was chosen).

    A missing, damaged or mismatched file (another model, tokenizer, vocabulary or k) is logged with
    the reason and gives an empty start, whose note says so; the file is never modified.
    """
    path = Path(path)
    what = _WHAT.get(origin, "the memory file")
    fingerprint = model_fingerprint(target)
    try:
        memory = PersistentMemory.read(path, fingerprint, target.vocab_size, SHIPPED_K)
    except FileNotFoundError:
        log.warning("%s %s does not exist; starting with an empty memory", what, path)
        return StartingMemory("empty", note=f"{what} is missing: cold start")
    except ValueError as error:
        hint = f" (rebuild it with {BUILD_COMMAND})" if origin == "shipped" else ""
        log.warning("%s; starting with an empty memory%s", error, hint)
        return StartingMemory("empty", note=f"{what} does not match this model or is damaged: cold start")
    log.info("%s %s: %d tokens known", what, path, len(memory))
    return StartingMemory(origin, path, len(memory), note=note, fingerprint=fingerprint)


def shipped_start(target: TargetModel) -> StartingMemory:
    """``target``'s shipped memory as its starting memory (empty when none ships for its folder)."""
    path = shipped_memory_for(target)
    return EMPTY_START if path is None else starting_memory(target, path, "shipped")


def warm_start(
    target: TargetModel,
    drafter_for: Callable[[PersistentMemory], Drafter],
    requests: Sequence[WarmupRequest],
    seconds: float,
    max_new_tokens: int = 64,
    folder: str | Path | None = None,
) -> StartingMemory:
    """A starting memory made now: ``requests`` decoded by ``drafter_for(memory)`` for at most
    ``seconds``, their committed positions' predictions averaged (`AveragedRecords`), saved to a file
    in ``folder`` (a temporary folder by default) that every scope copies."""
    averaged = AveragedRecords(drafter_for(PersistentMemory(target.vocab_size, SHIPPED_K)), target.vocab_size)
    report = warm_up(target, averaged, requests, max_new_tokens, seconds)
    memory = averaged.memory()
    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="recap-warm-"))
    path = folder / "warm-up.safetensors"
    fingerprint = model_fingerprint(target)
    memory.save(path, fingerprint)
    log.info(
        "warm-up: %d of %d requests (%d tokens) in %.1f s, %d tokens known",
        report.started,
        len(requests),
        report.tokens,
        report.seconds,
        len(memory),
    )
    note = f"warmed on {report.started} example request(s) at start ({report.seconds:.0f} s)"
    return StartingMemory("warm-up", path, len(memory), note=note, fingerprint=fingerprint)
