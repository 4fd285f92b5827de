"""Hot start: the persistent memory a model starts from, so that its first request already drafts.

A cold persistent memory drafts nothing on a visitor's first request (the embedded model's first
example: 20 tokens in 19 passes). So a warmed memory ships for each embedded model (v1 and v2, one file
per model folder), and every memory scope (each studio session, the process-wide scope, the CLI)
starts from its own copy of its model's file.

- `model_fingerprint`: what every memory file is tagged with: the tokenizer's fingerprint and, for a
  model in a local folder, a digest of its weights (a retrained model with the same tokenizer does not
  load the old model's memory); for a hub id, the id.
- `shipped_memory_for` / `SHIPPED_MEMORY_DIR`: the memory that ships for a local model folder
  (``assets/memory/<folder name>.safetensors``, built by ``python -m tools.build_memory``).
- `training_requests`: warm-up requests from an embedded model's TRAINING distribution (its scene
  world: `recap.scenes` for v1, `recap.scenes2` for v2): scene seeds below the world's
  ``HELDOUT_SEED_START``, training question templates. The held-out seeds (which the benchmark and
  the studio's examples use) are never drawn.
- `warm_up`: run requests through a drafter (its memories learn from every pass), optionally bounded
  in time; `AveragedRecords` averages the target's predictions at their committed positions into the
  records a starting memory ships (not the latest record of each token).
- `StartingMemory`: a model's starting point (a file, or nothing), its origin and one sentence about
  it; `starting_memory` resolves it from a file, with a log line and a cold start when the file is
  missing, damaged or made for another model. `StartingMemory.fresh` gives each scope its own copy.
- `seed_successors`: Token Recycling's successor matrix from the same records (TR's matrix after a set
  of passes holds exactly the ids of RECAP's 1-token records after the same passes).

What a memory file holds is what `PersistentMemory.save` writes: the 1-token records. The drafter's
other learnt state (stream-scope contextual records, acceptance estimates) is not saved.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
from PIL import Image

from recap import scenes
from recap.memory import PersistentMemory
from recap.recycling import recycling_keys

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
BUILD_COMMAND = "python -m tools.build_memory"
#: Bytes read from each end of a weight file for its digest (cheap even for a 7B model's folder).
DIGEST_BYTES = 1 << 20

Origin = Literal["shipped", "file", "warm-up", "empty"]


# ------------------------------------------------------------------------------------ fingerprints
def weights_digest(folder: str | Path) -> str:
    """A short digest of a model folder's weights: each weight file's name, size and first and last
    `DIGEST_BYTES`, plus ``config.json``. Retraining changes it; copying the folder elsewhere does not."""
    folder = Path(folder)
    digest = hashlib.sha256()
    weight_suffixes = {".safetensors", ".bin", ".gguf", ".pt", ".pth"}
    files = sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and (p.suffix in weight_suffixes or p.name == "config.json")
    )
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}:".encode())
        with open(path, "rb") as handle:
            digest.update(handle.read(DIGEST_BYTES))
            if size > 2 * DIGEST_BYTES:
                handle.seek(-DIGEST_BYTES, 2)
                digest.update(handle.read(DIGEST_BYTES))
    return digest.hexdigest()[:16]


def model_fingerprint(target: TargetModel) -> str:
    """The tag of a memory file made for ``target``: tokenizer fingerprint plus the weights' digest (a
    local folder) or the model's name (a hub id). A file with another tag is not loaded."""
    folder = Path(target.name)
    if folder.is_dir():
        return f"{target.fingerprint()}|weights:{weights_digest(folder)}"
    return f"{target.fingerprint()}|model:{target.name}"


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


def training_requests(n: int, first_seed: int = 0, world: ModuleType = scenes) -> list[WarmupRequest]:
    """``n`` requests about training scenes of ``world`` (`recap.scenes` for the embedded model v1,
    `recap.scenes2` for v2): scene seeds ``first_seed .. first_seed + n - 1`` (all below the world's
    ``HELDOUT_SEED_START``), its question types in turn, its training question templates. A question
    about two shapes (v2's relation) draws a scene of at least two shapes from the same seed.

    Example: ``training_requests(2)[1].label == "training scene 1 (colour)"``.
    """
    if n < 0 or first_seed < 0 or first_seed + n > world.HELDOUT_SEED_START:
        raise ValueError(
            f"training scene seeds must lie in [0, {world.HELDOUT_SEED_START}), got {first_seed}+{n}"
        )
    two_shape_types = getattr(world, "TWO_SHAPE_TYPES", ())
    requests = []
    for i in range(n):
        seed = first_seed + i
        qtype = world.QUESTION_TYPES[i % len(world.QUESTION_TYPES)]
        rng = np.random.default_rng(seed)
        scene = world.sample_scene(rng, 2) if qtype in two_shape_types else world.sample_scene(rng)
        prompt, _ = world.make_question(scene, qtype, rng)
        requests.append(
            WarmupRequest(prompt, (world.render_scene(scene),), f"training scene {seed} ({qtype})")
        )
    return requests


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
        steps = generate_steps(
            target, drafter, request.prompt, list(request.images), max_new_tokens, details=False
        )
        for step in steps:
            tokens += len(step.new_tokens)
            if step.finished:
                finished += 1
            if seconds is not None and clock() - start >= seconds:
                steps.close()
                break
    return WarmupReport(started, finished, tokens, clock() - start)


class AveragedRecords:
    """A drafter wrapper that also averages, for every token ``t``, the target's top-k next-token
    distribution at every COMMITTED position ending in ``t`` over a stream of requests (the prompt's
    text positions and the answer's; rejected tree nodes are left out), and turns the averages into a
    `PersistentMemory` (`memory`): each token's record is the top-k of its averaged distribution.

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
        from recap.drafters.token_recycling import SuccessorMatrix

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


def seed_successors(matrix: SuccessorMatrix, memory: PersistentMemory) -> int:
    """Write the ids of every record of ``memory`` into Token Recycling's ``matrix``; returns the rows set.

    TR overwrites row ``t`` with the top-k ids at every computed position ending in ``t``, and RECAP's
    1-token memory writes its records under the same keys in the same order, so after the same passes
    the two hold the same ids: the matrix starts from the same data as the memory.
    """
    tokens = [t for t in range(min(memory.vocab_size, matrix.vocab_size)) if memory.lookup(t) is not None]
    if tokens:
        rows = np.array([memory.lookup(t).ids for t in tokens], dtype=np.int64)
        matrix.write_many(np.array(tokens, dtype=np.int64), rows)
    return len(tokens)
