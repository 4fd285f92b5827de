"""RECAP's acceptance layer and the drafting machinery around it: estimates, depth-at-a-time best-first
growth (checked against a plain heap), vectorised fusion (checked against `fuse`), record tables,
flat cost curves and their replay, display-only step fields."""

from __future__ import annotations

import heapq
import json

import numpy as np
import pytest
from conftest import images_for, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_fusion import candidates, estimate
from test_drafters import IMAGE, PATTERN, VOCAB, Target, cycle_rule, seeded, simulate, start, step

from recap.decode import generate
from recap.drafters import make_drafter
from recap.drafters.base import RequestInfo
from recap.drafters.recap.backoff import BackoffRecord
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.context import ContextMemory
from recap.drafters.recap.drafter import RecapDrafter
from recap.drafters.recap.estimates import (
    BUCKETS,
    CODES,
    FINE_KINDS,
    HITS,
    SEEN,
    A,
    AcceptanceModel,
    B,
    bucket,
    coarse_kind,
    fine_kind,
    source_code,
)
from recap.drafters.recap.fusion import fuse, fuse_rows
from recap.memory.persistent import PersistentMemory
from recap.memory.records import PredictionRecord, pack_keys
from recap.models.cost import MAX_TREE, CostModel, load_curve
from recap.runtime import Runtime
from recap.tree import ROOT


# ------------------------------------------------------------------------------------- the estimates
def test_kinds_encode_what_each_memory_says():
    assert [source_code(False, False, 0), source_code(True, False, 0), source_code(True, True, 2)] == [
        0,
        1,
        8,
    ]
    assert source_code(True, False, 7) == 4 and source_code(True, False, None) == 5  # rank 3+, absent
    assert coarse_kind((0, 0, 1), suffix=False) == 2 and coarse_kind((0, 0, 1), suffix=True) == 3
    assert coarse_kind((1, 0, 0), False) == 2 * CODES * CODES
    assert fine_kind(3, 0.5) == 3 * BUCKETS + bucket(0.5) and bucket(0.0) == 0 and bucket(1.0) == BUCKETS - 1


def test_cold_start_estimate_is_the_fused_probability_and_counts_shrink_towards_it():
    model = AcceptanceModel(strength=8.0)
    kind = fine_kind(coarse_kind((0, 0, 1), False), 0.99)
    assert model.estimate(kind, 0.99) == pytest.approx(0.99)  # no labels: behaves like the method
    model.update(np.array([kind] * 100), np.array([kind] * 40))  # 100 seen, 40 right
    coarse = (40 + 8 * 0.99) / 108
    assert model.estimate(kind, 0.99) == pytest.approx((40 + 8 * coarse) / 108)  # ~0.40, not 0.99
    other = fine_kind(coarse_kind((0, 0, 1), False), 0.5)  # same coarse kind, another bucket
    assert model.estimate(other, 0.5) == pytest.approx((40 + 8 * 0.5) / 108)
    assert len(model) == 100
    model.reset()
    assert model.estimate(kind, 0.99) == pytest.approx(0.99) and len(model) == 0


def test_old_labels_decay_once_a_kind_is_well_known():
    model = AcceptanceModel(strength=1.0, memory=10.0, decay=0.5)
    kind = fine_kind(0, 0.5)
    model.update(np.array([kind] * 12), np.array([kind] * 12))  # 12 > 10 seen: halved
    assert model.seen_fine[kind] == pytest.approx(6.0) and model.hits_fine[kind] == pytest.approx(6.0)


