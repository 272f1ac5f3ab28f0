"""The growing KV cache (models.kvcache): in-place appends into a buffer, against transformers'
concatenating DynamicLayer fed the same updates, crops and external replacements.

Boundary: `GrowingLayer` and `new_cache` on plain tensors and on the tiny random Llama; the
tree / rollback arithmetic over it is tests/test_kv.py's.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from specviz.models import kvcache
from specviz.models.kvcache import GrowingLayer, new_cache


def kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 3, generator=g)


def same(a, b) -> None:
    torch.testing.assert_close(a.keys, b.keys, atol=0, rtol=0)
    torch.testing.assert_close(a.values, b.values, atol=0, rtol=0)


def test_appends_in_place_and_grows_when_full(monkeypatch):
    monkeypatch.setattr(kvcache, "MIN_ROOM", 4)
    mine, ref = GrowingLayer(), DynamicLayer()
    buffers = set()
    for step, n in enumerate([3, 1, 1, 1, 5, 1, 2, 9, 1]):
        k, v = kv(n, step)
        got = mine.update(k, v)
        ref.update(k, v)
        same(mine, ref)
        assert got[0] is mine.keys and got[1] is mine.values
        assert mine.keys.data_ptr() == mine._kbuf.data_ptr()      # a view of the buffer
        buffers.add(mine._kbuf.data_ptr())
    assert mine.get_seq_length() == 24
    assert len(buffers) < 9 // 2       # appends mostly land in room already allocated


def test_crop_then_update_overwrites_the_cut_positions():
    mine, ref = GrowingLayer(), DynamicLayer()
    for layer in (mine, ref):
        layer.update(*kv(6, 0))
        layer.crop(-4)
        layer.update(*kv(3, 1))
    same(mine, ref)
    assert mine.get_seq_length() == 5


def test_replaced_keys_are_adopted():
    """Code may assign a layer's keys/values (transformers' batch helpers do): the next update
    copies them into a fresh buffer instead of writing behind them."""
    mine, ref = GrowingLayer(), DynamicLayer()
    for layer in (mine, ref):
        layer.update(*kv(5, 0))
    k, v = kv(2, 7)
    for layer in (mine, ref):
        layer.keys, layer.values = k.clone(), v.clone()
        layer.update(*kv(1, 3))
    same(mine, ref)
    assert mine.keys.data_ptr() == mine._kbuf.data_ptr()


def test_reset_starts_over():
    mine = GrowingLayer()
    mine.update(*kv(4, 0))
    mine.reset()
    k, v = kv(2, 1)
    mine.update(k, v)
    torch.testing.assert_close(mine.keys, k, atol=0, rtol=0)


def test_a_model_decodes_the_same_through_it(tiny_target):
    """Greedy steps of the tiny Llama give the same logits with the growing cache as with
    transformers' own, and every layer of the model's cache is a GrowingLayer."""
    from transformers import DynamicCache
    model = tiny_target.model
    cache = new_cache(model.config)
    assert len(cache.layers) == model.config.num_hidden_layers
    assert all(type(layer) is GrowingLayer for layer in cache.layers)
    ref = DynamicCache(config=model.config)
    ids = [[5, 9, 13, 2]]
    with torch.inference_mode():
        for _ in range(6):
            a = model(torch.tensor(ids), past_key_values=cache).logits[0, -1]
            b = model(torch.tensor(ids), past_key_values=ref).logits[0, -1]
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
            ids = [[int(a.argmax())]]
    assert cache.get_seq_length() == ref.get_seq_length() == 9
