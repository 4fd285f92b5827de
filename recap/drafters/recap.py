"""RECAP: recycle the target's own predictions into contextual and persistent memories, fuse, search.

Per pass (see the method spec and the README's "paper vs ours"):
1. **Lookup** the records keyed by the last 3, 2 and 1 tokens of a context (``C3``, ``C2``: this
   request's, or the stream's with ``context_scope="stream"``; ``P1``: persistent). Keys containing an
   image placeholder are never looked up.
2. **Fuse** them with entropy-confidence weights (`fuse`; `fuse_rows` does many contexts at once).
3. **Estimate** (ours, `recap.acceptance`): each candidate's chance of being the target's greedy token,
   learnt online from its kind (which memories spoke and whether this request wrote them, its rank,
   its fused probability, whether it continues the suffix match); uncalibrated, it is the fused
   probability.
4. **Grow** the tree best-first on path estimates (products along the path), expanding a whole depth
   at a time with numpy (`RecapDrafter._best_first_tree`); the suffix-matched continuation from the
   request's own tokens is one more candidate per context along its path. The budget is fixed or
   cost-aware (`recap.cost`), counting the drafter's own time per pass.
5. **Recycle** (`observe`): every computed position (pending tokens, every tree node accepted or not,
   the prefill's prompt positions) writes its top-k under the 1/2/3-token keys ending there, and every
   candidate of every expanded context is labelled for the acceptance model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from recap.acceptance import BUCKETS, CODES, EDGES, AcceptanceModel
from recap.config import AUTO_CAP, AUTO_FALLBACK_BUDGET, RecapConfig
from recap.cost import CostModel, auto_budget
from recap.drafters.base import Observation, RequestInfo
from recap.drafters.prompt_lookup import NgramIndex
from recap.drafters.token_recycling import TR_TEMPLATE, Candidate, fill_template
from recap.memory import (
    KEY_BITS,
    ContextMemory,
    PersistentMemory,
    PredictionRecord,
    concentration,
    fit_topk,
    pack_keys,
    record_table,
    recycling_keys,
)
from recap.tree import ROOT, DraftTree, FusedCandidate

logger = logging.getLogger(__name__)

#: Weight of the latest pass in the smoothed drafting time the cost-aware budget counts.
OVERHEAD_SMOOTHING = 0.1

#: How many fused candidates at the root `RecapDrafter.root_candidates` returns for display.
ROOT_CANDIDATES = 10

#: The last three tokens of a context, oldest first; None where the context is shorter.
Tail = tuple[int | None, int | None, int | None]

#: The memories, most specific first.
SOURCES = ("ctx3", "ctx2", "persistent")


class Fused(NamedTuple):
    """A fused next-token distribution: ``tokens``/``probs`` best first, and each source's share.

    ``shares``: ``(source, w_n / sum w, record)`` per present record; a token's contribution from a
    source is ``share * record.prob(token)``.
    """

    tokens: list[int]
    probs: list[float]
    shares: tuple[tuple[str, float, PredictionRecord], ...]

    def contributions(self, rank: int) -> dict[str, float]:
        """Per-source parts of ``probs[rank]`` (summing to it); sources that did not propose it are absent."""
        token, parts = self.tokens[rank], {}
        for source, share, record in self.shares:
            if token in record.ids:
                part = share * record.probs[record.ids.index(token)]
                if part > 0:
                    parts[source] = part
        return parts

    def candidates(self, limit: int) -> list[FusedCandidate]:
        return [
            FusedCandidate(self.tokens[i], self.probs[i], self.contributions(i))
            for i in range(min(limit, len(self.tokens)))
        ]


EMPTY = Fused([], [], ())


def fuse(
    records: Sequence[tuple[str, PredictionRecord]],
    specificity: dict[str, float],
    kappa_min: float,
    uniform: bool = False,
) -> Fused:
    """Entropy-confidence fusion of the records found for one context.

    ``w_n = s_n * kappa(r_n)``, ``kappa(r) = max(kappa_min, concentration(r))`` (``s_n = kappa = 1`` when
    ``uniform``), ``q(y) = sum_n w_n * r_n.prob(y) / sum_n w_n`` with raw (not renormalised) top-k
    probabilities. Ties in ``q`` keep the order of the most specific record.

    Example (k = 2): ``ctx2`` ``{5: 0.8, 6: 0.2}`` (concentration 0.278, ``w = 2 * 0.278 = 0.556``) and
    ``persistent`` ``{6: 0.5, 7: 0.5}`` (concentration 0, ``w = kappa_min = 0.05``)::

        q(5) = 0.556 * 0.8 / 0.606                = 0.734
        q(6) = (0.556 * 0.2 + 0.05 * 0.5) / 0.606 = 0.225
        q(7) = 0.05 * 0.5 / 0.606                 = 0.041
    """
    if not records:
        return EMPTY
    if uniform:
        weights = [1.0] * len(records)
    else:
        weights = [specificity[source] * max(kappa_min, record.concentration) for source, record in records]
    total = sum(weights)
    shares = tuple((source, w / total, record) for (source, record), w in zip(records, weights))
    if len(records) == 1:
        # One record: q is its own (sorted) distribution, no accumulation needed.
        record = records[0][1]
        return Fused(list(record.ids), list(record.probs), shares)
    fused: dict[int, float] = {}
    get = fused.get
    for _, share, record in shares:
        for token, prob in zip(record.ids, record.probs):
            fused[token] = get(token, 0.0) + share * prob
    # A stable sort: equal probabilities keep the most specific record's order.
    tokens = sorted(fused, key=fused.__getitem__, reverse=True)
    return Fused(tokens, [fused[t] for t in tokens], shares)


def fuse_rows(ids: np.ndarray, values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """`fuse` for many contexts at once: the ``width`` best fused candidates of each.

    ``ids`` ``(B, n)``: the records found for B contexts side by side, most specific memory first (-1 where a
    memory had none); ``values`` ``(B, n)``: each entry's ``w_n / sum w * prob``. A token's fused
    probability is the sum of its entries. Returns ``tokens`` (int64) and ``q`` (float64), both
    ``(B, width)``, best first, ties in the order of the most specific record (as `fuse`); ``q <= 0``
    marks a slot beyond a context's candidates.
    """
    rows, n = ids.shape
    same = ids[:, :, None] == ids[:, None, :]
    fused = np.einsum("bij,bj->bi", same, values)
    repeated = (same & _strictly_lower(n)).any(2)  # a token counts once, at its first (most specific) place
    fused[repeated | (ids < 0)] = -1.0
    order = np.argsort(-fused, axis=1, kind="stable")[:, :width]
    at = np.arange(rows)[:, None]
    return ids[at, order], fused[at, order]


_LOWER: dict[int, np.ndarray] = {}


def _source_tuples() -> dict[int, tuple[str, ...]]:
    """Sources of a node from ``(argsort of the contributions) . (9, 3, 1) * 8 + present bits``."""
    table = {}
    for first in range(3):
        for second in range(3):
            for third in range(3):
                if len({first, second, third}) == 3:
                    for bits in range(8):
                        names = [SOURCES[i] for i, b in zip((first, second, third), (4, 2, 1)) if bits & b]
                        table[(first * 9 + second * 3 + third) * 8 + bits] = tuple(names)
    return table


_SOURCE_TUPLES = _source_tuples()

#: Place values of the ctx3, ctx2, persistent codes in a coarse kind (`recap.acceptance.coarse_kind`).
_CODE_WEIGHTS = np.array([CODES * CODES, CODES, 1], dtype=np.float32)
_COLUMNS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _column_matrices(k: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``n = 3k`` record columns: ``rank_weights`` ``(n, 3)`` weighs column j of a memory by j + 1,
    ``earlier`` ``(n, 3)`` marks the memories before each column's own (cached)."""
    found = _COLUMNS.get(k)
    if found is None:
        n = 3 * k
        rank_weights = np.zeros((n, 3), np.float32)
        for source in range(3):
            rank_weights[source * k : source * k + k, source] = np.arange(1, k + 1)
        earlier = np.arange(3)[None, :] < (np.arange(n) // k)[:, None]
        found = _COLUMNS[k] = (rank_weights, earlier)
    return found


def _strictly_lower(n: int) -> np.ndarray:
    """``mask[i, j] = j < i`` for ``n x n`` (cached)."""
    mask = _LOWER.get(n)
    if mask is None:
        mask = _LOWER[n] = np.tri(n, k=-1, dtype=bool)
    return mask


class _Lookup(NamedTuple):
    """The records found for B contexts, side by side (`fuse_rows`): ``ids``/``values`` ``(B, 3 * k)``
    (memory ``SOURCES[s]`` in columns ``s * k .. s * k + k``; id -1 and value 0 where it has no
    record), each memory's share ``w_n / sum w`` and whether this request wrote its record, ``shares``
    and ``fresh`` ``(3, B)``."""

    ids: np.ndarray
    values: np.ndarray
    shares: np.ndarray
    fresh: np.ndarray


class _Level(NamedTuple):
    """One depth of growth, for labelling: the contexts expanded (``nodes``: their pool index, -1 the
    root), their candidates ``tokens`` and fine acceptance ``kinds`` ``(F, n)`` (``offered``: a real
    candidate, the suffix token included)."""

    nodes: np.ndarray
    tokens: np.ndarray
    kinds: np.ndarray
    offered: np.ndarray


class _Pool:
    """Candidates of one proposal, a depth at a time: score, token, parent (pool index, -1 the root),
    depth and each memory's contribution ``(3,)`` to the fused probability."""

    def __init__(self) -> None:
        self.size = 0
        self.chain: set[int] = set()  # pool indices of the suffix tokens drafted
        self._parts: list[tuple[np.ndarray, ...]] = []

    def add(self, scores, tokens, parents, depth: int, parts) -> int:
        """Append candidates; returns the pool index of the first."""
        start, count = self.size, len(scores)
        self._parts.append((scores, tokens, parents, np.full(count, depth), parts))
        self.size += count
        return start

    def kth_best(self, k: int) -> float:
        """The ``k``-th best score of the pool."""
        everything = np.concatenate([part[0] for part in self._parts])
        return float(np.partition(everything, self.size - k)[self.size - k])

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate(column) for column in zip(*self._parts))


