"""A KV cache that grows in place: the decode loop's cache, a drop-in `DynamicCache`.

transformers' `DynamicLayer` appends a pass's keys and values with ``torch.cat``, which copies the
whole cache on every pass: O(length) work and a fresh allocation per layer and token, which at the
embedded model's size costs about as much as the attention itself. `GrowingLayer` keeps each layer in
a buffer with spare room (doubling when full) and writes new entries into it; ``keys`` / ``values`` are
views of the filled part, so attention reads the same numbers in the same order, and `crop` (drop
the last entries, as `TargetModel.commit` does with rejected tree nodes) only shortens the views.

Imported by `recap.models.adapter` when a request starts (this module imports transformers; the
`recap.models` package is the only code that does).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

#: Spare entries a layer's buffer holds beyond its first update (the prompt); it doubles when full.
SPARE = 256


class GrowingLayer(DynamicLayer):
    """One layer's keys and values ``(batch, heads, length, head_dim)`` as views of a larger buffer.

    Supports what the decode loop does: `update`, `crop`, `reset`, and writing into ``keys`` /
    ``values`` in place (`TargetModel.commit` moves accepted entries). What would replace ``keys`` /
    ``values`` with new tensors (beam-search reordering, batch selection, offloading) raises.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        capacity = key_states.shape[-2] + SPARE
        self._keys = _buffer(key_states, capacity)
        self._values = _buffer(value_states, capacity)
        self._expose()
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``(batch, heads, T, head_dim)`` new entries; return all keys and values so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            capacity = max(end, 2 * self._keys.shape[-2])
            self._keys = _grown(self._keys, self.length, capacity)
            self._values = _grown(self._values, self.length, capacity)
        self._keys.narrow(2, self.length, end - self.length).copy_(key_states)
        self._values.narrow(2, self.length, end - self.length).copy_(value_states)
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` entries (a negative count, as `DynamicLayer.crop` takes)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of entries to drop, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(self.length + tokens_to_remove, 0)
        self._expose()

    def reset(self) -> None:
        """Forget every entry: the buffers are released and the next update allocates new ones."""
        self.length = 0
        super().reset()  # (drops ``keys`` / ``values``; the next update initialises the layer again)
        self._keys = self._values = None

    def offload(self) -> None:
        raise NotImplementedError("GrowingLayer is not offloaded (its views would detach from the buffers)")

    def prefetch(self) -> None:
        raise NotImplementedError("GrowingLayer is not offloaded (its views would detach from the buffers)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("GrowingLayer does not reorder (the decode loop runs one sequence)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("GrowingLayer does not repeat batches (the decode loop runs one sequence)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("GrowingLayer does not select batches (the decode loop runs one sequence)")

    def _expose(self) -> None:
        self.keys = self._keys.narrow(2, 0, self.length)
        self.values = self._values.narrow(2, 0, self.length)


class GrowingCache(DynamicCache):
    """A `DynamicCache` of `GrowingLayer`s, one added per layer on its first update (every layer in
    full: sliding windows are applied by the masks, as for a `DynamicCache` built without a config)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)


def _buffer(like: torch.Tensor, capacity: int) -> torch.Tensor:
    batch, heads, _, head_dim = like.shape
    return like.new_empty((batch, heads, capacity, head_dim))


def _grown(buffer: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    """A buffer of ``capacity`` entries holding the first ``length`` entries of ``buffer``."""
    grown = _buffer(buffer, capacity)
    grown.narrow(2, 0, length).copy_(buffer.narrow(2, 0, length))
    return grown
