"""RECAP: recycle the target's own predictions into contextual and persistent memories, fuse, search.

Per pass (docs/method.md, "The paper's method and ours", says which steps are the paper's); where
each step lives:
1. **Lookup** (`RecapDrafter._lookup`): the records keyed by the last 3, 2 and 1 tokens of a context
   (``C3``, ``C2``: this request's, or the stream's with ``context_scope="stream"``; ``P1``: persistent;
   `recap.memory.persistent`, `recap.drafters.recap.context`). Keys containing an image placeholder are never
   looked up.
2. **Fuse** (`recap.drafters.recap.fusion`): entropy-confidence weights; every candidate of many
   contexts at once, with its coarse acceptance kind.
3. **Estimate** (ours, `recap.drafters.recap.estimates`): each candidate's chance of being the target's
   greedy token, learnt online from its kind (which memories spoke and whether this request wrote them, its
   rank, its fused probability, whether it continues the suffix match); uncalibrated, it is the fused
   probability.
4. **Grow** (`recap.drafters.recap.search`): the tree best-first on path estimates (products along the
   path), a whole depth at a time; the suffix-matched continuation from the request's own tokens is one
   more candidate per context along its path. The budget is fixed or cost-aware (`recap.models.cost`),
   counting the drafter's own time per pass.
5. **Recycle** (`RecapDrafter.observe`, `recap.drafters.recap.recycle`): every computed position (pending
   tokens, every tree node accepted or not, the prefill's prompt positions) writes its top-k under the
   1/2/3-token keys ending there, and every candidate of every expanded context is labelled for the
   acceptance model.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence

import numpy as np

from recap.drafters.base import Observation, RequestInfo
from recap.drafters.recap.budget import Budget
from recap.drafters.recap.chain import best_chain, restrict, worth_verifying
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.context import ContextMemory
from recap.drafters.recap.continuations import fan_ways
from recap.drafters.recap.estimates import AcceptanceModel
from recap.drafters.recap.fusion import EMPTY, MEMORIES, Fused, Lookup, fuse_rows
from recap.drafters.recap.mirror import RequestMirror
from recap.drafters.recap.recycle import GreedyLabels, VerifiedPass, recycle
from recap.drafters.recap.search import Growth, Memories, compile_kernels, grow, select, settings_of
from recap.drafters.recap.stream import StreamMemory
from recap.drafters.token_recycling import TR_TEMPLATE, Candidate, fill_template
from recap.memory.persistent import PersistentMemory
from recap.memory.records import KEY_BITS, PredictionRecord, record_table
from recap.models.cost import CostModel
from recap.tree import ROOT, DraftTree, FusedCandidate

logger = logging.getLogger(__name__)

#: Weight of the latest pass in the smoothed drafting time the cost-aware budget counts.
OVERHEAD_SMOOTHING = 0.1

#: How many fused candidates at the root `RecapDrafter.root_candidates` returns for display.
ROOT_CANDIDATES = 10

#: The last three tokens of a context, oldest first; None where the context is shorter.
Tail = tuple[int | None, int | None, int | None]


class RecapDrafter:
    """The RECAP drafter.

    What it keeps across requests is its stream's (`recap.drafters.recap.stream.StreamMemory`, ``stream``):
    ``persistent`` if given (a stream, e.g. a studio session's, or a bare 1-token memory, e.g. loaded from
    disk: the stream it belongs to, `StreamMemory.of`), else the drafter's own, created at the first
    `begin`. With ``context_scope="stream"`` the contextual memories are the stream's too.
    ``acceptance``: the acceptance model learnt over the stream
    (`recap.drafters.recap.estimates.AcceptanceModel`); by default the stream's, so that whoever shares the
    memory shares what was learnt about it. ``cost_model`` drives ``budget="auto"``
    (`recap.drafters.recap.budget.Budget`). ``pending`` is the number of uncached tokens a verification pass
    feeds besides the tree nodes (the root). ``explicit_end``: each request ends with `end` (an engine running
    several requests at once on one memory); otherwise the next `begin` ends the previous request.

    Example (persistent memory only, uncalibrated: after 1 the target said ``2 (0.6), 3 (0.3)``, after 2
    ``5 (0.9)``)::

        drafter.propose([0, 1])   # tokens [2, 5, 3]: scores 0.6, 0.54, 0.3 in best-first order,
                                  # parents [ROOT, 0, ROOT]
    """

    def __init__(
        self,
        config: RecapConfig | None = None,
        persistent: StreamMemory | PersistentMemory | None = None,
        cost_model: CostModel | None = None,
        name: str = "recap",
        pending: int = 1,
        acceptance: AcceptanceModel | None = None,
        explicit_end: bool = False,
    ) -> None:
        compile_kernels()
        self.config = config or RecapConfig()
        if isinstance(persistent, PersistentMemory):
            persistent = StreamMemory.of(persistent)
        if persistent is not None and persistent.tokens.k != self.config.k:
            raise ValueError(f"persistent memory has k={persistent.tokens.k}, config has k={self.config.k}")
        self.name = name
        self.record_k = self.config.k
        #: What this drafter keeps across requests (its 1-token memory is ``stream.tokens``).
        self.stream: StreamMemory | None = persistent
        self.cost_model = cost_model
        self.pending = pending
        self.explicit_end = explicit_end
        self._prompt_length, self._ended = 0, False
        self.budget = Budget(self.config, cost_model, pending)
        self._search = settings_of(self.config)  # what the compiled search reads of the config
        self._acceptance = acceptance
        self.ctx2 = ContextMemory(2)
        self.ctx3 = ContextMemory(3)
        self._seen = RequestMirror()  # the tokens the search reads (the root, the suffix match)
        self._excluded: frozenset[int] = frozenset()
        self._excluded_array = np.zeros(0, dtype=np.int64)
        self._usable = np.zeros(1, dtype=bool)  # token -> may appear in a key (last entry: no token)
        self._weights = np.array(self.config.memory_priors)  # specificity priors in `MEMORIES` order
        # CPU seconds a pass spends drafting (propose + observe, smoothed; this thread's CPU time, like
        # the cost curve on a CPU, so other jobs on the machine do not inflate it): the budget counts it.
        self._overhead, self._propose_seconds = 0.0, 0.0
        self._empty = np.zeros((0, 2 * self.config.k + 2), dtype=np.float32)  # `_empty_rows`
        self._request = -1  # this request's number (`PersistentMemory.next_request`), stamped on writes
        # The last proposal: its tree and root tail, and what labelling needs in `observe`.
        self._proposed: DraftTree | None = None
        self._root_tail: Tail | None = None
        self._growth: Growth | None = None
        self._kept = 0  # nodes of the grown tree kept in the proposal (a cost-aware budget may cut it)
        self._fans: tuple[np.ndarray, np.ndarray] | None = None  # this request's open contexts

    def __deepcopy__(self, memo: dict) -> RecapDrafter:
        """A drafter with copies of everything it learnt (its memories copy with locks of their own,
        `recap.memory.guarded`) and this one's compiled-search settings: they never change, and a
        writable copy of their read-only arrays would make numba compile the search again."""
        twin = object.__new__(type(self))
        memo[id(self)] = twin
        twin.__dict__.update(copy.deepcopy({k: v for k, v in vars(self).items() if k != "_search"}, memo))
        twin._search = self._search
        return twin

    @property
    def persistent(self) -> PersistentMemory | None:
        """The 1-token memory (``P1``) of this drafter's stream; None before the first `begin` without one."""
        return None if self.stream is None else self.stream.tokens

    @property
    def acceptance(self) -> AcceptanceModel:
        """The acceptance model this drafter learns into."""
        if self._acceptance is None:
            if self.stream is not None:
                return self.stream.acceptance
            self._acceptance = AcceptanceModel()
        return self._acceptance

    # ------------------------------------------------------------------------------------- protocol
    def begin(self, request: RequestInfo) -> None:
        if self.stream is None:
            self.stream = StreamMemory(PersistentMemory(request.vocab_size, self.config.k))
        elif self.persistent.vocab_size < request.vocab_size:
            raise ValueError(
                f"persistent memory covers {self.persistent.vocab_size} tokens, "
                f"the request has {request.vocab_size}"
            )
        self._request = self.persistent.next_request()
        if self.config.context_scope == "stream":
            self.ctx2, self.ctx3 = self.stream.context2, self.stream.context3
            if self.config.context_consensus > 0:
                self.ctx2.fold(self._request, self.config.context_consensus)
                self.ctx3.fold(self._request, self.config.context_consensus)
        else:
            self.ctx2.clear()
            self.ctx3.clear()
        self._excluded = frozenset(int(t) for t in request.excluded_tokens)
        self._excluded_array = np.fromiter(self._excluded, dtype=np.int64, count=len(self._excluded))
        self._usable = np.ones(request.vocab_size + 1, dtype=bool)
        self._usable[[t for t in self._excluded if 0 <= t < request.vocab_size]] = False
        self._usable[-1] = False
        continuations = self.stream.continuations
        if not self.explicit_end:
            continuations.fold_pending(self._usable)  # the request before this one (another image)
        image = np.isin(np.asarray(request.prompt_tokens, dtype=np.int64), self._excluded_array).any()
        self._fans = continuations.arrays() if self.config.fans and image else None
        stream = self.config.suffix_scope == "stream"
        self._seen.start(self.stream, stream, register=not self.explicit_end)
        self._prompt_length, self._ended = len(request.prompt_tokens), False
        if not self.explicit_end:
            continuations.pending = (self._seen, self._prompt_length)
        self._forget_proposal()

    def end(self) -> None:
        """End the request now: its tokens join what the stream keeps of finished requests (the suffix
        match's history, the continuations where the search fans), as the next `begin` would do.
        Needed with ``explicit_end``; harmless without (the next `begin` then has nothing to end)."""
        stream = self.stream
        if stream is None or self._ended:
            return
        self._ended = True
        continuations = stream.continuations
        if not self.explicit_end:
            if continuations.pending is None or continuations.pending[0] is not self._seen:
                return  # the next request's `begin` ended this one already
            continuations.pending = None
        if self.config.suffix_scope == "stream":
            self._seen.close(stream)
        continuations.fold(self._seen.request(), self._prompt_length, self._usable)

    def propose(self, context: Sequence[int]) -> DraftTree:
        start = time.thread_time()
        tree = self._propose(context)
        self._propose_seconds = time.thread_time() - start
        return tree

    def propose_chain(self, context: Sequence[int], length: int, draft_cost: float = 0.0) -> DraftTree:
        """`propose`, cut to the path of at most ``length`` drafts that commits the most on average
        (`recap.drafters.recap.chain`), for an engine that verifies one path; `observe` learns from it
        as from the tree (the contexts off the path were not verified). ``draft_cost``: what verifying
        one draft costs, as a share of a pass; the path is cut where more drafts would commit fewer
        tokens per unit of cost (`recap.drafters.recap.chain.worth_verifying`; 0: never cut)."""
        if self.config.tree != "best_first":
            raise ValueError("chains are cut from the best-first search; the template ablation has none")
        start = time.thread_time()
        tree = self._propose(context)
        growth = self._growth
        if growth is not None and self._kept:
            path = best_chain(growth.parents[: self._kept], growth.scores[: self._kept], length)
            path = path[: worth_verifying(growth.scores[path], draft_cost)]
            self._growth, self._kept = restrict(growth, path), len(path)
            tree = select(self._growth)
        self._proposed = tree
        self._propose_seconds = time.thread_time() - start
        return tree

    def shorten(self, count: int) -> DraftTree:
        """The chain `propose_chain` just proposed, cut to its first ``count`` drafts (a cut decided
        across a batch: `recap.vllm.cost.batch_lengths`); `observe` then learns from the shorter one."""
        if self._proposed is None or self._growth is None or count >= len(self._proposed):
            return self._proposed if self._proposed is not None else DraftTree()
        self._kept = max(count, 0)
        self._growth = restrict(self._growth, list(range(self._kept)))
        self._proposed = select(self._growth)
        return self._proposed

    def _propose(self, context: Sequence[int]) -> DraftTree:
        self._forget_proposal()
        if len(context) == 0:
            return DraftTree()
        tail = _tail(context)
        self._root_tail = tail
        template = self.config.tree == "template"
        tree = self._template_tree(tail) if template else self._best_first_tree(context)
        self._proposed = tree
        return tree

    def coverage(self, tails: np.ndarray, tokens: np.ndarray) -> list[tuple[tuple[str, ...], bool]]:
        """For each state (``tails[i]``: its last three tokens, -1 before the start) whether the memories
        hold ``tokens[i]`` now: the memories whose record there lists it (``ctx3``, ``ctx2``,
        ``persistent``; ``backoff`` where no memory has a record and the back-off record lists it), and
        whether a record written by this request lists it. A diagnostic (the benchmark's breakdown):
        call it between `propose` and `observe`."""
        tails = np.asarray(tails, dtype=np.int64).reshape(-1, 3)
        found, k = self._lookup(tails), self.config.k
        backoff = self._backoff()
        result = []
        for i, token in enumerate(np.asarray(tokens, dtype=np.int64).tolist()):
            names, fresh = [], False
            for m, name in enumerate(MEMORIES):
                if found.shares[m, i] > 0 and token in found.ids[i, m * k : m * k + k].tolist():
                    names.append(name)
                    fresh = fresh or bool(found.fresh[m, i])
            none = not (found.shares[:, i] > 0).any()
            usable = tails[i, 2] >= 0 and self._usable[tails[i, 2]]
            if none and usable and backoff is not None and token in backoff[0].tolist():
                names.append("backoff")
            result.append((tuple(names), fresh))
        return result

    def root_candidates(self, limit: int = ROOT_CANDIDATES) -> list[FusedCandidate]:
        """The fused distribution at the root of the last proposal, best first, with each source's share.

        Display only (the studio's "what the drafter believed" chart): call it after `propose` and
        before `observe` changes the memories; drafting never computes it.
        """
        return self._fused(self._root_tail).candidates(limit) if self._root_tail is not None else []

    def observe(self, observation: Observation) -> None:
        start = time.thread_time()
        self._observe(observation)
        if observation.acceptance is not None:  # a decoding pass: fold its drafting time in
            spent = self._propose_seconds + time.thread_time() - start
            self._overhead += OVERHEAD_SMOOTHING * (spent - self._overhead)

    def _observe(self, observation: Observation) -> None:
        if observation.topk_ids is None or observation.topk_probs is None or self.persistent is None:
            return
        config, tree, growth = self.config, observation.tree, self._growth
        labels = None
        if tree is self._proposed and growth is not None:  # the search's own arrays
            parents, tokens = growth.parents[: len(tree)], growth.tokens[: len(tree)]
            if config.calibrate and len(tree):
                labels = self._labels(observation)
        else:
            parents, tokens = tree.parents, tree.tokens
        if config.backoff and observation.acceptance is not None:  # the tokens this pass committed
            self.stream.backoff.count(observation.acceptance.tokens)
        accepted = observation.acceptance.nodes if observation.acceptance is not None else ()
        computed = VerifiedPass(
            observation.context,
            observation.positions,
            parents,
            tokens,
            accepted,
            observation.topk_ids,
            observation.topk_probs,
        )
        recycle(
            computed,
            self._excluded_array,
            config.k,
            self._request,
            self.persistent if config.use_persistent else None,
            self.ctx2 if config.use_context else None,
            self.ctx3 if config.use_context else None,
            labels,  # greedy: the acceptance counts in the same compiled call
        )

    def _forget_proposal(self) -> None:
        self._proposed, self._root_tail, self._growth = None, None, None
        self._kept = 0

    # --------------------------------------------------------------------------------------- lookup
    def _lookup(self, tails: np.ndarray) -> Lookup:
        """The records under the keys ending each context: ``C3[a, b, c]``, ``C2[b, c]``, ``P1[c]``,
        weighted as `fuse` weighs them.

        ``tails`` ``(B, 3)``: the last three tokens of each context (-1 before the sequence start). A key
        with an image placeholder or a missing token is never looked up.
        """
        config, count, k = self.config, len(tails), self.config.k
        usable = self._usable[tails]  # -1 (before the start) reads the last entry: False
        ok_c = usable[:, 2]
        ok_b = ok_c & usable[:, 1]
        empty = self._empty_rows(count)
        blocks = [empty, empty, empty]
        if config.use_context:
            two = np.where(ok_b, (tails[:, 1] << KEY_BITS) | tails[:, 2], -1)
            if len(self.ctx3):
                three = np.where(ok_b & usable[:, 0], (tails[:, 0] << (2 * KEY_BITS)) | two, -1)
                blocks[0] = self.ctx3.table[self.ctx3.slots(three)]
            if len(self.ctx2):
                blocks[1] = self.ctx2.table[self.ctx2.slots(two)]
        persistent = self.persistent
        if config.use_persistent and persistent is not None:
            blocks[2] = persistent.table[np.where(ok_c, tails[:, 2], -1)]  # row -1: the empty record
        rows = np.concatenate(blocks, axis=1).reshape(count, 3, 2 * k + 2)
        present = rows[:, :, 0] >= 0
        if config.uniform_weights:
            weights = present.astype(np.float64)
        else:
            weights = self._weights * np.maximum(config.kappa_min, rows[:, :, 2 * k]) * present
        # Some memory holds a record, or every weight is 0: dividing by a tiny total leaves them 0.
        weights /= np.maximum(weights.sum(1, keepdims=True), 1e-300)
        values = rows[:, :, k : 2 * k] * weights[:, :, None].astype(np.float32)
        fresh = rows[:, :, 2 * k + 1] == self._request
        ids = rows[:, :, :k].astype(np.int64).reshape(count, 3 * k)
        return Lookup(ids, values.reshape(count, 3 * k), weights.T, fresh.T)

    def _empty_rows(self, count: int) -> np.ndarray:
        """``count`` empty records (`record_table` layout: id -1, probability 0), read-only."""
        if len(self._empty) < count:
            k = self.config.k
            self._empty = record_table(
                np.full((2 * count, k), -1),
                np.zeros((2 * count, k)),
                np.zeros(2 * count),
                np.full(2 * count, -1),
            )
        return self._empty[:count]

    def _fused(self, tail: Tail) -> Fused:
        """The fused distribution after one context, with each record's share (as `fuse` gives it)."""
        found = self._lookup(np.array([[-1 if t is None else t for t in tail]], dtype=np.int64))
        k, shares = self.config.k, []
        for index, name in enumerate(MEMORIES):
            share = float(found.shares[index, 0])
            if share > 0:
                ids, values = (
                    found.ids[0, index * k : index * k + k],
                    found.values[0, index * k : index * k + k],
                )
                shares.append((name, share, PredictionRecord(ids.tolist(), (values / share).tolist(), 0.0)))
        if not shares:
            return EMPTY
        tokens, q = fuse_rows(found.ids, found.values, found.ids.shape[1])
        valid = q[0] > 0
        return Fused(tokens[0][valid].tolist(), q[0][valid].tolist(), tuple(shares))

    # ----------------------------------------------------------------------------------------- trees
    def _best_first_tree(self, context: Sequence[int]) -> DraftTree:
        """The best-first tree (`recap.drafters.recap.search`) under ``context``, with this pass's budget."""
        config = self.config
        cap = self.budget.cap()
        if cap == 0:
            return DraftTree()
        stop = self.budget.stop(cap, self._overhead)  # None: grow to the cap
        length = self._seen.update(context)
        growth = grow(
            self._seen.tokens,
            length,
            cap,
            self._search,
            self._usable,
            Memories(
                self.ctx3 if config.use_context else None,
                self.ctx2 if config.use_context else None,
                self.persistent if config.use_persistent else None,
                self._request,
                self.acceptance.levels() if config.calibrate else None,
                backoff=self._backoff(),
                fans=self._fans,
            ),
            stop=stop,
        )
        self._growth = growth
        if len(growth.tokens) == 0:
            return DraftTree()
        keep = None
        if stop is not None:  # the search applied the budget rule as it grew

            def keep(scores: np.ndarray) -> int:
                return growth.kept

        tree = select(growth, keep)
        self._kept = len(tree)
        return tree

    def explain(self, tree: DraftTree) -> None:
        """Fill the display-only fields of the last proposed ``tree``: the fused distribution at the
        root (``root_candidates``), each node's per-memory contributions (``share * record prob``),
        whether a record this request wrote proposed it (``this_request``) and its context's fan (``fans``).
        Call it after `propose` and before `observe` (the studio does; a benchmark does not)."""
        tree.root_candidates = self.root_candidates()
        if tree is self._proposed and self._growth is not None and self._kept == len(tree):
            parts = self._growth.parts[: len(tree)]
            for node, column in enumerate(parts.tolist()):
                tree.contributions[node] = {name: part for name, part in zip(MEMORIES, column) if part > 0}
            tails = self._parent_tails(tree)
            fresh = self._lookup(tails).fresh.T  # (N, 3): at each node's context
            tree.this_request = ((parts > 0) & fresh).any(axis=1).tolist()
            ways = np.array(fan_ways(self._fans, tails, self._usable), dtype=np.int64)
            tree.fans = (ways * self._growth.fanned[: len(tree)]).tolist()  # (0: not in a fan)

    def _parent_tails(self, tree: DraftTree) -> np.ndarray:
        """The last three tokens of each node's context (its parent's path; -1 before the start)."""
        root = [-1 if t is None else t for t in self._root_tail or (None, None, None)]
        tails = np.empty((len(tree), 3), dtype=np.int64)
        own = np.empty((len(tree), 3), dtype=np.int64)  # each node's own tail: its parent's, then it
        for node, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):
            tails[node] = root if parent == ROOT else own[parent]
            own[node] = (tails[node, 1], tails[node, 2], token)
        return tails

    def _backoff(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The back-off record's ``(ids, probs)`` for the search (`recap.drafters.recap.backoff`), or None
        when off."""
        if not self.config.backoff or self.stream is None:
            return None
        return self.stream.backoff.record()

    def _template_tree(self, tail: Tail) -> DraftTree:
        """Ablation: TR's static template filled from the fused distribution instead of best-first."""
        tails: dict[int, Tail] = {ROOT: tail}

        def children(tree: DraftTree, node: int) -> list[Candidate]:
            node_tail = tails.get(node)
            if node_tail is None:
                parent_tail = tails[tree.parents[node]]
                node_tail = tails[node] = (parent_tail[1], parent_tail[2], tree.tokens[node])
            fused = self._fused(node_tail)
            base = 1.0 if node == ROOT else tree.scores[node]
            options = []
            for rank in range(len(fused.tokens)):
                contributions = fused.contributions(rank)
                options.append(
                    (fused.tokens[rank], base * fused.probs[rank], tuple(contributions), contributions)
                )
            return options

        return fill_template(TR_TEMPLATE, children)

    # ------------------------------------------------------------------------------------- learning
    def _labels(self, observation: Observation) -> GreedyLabels | None:
        """Label every candidate of every context the last tree expanded, and count the labels (when
        greedy: returns them for `recycle` to count in its call).

        A candidate is right when it is the target's greedy token at its context (the root, or the node
        it would continue), whether or not it was drafted and whether or not its parent was accepted.
        When sampling, its label is instead the chance that the target commits it there (a soft label,
        `Observation.commit_probs`): what its acceptance is worth under the sampling rule.
        Contexts whose node was left out of the tree were not verified: they teach nothing.
        """
        growth = self._growth  # one label per candidate offered at every context expanded
        if observation.commit_probs is None:  # greedy: right when it is the target's argmax
            return GreedyLabels(
                self.acceptance, growth.label_nodes, growth.label_tokens, growth.label_kinds, self._kept
            )
        verified = growth.label_nodes < self._kept  # the root (-1) and the nodes kept in the tree
        rows = len(observation.positions) + growth.label_nodes[verified]
        tokens, kinds = growth.label_tokens[verified], growth.label_kinds[verified]
        # Sampling: a candidate is accepted with the target's processed probability of it (soft
        # label; 0 outside the target's top-k).
        worth = ((tokens[:, None] == observation.topk_ids[rows]) * observation.commit_probs[rows]).sum(1)
        right = worth > 0
        self.acceptance.update(kinds, kinds[right], worth[right])
        return None


def _tail(context: Sequence[int]) -> Tail:
    """The last three tokens of ``context`` as Python ints, padded with None in front."""
    last = [int(t) for t in context[-3:]]
    return tuple([None] * (3 - len(last)) + last)  # type: ignore[return-value]