class RecapDrafter:
    """The RECAP drafter.

    Token-level memory: ``persistent`` if given (e.g. loaded from disk or shared by a studio
    session, or `recap.runtime.Runtime`'s memory of this model and method), else the drafter's own, created
    at the first `begin` and kept across requests. With ``context_scope="stream"`` the contextual
    memories are the persistent memory's too (kept across requests). ``acceptance``: the acceptance
    model learnt over the stream (`recap.acceptance.AcceptanceModel`); by default the one the persistent
    memory carries, so that whoever shares the memory shares what was learnt about it. ``cost_model``
    drives ``budget="auto"``; without one, auto uses `AUTO_FALLBACK_BUDGET` nodes. ``pending`` is the
    number of uncached tokens a verification pass feeds besides the tree nodes (the root).

    Example (persistent memory only, uncalibrated: after 1 the target said ``2 (0.6), 3 (0.3)``, after 2
    ``5 (0.9)``)::

        drafter.propose([0, 1])   # tokens [2, 5, 3]: scores 0.6, 0.54, 0.3 in best-first order,
                                  # parents [ROOT, 0, ROOT]
    """

    def __init__(
        self,
        config: RecapConfig | None = None,
        persistent: PersistentMemory | None = None,
        cost_model: CostModel | None = None,
        name: str = "recap",
        pending: int = 1,
        acceptance: AcceptanceModel | None = None,
    ) -> None:
        self.config = config or RecapConfig()
        if persistent is not None and persistent.k != self.config.k:
            raise ValueError(f"persistent memory has k={persistent.k}, config has k={self.config.k}")
        self.name = name
        self.record_k = self.config.k
        self.persistent = persistent
        self.cost_model = cost_model
        self.pending = pending
        self._acceptance = acceptance
        self.ctx2 = ContextMemory(2)
        self.ctx3 = ContextMemory(3)
        self._index = NgramIndex(2, self.config.suffix_max_len)
        self._excluded: frozenset[int] = frozenset()
        self._excluded_array = np.zeros(0, dtype=np.int64)
        self._usable = np.zeros(1, dtype=bool)  # token -> may appear in a key (last entry: no token)
        s1, s2, s3 = self.config.specificity
        self._weights = np.array([s3, s2, s1])  # specificity priors in `SOURCES` order
        self._flat: int | None = None  # `_flat_extent`, once known
        # Seconds a pass spends drafting (propose + observe, smoothed): the budget rule counts it.
        self._overhead, self._propose_seconds = 0.0, 0.0
        self._empty = np.zeros((0, 2 * self.config.k + 2), dtype=np.float32)  # `_empty_rows`
        self._request = -1  # this request's number (`PersistentMemory.next_request`), stamped on writes
        # The last proposal: its tree and root tail, and what labelling needs in `observe`.
        self._proposed: DraftTree | None = None
        self._root_tail: Tail | None = None
        self._levels: list[_Level] = []
        self._final: np.ndarray = np.zeros(0, dtype=np.int64)  # pool index -> node id (-1: not drafted)
        self._parts: np.ndarray = np.zeros((0, 3))  # each node's contribution per memory (`explain`)

    @property
    def acceptance(self) -> AcceptanceModel:
        """The acceptance model this drafter learns into."""
        if self._acceptance is None:
            if self.persistent is not None:
                return self.persistent.acceptance
            self._acceptance = AcceptanceModel()
        return self._acceptance

    # ------------------------------------------------------------------------------------- protocol
    def begin(self, request: RequestInfo) -> None:
        if self.persistent is None:
            self.persistent = PersistentMemory(request.vocab_size, self.config.k)
        elif self.persistent.vocab_size < request.vocab_size:
            raise ValueError(
                f"persistent memory covers {self.persistent.vocab_size} tokens, "
                f"the request has {request.vocab_size}"
            )
        self._request = self.persistent.next_request()
        if self.config.context_scope == "stream":
            self.ctx2, self.ctx3 = self.persistent.context2, self.persistent.context3
        else:
            self.ctx2.clear()
            self.ctx3.clear()
        self._excluded = frozenset(int(t) for t in request.excluded_tokens)
        self._excluded_array = np.fromiter(self._excluded, dtype=np.int64, count=len(self._excluded))
        self._usable = np.ones(request.vocab_size + 1, dtype=bool)
        self._usable[[t for t in self._excluded if 0 <= t < request.vocab_size]] = False
        self._usable[-1] = False
        self._index.reset(self._excluded)
        self._forget_proposal()

    def propose(self, context: Sequence[int]) -> DraftTree:
        start = time.perf_counter()
        tree = self._propose(context)
        self._propose_seconds = time.perf_counter() - start
        return tree

    def _propose(self, context: Sequence[int]) -> DraftTree:
        self._forget_proposal()
        if len(context) == 0:
            return DraftTree()
        tail = _tail(context)
        self._root_tail = tail
        if self.config.tree == "template":
            tree = self._template_tree(tail)
        else:
            tree = self._best_first_tree(context, tail)
        self._proposed = tree
        return tree

    def root_candidates(self, limit: int = ROOT_CANDIDATES) -> list[FusedCandidate]:
        """The fused distribution at the root of the last proposal, best first, with each source's share.

        Display only (the studio's "what the drafter believed" chart): call it after `propose` and
        before `observe` changes the memories; drafting never computes it.
        """
        return self._fused(self._root_tail).candidates(limit) if self._root_tail is not None else []

    def observe(self, observation: Observation) -> None:
        start = time.perf_counter()
        self._observe(observation)
        if observation.acceptance is not None:  # a decoding pass: fold its drafting time in
            spent = self._propose_seconds + time.perf_counter() - start
            self._overhead += OVERHEAD_SMOOTHING * (spent - self._overhead)

    def _observe(self, observation: Observation) -> None:
        if observation.topk_ids is None or observation.topk_probs is None or self.persistent is None:
            return
        config, tree = self.config, observation.tree
        if config.calibrate and tree is self._proposed and len(tree) and self._levels:
            self._learn(observation)
        ids, probs = fit_topk(observation.topk_ids, observation.topk_probs, config.k)
        accepted = observation.acceptance.nodes if observation.acceptance is not None else ()
        rows, keys, lengths = recycling_keys(
            observation.context,
            observation.positions,
            tree.parents,
            tree.tokens,
            accepted,
            self._excluded_array,
        )
        concentrations = concentration(probs)  # once per row, shared by all memories
        if config.use_persistent:
            usable = lengths >= 1
            chosen = rows[usable]
            self.persistent.write_many(
                keys[usable, 2], ids[chosen], probs[chosen], concentrations[chosen], self._request
            )
        if config.use_context:
            usable = lengths >= 2
            chosen = rows[usable]
            self.ctx2.write_rows(
                pack_keys(keys[usable, 1:]), ids[chosen], probs[chosen], concentrations[chosen], self._request
            )
            usable = lengths >= 3
            chosen = rows[usable]
            self.ctx3.write_rows(
                pack_keys(keys[usable]), ids[chosen], probs[chosen], concentrations[chosen], self._request
            )

    def _forget_proposal(self) -> None:
        self._proposed, self._root_tail, self._levels = None, None, []
        self._final, self._parts = np.zeros(0, dtype=np.int64), np.zeros((0, 3))

    # --------------------------------------------------------------------------------------- lookup
    def _lookup(self, tails: np.ndarray) -> _Lookup:
        """The records under the keys ending each context: ``C3[a, b, c]``, ``C2[b, c]``, ``P1[c]``,
        weighted as `fuse` weighs them.

        ``tails`` ``(B, 3)``: the last three tokens of each context (-1 before the sequence start). A key
        with an image placeholder or a missing token is never looked up.
        """
        config, count, k = self.config, len(tails), self.config.k
        usable = self._usable[tails]  # -1 (before the start) reads the last entry: False
        ok_c = usable[:, 2]
        ok_b = ok_c & usable[:, 1]
        ok_a = ok_b & usable[:, 0]
        blocks = []
        empty = self._empty_rows(count)
        if config.use_context:
            two = (tails[:, 1] << KEY_BITS) | tails[:, 2]
            for memory, ok, keys in (
                (self.ctx3, ok_a, (tails[:, 0] << (2 * KEY_BITS)) | two),
                (self.ctx2, ok_b, two),
            ):
                blocks.append(memory.table[memory.slots(np.where(ok, keys, -1))] if len(memory) else empty)
        else:
            blocks += [empty, empty]
        persistent = self.persistent
        if config.use_persistent and persistent is not None:
            table = persistent.table
            blocks.append(table[np.where(ok_c, tails[:, 2], len(table) - 1)])
        else:
            blocks.append(empty)
        rows = np.stack(blocks, axis=1)  # (B, 3, 2k + 2)
        ids = rows[:, :, :k].astype(np.int64)
        present = ids[:, :, 0] >= 0
        if config.uniform_weights:
            weights = present.astype(np.float64)
        else:
            weights = self._weights * np.maximum(config.kappa_min, rows[:, :, 2 * k]) * present
        total = weights.sum(1, keepdims=True)
        weights /= np.where(total > 0, total, 1.0)
        values = rows[:, :, k : 2 * k] * weights[:, :, None].astype(np.float32)
        fresh = rows[:, :, 2 * k + 1] == self._request
        return _Lookup(ids.reshape(count, 3 * k), values.reshape(count, 3 * k), weights.T, fresh.T)

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
        for index, name in enumerate(SOURCES):
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
    def _budget(self) -> int:
        """Node cap: the fixed budget; with ``auto``, ``max_budget`` or (None) `AUTO_CAP`, raised to the
        extent of a flat cost curve (the cap follows the device); without a cost model, the fallback."""
        config = self.config
        if config.budget != "auto":
            return config.budget
        if self.cost_model is None:
            return min(AUTO_FALLBACK_BUDGET, config.max_budget or AUTO_FALLBACK_BUDGET)
        if config.max_budget is not None:
            return config.max_budget
        return max(AUTO_CAP, self._flat_extent())

    def _flat_extent(self) -> int:
        """How far the cost curve is flat within its noise (`CostModel.flat_extent`), computed once."""
        if self._flat is None:
            self._flat = self.cost_model.flat_extent() if self.cost_model is not None else 0
        return self._flat

    def _candidates(self, found: _Lookup) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every candidate of B contexts, in the records' columns (a token counts at its first column).

        Returns ``tokens`` ``(B, n)``, fused probabilities ``q`` (-1 where the column is a repeat or
        empty), coarse acceptance kinds as ordinary candidates (what each memory says about the token:
        no record; fresh or not, its rank or absent) and each memory's contribution ``(B, n, 3)``.
        Sums over the records' columns are matrix products with small constant matrices (numpy reduces
        short trailing axes slowly).
        """
        ids, values, k = found.ids, found.values, self.config.k
        count, n = ids.shape
        rank_weights, earlier = _column_matrices(k)
        # A record holds distinct ids, so the sum over its columns of (column + 1) * match is the
        # token's rank + 1 in it (0: absent). float32: numpy's float32 products are much faster.
        same = (ids[:, :, None] == ids[:, None, :]).astype(np.float32)  # (B, n, n)
        rank = (same.reshape(count * n, n) @ rank_weights).reshape(count, n, 3).astype(np.int64)
        found_in = rank > 0
        column = np.clip(rank - 1, 0, k - 1)  # (empty columns, id -1, match each other: clipped)
        taken = np.take_along_axis(values.reshape(count, 1, 3, k), column[..., None], 3)
        parts = np.where(found_in, taken[..., 0], 0.0)  # (B, n, 3): each memory's share of q
        q = parts.sum(2, dtype=np.float64)
        # A token counts once, at its first (most specific) memory's column.
        repeated = (found_in & earlier).any(2)
        q[repeated | (ids < 0)] = -1.0
        code = np.where(found_in, np.minimum(rank - 1, 3), 4) + 1 + 5 * found.fresh.T[:, None, :]
        code = np.where((found.shares > 0).T[:, None, :], code, 0)
        coarse = (code.reshape(count * n, 3) @ _CODE_WEIGHTS).reshape(count, n).astype(np.int64) * 2
        return ids, q, coarse, parts

    def _estimate(
        self, coarse: np.ndarray, q: np.ndarray, prior: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Fine kinds and acceptance estimates of candidates of kinds ``coarse`` with fused probability
        ``q`` and cold-start ``prior`` (uncalibrated, the estimate is the prior).

        Estimates are clipped to [0, 1]: a fused probability summed in float32 may exceed 1 by a
        rounding step, and a child must never score above its parent (parents precede children).
        """
        kinds = coarse * BUCKETS + np.searchsorted(EDGES, q, side="right")
        if self.config.calibrate:
            offset, slope = self.acceptance.linear()
            prior = offset[kinds] + slope[kinds] * prior
        # Clipped to [0, 1]: a path estimate must never grow along a path (a fused probability can
        # round to just above 1), or a child would rank before its parent and the tree break its order.
        return kinds, np.clip(prior, 0.0, 1.0)

    def _best_first_tree(self, context: Sequence[int], tail: Tail) -> DraftTree:
        """The ``cap`` best nodes by path estimate (a node's estimate times its parent's path estimate),
        down to the depth limit and above the floor: what best-first search would pop, found a depth at
        a time.

        At each context, every fused candidate is estimated and the ``branching`` best are offered.
        Path estimates never grow along a path, so after each depth the ``cap``-th best estimate so far
        bounds what can still enter: only nodes at or above it have their contexts expanded. The nodes
        come out best first (ties: shallower, then older first), so parents precede children.
        """
        config = self.config
        cap = self._budget()
        if cap == 0:
            return DraftTree()
        chain: list[int] = []
        if config.suffix and config.suffix_budget > 0:
            chain = self._index.continuation(context, min(config.depth, config.suffix_budget))
        width, floor = config.branching, config.score_floor
        pool = _Pool()
        frontier = np.array([-1], dtype=np.int64)
        frontier_tails = np.array([[-1 if t is None else t for t in tail]], dtype=np.int64)
        frontier_scores = np.ones(1)
        chain_node = -1  # pool index of the last suffix token drafted (-1: the root; -2: chain cut)
        threshold = 0.0
        for depth in range(1, config.depth + 1):
            if len(frontier) == 0:
                break
            found = self._lookup(frontier_tails)
            tokens, q, coarse, parts = self._candidates(found)
            chain_info = None
            if depth <= len(chain) and chain_node != -2:
                at = np.flatnonzero(frontier == chain_node)
                if len(at):
                    row, token = int(at[0]), chain[depth - 1]
                    hit = np.flatnonzero((tokens[row] == token) & (q[row] > 0))
                    if len(hit) == 0:  # not proposed by any memory: one more candidate for this context
                        tokens, q, coarse, parts = _widen(
                            tokens, q, coarse, parts, row, token, self._absent_code(found, row)
                        )
                        hit = [tokens.shape[1] - 1]
                    chain_info = (row, int(hit[0]), token)
                    coarse[row, hit[0]] += 1  # the suffix flag
            prior = q.copy()
            if chain_info is not None:
                row, column, _ = chain_info
                prior[row, column] = max(prior[row, column], config.suffix_prior)
            kinds, estimate = self._estimate(coarse, q, prior)
            offered = q > 0
            if chain_info is not None:
                offered[chain_info[0], chain_info[1]] = True
            estimate = np.where(offered, estimate, 0.0)
            self._levels.append(_Level(frontier, tokens, kinds, offered))
            # The `branching` best candidates of each context, by estimate.
            order = np.argsort(-estimate, axis=1, kind="stable")[:, :width]
            at = np.arange(len(frontier))[:, None]
            child_scores = frontier_scores[:, None] * estimate[at, order]
            rows, columns = np.nonzero(child_scores > floor)
            new_scores = child_scores[rows, columns]
            columns = order[rows, columns]
            new_tokens = tokens[rows, columns]
            start = pool.add(new_scores, new_tokens, frontier[rows], depth, parts[rows, columns])
            if chain_info is not None:
                drafted = np.flatnonzero((rows == chain_info[0]) & (columns == chain_info[1]))
                chain_node = start + int(drafted[0]) if len(drafted) else -2
                if chain_node >= 0:
                    pool.chain.add(chain_node)
            if pool.size > cap:
                threshold = max(threshold, pool.kth_best(cap))
            fresh = np.flatnonzero(new_scores >= threshold)
            frontier = start + fresh
            frontier_scores = new_scores[fresh]
            parent_tails = frontier_tails[rows[fresh]]
            frontier_tails = np.column_stack([parent_tails[:, 1], parent_tails[:, 2], new_tokens[fresh]])
        if pool.size == 0:
            return DraftTree()
        return self._select(pool, cap)

    def _absent_code(self, found: _Lookup, row: int) -> int:
        """Coarse kind (non-suffix) of a token no memory proposed at context ``row``."""
        code = np.where(found.shares[:, row] > 0, 1 + 5 * found.fresh[:, row] + 4, 0)
        return int(code @ _CODE_WEIGHTS.astype(np.int64)) * 2

    def _select(self, pool: _Pool, cap: int) -> DraftTree:
        """The ``cap`` best pool nodes, best first (then shallower, then older), as a `DraftTree`; with a
        cost-aware budget, the prefix the budget rule keeps.

        A node's sources are the memories that proposed it, the largest contributor first, then
        ``suffix`` for a suffix-matched token; the contributions themselves are display-only (`explain`).
        """
        scores, tokens, parents, depths, parts = pool.arrays()
        order = np.lexsort((np.arange(len(scores)), depths, -scores))[:cap]
        if self._cost_aware() and self._flat_extent() < cap + self.pending:
            # Where the curve is flat up to the cap, costs differ by noise only: grow to the cap.
            kept = auto_budget(self.cost_model, scores[order], self.pending, overhead=self._overhead)
            order = order[:kept]
        final = np.full(len(scores), -1, dtype=np.int64)
        final[order] = np.arange(len(order))
        self._final, self._parts = final, parts[order]
        chosen_parents = np.where(parents[order] < 0, ROOT, final[np.maximum(parents[order], 0)])
        if np.any(chosen_parents >= np.arange(len(order))):  # cannot happen with estimates <= 1
            raise RuntimeError("draft tree out of order: a node precedes its parent")
        ranked = np.argsort(-self._parts, axis=1, kind="stable")
        present = np.take_along_axis(self._parts, ranked, 1) > 0
        codes = ((ranked @ np.array([9, 3, 1])) * 8 + present @ np.array([4, 2, 1])).tolist()
        sources = [_SOURCE_TUPLES[code] for code in codes]
        for node in pool.chain:
            if final[node] >= 0:
                sources[final[node]] = (*sources[final[node]], "suffix")
        return DraftTree(
            tokens[order].tolist(),
            chosen_parents.tolist(),
            scores[order].tolist(),
            sources,
            [{} for _ in range(len(order))],
        )

    def explain(self, tree: DraftTree) -> None:
        """Fill the display-only fields of the last proposed ``tree``: the fused distribution at the
        root (``root_candidates``) and each node's per-memory contributions (``share * record prob``).

        Call it after `propose` and before `observe` (the studio does; a benchmark does not).
        """
        tree.root_candidates = self.root_candidates()
        if tree is self._proposed and len(self._parts) == len(tree):
            for node, column in enumerate(self._parts.tolist()):
                tree.contributions[node] = {name: part for name, part in zip(SOURCES, column) if part > 0}

    def _cost_aware(self) -> bool:
        return self.config.budget == "auto" and self.cost_model is not None

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
    def _learn(self, observation: Observation) -> None:
        """Label every candidate of every context the last tree expanded, and count the labels.

        A candidate is right when it is the target's greedy token at its context (the root, or the node
        it would continue), whether or not it was drafted and whether or not its parent was accepted.
        When sampling, its label is instead the chance that the target commits it there (a soft label,
        `Observation.commit_probs`): what its acceptance is worth under the sampling rule.
        Contexts whose node was left out of the tree were not verified: they teach nothing.
        """
        width = max(level.tokens.shape[1] for level in self._levels)
        levels = [_pad_columns(level, width) for level in self._levels]
        nodes = np.concatenate([level.nodes for level in levels])
        node_ids = np.where(nodes < 0, -1, self._final[np.maximum(nodes, 0)])
        verified = (nodes < 0) | (node_ids >= 0)
        rows = len(observation.positions) + node_ids[verified]
        tokens = np.concatenate([level.tokens for level in levels])[verified]
        kinds = np.concatenate([level.kinds for level in levels])[verified]
        offered = np.concatenate([level.offered for level in levels])[verified]
        if observation.commit_probs is None:  # greedy: right when it is the target's argmax
            right = offered & (tokens == observation.topk_ids[rows, 0][:, None])
            self.acceptance.update(kinds[offered], kinds[right])
            return
        # Sampling: a candidate is accepted with the target's processed probability of it (soft
        # label; 0 outside the target's top-k).
        found = tokens[:, :, None] == observation.topk_ids[rows][:, None, :]
        worth = (found * observation.commit_probs[rows][:, None, :]).sum(2)
        right = offered & (worth > 0)
        self.acceptance.update(kinds[offered], kinds[right], worth[right])


