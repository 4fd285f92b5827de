"""`recap.models`: the target model and what it costs.

- `adapter`: `TargetModel`, the decode loop's four verbs over a Hugging Face model (the only code that
  imports transformers, lazily, when a model is loaded or a request starts); `kv_cache`: `GrowingCache`.
- `families`: what differs between model families, one row per family (positions, image tokens, masks).
- `cost`: the tree-cost curve ``c(T)`` of a model on a device (measured, fitted, replayed).

`TargetModel` is imported on first use, so that `recap.models.cost` stays free of torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TargetModel", "supported_attention"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from recap.models import adapter

        return getattr(adapter, name)
    raise AttributeError(f"module 'recap.models' has no attribute {name!r}")
