"""The KV cache the engine decodes with: transformers' DynamicCache, with each full-attention
layer's keys and values kept in a preallocated buffer that grows in large steps.

Boundary: `new_cache(config)` and the `GrowingLayer` it puts in the cache. Everything else
(positions, masks, crop, tree compaction) is transformers' and `Target`'s, unchanged: a layer's
`keys` / `values` stay ordinary [batch, heads, length, dim] tensors, here views of the buffer's
first `length` positions. Cropping shortens the view, and the next update writes over what was
cut. A layer whose keys were replaced by a tensor outside its buffer (any code may assign them)
copies them into a new buffer on its next update.

Why: transformers' DynamicLayer appends by concatenating, so every new token copies the whole
cache of every layer into freshly allocated memory (60 tensors per step for the embedded model),
a cost that grows with the context. On this 2-core CPU, a one-token step of the embedded model
(medians of 40, interleaved) took 2.6% longer with concatenation at 300 cached positions, 9% at
1000 and 16% at 1800; over the dev prompts' short contexts (~100-400) the end-to-end difference
is inside the machine's noise.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 256   # positions allocated ahead when a buffer grows (or half the length, if more)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose update writes into a buffer instead of concatenating."""

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:  # transformers' own lazy set-up, whatever its version
            super().update(key_states[..., :0, :], value_states[..., :0, :], *args, **kwargs)
        old = self.get_seq_length()
        new = old + key_states.shape[-2]
        buf = self._kbuf
        if (buf is None or new > buf.shape[-2] or self.keys.data_ptr() != buf.data_ptr()
                or self.keys.shape[:-2] != key_states.shape[:-2]):
            room = new + max(MIN_ROOM, new // 2)
            self._kbuf = _grown(self.keys, old, key_states, room)
            self._vbuf = _grown(self.values, old, value_states, room)
        self._kbuf[..., old:new, :] = key_states
        self._vbuf[..., old:new, :] = value_states
        self.keys, self.values = self._kbuf[..., :new, :], self._vbuf[..., :new, :]
        return self.keys, self.values


def _grown(kept: torch.Tensor, n: int, like: torch.Tensor, room: int) -> torch.Tensor:
    """A buffer with `room` positions shaped like `like`, holding the first n of `kept`."""
    buf = like.new_empty((*like.shape[:-2], room, like.shape[-1]))
    if n:
        buf[..., :n, :] = kept[..., :n, :]
    return buf


def new_cache(config) -> DynamicCache:
    """A DynamicCache for a model with this config whose full-attention layers grow in place
    (sliding-window and other layer kinds keep transformers' own)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache
