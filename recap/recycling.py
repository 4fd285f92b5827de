"""Recycling: which computed position's prediction is written under which context keys, in which order.

After a verification pass, every position whose logits the pass computed (the pending committed
tokens and every tree node, accepted or rejected) writes its record under the 1-, 2- and 3-token keys
that end there; a tree node's key follows its own path. Token Recycling writes the 1-token keys only
(`recap.drafters.token_recycling`), RECAP all three (`recap.drafters.recap`).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    excluded = np.asarray(excluded, dtype=np.int64).reshape(-1)
    n_pos, n_nodes = len(positions), len(tokens)
    keys = np.full((n_pos + n_nodes, 3), -1, dtype=np.int64)
    if n_pos:
        low = max(int(positions.min()) - 2, 0)
        segment = np.asarray(context[low:], dtype=np.int64)
        for back in range(3):
            at = positions - back
            keys[:n_pos, 2 - back] = np.where(at >= 0, segment[np.maximum(at - low, 0)], -1)
    if n_nodes:
        node_tokens = np.asarray(tokens, dtype=np.int64)
        parent = np.asarray(parents, dtype=np.int64)
        last = int(context[-1]) if len(context) >= 1 else -1
        before_last = int(context[-2]) if len(context) >= 2 else -1
        grand = np.where(parent >= 0, parent[np.maximum(parent, 0)], -2)  # -2: parent is the root
        keys[n_pos:, 2] = node_tokens
        keys[n_pos:, 1] = np.where(parent >= 0, node_tokens[np.maximum(parent, 0)], last)
        keys[n_pos:, 0] = np.where(
            parent < 0, before_last, np.where(grand >= 0, node_tokens[np.maximum(grand, 0)], last)
        )
    usable = keys >= 0
    if len(excluded) <= 16:  # a VLM has a handful of vision ids; comparing beats np.isin's setup
        for token in excluded.tolist():
            usable &= keys != token
    else:
        usable &= ~np.isin(keys, excluded)
    lengths = np.cumprod(usable[:, ::-1], axis=1).sum(axis=1)
    accepted_rows = n_pos + np.asarray(accepted, dtype=np.int64)
    is_accepted = np.zeros(n_nodes, dtype=bool)
    is_accepted[accepted_rows - n_pos] = True
    rejected_rows = n_pos + np.flatnonzero(~is_accepted)
    rows = np.concatenate([rejected_rows, np.arange(n_pos), accepted_rows]).astype(np.int64)
    return rows, keys[rows], lengths[rows]