def test_greedy_labels_count_as_update_with_the_labels_chosen_in_numpy():
    """`update_greedy` (labels chosen and counted in one compiled call) equals `update` with the verified
    labels and the right ones picked by numpy, over passes that decay counts."""
    rng = np.random.default_rng(0)
    fused, apart = (AcceptanceModel(strength=2.0, memory=40.0, decay=0.9) for _ in range(2))
    for _ in range(30):
        labels, kept, first_row = int(rng.integers(0, 60)), int(rng.integers(0, 8)), int(rng.integers(1, 4))
        nodes = rng.integers(-1, 10, labels)
        tokens = rng.integers(0, 5, labels)
        kinds = rng.integers(0, 3 * BUCKETS, labels)  # few kinds: counts pass `memory` and decay
        greedy = rng.integers(0, 5, first_row + 10)
        fused.update_greedy(nodes, tokens, kinds, kept, first_row, greedy)
        verified = nodes < kept
        right = tokens[verified] == greedy[first_row + nodes[verified]]
        apart.update(kinds[verified], kinds[verified][right])
    for ours, theirs in zip(fused.levels(), apart.levels()):  # counts and shrinkage (not scratch)
        assert np.array_equal(ours[:, [SEEN, HITS, A, B]], theirs[:, [SEEN, HITS, A, B]])
    assert len(fused) == len(apart) > 0


@pytest.mark.parametrize(
    ("nodes", "tokens", "kinds", "message"),
    [
        ([0, 1], [5, 5], [3], "2 nodes, 2 tokens and 1 kinds"),
        ([0], [5], [-1], "label 0: fine kind -1"),
        ([0], [5], [FINE_KINDS], f"label 0: fine kind {FINE_KINDS}"),
        ([5], [5], [3], "greedy row 6"),  # a verified node beyond the 3 computed rows
    ],
)
def test_greedy_labels_out_of_range_are_refused_and_nothing_is_counted(nodes, tokens, kinds, message):
    model = AcceptanceModel()
    with pytest.raises(ValueError, match=message):
        model.update_greedy(np.array(nodes), np.array(tokens), np.array(kinds), 9, 1, np.array([5, 5, 5]))
    assert len(model) == 0


@pytest.mark.parametrize(
    ("strength", "memory", "decay"), [(0.0, 10.0, 0.5), (1.0, 0.0, 0.5), (1.0, 10.0, 0.0), (1.0, 10.0, 1.5)]
)
def test_acceptance_model_rejects_bad_settings(strength, memory, decay):
    with pytest.raises(ValueError, match="strength"):
        AcceptanceModel(strength, memory, decay)


def persistent_kind(rank: int, q: float, fresh: bool = False) -> int:
    """Fine kind of a candidate only the persistent memory proposes, at ``rank`` with probability q."""
    return fine_kind(coarse_kind((0, 0, source_code(True, fresh, rank)), False), q)


@pytest.mark.parametrize(("method", "first"), [("recap", 8), ("recap-uncalibrated", 7)])
def test_estimates_order_the_candidates(method, first):
    # P1[1] says 7 (0.9) then 8 (0.05); the acceptance model has seen that such a memory's first
    # choice is never right and its second always is: calibrated drafting tries 8 first.
    drafter = make_drafter(method, config=RecapConfig(k=3, budget=1, suffix=False, use_context=False))
    seeded(drafter, {1: {7: 0.9, 8: 0.05}})
    wrong, right = persistent_kind(0, 0.9), persistent_kind(1, 0.05)
    drafter.acceptance.update(np.array([wrong] * 50 + [right] * 50), np.array([right] * 50))
    assert drafter.propose([0, 1]).tokens == [first]


def test_every_expanded_context_teaches_the_acceptance_model():
    drafter = make_drafter("recap", config=RecapConfig(budget=8, suffix=False, use_context=False))
    simulate(drafter, [IMAGE] * 4 + PATTERN * 2, Target(cycle_rule(PATTERN)), passes=20)
    model = drafter.acceptance
    assert model is drafter.stream.acceptance and len(model) > 20 * 8  # more labels than nodes
    # A cycle: the persistent memory's first choice is always right, its second never.
    assert model.estimate(persistent_kind(0, 0.7, fresh=True), 0.7) > 0.9
    assert model.estimate(persistent_kind(1, 0.04, fresh=True), 0.04) < 0.04


