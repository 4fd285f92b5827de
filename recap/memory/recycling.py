"""Recycling: which computed position's prediction is written under which context keys, in which order.

After a verification pass, every position whose logits the pass computed (the pending committed
tokens and every tree node, accepted or rejected) writes its record under the 1-, 2- and 3-token keys
that end there; a tree node's key follows its own path. Token Recycling writes the 1-token keys only
(`recap.drafters.token_recycling`), the hot start averages the committed rows' 1-token records
(`recap.hotstart.AveragedRecords`), RECAP writes all three in one compiled call
(`recap.drafters.recap.recycle`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np


def recycling_keys(
    context: Sequence[int],
    positions: np.ndarray,
    parents: Sequence[int],
    tokens: Sequence[int],
    accepted: Sequence[int],
    excluded: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which observation row is written under which 1/2/3-token keys, in write order.

    Rows of an observation are the ``positions`` of ``context`` first, then the tree nodes (``parents``,
    ``tokens``); node ``j`` continues ``context`` by its own path. Returns ``(rows, keys, lengths)``:
    ``rows`` (R,) indices into the observation's top-k rows, ordered rejected nodes, then positions, then
    accepted nodes, so that with overwrite-with-latest the committed sequence wins over speculation;
    ``keys`` (R, 3) the tokens ``(t-2, t-1, t)`` ending at each row's position (-1 when missing);
    ``lengths`` (R,) how many trailing key tokens are usable (0-3): a key containing an ``excluded``
    token (image placeholder) or reaching before the sequence start is never used.

    Example: context ``[5, 6, 7]``, positions ``[2]``, one node (token 8 under the root), accepted::

        rows = [0, 1];  keys = [[5, 6, 7], [6, 7, 8]];  lengths = [3, 3]
    """
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    low = max(int(positions.min()) - 2, 0) if len(positions) else 0
    last = int(context[-1]) if len(context) >= 1 else -1
    before_last = int(context[-2]) if len(context) >= 2 else -1
    return recycling_keys_compiled(
        np.asarray(context[low:], dtype=np.int64),
        low,
        positions,
        np.asarray(parents, dtype=np.int64).reshape(-1),
        np.asarray(tokens, dtype=np.int64).reshape(-1),
        np.asarray(accepted, dtype=np.int64).reshape(-1),
        np.asarray(excluded, dtype=np.int64).reshape(-1),
        last,
        before_last,
    )


@numba.njit(cache=True, nogil=True)
def recycling_keys_compiled(segment, low, positions, parents, tokens, accepted, excluded, last, before_last):
    """`recycling_keys` on arrays, for compiled callers (`recap.drafters.recap.recycle`): ``segment`` is
    the context from index ``low`` on, ``last`` and ``before_last`` its last two tokens (-1: none)."""
    n_pos, n_nodes = len(positions), len(tokens)
    keys = np.full((n_pos + n_nodes, 3), -1, dtype=np.int64)
    for i in range(n_pos):
        for back in range(3):
            at = positions[i] - back
            if at >= 0:
                keys[i, 2 - back] = segment[at - low]
    for j in range(n_nodes):
        parent = parents[j]
        row = n_pos + j
        keys[row, 2] = tokens[j]
        if parent < 0:
            keys[row, 1], keys[row, 0] = last, before_last
        else:
            keys[row, 1] = tokens[parent]
            grand = parents[parent]
            keys[row, 0] = tokens[grand] if grand >= 0 else last
    lengths = np.zeros(n_pos + n_nodes, dtype=np.int64)
    for row in range(n_pos + n_nodes):
        for column in range(2, -1, -1):
            token = keys[row, column]
            usable = token >= 0
            for placeholder in excluded:
                if token == placeholder:
                    usable = False
            if not usable:
                break
            lengths[row] += 1
    is_accepted = np.zeros(n_nodes, dtype=np.bool_)
    for node in accepted:
        is_accepted[node] = True
    rows = np.empty(n_pos + n_nodes, dtype=np.int64)
    at = 0
    for j in range(n_nodes):
        if not is_accepted[j]:
            rows[at] = n_pos + j
            at += 1
    for i in range(n_pos):
        rows[at] = i
        at += 1
    for node in accepted:
        rows[at] = n_pos + node
        at += 1
    rows = rows[:at]
    return rows, keys[rows], lengths[rows]
