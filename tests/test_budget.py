"""The cost-aware budget (`recap.drafters.recap.budget`): the auto cap follows the device's cost curve."""

from __future__ import annotations

import numpy as np
from test_cost import CPU, H200
from test_drafters import VOCAB

from recap.drafters.base import RequestInfo
from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter
from recap.models.cost import CostModel


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
