"""The decode loop's key/value cache (``decode_cache``): transformers' ``DynamicCache`` whose plain
full-attention layers are ``GrowingLayer`` s, buffers allocated once for the whole call.

``DynamicLayer`` grows by ``torch.cat``, copying the whole cache of a layer every token (quadratic
in the length); a ``GrowingLayer`` writes each step's column in place and hands the model views of
the filled columns: the same keys and values, no copy. Its rows can be dropped
(``batch_select_indices``), as ``rollout.decode`` drops finished rows.

This module imports transformers when it is imported; ``rollout.decode`` and ``rollout.hf`` import
it on first use, so importing them loads neither (rlhfkit imports transformers lazily).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

_EMPTY = torch.empty(0)  # the buffers of a layer not yet allocated


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer with room for ``capacity`` columns, allocated at its first
    update: each update writes its columns in place and returns views of the filled ones
    (``DynamicLayer`` concatenates, copying the whole cache every step). Keys and values are each
    held in the dtype the model writes them in (under autocast over float32 weights they differ)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0
        self.key_buffer, self.value_buffer = _EMPTY, _EMPTY

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.is_initialized = key_states.device, True
        self._allocate(key_states.shape[0], key_states, value_states)

    def _allocate(self, rows: int, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        """Buffers of ``rows`` rows and ``capacity`` columns, each with the heads, head size, dtype
        and device of ``like_k`` / ``like_v``."""
        self.key_buffer = like_k.new_empty((rows, like_k.shape[1], self.capacity, like_k.shape[-1]))
        self.value_buffer = like_v.new_empty((rows, like_v.shape[1], self.capacity, like_v.shape[-1]))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"decode cache: {end} columns for a capacity of {self.capacity}")
        self.key_buffer[:, :, start:end].copy_(key_states)
        self.value_buffer[:, :, start:end].copy_(value_states)
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        super().reset()
        self.length, self.key_buffer, self.value_buffer = 0, _EMPTY, _EMPTY

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("the decode cache only grows")

    def _rebuild(self, take: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """New buffers holding ``take(old filled part)`` (only the filled columns are copied)."""
        if not self.length or self.keys is None or self.values is None:
            return
        keys, values = take(self.keys), take(self.values)
        self._allocate(keys.shape[0], keys, values)
        self.key_buffer[:, :, : self.length].copy_(keys)
        self.value_buffer[:, :, : self.length].copy_(values)
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rebuild(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rebuild(lambda t: t.index_select(0, indices.to(t.device)))


def decode_cache(model, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``model`` whose plain full-attention layers are ``GrowingLayer`` s of
    ``capacity`` columns; other layer kinds (sliding windows, linear attention) stay as
    transformers builds them."""
    cache = DynamicCache(config=model.config)
    if not cache.layers:  # a config transformers cannot read layer types from: it adds DynamicLayers lazily
        cache.layer_class_to_replicate = None
        layers = model.config.get_text_config(decoder=True).num_hidden_layers
        cache.layers = [GrowingLayer(capacity) for _ in range(layers)]
        return cache
    cache.layers = [GrowingLayer(capacity) if type(old) is DynamicLayer else old for old in cache.layers]
    return cache
