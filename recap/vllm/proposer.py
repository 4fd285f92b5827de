"""`RecapProposer`: RECAP as a vLLM speculative proposer (``speculative_config={"method": "custom_class",
"model": "recap.vllm.RecapProposer", "num_speculative_tokens": k}``).

vLLM builds the class with its config inside the model runner; the class installs the runner hooks
(`recap.vllm.internals`, the one module that touches vLLM's internals), which hand it, every step:

1. `record`: each request's verified pass as the runner computed it: the drafts it verified and the
   top-k of the target's prediction at every position it computed (the pending token, every draft,
   accepted or rejected, the last one giving the bonus token);
2. `draft`: each request's committed tokens and what this step sampled for it; the proposer lets the
   request's drafter learn from its pass (`recap.drafters.recap.drafter.RecapDrafter.observe`, the
   same recycling as in this project's engine) and returns its best chain of up to k drafts
   (`RecapDrafter.propose_chain`);
3. `finish`: the requests vLLM finished or aborted; their drafters end and are dropped.

One `RecapDrafter` per running request, all on one stream (`recap.drafters.recap.stream.StreamMemory`:
the 1-token records, the acceptance estimates and what the stream keeps of finished requests); each
request has its own 2- and 3-token contextual memories (``context_scope="request"``, the paper's:
records conditioned on this request's image) unless ``RECAP_VLLM_CONTEXT_SCOPE=stream``. Nothing here
imports vLLM: the runner's data reaches it as `Pass` and `Row` values, so this logic is tested without
vLLM too.

Settings (environment variables, read when vLLM builds the proposer):
``RECAP_VLLM_MEMORY``: a saved persistent memory (this project's safetensors file, made for the same
model) to start from; ``RECAP_VLLM_BUDGET``: nodes the search grows before the chain is cut (default
`DEFAULT_BUDGET`); ``RECAP_VLLM_CONTEXT_SCOPE``: ``request`` (default) or ``stream``;
``RECAP_VLLM_DRAFT_COST``: ``auto`` (the default) cuts the batch's chains where more drafts would
commit fewer tokens per second, or sends none, on what a step costs as learnt from the engine's own
steps (`recap.vllm.cost`); a number is what verifying one draft costs as a share of a pass, each
request's chain cut alone by it (0: never cut, chains of k whenever the memories offer them).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recap.drafters.base import Observation, RequestInfo
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter
from recap.drafters.recap.search import compile_kernels
from recap.drafters.recap.stream import StreamMemory
from recap.memory.fingerprint import memory_tag, tokenizer_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.models.families import placeholder_ids
from recap.tree import DraftTree
from recap.verify import Acceptance
from recap.vllm.cost import LEAST_WEIGHT, PassCost, batch_lengths
from recap.vllm.records import RECORD_K, Pass, Row

logger = logging.getLogger(__name__)

#: Nodes the search grows per request and step before the best chain of k is cut from them.
DEFAULT_BUDGET = 16
#: ``RECAP_VLLM_DRAFT_COST``'s default: chains cut across the batch by the pass cost learnt (`PassCost`).
AUTO = "auto"
#: With ``auto``, a step sends no drafts at least every this many steps while the fit holds too few
#: steps without drafts to tell what drafting itself costs a step (`recap.vllm.cost.StepCost`).
EXPLORE = 32


@dataclass
class Running:
    """A running request: its drafter and the chain it proposed last (what the next pass verifies)."""

    drafter: RecapDrafter
    proposed: DraftTree = field(default_factory=DraftTree)


@dataclass
class ProposerStats:
    """What the proposer did so far: passes observed, drafts proposed, expected and accepted, its own CPU
    time (this thread's) in `draft` (``cpu_seconds``) and in the runner hook's top-k for `record`
    (``record_seconds``)."""

    passes: int = 0
    proposed: int = 0
    accepted: int = 0
    #: The path estimates of the drafts proposed, added up: what the proposer expected to be accepted.
    expected: float = 0.0
    cpu_seconds: float = 0.0
    record_seconds: float = 0.0
    steps: int = 0


class RecapProposer:
    """RECAP for vLLM (see the module docstring). ``vllm_config``: vLLM's config; only its speculative
    settings (``num_speculative_tokens``), the model's vocabulary, length limit, name and HF config are
    read. ``install_hooks=False`` builds it without touching vLLM (tests of the logic)."""

    def __init__(self, vllm_config: Any, install_hooks: bool = True) -> None:
        spec, model = vllm_config.speculative_config, vllm_config.model_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(model.max_model_len)
        self.vocab_size = int(model.get_vocab_size())
        budget = _setting("RECAP_VLLM_BUDGET", DEFAULT_BUDGET, int, "a whole number of nodes >= 1")
        cost = os.environ.get("RECAP_VLLM_DRAFT_COST", "").strip() or AUTO
        #: A draft's share of a pass (each chain cut alone), or None: cut across the batch (`pass_cost`).
        self.draft_cost = None if cost == AUTO else _setting("RECAP_VLLM_DRAFT_COST", 0.0, float,
                                                             "'auto' or a number >= 0")  # fmt: skip
        if budget < 1 or not (self.draft_cost is None or 0 <= self.draft_cost < float("inf")):
            raise ValueError(
                f"RECAP_VLLM_BUDGET must be >= 1 and RECAP_VLLM_DRAFT_COST 'auto' or a number >= 0, got "
                f"{budget} and {cost!r}"
            )
        #: What an engine step costs, fitted from the steps `step` times (`recap.vllm.cost.StepCost`).
        self.pass_cost = PassCost()
        #: The step under way: when it started, its tokens and drafts, if it computes only the pending
        #: tokens and drafts `draft` planned (a step with a prefill or a request joining is not timed).
        self._step: tuple[float, int, int] | None = None
        self._planned = (0, 0)  # the tokens and drafts of the next step if it only verifies this step's
        self._since_plain = 0  # steps since the last one without drafts
        scope = os.environ.get("RECAP_VLLM_CONTEXT_SCOPE", "request")
        if scope not in ("request", "stream"):
            raise ValueError(f"RECAP_VLLM_CONTEXT_SCOPE must be 'request' or 'stream', got {scope!r}")
        self.config = RecapConfig(k=RECORD_K, budget=max(budget, self.k), depth=self.k, context_scope=scope)
        hf_config = getattr(model, "hf_config", None)
        self.excluded = placeholder_ids(hf_config)
        #: What every request's drafter shares (`StreamMemory`: the 1-token memory, ``stream.tokens``, and
        #: what the stream learnt besides), kept for the proposer's lifetime.
        self.stream = StreamMemory(self._start_memory(os.environ.get("RECAP_VLLM_MEMORY"), model))
        self.requests: dict[str, Running] = {}
        self.stats = ProposerStats()
        self._passes: dict[str, Pass] = {}
        compile_kernels()  # now, not in the first step that drafts
        if install_hooks:
            from recap.vllm.internals import install

            install()
        logger.info(
            "RECAP proposer: chains of up to %d drafts from %d-node searches, %s contextual memories, "
            "persistent memory of %d tokens",
            self.k, self.config.budget, scope, len(self.stream),
        )  # fmt: skip

    @property
    def persistent(self) -> PersistentMemory:
        """The stream's 1-token memory (``stream.tokens``)."""
        return self.stream.tokens

    # --------------------------------------------------------------------------- vLLM's custom_class
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: RECAP drafts from the target's own predictions."""

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        """vLLM's custom-proposer call, which sees token ids only; the installed hooks route the runner
        to `draft` instead. Reached only when they are not installed, which is an error."""
        raise RuntimeError(
            "RecapProposer.propose was called directly: the runner hooks (recap.vllm.internals) are not "
            "installed, so the proposer has no logits to recycle"
        )

    # ------------------------------------------------------------------------------ from the hooks
    def step(self, tokens: int) -> None:
        """An engine step starts, computing ``tokens`` tokens: the step before it ended now, so its
        wall-clock time goes to `pass_cost` with its tokens if it was a verification step (it computed
        just the pending tokens and drafts that `draft` planned: a prefill's tokens cost otherwise)."""
        now = time.perf_counter()
        if self._step is not None:
            started, planned, drafts = self._step
            self.pass_cost.add(planned, drafts, now - started)
        planned, drafts = self._planned
        self._step = (now, planned, drafts) if int(tokens) == planned else None

    def record(self, passes: Iterable[Pass]) -> None:
        """This step's verification passes (before sampling), one per request in the batch."""
        self._passes = {p.req_id: p for p in passes}

    def draft(self, rows: Sequence[Row]) -> list[list[int]]:
        """Learn from this step's passes and propose each row's chain (empty for a row that committed
        nothing this step: a prefill still in progress)."""
        start = time.thread_time()
        passes, self._passes = self._passes, {}
        drafting: list[Running] = []  # the rows that commit this step, in order
        for row in rows:
            if not len(row.sampled):
                continue
            running = self.requests.get(row.req_id)
            if running is None:
                running = self.requests[row.req_id] = self._begin(row)
            verified = passes.get(row.req_id)
            if verified is not None:
                self._observe(running, row, verified)
            length = min(self.k, row.room)
            if length > 0:
                running.proposed = running.drafter.propose_chain(row.context, length, self.draft_cost or 0.0)
            else:
                running.proposed = DraftTree()
            drafting.append(running)
        self._cut(drafting)
        sent = sum(len(running.proposed) for running in drafting)
        self._planned = (len(drafting) + sent, sent)
        self._since_plain = 0 if sent == 0 else self._since_plain + 1
        by_row = iter(drafting)
        drafts = [list(next(by_row).proposed.tokens) if len(row.sampled) else [] for row in rows]
        self.stats.proposed += sent
        self.stats.expected += sum(sum(running.proposed.scores) for running in drafting)
        self.stats.cpu_seconds += time.thread_time() - start
        self.stats.steps += 1
        return drafts

    def finish(self, req_ids: Iterable[str]) -> None:
        """Requests vLLM finished or aborted: their answers join the stream, their drafters go."""
        for req_id in req_ids:
            running = self.requests.pop(req_id, None)
            if running is not None:
                running.drafter.end()

    # ------------------------------------------------------------------------------------ helpers
    def _cut(self, drafting: list[Running]) -> None:
        """With ``auto`` cost, cut the batch's chains where more drafts would commit fewer tokens per
        second (`batch_lengths` on the learnt `pass_cost`; whole chains until it has a fit), or send
        none, also every `EXPLORE` steps while the fit lacks steps without drafts."""
        fit = self.pass_cost.fit() if self.draft_cost is None else None
        if fit is None or not drafting:
            return
        if self._since_plain + 1 >= EXPLORE and self.pass_cost.without_drafts() < LEAST_WEIGHT:
            lengths = [0] * len(drafting)
        else:
            chains = [np.asarray(running.proposed.scores, dtype=np.float64) for running in drafting]
            lengths = batch_lengths(chains, fit)
        for running, count in zip(drafting, lengths):
            if count < len(running.proposed):
                running.proposed = running.drafter.shorten(count)

    def _begin(self, row: Row) -> Running:
        drafter = RecapDrafter(self.config, persistent=self.stream, explicit_end=True)
        prompt = tuple(int(t) for t in row.context[: row.prompt_length])
        drafter.begin(RequestInfo(prompt, self.excluded, self.vocab_size))
        return Running(drafter)

    def _observe(self, running: Running, row: Row, verified: Pass) -> None:
        """Let the request's drafter learn from its pass: the context before it, the pending token's
        position, the chain verified, the top-k rows and what was committed."""
        sampled = tuple(int(t) for t in row.sampled)
        before = row.context[: len(row.context) - len(sampled)]
        drafts = verified.drafts
        if len(verified.topk_ids) != len(drafts) + 1 or len(before) == 0:
            logger.warning("request %s: a pass of %d rows for %d drafts, not recycled", row.req_id,
                           len(verified.topk_ids), len(drafts))  # fmt: skip
            return
        accepted = len(sampled) - 1
        if accepted > len(drafts) or tuple(drafts[:accepted]) != sampled[:accepted]:
            logger.warning("request %s: committed tokens that are not the verified drafts", row.req_id)
            return
        proposed = running.proposed
        tree = proposed if tuple(proposed.tokens) == drafts else chain_tree(drafts)
        prefill = len(before) == row.prompt_length and not drafts
        acceptance = None if prefill else Acceptance(tuple(range(accepted)), sampled)
        observation = Observation(
            before, np.array([len(before) - 1]), tree, verified.topk_ids, verified.topk_probs, acceptance
        )
        running.drafter.observe(observation)
        self.stats.passes += 1
        self.stats.accepted += accepted

    def _start_memory(self, path: str | None, model: Any) -> PersistentMemory:
        """The persistent memory: read from ``path`` (checked against this model: tokenizer, weights)
        or empty. A file that does not load is an error: the operator asked for it."""
        if not path:
            return PersistentMemory(self.vocab_size, RECORD_K)
        tag = model_tag(model, self.vocab_size)
        return PersistentMemory.read(path, tag, self.vocab_size, RECORD_K)


def _setting(name: str, default: Any, kind: type, meaning: str) -> Any:
    """The environment variable ``name`` as ``kind`` (``default`` when unset); a clear error otherwise."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be {meaning}, got {value!r}") from None


def chain_tree(tokens: Sequence[int]) -> DraftTree:
    """A chain of ``tokens`` under the root (what vLLM verified when it is not the last proposal)."""
    count = len(tokens)
    parents = list(range(-1, count - 1))
    return DraftTree([int(t) for t in tokens], parents, [0.0] * count, [()] * count, [{} for _ in tokens])


def model_tag(model: Any, vocab_size: int) -> str:
    """The memory-file tag of the model vLLM serves (`recap.memory.fingerprint.memory_tag`), as this
    project's engine computes it for the same folder: its tokenizer's vocabulary, type and weights."""
    from transformers import AutoTokenizer

    name = str(model.model)
    tokenizer = AutoTokenizer.from_pretrained(getattr(model, "tokenizer", None) or name)
    model_type = str(getattr(model.hf_config, "model_type", ""))
    return memory_tag(name, tokenizer_fingerprint(model_type, vocab_size, tokenizer.get_vocab()))
