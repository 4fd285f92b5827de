"""Prediction records and the memories that recycle them.

A *prediction record* is the target's top-k next tokens with their probabilities at one position
(``k = 8`` by default), plus its *concentration* ``1 - H(p_hat) / log k`` (``p_hat`` = the probabilities
renormalised), which fusion turns into a confidence weight.

- `PersistentMemory` (``P1``): ``token -> record``, array-backed (``[vocab, k]`` ids and probs), shared by
  the requests of one scope (`recap.runtime.Runtime` keeps one per model and method), saved to /
  loaded from safetensors.
- `ContextMemory` (``C2``, ``C3``): ``(t-1, t) -> record`` / ``(t-2, t-1, t) -> record``, request-local.

Both overwrite with the latest record. Which keys are written is the drafter's business
(`recap.drafters.recap`); memories store what they are given.

Example::

    p1 = PersistentMemory(vocab_size=100, k=2)
    p1.write_many(np.array([7, 7]), np.array([[1, 2], [3, 4]]), np.array([[0.6, 0.3], [0.9, 0.1]]))
    p1.lookup(7).ids        # [3, 4]  (the later row wins)
    p1.lookup(8)            # None
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from recap.acceptance import AcceptanceModel

logger = logging.getLogger(__name__)

#: Version of the persistent-memory file layout; a file with another version is not loaded.
FORMAT_VERSION = "1"
#: Records a stream-scope contextual memory keeps (the oldest keys are dropped beyond it).
STREAM_CONTEXT_CAPACITY = 1 << 17


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
    ids = np.asarray(ids).reshape(len(ids), -1)
    probs = np.asarray(probs).reshape(len(probs), -1)
    if ids.shape != probs.shape:
        raise ValueError(f"top-k ids {ids.shape} and probs {probs.shape} differ in shape")
    if ids.shape[1] == 0:
        raise ValueError("top-k rows are empty")
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


class PersistentMemory:
    """``P1``: one prediction record per token id, overwrite-with-latest; thread-safe writes and saves.

    Arrays: ``ids`` ``(vocab, k)`` int32, ``probs`` ``(vocab, k)`` float32, ``filled`` ``(vocab,)`` bool, and
    the derived ``concentrations`` ``(vocab,)`` float32 (recomputed on load, not saved).
    """

    def __init__(self, vocab_size: int, k: int = 8) -> None:
        if vocab_size < 1 or k < 1:
            raise ValueError(f"PersistentMemory needs vocab_size >= 1 and k >= 1, got {vocab_size}, {k}")
        self.vocab_size = int(vocab_size)
        self.k = int(k)
        self.ids = np.zeros((vocab_size, k), dtype=np.int32)
        self.probs = np.zeros((vocab_size, k), dtype=np.float32)
        self.filled = np.zeros(vocab_size, dtype=bool)
        self.concentrations = np.zeros(vocab_size, dtype=np.float32)
        #: The request that wrote each row (`next_request`), -1 before any write; not saved.
        self.stamps = np.full(vocab_size, -1, dtype=np.int64)
        #: What the drafters sharing this memory learnt about their candidates' acceptance (not saved).
        self.acceptance = AcceptanceModel()
        #: Contextual memories kept across requests (``context_scope="stream"``; not saved).
        self.context2 = ContextMemory(2, capacity=STREAM_CONTEXT_CAPACITY)
        self.context3 = ContextMemory(3, capacity=STREAM_CONTEXT_CAPACITY)
        self._requests = itertools.count()
        self._table: np.ndarray | None = None  # `table`, built on first use
        self._lock = threading.Lock()

    @property
    def table(self) -> np.ndarray:
        """All records as float32 rows (`record_table` layout), ``(vocab + 1, 2k + 2)``; the last row and
        the rows of tokens without a record are empty (id -1). Kept in step by `write_many` and `reset`.
        """
        if self._table is None:
            ids = np.where(self.filled[:, None], self.ids, -1)
            rows = record_table(ids, self.probs, self.concentrations, self.stamps)
            empty = record_table(np.full((1, self.k), -1), np.zeros((1, self.k)), [0.0], [-1])
            self._table = np.concatenate([rows, empty])
        return self._table

    def next_request(self) -> int:
        """A new request number for the stamps of what the request writes (unique per memory)."""
        return next(self._requests)

    def __len__(self) -> int:
        """Number of tokens that have a record."""
        return int(self.filled.sum())

    def lookup(self, token: int) -> PredictionRecord | None:
        """The latest record written under ``token``, or None."""
        if not 0 <= token < self.vocab_size or not self.filled[token]:
            return None
        return PredictionRecord(
            self.ids[token].tolist(),
            self.probs[token].tolist(),
            float(self.concentrations[token]),
            int(self.stamps[token]),
        )

    def write_many(
        self,
        keys: np.ndarray,
        ids: np.ndarray,
        probs: np.ndarray,
        concentrations: np.ndarray | None = None,
        request: int = -1,
    ) -> None:
        """Write rows ``ids[i], probs[i]`` (shape ``(R, k)``) under ``keys[i]`` (shape ``(R,)``).

        A key that appears twice keeps its last row; keys outside the vocabulary are ignored.
        ``concentrations`` (R,) may be passed when the caller already computed them for these rows;
        ``request`` stamps the rows with the request that wrote them.
        """
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if len(keys) == 0:
            return
        ids, probs = fit_topk(ids, probs, self.k)
        if concentrations is None:
            concentrations = concentration(probs)
        keep = last_occurrence(keys)
        keep = keep[(keys[keep] >= 0) & (keys[keep] < self.vocab_size)]
        keys = keys[keep]
        with self._lock:
            self.ids[keys] = ids[keep]
            self.probs[keys] = probs[keep]
            self.filled[keys] = True
            self.concentrations[keys] = np.asarray(concentrations)[keep]
            self.stamps[keys] = request
            if self._table is not None:
                self._table[keys] = record_table(
                    ids[keep], probs[keep], np.asarray(concentrations)[keep], np.full(len(keys), request)
                )

    def reset(self) -> None:
        """Forget every record."""
        with self._lock:
            self.ids.fill(0)
            self.probs.fill(0.0)
            self.filled.fill(False)
            self.concentrations.fill(0.0)
            self.stamps.fill(-1)
            self._table = None
            self.context2.clear()
            self.context3.clear()
        self.acceptance.reset()

    # ------------------------------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike, fingerprint: str) -> None:
        """Write the memory atomically to ``path`` (safetensors) with the tokenizer ``fingerprint``.

        The file is written to a temporary sibling ``.NAME.PID-XXXX.tmp``, fsynced and moved into place
        with ``os.replace``, so readers and concurrent savers only ever see a complete file. Siblings
        that a killed save left behind are removed first (`remove_orphans`). Raises ``OSError`` when
        the folder cannot be written (read-only, or ``path`` is a folder); nothing is left behind then.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_orphans(path)
        with self._lock:
            tensors = {
                "ids": self.ids.copy(),
                "probs": self.probs.copy(),
                "filled": self.filled.astype(np.uint8),
            }
        metadata = {
            "format_version": FORMAT_VERSION,
            "fingerprint": str(fingerprint),
            "vocab_size": str(self.vocab_size),
            "k": str(self.k),
        }
        handle, temp = tempfile.mkstemp(
            prefix=f"{_temp_prefix(path)}{os.getpid()}-", suffix=".tmp", dir=path.parent
        )
        os.close(handle)
        try:
            save_file(tensors, temp, metadata=metadata)
            with open(temp, "rb") as written:
                os.fsync(written.fileno())
            os.replace(temp, path)
        finally:
            if os.path.exists(temp):
                os.unlink(temp)

    @classmethod
    def read(cls, path: str | os.PathLike, fingerprint: str, vocab_size: int, k: int = 8) -> PersistentMemory:
        """The memory saved at ``path``; raises ``FileNotFoundError`` if there is none and ``ValueError``
        (with the reason) if the file is unusable: unreadable/corrupt, not a file, another format
        version, tokenizer fingerprint, vocabulary size or k. The file on disk is never modified here
        (a killed save's leftover siblings are removed, see `remove_orphans`).
        """
        path = Path(path)
        remove_orphans(path)
        try:
            arrays = _read_checked(path, fingerprint, vocab_size, k)
        except FileNotFoundError:
            raise
        except (SafetensorError, OSError, ValueError, KeyError) as error:
            raise ValueError(f"persistent memory {path} not loaded ({error})") from None
        memory = cls(vocab_size, k)
        memory.ids[:] = arrays["ids"]
        memory.probs[:] = arrays["probs"]
        memory.filled[:] = arrays["filled"].astype(bool)
        memory.concentrations[:] = np.where(memory.filled, concentration(memory.probs), 0.0)
        logger.info("loaded persistent memory %s (%d tokens)", path, len(memory))
        return memory

    @classmethod
    def load(cls, path: str | os.PathLike, fingerprint: str, vocab_size: int, k: int = 8) -> PersistentMemory:
        """`read`, or a fresh memory (with a warning) if the file is missing or unusable.

        The file on disk is never modified here.
        """
        try:
            return cls.read(path, fingerprint, vocab_size, k)
        except FileNotFoundError:
            logger.warning("persistent memory %s does not exist; starting with an empty memory", path)
        except ValueError as error:
            logger.warning("%s; starting with an empty memory", error)
        return cls(vocab_size, k)


