"""Drafters: proposal strategies behind one protocol (`recap.drafters.base.Drafter`).

`make_drafter(method, **options)` builds one by name; `METHODS` lists the names the CLI, studio and
benchmark accept. Each method declares the shared state it needs (`shared_state`), so that whoever
builds drafters (`recap.runtime.Runtime`, the benchmark) creates only that; a factory takes the options
it uses and ignores the rest:

- ``config``: `recap.drafters.recap.config.RecapConfig` for the RECAP family (ablations apply their
overrides on top);
- ``persistent``: a shared `recap.drafters.recap.stream.StreamMemory` (what RECAP keeps across a stream:
  its 1-token memory and the rest), or a bare `recap.memory.persistent.PersistentMemory` (its stream's);
- ``cost_model``: `recap.models.cost.CostModel` for ``budget="auto"``;
- ``successors``: a shared `SuccessorMatrix` (TR's hot-started matrix); ``cold_start`` for TR;
- ``max_ngram``, ``num_tokens`` for PLD;
- ``suffix_cache``: a shared `SuffixTreeCache` (SuffixDecoding's global tree), ``suffix_config`` for
  ``suffix`` (needs the authors' package ``arctic-inference``; without it, a ValueError says how to
  install it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from recap.drafters.autoregressive import AutoregressiveDrafter
from recap.drafters.base import Drafter, Observation, RequestInfo
from recap.drafters.prompt_lookup import PromptLookupDrafter
from recap.drafters.recap.config import ABLATIONS, RecapConfig, apply_ablation
from recap.drafters.recap.drafter import RecapDrafter
from recap.drafters.recap.stream import StreamMemory
from recap.drafters.suffix_decoding import SuffixConfig, SuffixDecodingDrafter, SuffixTreeCache
from recap.drafters.token_recycling import SuccessorMatrix, TokenRecyclingDrafter
from recap.memory.persistent import PersistentMemory
from recap.models.cost import CostModel

DEFAULT_METHOD = "recap"


def _recap_factory(method: str) -> Callable[..., Drafter]:
    def build(
        config: RecapConfig | None = None,
        persistent: StreamMemory | PersistentMemory | None = None,
        cost_model: CostModel | None = None,
        **_: Any,
    ) -> Drafter:
        return RecapDrafter(
            apply_ablation(config or RecapConfig(), method),
            persistent=persistent,
            cost_model=cost_model,
            name=method,
        )

    return build


def _tr(
    successors: SuccessorMatrix | None = None,
    cold_start: bool = False,
    **_: Any,
) -> Drafter:
    return TokenRecyclingDrafter(successors=successors, cold_start=cold_start)


def _pld(max_ngram: int = 3, num_tokens: int = 10, **_: Any) -> Drafter:
    return PromptLookupDrafter(max_ngram=max_ngram, num_tokens=num_tokens)


def _suffix(
    suffix_cache: SuffixTreeCache | None = None, suffix_config: SuffixConfig | None = None, **_: Any
) -> Drafter:
    return SuffixDecodingDrafter(cache=suffix_cache, config=suffix_config)


#: Shared state a drafter can be given (state that outlives a request, or is measured once per model).
SharedState = Literal["persistent", "cost_model", "successors", "suffix_cache"]

#: name -> factory(**options) -> Drafter.
_FACTORIES: dict[str, Callable[..., Drafter]] = {
    "recap": _recap_factory("recap"),
    "tr": _tr,
    "pld": _pld,
    "ar": lambda **_: AutoregressiveDrafter(),
    "suffix": _suffix,
    **{name: _recap_factory(name) for name in ABLATIONS},
}

METHODS: tuple[str, ...] = tuple(_FACTORIES)


def is_recap_method(name: str) -> bool:
    """Whether ``name`` is RECAP or one of its ablations (the methods with memories and a cost model)."""
    return name == "recap" or name.startswith("recap-")


#: The shared state each method needs, beyond its config (RECAP's cost model: see `shared_state`).
_NEEDS: dict[str, frozenset[SharedState]] = {
    "tr": frozenset({"successors"}),
    "pld": frozenset(),
    "ar": frozenset(),
    "suffix": frozenset({"suffix_cache"}),
}


def shared_state(method: str, config: RecapConfig | None = None) -> frozenset[SharedState]:
    """What ``method`` needs to be given: RECAP's family its persistent memory, and the device's
    cost model when its budget is ``"auto"``; TR its successor matrix; SuffixDecoding its global tree;
    AR and prompt lookup nothing.

    Example: ``shared_state("recap", RecapConfig(budget=32)) == {"persistent"}``.
    """
    if method not in _FACTORIES:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
    if not is_recap_method(method):
        return _NEEDS[method]
    auto = (config or RecapConfig()).budget == "auto"
    return frozenset({"persistent", "cost_model"} if auto else {"persistent"})


def make_drafter(method: str, **options: Any) -> Drafter:
    """Build the drafter called ``method`` (one of `METHODS`); options it does not use are ignored."""
    try:
        factory = _FACTORIES[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}") from None
    return factory(**options)


__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "Drafter",
    "Observation",
    "RequestInfo",
    "is_recap_method",
    "make_drafter",
    "shared_state",
]
