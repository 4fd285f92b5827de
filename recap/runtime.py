"""A loaded target model with its drafting resources: the cost curve and the drafters' shared state.

The CLI, the studio and the benchmark all go through `Runtime`: it loads the model once, measures
the tree-cost curve once (lazily, only when a cost-aware budget needs it), and builds drafters by
method name with the shared state of the chosen scope (`recap.state.DrafterState`: the runtime's own,
or one the caller keeps, e.g. a studio session's).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

from recap.drafters import DEFAULT_METHOD, Drafter
from recap.drafters.recap.config import RecapConfig
from recap.memory.fingerprint import model_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.models import TargetModel
from recap.models.cost import CostModel, steady_curve
from recap.state import DrafterState, build_drafter

log = logging.getLogger(__name__)

_MODELS_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
#: The embedded model v1 (the small scene world of `recap.embedded.scenes`; benchmark dataset ``scenes``),
#: kept beside v2 for its earlier results: pass it as ``--model``.
EMBEDDED_MODEL_V1 = _MODELS_DIR / "tiny-scenes-llava"
#: The embedded model v2 (the wider scene world of `recap.embedded.scenes2`: detailed descriptions and
#: relations; benchmark dataset ``scenes2``).
EMBEDDED_MODEL_V2 = _MODELS_DIR / "tiny-scenes-llava-v2"
#: The default model of the CLI, the benchmark and the studio: the embedded model v2 (both ship in
#: assets/models, trained by ``python -m training.train``).
EMBEDDED_MODEL = EMBEDDED_MODEL_V2

#: Sweeps over the curve's sizes when a CPU measures the tree-cost curve (each: a prefill, then one
#: unmeasured and one measured pass per size; about 0.1 s for the embedded model on one idle thread,
#: 1.5 s for SmolLM2-135M): at least `CPU_COST_SWEEPS`, then more while the sweeps so far took less
#: than `CPU_COST_SECONDS`, at most `CPU_COST_MAX_SWEEPS`. Each size keeps its fastest pass, so a
#: cheap model's curve, measured over many sweeps, is not left with one sweep's noise (a single
#: millisecond pass on a shared CPU moves by 30%).
CPU_COST_SWEEPS = 3
CPU_COST_SECONDS = 1.0
CPU_COST_MAX_SWEEPS = 20

__all__ = [
    "DEFAULT_METHOD",
    "EMBEDDED_MODEL",
    "EMBEDDED_MODEL_V1",
    "EMBEDDED_MODEL_V2",
    "Runtime",
    "parse_budget",
]


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
    """One target model plus the state its drafters share across requests (``state``; thread-safe):
    ``state.persistent(method, k)``, ``state.successors()`` and ``state.suffix_cache()`` are the
    memories this runtime's drafters share unless given another `DrafterState`."""

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self._cost: CostModel | None = None
        self._lock = threading.Lock()
        #: The runtime's own scope: what its drafters share unless given another `DrafterState`.
        self.state = DrafterState(target.vocab_size)

    @classmethod
    def load(cls, name_or_path: str, **kwargs) -> Runtime:
        """A runtime for the model ``name_or_path`` (``kwargs``: `TargetModel.load`'s)."""
        return cls(TargetModel.load(name_or_path, **kwargs))

    def cost_model(self) -> CostModel:
        """This model's tree-cost curve c(T) on this device, measured once at the first cost-aware drafter.

        On a GPU: the median of 10 passes per size (a pass's jitter is as large as T's effect). On a CPU:
        `CPU_COST_SWEEPS` or more quick sweeps, each size keeping its fastest pass
        (`recap.models.cost.steady_curve`), timed in thread CPU time when torch computes on one thread
        (time given to other processes is not the pass's cost), else in wall-clock time.
        """
        with self._lock:
            if self._cost is None:
                target = self.target
                if target.device.type == "cuda":
                    self._cost = CostModel(target.measure_tree_cost(repeats=10))
                else:
                    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
                    sweeps, start = [], time.perf_counter()
                    while len(sweeps) < CPU_COST_SWEEPS or (
                        len(sweeps) < CPU_COST_MAX_SWEEPS and time.perf_counter() - start < CPU_COST_SECONDS
                    ):
                        sweeps.append(target.measure_tree_cost(repeats=1, clock=clock))
                    self._cost = steady_curve(sweeps)
                    log.info("tree cost curve (T, ms): %s", self._cost.to_ms()["measured"])
            return self._cost

    def use_cost_model(self, model: CostModel) -> None:
        """Use ``model`` as this device's tree-cost curve instead of measuring one (e.g. a curve
        recorded on a GPU, replayed on a CPU: `recap.models.cost.load_curve`)."""
        with self._lock:
            self._cost = model

    def measured_cost(self) -> CostModel | None:
        """The tree-cost curve if a cost-aware drafter has measured it already (never measures)."""
        return self._cost

    def load_persistent_memory(
        self, path: str | Path, k: int = 8, method: str = DEFAULT_METHOD, strict: bool = False
    ) -> PersistentMemory:
        """Replace ``method``'s memory by the one saved at ``path`` (the file is never modified).

        A missing, corrupt or mismatched file (another model by `recap.memory.fingerprint.model_fingerprint`,
        another vocabulary or k) gives a fresh memory with a warning.

        Raises:
            FileNotFoundError, ValueError: with ``strict=True``, for such a file (the current memory stays).
        """
        fingerprint, vocab = model_fingerprint(self.target), self.target.vocab_size
        if strict:
            memory = PersistentMemory.read(path, fingerprint, vocab, k)
        else:
            memory = PersistentMemory.load(path, fingerprint, vocab, k)
        self.state.replace(memory, method)
        return memory

    def save_persistent_memory(self, path: str | Path, k: int = 8, method: str = DEFAULT_METHOD) -> None:
        """Save ``method``'s memory atomically, tagged with this model's fingerprint."""
        self.state.persistent(method, k).save(path, model_fingerprint(self.target))

    def drafter(
        self,
        method: str = DEFAULT_METHOD,
        budget: str | int | None = None,
        config: RecapConfig | None = None,
        state: DrafterState | None = None,
    ) -> Drafter:
        """Build the drafter ``method`` (`recap.state.build_drafter`) on the parts of a scope: ``state`` (a
        studio session's, a benchmark stream's, `DrafterState.given` parts a caller holds) or this
        runtime's own, with this model's cost curve for a cost-aware budget. ``budget`` overrides
        ``config.budget``."""
        config = config or RecapConfig()
        if budget is not None:
            config = replace(config, budget=budget)
        return build_drafter(method, state or self.state, config, self.cost_model)
