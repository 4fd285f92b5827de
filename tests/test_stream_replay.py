"""RECAP drafts the very trees it drafted when the stream was recorded (same inputs, same trees).

``tests/data/recap_scenes_stream.npz`` holds RECAP's stream on 20 held-out scenes of the embedded model
at budget 80 (`scripts.record_stream`): every request's prompt, every observation (top-k rows, accepted
path) and every tree proposed. With a fixed budget a tree depends only on what the drafter observed,
so a replay must reproduce each tree: same tokens, parents and sources, and the same scores up to
float rounding. Any change to how RECAP drafts or learns (a faster implementation, a split module)
is held to it; a change meant to alter the trees re-records the file and says so.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter
from scripts.record_stream import load_stream

STREAM = Path(__file__).parent / "data" / "recap_scenes_stream.npz"


@pytest.fixture(scope="module")
def events():
    return load_stream(STREAM)


def test_the_recorded_stream_covers_requests_and_trees(events):
    kinds = [kind for kind, _ in events]
    assert kinds.count("begin") == 20 and kinds.count("propose") > 100
    sizes = [len(tree) for kind, payload in events if kind == "propose" for tree in [payload[1]]]
    assert max(sizes) == 80  # the budget is reached


def test_replay_proposes_the_recorded_trees(events):
    drafter = RecapDrafter(RecapConfig(budget=80))
    compared, tree = 0, None
    for kind, payload in events:
        if kind == "begin":
            drafter.begin(payload)
        elif kind == "observe":
            if len(payload.tree):  # the loop hands back the very tree the drafter proposed
                assert payload.tree.tokens == tree.tokens and payload.tree.parents == tree.parents
                payload = replace(payload, tree=tree)
            drafter.observe(payload)
        else:
            context, expected = payload
            tree = drafter.propose(context)
            where = f"tree {compared}"
            assert tree.tokens == expected.tokens, where
            assert tree.parents == expected.parents, where
            assert [tuple(s) for s in tree.sources] == [tuple(s) for s in expected.sources], where
            np.testing.assert_allclose(tree.scores, expected.scores, rtol=1e-6, atol=1e-12, err_msg=where)
            compared += 1
    assert compared > 100


def test_the_cost_tool_replays_every_pass(events):
    from scripts.drafter_cost import replay

    propose, observe, passes = replay("recap", events, 80)
    assert passes == sum(kind == "propose" for kind, _ in events) and propose > 0 and observe > 0
