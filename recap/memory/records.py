"""Prediction records: the target's top-k at one position, and the array forms the memories keep.

A *prediction record* is the target's top-k next tokens with their probabilities at one position
(``k = 8`` by default), plus its *concentration* ``1 - H(p_hat) / log k`` (``p_hat`` = the probabilities
renormalised), which fusion turns into a confidence weight (`recap.drafters.recap.fusion`).

- `PredictionRecord`: one record as plain Python values (tests, display, `ContextMemory.lookup`);
- `fit_topk`, `concentration`: rows of top-k as the memories store them;
- `record_table`: rows ``[ids, probs, concentration, stamp]`` in one float32 array, what a drafter
  gathers in one indexing operation (`recap.memory.persistent.PersistentMemory.table`,
  `recap.drafters.recap.context.ContextMemory.table`);
- `pack_keys`: a 2- or 3-token context key packed into one int64;
- `last_occurrence`, `last_rows`: overwrite-with-latest for a bulk write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numba
import numpy as np


class PredictionRecord(NamedTuple):
    """The target's top-k at one position: ``ids``/``probs`` (length k, probs descending), concentration,
    and the request that wrote it (`PersistentMemory.next_request`; -1: unknown)."""

    ids: Sequence[int]
    probs: Sequence[float]
    concentration: float
    request: int = -1


def concentration(probs: np.ndarray) -> np.ndarray:
    """``1 - H(p_hat) / log k`` of each row of ``probs`` (shape ``(..., k)``) -> shape ``(...)``, in [0, 1].

    ``p_hat`` is the row renormalised to sum 1; an all-zero row counts as uniform (concentration 0).
    With ``k = 1`` every record is fully concentrated. Example: ``[0.5, 0.5] -> 0``, ``[1, 0] -> 1``.
    """
    probs = np.asarray(probs, dtype=np.float64)
    k = probs.shape[-1]
    if k <= 1:
        return np.ones(probs.shape[:-1], dtype=np.float64)
    total = probs.sum(axis=-1, keepdims=True)
    # An all-zero row becomes uniform; clipping before the log makes 0 * log 0 count as 0.
    p_hat = np.where(total > 0, probs, 1.0) / np.where(total > 0, total, k)
    entropy = -(p_hat * np.log(np.maximum(p_hat, 1e-30))).sum(axis=-1)
    return np.clip(1.0 - entropy / math.log(k), 0.0, 1.0)


def fit_topk(ids: np.ndarray, probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of top-k ``(R, k')`` sorted best first, cut or padded to width ``k`` -> int32 ids, float32 probs.

    Padding (a vocabulary smaller than k) repeats each row's last id with probability 0, so fusion
    and the tree ignore it.
    """
    ids, probs = topk_rows(ids, probs)
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        ids = np.concatenate([ids, np.repeat(ids[:, -1:], pad, axis=1)], axis=1)
        probs = np.concatenate([probs, np.zeros((len(probs), pad), dtype=probs.dtype)], axis=1)
    if ids.shape[1] > 1 and np.any(np.diff(probs, axis=1) > 0):
        # Records are sorted by probability, best first; the drafters rely on that order.
        order = np.argsort(-probs, axis=1, kind="stable")
        ids, probs = np.take_along_axis(ids, order, axis=1), np.take_along_axis(probs, order, axis=1)
    return ids[:, :k].astype(np.int32, copy=False), probs[:, :k].astype(np.float32, copy=False)


def last_occurrence(keys: np.ndarray) -> np.ndarray:
    """Indices of the last occurrence of each distinct value of ``keys`` (1-D), in ascending order.

    Overwrite-with-latest for a bulk write: ``keys = [4, 2, 4] -> [1, 2]``.
    """
    keys = np.asarray(keys)
    _, first_in_reversed = np.unique(keys[::-1], return_index=True)
    return np.sort(len(keys) - 1 - first_in_reversed)


def last_rows(keys: list[int]) -> list[int] | None:
    """`last_occurrence` for a Python list of keys, None when every key is distinct (keep all rows):
    a write of a hundred keys costs less as one dict than as numpy's sort-based unique.

    Example: ``last_rows([4, 2, 4]) == [1, 2]``, ``last_rows([4, 2]) is None``.
    """
    last = dict(zip(keys, range(len(keys))))
    return None if len(last) == len(keys) else sorted(last.values())


