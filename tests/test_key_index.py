"""The hash index of the contextual memories (`recap.memory.key_index`) and the compiled parts' start-up."""

from __future__ import annotations

import numpy as np
import pytest

from recap.drafters.recap.search import compile_kernels
from recap.memory.key_index import KeyIndex


@pytest.mark.parametrize(
    ("capacity", "writes", "expected"),
    [
        # (keys written in order, batch by batch) -> {key: row} held afterwards
        (None, [[7, 9]], {7: 1, 9: 2}),
        (None, [[7, 9], [9, 4]], {7: 1, 9: 2, 4: 3}),  # a key held keeps its row
        (2, [[1, 2, 3]], {2: 2, 3: 1}),  # full: 3 reuses row 1 and 1 is forgotten
        (2, [[1, 2, 3, 1]], {3: 1, 1: 2}),  # then 1 comes back in the row after: 2 is forgotten
        (2, [[1, 2], [3], [4], [5]], {5: 1, 4: 2}),  # round robin over rows 1..capacity
    ],
)
def test_write_slots_hand_out_rows_and_evict_round_robin(capacity, writes, expected):
    index = KeyIndex(capacity)
    for batch in writes:
        index.write_slots(np.array(batch))
    keys, rows = index.items()
    assert dict(zip(keys.tolist(), rows.tolist())) == expected
    assert len(index) == len(expected)
    probe = np.array([*expected, 12345, -1])
    assert index.find(probe).tolist() == [*expected.values(), 0, 0]  # 0: absent


def test_index_matches_a_dict_through_growth_eviction_and_clear():
    rng = np.random.default_rng(0)
    index, reference, owner, capacity = KeyIndex(300), {}, {}, 300
    next_row, clock = 1, 0
    for _ in range(40):  # 40 x 50 keys drawn from 1000: rebuilds, evictions, keys coming back
        batch = rng.integers(0, 1 << 45, 50) % 1000 * 7919
        rows = index.write_slots(batch)
        for key, row in zip(batch.tolist(), rows.tolist()):  # what the dict-based memory did
            if key not in reference:
                if next_row > capacity:
                    clock = clock % capacity + 1
                    del reference[owner[clock]]
                    new = clock
                else:
                    new, next_row = next_row, next_row + 1
                owner[new], reference[key] = key, new
            assert row == reference[key]
    keys, rows = index.items()
    assert dict(zip(keys.tolist(), rows.tolist())) == reference
    assert index.find(np.arange(0, 1000 * 7919, 7919)).tolist() == [
        reference.get(key, 0) for key in range(0, 1000 * 7919, 7919)
    ]
    index.clear()
    assert len(index) == 0 and index.find(np.array(list(reference))).tolist() == [0] * len(reference)
    assert index.write_slots(np.array([5])).tolist() == [1]


def test_compile_kernels_runs_once_per_process():
    compile_kernels()
    assert compile_kernels.cache_info().currsize == 1