#: A temporary sibling older than this is an orphan even if its writer's process id is in use again.
ORPHAN_AGE_S = 3600.0


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_orphans(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary siblings (``.NAME.*.tmp``) of ``path`` that no running save will finish.

    A sibling is an orphan when the process id in its name no longer runs (a save killed mid-way), or
    when it is older than `ORPHAN_AGE_S` (an older name without a process id, or a reused id). Saves
    in progress, in this process or another, are left alone. Returns what was removed.
    """
    path = Path(path)
    prefix = _temp_prefix(path)
    removed = []
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(".tmp")]
    except OSError:
        return removed
    for sibling in siblings:
        writer = sibling.name[len(prefix) : -len(".tmp")].split("-", 1)[0]
        try:
            age = time.time() - sibling.stat().st_mtime
            if age > ORPHAN_AGE_S or (writer.isdigit() and not _process_runs(int(writer))):
                sibling.unlink()
                removed.append(sibling)
        except OSError:  # gone already (its save finished), or not ours to remove
            continue
    if removed:
        logger.info("removed %d unfinished save(s) of %s", len(removed), path)
    return removed


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or an id this OS cannot check): assume it runs
    return True


def _read_checked(path: Path, fingerprint: str, vocab_size: int, k: int) -> dict[str, np.ndarray]:
    """Read a saved memory, raising ValueError on any mismatch with what the caller expects."""
    if not path.exists():
        raise FileNotFoundError(path)
    if not path.is_file():
        raise ValueError("it is not a file")
    with safe_open(str(path), framework="np") as handle:
        meta = handle.metadata() or {}
        expected = {
            "format_version": FORMAT_VERSION,
            "fingerprint": str(fingerprint),
            "vocab_size": str(vocab_size),
            "k": str(k),
        }
        for name, value in expected.items():
            if meta.get(name) != value:
                raise ValueError(f"{name} is {meta.get(name)!r}, expected {value!r}")
        arrays = {name: handle.get_tensor(name) for name in ("ids", "probs", "filled")}
    shapes = {"ids": (vocab_size, k), "probs": (vocab_size, k), "filled": (vocab_size,)}
    for name, shape in shapes.items():
        if arrays[name].shape != shape:
            raise ValueError(f"tensor {name} has shape {arrays[name].shape}, expected {shape}")
    if not np.all(np.isfinite(arrays["probs"])):
        raise ValueError("tensor probs holds non-finite values")
    return arrays


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


class ContextMemory:
    """``C2``/``C3``: ``key -> record`` (overwrite-with-latest), cleared per request by the drafter unless
    it keeps them for the whole stream (then bounded by ``capacity``: a full memory reuses the row of
    the key stored longest ago).

    Array-backed: a dict maps each packed key (`pack_keys`) to a row of ``table`` (`record_table`
    layout; row 0 is an empty record, id -1, for keys that have none), so that a drafter looks up and
    writes many contexts at once (`slots`, `write_rows`) and no per-record Python object is kept. Keys
    are given as token tuples (`lookup`, `write`, `keys`) or packed (`slots`, `write_rows`).
    """

    def __init__(self, order: int, capacity: int | None = None) -> None:
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.order = order
        self.capacity = capacity
        self.k = 0  # record width, set by the first write
        self.table = np.zeros((0, 2), dtype=np.float32)
        self._slot: dict[int, int] = {}  # packed key -> row
        self._owner: list[int] = [-1]  # row -> packed key (row 0: the empty record)
        self._clock = 0  # the row a full memory reused last
        self._lock = threading.Lock()  # stream-scope memories are shared by concurrent requests

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self._pack(key) in self._slot

    def keys(self) -> list[tuple[int, ...]]:
        """Every key that holds a record, as token tuples."""
        mask = (1 << KEY_BITS) - 1
        return [
            tuple((packed >> (KEY_BITS * (self.order - 1 - i))) & mask for i in range(self.order))
            for packed in self._slot
        ]

    def lookup(self, key: tuple[int, ...]) -> PredictionRecord | None:
        """The latest record under ``key`` (a tuple of ``order`` tokens), or None."""
        row = self._slot.get(self._pack(key))
        if row is None:
            return None
        k, values = self.k, self.table[row]
        return PredictionRecord(
            values[:k].astype(np.int64).tolist(),
            values[k : 2 * k].tolist(),
            float(values[2 * k]),
            int(values[-1]),
        )

    def slots(self, packed: np.ndarray) -> np.ndarray:
        """Row of each packed key in ``table``, 0 (the empty record) where there is none."""
        get = self._slot.get
        return np.array([get(key, 0) for key in np.asarray(packed).tolist()], dtype=np.int64)

    def write(self, key: tuple[int, ...], record: PredictionRecord) -> None:
        """Store ``record`` under ``key`` (``order`` tokens), replacing an older one."""
        self.write_many([(key, record)])

    def write_many(self, items: Iterable[tuple[tuple[int, ...], PredictionRecord]]) -> None:
        """Store ``(key, record)`` pairs in order, later ones winning (records narrower than the memory's
        width are padded with probability 0)."""
        for key, record in items:
            width = max(len(record.ids), self.k)
            ids, probs = fit_topk(np.array([record.ids]), np.array([record.probs], dtype=np.float32), width)
            self.write_rows(
                np.array([self._pack(key)]), ids, probs, np.array([record.concentration]), record.request
            )

    def write_rows(
        self, packed: np.ndarray, ids: np.ndarray, probs: np.ndarray, concentrations: np.ndarray, request: int
    ) -> None:
        """Store row ``i`` of ``ids``/``probs`` ``(R, k)`` and ``concentrations`` under the packed key
        ``packed[i]``, stamped with ``request``; a key given twice keeps its last row."""
        packed = np.asarray(packed, dtype=np.int64).reshape(-1)
        if len(packed) == 0:
            return
        keep = last_occurrence(packed)
        ids, probs = np.asarray(ids)[keep], np.asarray(probs)[keep]
        with self._lock:
            if self.k == 0:
                self.k = ids.shape[1]
                self.table = record_table(np.full((1, self.k), -1), np.zeros((1, self.k)), [0.0], [-1])
            elif ids.shape[1] != self.k:
                ids, probs = fit_topk(ids, probs, self.k)
            get, row_for = self._slot.get, self._row_for
            rows = [get(key) or row_for(key) for key in packed[keep].tolist()]
            self.table[rows] = record_table(
                ids, probs, np.asarray(concentrations)[keep], np.full(len(rows), request)
            )

    def clear(self) -> None:
        """Forget every record (start of a request)."""
        with self._lock:
            self._slot.clear()
            del self._owner[1:]
            self._clock = 0

    def _pack(self, key: tuple[int, ...]) -> int:
        if len(key) != self.order:
            raise ValueError(f"a key of this memory has {self.order} tokens, got {key!r}")
        packed = 0
        for token in key:
            packed = (packed << KEY_BITS) | int(token)
        return packed

    def _row_for(self, key: int) -> int:
        """A new row for ``key`` (growing the table, or reusing the oldest row when full)."""
        row = len(self._owner)
        if self.capacity is not None and row > self.capacity:
            self._clock = self._clock % self.capacity + 1  # rows 1..capacity, round robin
            row = self._clock
            del self._slot[self._owner[row]]
            self._owner[row] = key
        else:
            self._owner.append(key)
            if row >= len(self.table):
                grown = max(1024, 2 * len(self.table))
                if self.capacity is not None:
                    grown = min(grown, self.capacity + 1)
                table = np.zeros((grown, self.table.shape[1]), dtype=np.float32)
                table[: len(self.table)] = self.table
                self.table = table
        self._slot[key] = row
        return row


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
