"""Memories guarded by a lock of their own that can still be copied.

A memory that concurrent requests may update holds ``self._lock`` (a `threading.Lock`). A lock cannot be
copied, so `copy.deepcopy` (and pickle) of such a memory, or of a drafter holding one, failed. `Guarded`
copies everything else and gives the copy a new, unlocked lock: a lock guards one object's updates, and
a copy is another object. Copy only a memory that no other thread is updating (the Compare tab copies
the drafters it alone warmed, `recap.studio.ui.compare`).

Example::

    memory = ContextMemory(k=8)
    twin = copy.deepcopy(memory)  # its own records and its own lock; updating one leaves the other
"""

from __future__ import annotations

import threading
from typing import Any


class Guarded:
    """Mixin for a class whose instances keep their lock in ``self._lock`` (a plain `threading.Lock`)."""

    def __copy__(self) -> Guarded:
        raise TypeError(
            f"a shallow copy of {type(self).__name__} would share its records under another lock: "
            "use copy.deepcopy"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