# ------------------------------------------------------------------------------------ vectorised parts
@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(
        st.one_of(
            st.none(),
            st.tuples(
                st.lists(st.integers(0, 9), min_size=4, max_size=4, unique=True),
                st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4),
                st.floats(0.1, 3.0),
            ),
        ),
        min_size=3,
        max_size=3,
    )
)
def test_fuse_rows_equals_fuse(records):
    ids = np.full((1, 12), -1)
    values = np.zeros((1, 12))
    present, weights = [], []
    for s, record in enumerate(records):
        if record is None:
            continue
        tokens, probs, weight = record
        probs = sorted(probs, reverse=True)
        ids[0, s * 4 : s * 4 + 4] = tokens
        present.append((("ctx3", "ctx2", "persistent")[s], PredictionRecord(tokens, probs, 0.0)))
        weights.append(weight)
        values[0, s * 4 : s * 4 + 4] = probs
    total = sum(weights) or 1.0
    at = 0
    for s, record in enumerate(records):
        if record is not None:
            values[0, s * 4 : s * 4 + 4] *= weights[at] / total
            at += 1
    spec = {name: w for (name, _), w in zip(present, weights)}
    expected = fuse(present, spec, 1.0)  # kappa_min 1: w_n = the weight itself
    tokens, q = fuse_rows(ids, values, 12)
    valid = q[0] > 0
    nonzero = [(t, p) for t, p in zip(expected.tokens, expected.probs) if p > 0]
    assert q[0][valid].tolist() == pytest.approx([p for _, p in nonzero])
    assert tokens[0][valid].tolist() == [t for t, _ in nonzero]


def reference_best_first(drafter: RecapDrafter, context, cap):
    """Plain best-first search over the same estimates: pop the best candidate, push its children."""
    heap, order, chosen = [], 0, []
    tail = tuple(context[-3:])

    def push(node, node_tail, path, depth):
        nonlocal order
        found = drafter._lookup(np.array([node_tail]))
        tokens, q, coarse, _ = candidates(found, drafter.config.k)
        backoff = drafter.stream.backoff.record() if drafter.config.backoff else None
        if backoff is not None and not found.shares.any() and drafter._usable[node_tail[2]]:
            # no memory has a record: the back-off record's tokens, of coarse kind 0
            ids, probs = backoff
            tokens, q = ids[None], np.where(ids >= 0, probs.astype(np.float64), -1.0)[None]
            coarse = np.zeros_like(tokens)
        _, estimates = estimate(drafter, coarse, q, q.copy())
        estimates = np.where(q > 0, estimates, 0.0)[0]
        for column in np.argsort(-estimates, kind="stable")[: drafter.config.branching]:
            if path * estimates[column] > 0:
                score = path * estimates[column]
                heapq.heappush(heap, (-score, depth, order, node, int(tokens[0, column]), node_tail))
                order += 1

    push(ROOT, tail, 1.0, 1)
    while heap and len(chosen) < cap:
        negative, depth, _, parent, token, parent_tail = heapq.heappop(heap)
        chosen.append((parent, token, -negative))
        if depth < drafter.config.depth:
            push(len(chosen) - 1, (parent_tail[1], parent_tail[2], token), -negative, depth + 1)
    return chosen


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), cap=st.integers(1, 40))
def test_compiled_growth_picks_what_best_first_search_over_the_numpy_reference_pops(seed, cap):
    rng = np.random.default_rng(seed)
    drafter = make_drafter("recap", config=RecapConfig(budget=cap, suffix=False, k=4, branching=3, depth=4))
    context = start(drafter, [1, 2, 3], Target(lambda c: int(rng.integers(0, 12)), k=4))
    for _ in range(4):
        step(drafter, context, Target(lambda c: int(rng.integers(0, 12)), k=4))
    tree = drafter.propose(context)
    tree.validate()
    expected = sorted(s for _, _, s in reference_best_first(drafter, context, cap))
    assert sorted(tree.scores) == pytest.approx(expected)
    assert tree.scores == sorted(tree.scores, reverse=True)


