"""RECAP's best-first growth, compiled: lookup, fusion, acceptance estimates and the search in one call.

Python reference for every step: `recap.drafters.recap.fusion.fuse` (one context), `RecapDrafter._lookup` (the
records), and `tests/reference_fusion.py` (candidates of many contexts and their estimates as numpy
arrays: the drafter's own code before the search was compiled). This module does the same
arithmetic, in the same order and precision (float32 record values, float64 fused probabilities and
scores), for one context at a time inside a best-first search, so that a pass costs tens of
microseconds instead of a few hundred numpy calls. `tests/test_search.py` checks the trees against
a plain best-first search over the numpy reference, and `tests/test_stream_replay.py` that a recorded
stream replays to the very trees it recorded.

The search: a heap of candidate nodes ordered by (path estimate descending, depth, key); the root's
context is expanded first, then the best node is popped (it joins the tree: path estimates never grow
along a path, so nothing later can precede it) and its context expanded, until ``cap`` nodes are
popped. Every popped node above the depth limit is expanded, so every node of the tree has its
candidates labelled for the acceptance model. A *fan* (`recap.drafters.recap.continuations`: a context earlier
answers continued in several ways) queues the context's best candidate and every other candidate that
is one of those continuations, even beyond the ``width`` best, at the context's own path estimate
instead of their own; their scores, and their descendants', stay their own, and a parent is still
popped before its children, so any prefix of the pops is a tree.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numba
import numpy as np

from recap.drafters.recap.continuations import continued, fan_row
from recap.drafters.recap.estimates import CODES, A, B
from recap.drafters.recap.suffix_match import suffix_chain
from recap.memory.key_index import find_row
from recap.memory.records import KEY_BITS

#: Place values of the ctx3, ctx2, persistent codes in a coarse kind
#: (`recap.drafters.recap.estimates.coarse_kind`).
CODE_WEIGHTS = np.array([CODES * CODES, CODES, 1], dtype=np.int64)
#: The `recap.drafters.recap.fusion.SOURCE_NAMES` code of a node the back-off record proposed (+ 1: and
#: the suffix matched it too).
BACKOFF_CODE = 27 * 16
#: A memory's rank code by ``min(rank + 1, 4)`` (0: the memory does not hold the token).
RANK_CODES = np.array([4, 0, 1, 2, 3], dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _fetch(out, source, table, row, empty):
    """Copy record row ``row`` of ``table`` into ``out[source]`` (``empty`` when ``row < 0``)."""
    if row < 0:
        out[source, :] = empty
    else:
        out[source, :] = table[row]


@numba.njit(cache=True, nogil=True)
def _gather(tail, usable, memories, out, empty):
    """The records of ``C3[a, b, c]``, ``C2[b, c]`` and ``P1[c]`` (``memories``: `SearchMemories`) for the
    context ending in ``tail`` into ``out`` ``(3, 2k + 2)`` (``empty`` rows where a memory is off, holds
    nothing, or a key is not usable: an image placeholder, or before the sequence start)."""
    m = memories
    a, b, c = tail[0], tail[1], tail[2]
    ok_c = c >= 0 and usable[c]
    ok_b = ok_c and b >= 0 and usable[b]
    ok_a = ok_b and a >= 0 and usable[a]
    row = -1
    if m.c3_on and ok_a:
        row = find_row(m.c3_keys, m.c3_rows, (a << (2 * KEY_BITS)) | (b << KEY_BITS) | c)
    _fetch(out, 0, m.c3_table, row, empty)
    row = -1
    if m.c2_on and ok_b:
        row = find_row(m.c2_keys, m.c2_rows, (b << KEY_BITS) | c)
    _fetch(out, 1, m.c2_table, row, empty)
    row = -1
    if m.p_on:
        row = c if ok_c else len(m.p_table) - 1  # the last row: the empty record
    _fetch(out, 2, m.p_table, row, empty)


@numba.njit(cache=True, nogil=True)
def _searchsorted_right(edges, value):
    """``np.searchsorted(edges, value, side="right")``."""
    low, high = 0, len(edges)
    while low < high:
        middle = (low + high) // 2
        if edges[middle] <= value:
            low = middle + 1
        else:
            high = middle
    return low


class SearchMemories(NamedTuple):
    """The memories' arrays one search reads (`recap.drafters.recap.search.grow` builds it each pass).

    ``C3``/``C2``: an on flag, hash slots and rows (`recap.memory.key_index.KeyIndex`) and the record
    table; ``P1``: an on flag and its table (`recap.memory.persistent.PersistentMemory.table`); a memory
    that is off reads as empty. ``request``: this request's stamp (fresh records). ``calibrate`` and the
    acceptance model's shrinkage levels (`recap.drafters.recap.estimates.AcceptanceModel.levels`). The
    back-off record (`recap.drafters.recap.backoff`): on flag, ids ``(k,)``, probabilities ``(k,)``. The
    open contexts (`recap.drafters.recap.continuations.Continuations.arrays`): packed 2-token keys,
    sorted, and the tokens that followed each (empty: no fans).
    """

    c3_on: bool
    c3_keys: np.ndarray
    c3_rows: np.ndarray
    c3_table: np.ndarray
    c2_on: bool
    c2_keys: np.ndarray
    c2_rows: np.ndarray
    c2_table: np.ndarray
    p_on: bool
    p_table: np.ndarray
    request: int
    calibrate: bool
    fine_rows: np.ndarray
    coarse_rows: np.ndarray
    backoff_on: bool
    backoff_ids: np.ndarray
    backoff_probs: np.ndarray
    fan_keys: np.ndarray
    fan_ways: np.ndarray


class SearchSettings(NamedTuple):
    """The search's settings, taken once per drafter (`recap.drafters.recap.search.settings_of`).

    A field named as a `recap.drafters.recap.config.RecapConfig` field is that knob, copied by name and
    cast to the type declared here: ``suffix_max_len``, ``k`` (the records' width), ``branching`` (children
    per context), ``score_floor`` (the path estimate a node must pass), ``depth`` (the depth limit),
    ``suffix_prior``, ``uniform_weights`` and ``kappa_min``. The others are derived: ``suffix_min`` and
    ``suffix_num``, the suffix-matched continuation's shortest suffix and tokens (`suffix_chain`; 0:
    none); ``memory_priors`` (the config's, as an array: ctx3, ctx2, persistent,
    `recap.drafters.recap.fusion.MEMORIES` order); ``edges`` and ``buckets`` of the fused probability
    (`recap.drafters.recap.estimates`); ``patience``: the budget rule's
    (`recap.drafters.recap.budget.PATIENCE`).
    """

    suffix_max_len: int
    k: int
    branching: int
    score_floor: float
    depth: int
    suffix_prior: float
    uniform_weights: bool
    kappa_min: float
    suffix_min: int
    suffix_num: int
    memory_priors: np.ndarray
    edges: np.ndarray
    buckets: int
    patience: int


class StopRule(NamedTuple):
    """The cost-aware budget rule (`recap.drafters.recap.budget.Budget.stop`): ``costs[T]`` the cost of a
    pass over ``T`` tokens (empty: no rule, grow to ``cap``), ``pending`` tokens a pass feeds besides the
    nodes, ``overhead`` seconds it spends besides the forward."""

    costs: np.ndarray
    pending: int
    overhead: float


@numba.njit(cache=True, nogil=True)
def grow_tree(tokens, length, cap, usable, memories, settings, stop):
    """Grow the tree of the ``cap`` best nodes (see the module docstring).

    ``tokens[:length]``: the context (its last three tokens are the root's, -1 before the start);
    ``usable``: token -> may appear in a key (``len`` vocab + 1); ``memories``: `SearchMemories`;
    ``settings``: `SearchSettings`; ``stop``: `StopRule`, so that the search stops where the budget rule
    stops looking (it gives up after ``settings.patience`` nodes in a row that did not raise the best
    expected tokens per second; the nodes it would keep come out the same, fewer of those it would drop
    are grown). The back-off record is read as the only record of a context whose last token is usable
    but that no memory has a record for; its candidates have coarse kind 0 (no memory spoke; never an
    ordinary candidate's) and contribute nothing to ``parts``.

    Returns the tree, best first (then shallower, then earlier by key): ``tokens``, ``parents`` (node
    ids, -1 the root), path estimates ``scores``, each memory's contribution ``parts`` ``(N, 3)`` and
    source ``codes`` (`recap.drafters.recap.fusion.SOURCE_NAMES`), ``fanned`` (queued in a fan); the
    labels of every candidate offered at every context expanded (``label_nodes``: the context's node
    id, -1 the root; ``label_tokens``; ``label_kinds``: fine acceptance kinds); and how many of the best
    nodes the budget rule keeps (all without a rule).
    """
    request, calibrate = memories.request, memories.calibrate
    fine_rows, coarse_rows = memories.fine_rows, memories.coarse_rows
    backoff_on, backoff_ids, backoff_probs = memories.backoff_on, memories.backoff_ids, memories.backoff_probs
    fan_keys, fan_ways = memories.fan_keys, memories.fan_ways
    k, width = settings.k, settings.branching
    stop_costs, stop_pending, stop_overhead = stop
    root_tail = np.full(3, -1, dtype=np.int64)
    for back in range(min(3, length)):
        root_tail[2 - back] = tokens[length - 1 - back]
    chain = suffix_chain(
        tokens, length, usable, settings.suffix_min, settings.suffix_max_len, settings.suffix_num
    )
    n = 3 * k
    max_pool = (cap + 1) * (n + 1) + 1  # (a fan may take every candidate of a context)
    score = np.empty(max_pool)
    token = np.empty(max_pool, dtype=np.int64)
    parent = np.empty(max_pool, dtype=np.int64)
    depth = np.empty(max_pool, dtype=np.int64)
    key = np.empty(max_pool)
    tails = np.empty((max_pool, 3), dtype=np.int64)
    parts = np.zeros((max_pool, 3))
    suffix = np.zeros(max_pool, dtype=np.bool_)
    backed_node = np.zeros(max_pool, dtype=np.bool_)
    max_labels = (cap + 1) * (n + 1)
    label_node = np.empty(max_labels, dtype=np.int64)
    label_token = np.empty(max_labels, dtype=np.int64)
    label_kind = np.empty(max_labels, dtype=np.int64)
    tree_id = np.full(max_pool, -1, dtype=np.int64)
    fanned = np.zeros(max_pool, dtype=np.bool_)  # queued in a fan (at its context's estimate)
    out_fanned = np.zeros(cap, dtype=np.bool_)
    out_tokens = np.empty(cap, dtype=np.int64)
    out_parents = np.empty(cap, dtype=np.int64)
    out_scores = np.empty(cap)
    out_parts = np.empty((cap, 3))
    out_codes = np.empty(cap, dtype=np.int64)
    order = np.empty(3, dtype=np.int64)

    empty = np.zeros(2 * k + 2, dtype=np.float32)
    empty[:k] = -1.0
    empty[2 * k + 1] = -1.0
    records = np.empty((3, 2 * k + 2), dtype=np.float32)
    record_ids = np.empty((3, k), dtype=np.int64)
    values = np.empty((3, k), dtype=np.float32)
    weights = np.empty(3)
    present = np.empty(3, dtype=np.bool_)
    fresh = np.empty(3, dtype=np.bool_)
    rank = np.empty(3, dtype=np.int64)
    c_token = np.empty(n + 1, dtype=np.int64)
    c_q = np.empty(n + 1)
    c_coarse = np.empty(n + 1, dtype=np.int64)
    c_parts = np.zeros((n + 1, 3), dtype=np.float32)
    c_estimate = np.empty(n + 1)
    c_taken = np.empty(n + 1, dtype=np.bool_)

    heap = [(0.0, np.int64(0), 0.0, np.int64(0))]
    heap.pop()
    rule = len(stop_costs) > 0
    summed, stale, stop, kept = 0.0, 0, False, 0  # (1 + summed: the reference rule's order of additions)
    best_ratio = 1.0 / (stop_costs[stop_pending] + stop_overhead) if rule else 0.0
    size, labels, pops, chain_node = 0, 0, 0, np.int64(-1)
    context = np.int64(-1)  # pool index of the context's node (the root first) ...
    context_id = np.int64(-1)  # ... and its node id in the tree
    context_tail = root_tail
    context_score, context_depth, context_key = 1.0, np.int64(0), 0.0
    while True:
        # ---- lookup and weights (`RecapDrafter._lookup`)
        _gather(context_tail, usable, memories, records, empty)
        last = context_tail[2]
        backed = (
            backoff_on
            and records[0, 0] < 0
            and records[1, 0] < 0
            and records[2, 0] < 0
            and last >= 0
            and usable[last]
        )
        if backed:  # no memory has a record here: the back-off record, as the only one
            for j in range(k):
                records[2, j] = np.float32(backoff_ids[j])
                records[2, k + j] = backoff_probs[j]
            records[2, 2 * k] = np.float32(1.0)
            records[2, 2 * k + 1] = np.float32(-1.0)
        for s in range(3):
            for j in range(k):
                record_ids[s, j] = np.int64(records[s, j])
            present[s] = records[s, 0] >= 0
            fresh[s] = records[s, 2 * k + 1] == request
            if settings.uniform_weights:
                weights[s] = 1.0 if present[s] else 0.0
            else:
                # (in float32, as numpy compares a Python float with float32 concentrations)
                confidence = np.float64(max(np.float32(settings.kappa_min), records[s, 2 * k]))
                weights[s] = settings.memory_priors[s] * confidence * present[s]
        total = max(weights[0] + weights[1] + weights[2], 1e-300)
        base = 0
        for s in range(3):
            weights[s] /= total
            scale = np.float32(weights[s])
            for j in range(k):
                values[s, j] = records[s, k + j] * scale
            if present[s] and not backed:
                base += (1 + 5 * fresh[s]) * 2 * CODE_WEIGHTS[s]
        # ---- candidates (`recap.drafters.recap.fusion.candidates`), one column per record entry
        for column in range(n):
            memory = column // k
            tok = record_ids[memory, column % k]
            if tok < 0:  # an empty entry (or an absent memory's): never offered
                c_token[column], c_q[column], c_coarse[column] = tok, -1.0, base
                continue
            coarse = base
            q = 0.0
            for s in range(3):
                rank[s] = 0
                if present[s]:
                    for j in range(k):
                        if record_ids[s, j] == tok:
                            rank[s] = j + 1
                            break
                if s < memory and rank[s] > 0:
                    q = -1.0  # counted at a more specific memory's column: never offered here
                    break
                part = values[s, rank[s] - 1] if rank[s] > 0 else np.float32(0.0)
                c_parts[column, s] = 0.0 if backed else part
                q += np.float64(part)
                if present[s] and not backed:
                    coarse += 2 * CODE_WEIGHTS[s] * RANK_CODES[min(rank[s], 4)]
            c_token[column], c_q[column], c_coarse[column] = tok, q, coarse
        columns = n
        # ---- the suffix-matched continuation, one more candidate along its path
        chain_column = -1
        if chain_node != -2 and context == chain_node and context_depth < len(chain):
            wanted = chain[context_depth]
            for column in range(n):
                if c_token[column] == wanted and c_q[column] > 0:
                    chain_column = column
                    break
            if chain_column < 0:  # no memory proposed it: a candidate of fused probability 0
                chain_column = n
                columns = n + 1
                absent = base
                for s in range(3):
                    if present[s] and not backed:
                        absent += 2 * CODE_WEIGHTS[s] * 4
                c_token[n], c_q[n], c_coarse[n] = wanted, 0.0, absent
                c_parts[n, :] = 0.0
            c_coarse[chain_column] += 1  # the suffix flag
        # ---- acceptance estimates (`recap.drafters.recap.estimates`, clipped) and labels
        for column in range(columns):
            q = c_q[column]
            prior = max(q, settings.suffix_prior) if column == chain_column else q
            kind = c_coarse[column] * settings.buckets + _searchsorted_right(settings.edges, q)
            estimate = prior
            if calibrate:  # (a_f + b_f * a_c) + (b_f * b_c) * prior: `AcceptanceModel.levels`
                a_f, b_f = fine_rows[kind, A], fine_rows[kind, B]
                a_c, b_c = coarse_rows[kind // settings.buckets, A], coarse_rows[kind // settings.buckets, B]
                estimate = (a_f + b_f * a_c) + (b_f * b_c) * prior
            offered = q > 0 or column == chain_column
            c_estimate[column] = min(max(estimate, 0.0), 1.0) if offered else 0.0
            c_taken[column] = False
            if offered:
                label_node[labels], label_kind[labels] = context_id, kind
                label_token[labels] = c_token[column]
                labels += 1
        # ---- the `width` best candidates become nodes (ties: the earlier column); at an open context,
        # its fan: the best one and every candidate earlier answers continued with there, at the
        # context's priority
        chain_next = np.int64(-2) if chain_column >= 0 else chain_node
        row = fan_row(fan_keys, context_tail, usable)
        for place in range(columns if row >= 0 else min(width, columns)):
            best = -1
            for column in range(columns):
                if not c_taken[column] and (best < 0 or c_estimate[column] > c_estimate[best]):
                    best = column
            c_taken[best] = True
            child_score = context_score * c_estimate[best]
            if not child_score > settings.score_floor:
                break
            fanned[size] = row >= 0 and (place == 0 or continued(fan_ways, row, c_token[best]))
            if place >= width and not fanned[size]:
                continue
            token[size], score[size], parent[size] = c_token[best], child_score, context
            # (a fan's candidates beyond the `width` best share the last place: ties go in turn)
            depth[size], key[size] = context_depth + 1, context_key * width + min(place, width - 1)
            tails[size, 0], tails[size, 1], tails[size, 2] = context_tail[1], context_tail[2], c_token[best]
            for s in range(3):
                parts[size, s] = np.float64(c_parts[best, s])
            backed_node[size] = backed and best < n  # (column n: the suffix token, no record proposed it)
            if best == chain_column:
                suffix[size] = True
                chain_next = size
            priority = context_score if fanned[size] else child_score
            heapq.heappush(heap, (-priority, depth[size], key[size], np.int64(size)))
            size += 1
        chain_node = chain_next
        # ---- the next node joins the tree; its context is expanded next
        expanded = False
        while len(heap) > 0 and pops < cap and not expanded:
            _, _, _, node = heapq.heappop(heap)
            tree_id[node] = pops
            out_tokens[pops], out_scores[pops] = token[node], score[node]
            out_parents[pops] = tree_id[parent[node]] if parent[node] >= 0 else -1
            out_parts[pops] = parts[node]
            out_fanned[pops] = fanned[node]
            out_codes[pops] = (
                BACKOFF_CODE + suffix[node]
                if backed_node[node]
                else _source_code(parts[node], suffix[node], order)
            )
            pops += 1
            if rule:  # the budget rule (`recap.drafters.recap.budget`), one node at a time
                summed += score[node]
                ratio = (1.0 + summed) / (stop_costs[pops + stop_pending] + stop_overhead)
                if ratio > best_ratio:
                    best_ratio, stale, kept = ratio, 0, pops
                elif not fanned[node]:  # (a fan's nodes come early: they never end the search)
                    stale += 1
                    if stale >= settings.patience:
                        stop = True
                        break
            if depth[node] < settings.depth:
                context, context_id, context_tail = node, pops - 1, tails[node]
                context_score, context_depth, context_key = score[node], depth[node], key[node]
                expanded = True
        if stop or not expanded:
            break
    return (
        out_tokens[:pops],
        out_parents[:pops],
        out_scores[:pops],
        out_parts[:pops],
        out_codes[:pops],
        out_fanned[:pops],
        label_node[:labels],
        label_token[:labels],
        label_kind[:labels],
        kept if rule else pops,
    )


@numba.njit(cache=True, nogil=True)
def _source_code(parts, suffix, order):
    """A node's `recap.drafters.recap.fusion.SOURCE_NAMES` code: the memories ranked by contribution
    (largest first,
    ties the more specific first), which of them contributed, and the suffix flag."""
    order[0], order[1], order[2] = 0, 1, 2
    for i in range(1, 3):  # a stable insertion sort, descending
        j = i
        while j > 0 and parts[order[j]] > parts[order[j - 1]]:
            order[j], order[j - 1] = order[j - 1], order[j]
            j -= 1
    bits = 0
    for place in range(3):
        if parts[order[place]] > 0:
            bits |= 4 >> place
    return ((order[0] * 9 + order[1] * 3 + order[2]) * 8 + bits) * 2 + (1 if suffix else 0)