def _tail(context: Sequence[int]) -> Tail:
    """The last three tokens of ``context`` as Python ints, padded with None in front."""
    last = [int(t) for t in context[-3:]]
    return tuple([None] * (3 - len(last)) + last)  # type: ignore[return-value]


def _widen(
    tokens: np.ndarray, q: np.ndarray, coarse: np.ndarray, parts: np.ndarray, row: int, token: int, kind: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The candidate arrays with one more column, holding ``token`` (fused probability 0) at ``row``."""
    tokens = np.pad(tokens, ((0, 0), (0, 1)), constant_values=-1)
    q = np.pad(q, ((0, 0), (0, 1)), constant_values=-1.0)
    coarse = np.pad(coarse, ((0, 0), (0, 1)))
    parts = np.pad(parts, ((0, 0), (0, 1), (0, 0)))
    tokens[row, -1], q[row, -1], coarse[row, -1] = token, 0.0, kind
    return tokens, q, coarse, parts


def _pad_columns(level: _Level, width: int) -> _Level:
    """``level`` with its candidate arrays padded to ``width`` columns (padding is never offered)."""
    extra = width - level.tokens.shape[1]
    if extra == 0:
        return level
    pad = ((0, 0), (0, extra))
    return _Level(
        level.nodes,
        np.pad(level.tokens, pad, constant_values=-1),
        np.pad(level.kinds, pad),
        np.pad(level.offered, pad),
    )