# -------------------------------------------------------------------------------------- record tables
def test_context_memory_rows_slots_and_the_empty_record():
    memory = ContextMemory(2)
    assert memory.slots(pack_keys(np.array([[1, 2]]))).tolist() == [0]  # nothing yet: the empty row
    memory.write_rows(
        pack_keys(np.array([[1, 2], [3, 4], [1, 2]])),
        np.array([[5, 6], [7, 8], [9, 1]]),
        np.array([[0.6, 0.4]] * 3),
        np.array([0.1, 0.2, 0.3]),
        request=4,
    )
    rows = memory.slots(pack_keys(np.array([[1, 2], [3, 4], [9, 9]])))
    assert rows[2] == 0 and memory.table[0, 0] == -1  # missing key -> the empty record (id -1)
    assert memory.lookup((1, 2)) == PredictionRecord([9, 1], pytest.approx([0.6, 0.4]), pytest.approx(0.3), 4)
    assert sorted(memory.keys()) == [(1, 2), (3, 4)] and (3, 4) in memory and len(memory) == 2


def test_a_full_stream_memory_reuses_the_oldest_row():
    memory = ContextMemory(2, capacity=2)
    for key in ([1, 1], [2, 2], [3, 3]):
        memory.write_rows(pack_keys(np.array([key])), np.array([key]), np.array([[1.0, 0.0]]), np.ones(1), 0)
    assert sorted(memory.keys()) == [(2, 2), (3, 3)] and memory.lookup((3, 3)).ids == [3, 3]
    assert len(memory.table) == 3  # two rows and the empty one, never more


def test_persistent_table_mirrors_the_arrays():
    memory = PersistentMemory(10, 2)
    memory.write_many(np.array([3]), np.array([[1, 2]]), np.array([[0.7, 0.3]]), request=5)
    table = memory.table
    assert table.shape == (11, 6) and table[3].tolist() == pytest.approx([1, 2, 0.7, 0.3, table[3, 4], 5])
    assert table[4, 0] == -1 and table[10, 0] == -1  # no record, and the empty last row
    memory.write_many(np.array([4]), np.array([[8, 9]]), np.array([[1.0, 0.0]]), request=6)
    assert memory.table[4, :2].tolist() == [8, 9] and memory.lookup(4).request == 6
    memory.reset()
    assert memory.table[3, 0] == -1


# -------------------------------------------------------------------------------- budgets and curves
H200 = [(1, 3.151), (4, 3.537), (8, 2.904), (16, 3.46), (32, 3.486), (64, 3.516)]  # ms, recorded
CPU = [(1, 2.004), (4, 2.45), (8, 2.374), (16, 2.955), (32, 3.731), (64, 4.866)]


@pytest.mark.parametrize(
    ("points_ms", "extent"),
    [
        (H200, 128),  # flat within its noise; trusted to twice the largest measured size
        (CPU, 0),  # a 2-core CPU: T = 4 already costs 22% more
        ([(1, 1.0), (256, 1.0)], MAX_TREE),  # perfectly flat
        ([(1, 1.0), (8, 1.04), (16, 2.0)], 8),  # flat (within 5%) until the step
    ],
)
def test_flat_extent(points_ms, extent):
    assert CostModel([(t, ms / 1e3) for t, ms in points_ms]).flat_extent() == extent


