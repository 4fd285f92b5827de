"""A loaded target model with its drafting resources: the cost curve and the persistent memories.

The CLI, the studio and the benchmark all go through `Runtime`: it loads the model once, measures
the tree-cost curve once (lazily, only when a cost-aware budget needs it), and builds drafters by
method name with the right shared state (the persistent token memory of the chosen scope, the Token
Recycling matrix).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

from recap.config import RecapConfig
from recap.cost import CostModel
from recap.drafters import DEFAULT_METHOD, Drafter, make_drafter
from recap.drafters.token_recycling import SuccessorMatrix
from recap.memory import PersistentMemory
from recap.models import TargetModel

log = logging.getLogger(__name__)

#: The embedded default model (trained by ``python -m recap.train_embedded``; ships in assets/).
EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "assets" / "models" / "tiny-scenes-llava"

__all__ = ["DEFAULT_METHOD", "EMBEDDED_MODEL", "Runtime", "parse_budget"]


def parse_budget(value: str | int) -> str | int:
    """``"auto"`` or a node budget from 0 to 256."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        budget = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"budget must be 'auto' or a whole number of tree nodes, got {value!r}") from None
    if not 0 <= budget <= 256:
        raise ValueError(f"budget must be from 0 to 256 nodes, got {budget}")
    return budget


class Runtime:
    """One target model plus the state its drafters share across requests (thread-safe)."""

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self._cost: CostModel | None = None
        self._lock = threading.Lock()
        self._successors: SuccessorMatrix | None = None
        self._memories: dict[tuple[str, int], PersistentMemory] = {}

    @classmethod
    def load(cls, name_or_path: str, **kwargs) -> Runtime:
        return cls(TargetModel.load(name_or_path, **kwargs))

    def cost_model(self) -> CostModel:
        """The measured tree-cost curve c(T) of this model on this device (measured once)."""
        with self._lock:
            if self._cost is None:
                # GPU passes take milliseconds and jitter by about as much as T changes them: more repeats.
                repeats = 10 if self.target.device.type == "cuda" else 3
                self._cost = CostModel(self.target.measure_tree_cost(repeats=repeats))
            return self._cost

    def use_cost_model(self, model: CostModel) -> None:
        """Use ``model`` as this device's tree-cost curve instead of measuring one (e.g. a curve
        recorded on a GPU, replayed on a CPU: `recap.cost.load_curve`)."""
        with self._lock:
            self._cost = model

    def measured_cost(self) -> CostModel | None:
        """The tree-cost curve if a cost-aware drafter has measured it already (never measures)."""
        return self._cost

    def persistent_memory(self, k: int = 8, method: str = DEFAULT_METHOD) -> PersistentMemory:
        """The persistent token memory this runtime's ``method`` drafters share (one per method, so
        an ablation never learns from another method's trees)."""
        with self._lock:
            memory = self._memories.get((method, k))
            if memory is None:
                memory = self._memories[(method, k)] = PersistentMemory(self.target.vocab_size, k)
            return memory

    def load_persistent_memory(
        self, path: str | Path, k: int = 8, method: str = DEFAULT_METHOD
    ) -> PersistentMemory:
        """Replace ``method``'s memory by the one saved at ``path``.

        A corrupt file, or one saved for another tokenizer, logs a warning and gives a fresh memory;
        the file itself is left untouched.
        """
        memory = PersistentMemory.load(path, self.target.fingerprint(), self.target.vocab_size, k)
        with self._lock:
            self._memories[(method, k)] = memory
        return memory

    def save_persistent_memory(self, path: str | Path, k: int = 8, method: str = DEFAULT_METHOD) -> None:
        """Save ``method``'s memory atomically, tagged with this tokenizer's fingerprint."""
        self.persistent_memory(k, method).save(path, self.target.fingerprint())

    def successor_matrix(self) -> SuccessorMatrix:
        """The process-wide Token Recycling matrix of this model (hot start across requests)."""
        with self._lock:
            if self._successors is None:
                self._successors = SuccessorMatrix(self.target.vocab_size)
            return self._successors

    def drafter(
        self,
        method: str = DEFAULT_METHOD,
        budget: str | int | None = None,
        config: RecapConfig | None = None,
        persistent: PersistentMemory | None = None,
        successors: SuccessorMatrix | None = None,
    ) -> Drafter:
        """Build the drafter ``method`` with this runtime's shared state.

        ``budget`` overrides ``config.budget``. ``persistent`` / ``successors`` replace the process-wide
        memories (the studio passes per-session ones, the benchmark fresh ones per method).
        """
        config = config or RecapConfig()
        if budget is not None:
            config = replace(config, budget=budget)
        uses_cost = method.startswith("recap") and config.budget == "auto"
        return make_drafter(
            method,
            config=config,
            persistent=persistent if persistent is not None else self.persistent_memory(config.k, method),
            cost_model=self.cost_model() if uses_cost else None,
            successors=successors if successors is not None else self.successor_matrix(),
        )