#: Bits per token in a packed context key (`pack_keys`): vocabularies up to about a million tokens.
KEY_BITS = 20


def pack_keys(keys: np.ndarray) -> np.ndarray:
    """Pack rows of ``n <= 3`` token ids ``(R, n)`` into one int64 each (oldest token highest).

    Example: ``pack_keys([[1, 2]]) == [(1 << 20) | 2]``. Ids must lie in ``[0, 2**KEY_BITS)``.
    """
    keys = np.asarray(keys, dtype=np.int64)
    packed = np.zeros(keys.shape[:-1], dtype=np.int64)
    for column in range(keys.shape[-1]):
        packed = (packed << KEY_BITS) | keys[..., column]
    return packed


def record_table(ids: np.ndarray, probs: np.ndarray, concentrations: Any, stamps: Any) -> np.ndarray:
    """Rows ``[ids (k), probs (k), concentration, stamp]`` as float32 ``(R, 2k + 2)``: what a drafter reads
    in one gather (`ContextMemory.table`, `PersistentMemory.table`). Exact for ids and stamps < 2**24."""
    return np.concatenate(
        [ids, probs, np.asarray(concentrations)[:, None], np.asarray(stamps)[:, None]],
        axis=1,
        dtype=np.float32,
    )


def topk_rows(ids: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` and ``probs`` as rows ``(R, width)`` of one shape, width >= 1 (else ValueError)."""
    ids = np.asarray(ids).reshape(len(ids), -1)
    probs = np.asarray(probs).reshape(len(probs), -1)
    if ids.shape != probs.shape:
        raise ValueError(f"top-k ids {ids.shape} and probs {probs.shape} differ in shape")
    if ids.shape[1] == 0:
        raise ValueError("top-k rows are empty")
    return ids, probs


def record_rows(ids: np.ndarray, probs: np.ndarray, k: int, stamp: int) -> np.ndarray:
    """`record_table` of ``fit_topk(ids, probs, k)`` with their `concentration` and ``stamp``, in one
    compiled pass (what a drafter writing every computed position builds each pass). Equal to the
    numpy composition: the float64 concentration can differ from numpy's in its last bit (summation
    order), which the float32 row rounds away."""
    ids, probs = topk_rows(ids, probs)
    return record_rows_compiled(
        np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(probs, dtype=np.float32), k, stamp
    )


@numba.njit(cache=True, nogil=True)
def record_rows_compiled(ids, probs, k, stamp):
    """`record_rows` for compiled callers (`recap.drafters.recap.recycle.recycle`): ``ids`` int64 and
    ``probs`` float32 ``(R, width)`` rows, C-contiguous."""
    count, width = ids.shape
    rows = np.zeros((count, 2 * k + 2), dtype=np.float32)
    order = np.empty(width, dtype=np.int64)
    for r in range(count):
        for j in range(width):
            order[j] = j
        for i in range(1, width):  # a stable insertion sort, most probable first (rows come sorted)
            j = i
            while j > 0 and probs[r, order[j]] > probs[r, order[j - 1]]:
                order[j], order[j - 1] = order[j - 1], order[j]
                j -= 1
        for j in range(k):
            if j < width:
                rows[r, j] = np.float32(np.int32(ids[r, order[j]]))
                rows[r, k + j] = probs[r, order[j]]
            else:  # padding (`fit_topk`): the row's last id again, probability 0
                rows[r, j] = np.float32(np.int32(ids[r, width - 1]))
        rows[r, 2 * k] = np.float32(row_concentration(rows[r], k))
        rows[r, 2 * k + 1] = np.float32(stamp)
    return rows


@numba.njit(cache=True, nogil=True)
def row_concentration(row, k):
    """`concentration` of one `record_table` row's ``k`` probabilities (``row[k:2k]``), for compiled
    writers (`record_rows_compiled`, `recap.drafters.recap.context.ContextMemory.fold`)."""
    if k <= 1:
        return 1.0
    total = 0.0
    for j in range(k):
        total += np.float64(row[k + j])
    entropy = 0.0
    for j in range(k):
        p = np.float64(row[k + j]) / total if total > 0 else 1.0 / k
        entropy -= p * np.log(max(p, 1e-30))
    return min(max(1.0 - entropy / np.log(k), 0.0), 1.0)