def test_the_auto_cap_follows_the_device():
    def auto_tree(points_ms):
        drafter = RecapDrafter(
            RecapConfig(k=3, suffix=False, use_context=False, depth=256, branching=2),
            cost_model=CostModel([(t, ms / 1e3) for t, ms in points_ms]),
        )
        drafter.begin(RequestInfo((0,), frozenset(), VOCAB))
        rows = np.array([[t + 1, (t + 2) % VOCAB, 0] for t in range(VOCAB)])
        drafter.persistent.write_many(np.arange(VOCAB), rows, np.array([[0.9, 0.05, 0.0]] * VOCAB))
        return len(drafter.propose([0, 1]))

    assert auto_tree(H200) == 128  # flat: grows past the default cap of 64, to the device's extent
    assert auto_tree(CPU) < 32  # steep: the budget rule keeps what pays


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[[1, 3.1], [64, 3.5]]", None),
        ('{"settings": {"cost_curve_ms": {"measured": [[1, 3.1], [64, 3.5]], "fitted": []}}}', None),
        ("not json", "not readable JSON"),
        ('{"settings": {}}', "no cost curve found"),
        ('[[1, "fast"]]', "bad cost curve point"),
        ("[[0, 1.0]]", "tokens >= 1"),
    ],
)
def test_load_curve(tmp_path, content, message):
    path = tmp_path / "curve.json"
    path.write_text(content)
    if message is None:
        assert load_curve(path).points == ((1, pytest.approx(3.1e-3)), (64, pytest.approx(3.5e-3)))
    else:
        with pytest.raises(ValueError, match=message):
            load_curve(path)


def test_load_curve_of_a_missing_file_names_it(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_curve(tmp_path / "absent.json")


def test_bench_replays_a_recorded_curve(tmp_path):
    from recap.bench import run_benchmark
    from recap.bench.datasets import Sample

    target = tiny("llava")
    runtime = Runtime(target)
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps([[t, ms] for t, ms in H200]))
    runtime.use_cost_model(load_curve(curve))
    samples = [Sample("describe the image.", images_for(target, i)) for i in range(2)]
    result = run_benchmark(runtime, samples, "recap", max_new_tokens=8, warmup=0, progress=False)
    assert result.settings["cost_curve_ms"]["measured"] == [[t, ms] for t, ms in H200]
    assert result.methods["recap"].match_rate == 1.0


# -------------------------------------------------------------------------- display-only step fields
@pytest.mark.parametrize("details", [True, False])
def test_display_fields_only_when_asked(details):
    target = tiny("llava")
    drafter = make_drafter("recap", config=RecapConfig(budget=8))
    generate(target, drafter, "describe the image.", images_for(target), 12)  # fill the memories
    result = generate(target, drafter, "describe the image.", images_for(target), 12, details=details)
    drafted = [s for s in result.steps[1:] if s.nodes]
    assert drafted and all(s.target_prob is not None for s in result.steps[1:])  # from the top-k, free
    assert any(s.fused_at_root for s in drafted) == details
    assert any(n.contributions for s in drafted for n in s.nodes) == details
    assert all(bool(s.new_texts) == details for s in result.steps)


def test_image_placeholder_context_drafts_nothing():
    drafter = make_drafter("recap", config=RecapConfig(budget=16))
    context = start(drafter, [1, 2, 3, IMAGE], Target(cycle_rule([1, 2, 3])))
    assert len(drafter.propose(context)) == 0


def test_bench_cli_refuses_a_bad_cost_curve_before_loading_a_model(tmp_path, capsys):
    from recap.bench import main

    assert main(["--cost-curve", str(tmp_path / "absent.json"), "--out", str(tmp_path / "out")]) == 2
    assert "cost curve file not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("method", ["recap", "recap-uncalibrated"])
def test_certain_records_in_every_memory_never_score_a_child_above_its_parent(method):
    # Three records of probability 1 fuse, in float32 with weights 4:2:1, to 1.0000000447: unclipped,
    # a child would outscore its parent and be placed before it (a tree the verifier misreads).
    drafter = make_drafter(method, config=RecapConfig(budget=32, suffix=False))
    simulate(drafter, PATTERN * 3, Target(cycle_rule(PATTERN), top=1.0), passes=10)
    tree = drafter.propose(PATTERN * 3)
    tree.validate()
    assert len(tree) > 1 and all(
        tree.scores[node] <= tree.scores[parent] for node, parent in enumerate(tree.parents) if parent != ROOT
    )


