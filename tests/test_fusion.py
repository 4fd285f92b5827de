"""RECAP's fusion (`recap.drafters.recap.fusion`): the vectorised `fuse_rows` equals `fuse`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recap.drafters.recap.fusion import fuse, fuse_rows
from recap.memory.records import PredictionRecord


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
