"""``P1``, the persistent token memory, and its file format.

`PersistentMemory`: ``token -> record`` (`recap.memory.records`), array-backed (``[vocab, k]`` ids and probs),
shared by the requests of one scope (`recap.runtime.Runtime` keeps one per model and method), saved to
and loaded from safetensors with the tokenizer's fingerprint. Overwrite with the latest record. What
else a RECAP stream keeps beside it (contextual records, acceptance estimates, back-off, suffix history)
is the stream's (`recap.drafters.recap.stream.StreamMemory`, which holds this memory as ``tokens``).
Which keys are written is the drafter's business (`recap.memory.recycling`); memories store what they
are given.

Example::

    p1 = PersistentMemory(vocab_size=100, k=2)
    p1.write_many(np.array([7, 7]), np.array([[1, 2], [3, 4]]), np.array([[0.6, 0.3], [0.9, 0.1]]))
    p1.lookup(7).ids        # [3, 4]  (the later row wins)
    p1.lookup(8)            # None
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from recap.memory.guarded import Guarded
from recap.memory.records import PredictionRecord, concentration, fit_topk, last_rows, record_table

logger = logging.getLogger(__name__)

#: Version of the persistent-memory file layout; a file with another version is not loaded.
FORMAT_VERSION = "1"


class PersistentMemory(Guarded):
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
        #: The stream that holds this memory (`recap.drafters.recap.stream.StreamMemory.of`: what RECAP
        #: keeps beside it across requests), None until one does; not saved.
        self.owner: object | None = None
        self._requests = 0  # requests numbered so far (`next_request`)
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
        with self._lock:
            self._requests += 1
            return self._requests - 1

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
        stamps = np.full(len(keys), request)
        self.write_table(keys, record_table(ids, probs, np.asarray(concentrations), stamps))

    def write_table(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """`write_many` for rows already in `record_table` layout ``(R, 2k + 2)`` (k this memory's), each
        with its concentration and request stamp: what a drafter writing several memories builds once."""
        if len(keys) == 0:
            return
        if rows.shape[1] != 2 * self.k + 2:
            raise ValueError(f"records of width {(rows.shape[1] - 2) // 2} for a memory of k={self.k}")
        listed = keys.tolist()
        keep = last_rows(listed)
        if keep is None:
            keep = range(len(listed))
        inside = [row for row in keep if 0 <= listed[row] < self.vocab_size]
        if len(inside) < len(listed):
            keys, rows = keys[inside], rows[inside]
        k = self.k
        with self._lock:
            self.ids[keys] = rows[:, :k]
            self.probs[keys] = rows[:, k : 2 * k]
            self.filled[keys] = True
            self.concentrations[keys] = rows[:, 2 * k]
            self.stamps[keys] = rows[:, 2 * k + 1]
            if self._table is not None:
                self._table[keys] = rows

    def frozen(self) -> threading.Lock:
        """Hold other writers and savers off while compiled code writes the arrays directly: ``with
        memory.frozen(): ...`` (the memory's lock itself, so holding it costs no more than a lock)."""
        return self._lock

    def reset(self) -> None:
        """Forget every record."""
        with self._lock:
            self.ids.fill(0)
            self.probs.fill(0.0)
            self.filled.fill(False)
            self.concentrations.fill(0.0)
            self.stamps.fill(-1)
            self._table = None

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