def test_writes_to_a_shared_context_memory_wait_for_its_lock():
    # Concurrent studio requests share a stream-scope memory: a write allocates rows under a lock.
    import threading

    memory = ContextMemory(2, capacity=4)
    done = threading.Event()

    def write():
        memory.write_rows(pack_keys(np.array([[1, 2]])), np.array([[3, 4]]), np.array([[1.0, 0.0]]), [1.0], 0)
        done.set()

    with memory._lock:
        threading.Thread(target=write).start()
        assert not done.wait(0.2) and len(memory) == 0  # blocked while another writer holds the lock
    assert done.wait(60) and memory.lookup((1, 2)).ids == [3, 4]  # 60 s: generous for a busy CPU


# ------------------------------------------------------------------------------------ the back-off record
@settings(max_examples=30, deadline=None)
@given(tokens=st.lists(st.integers(-2, 12), max_size=60), k=st.integers(1, 5))
def test_backoff_record_keeps_the_most_often_counted_tokens(tokens, k):
    record = BackoffRecord(vocab_size=11, k=k)
    for chunk in (tokens[: len(tokens) // 2], tokens[len(tokens) // 2 :]):
        record.count(chunk)
    counted = [t for t in tokens if 0 <= t < 11]
    found = record.record()
    if not counted:
        assert found is None
        return
    ids, probs = found
    counts = np.bincount(counted, minlength=11)
    kept = ids[ids >= 0]
    assert len(kept) == min(k, np.count_nonzero(counts)) and len(set(kept.tolist())) == len(kept)
    assert counts[kept].tolist() == sorted(counts[kept].tolist(), reverse=True)
    assert counts[kept].min() >= np.sort(counts)[::-1][len(kept) - 1]  # no better token left out
    assert probs[ids >= 0].tolist() == pytest.approx((counts[kept] / len(counted)).tolist())
    assert (probs[ids < 0] == 0).all()
    record.reset()
    assert record.record() is None and len(record) == 0


def test_backoff_record_hands_out_copies():
    record = BackoffRecord(vocab_size=10, k=2)
    record.count([3, 5, 3])
    ids, probs = record.record()
    ids[:], probs[:] = -1, 0.0
    again, shares = record.record()
    assert again.tolist() == [3, 5] and shares.tolist() == pytest.approx([2 / 3, 1 / 3])


@pytest.mark.parametrize("backoff", [True, False])
def test_a_context_no_memory_knows_drafts_the_backoff_record(backoff):
    drafter = make_drafter("recap", config=RecapConfig(budget=16, backoff=backoff))
    target = Target(cycle_rule([1, 2, 3]))
    context = start(drafter, [1, 2, 3], target)
    context.append(1)
    for _ in range(4):
        step(drafter, context, target)
    context.append(40)  # never computed: no record in any memory
    tree = drafter.propose(context)
    if not backoff:
        assert len(tree) == 0
        return
    ids, _ = drafter.stream.backoff.record()
    roots = [j for j in range(len(tree)) if tree.parents[j] == ROOT]
    assert sorted(tree.tokens[j] for j in roots) == sorted(ids[ids >= 0].tolist())
    assert all(tree.sources[j] == ("backoff",) for j in roots)
    assert drafter.root_candidates() == []  # the memories' fused distribution is unchanged: empty


def test_a_backoff_token_the_suffix_match_also_proposes_is_credited_to_both():
    """At a context no memory knows, the suffix-matched token is usually one of the back-off record's
    too: the node is credited to both (``backoff`` first, as the studio and the bench count it)."""
    drafter = make_drafter("recap", config=RecapConfig(budget=16))
    target = Target(cycle_rule([1, 2, 3]))
    context = start(drafter, [1, 2, 3], target)
    context.append(1)
    for _ in range(4):
        step(drafter, context, target)
    context += [1, 40, 2, 3, 1, 40]  # never computed: no record keyed by 40; "1 40" was followed by 2
    tree = drafter.propose(context)
    ids, _ = drafter.stream.backoff.record()
    assert 2 in ids.tolist()
    node = tree.child(ROOT, 2)
    assert node is not None and tree.sources[node] == ("backoff", "suffix")
    others = [j for j in range(len(tree)) if tree.parents[j] == ROOT and j != node]
    assert others and all(tree.sources[j] == ("backoff",) for j in others)
