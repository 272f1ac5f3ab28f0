"""Scaled RoPE in published drafters: a tiny Llama target with Llama-3.1's llama3 (or Qwen's
yarn) rope scaling and an EAGLE-3 folder whose config.json carries the same rope_scaling load;
the drafter's logits equal test_published's reference forward with the target's own rotary
frequencies and attention factor (transformers' LlamaRotaryEmbedding), and greedy equals `ar`.
An unsupported (length-dependent) scaling fails with one line."""
from __future__ import annotations

import json

import pytest
import torch

import test_published as tp
from specviz.drafters import feature_heads as fh
from specviz.drafters.layers import widen

SCALINGS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
}


def _target(scaling: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from specviz.models.loading import embedded_folder
    from specviz.models.target import Target
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=tp.D, intermediate_size=128,
                      num_hidden_layers=tp.N_LAYERS, num_attention_heads=tp.HEADS,
                      num_key_value_heads=tp.KV, head_dim=tp.HD, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                      rope_parameters=scaling | {"rope_theta": tp.THETA})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.requires_grad_(False)
    return Target(model, AutoTokenizer.from_pretrained(embedded_folder()), "tiny-llama-scaled")


def _scaled_rot(target):
    """test_published.rot with the target's own rotary frequencies and attention factor."""
    rotary = target.model.model.rotary_emb
    inv, factor = rotary.inv_freq.float(), float(rotary.attention_scaling)

    def rot(x, pos):
        ang = pos.float()[:, None] * inv
        cos = (torch.cat([ang.cos()] * 2, -1) * factor)[:, None]
        sin = (torch.cat([ang.sin()] * 2, -1) * factor)[:, None]
        return x * cos + torch.cat([-x[..., tp.HD // 2:], x[..., :tp.HD // 2]], -1) * sin
    return rot


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_eagle3_scaled_rope(kind, tmp_path, monkeypatch):
    target = _target(SCALINGS[kind])
    path, t = tp.eagle3_folder(tmp_path / "e3", target)
    cfg = json.loads((tmp_path / "e3/config.json").read_text())
    (tmp_path / "e3/config.json").write_text(json.dumps(cfg | {"rope_scaling": SCALINGS[kind]}))
    drafter = tp._drafter(target, "eagle3", path)
    shape = drafter.head.layer.s
    plain = tp.THETA ** (-torch.arange(0, tp.HD, 2).float() / tp.HD)
    assert len(shape.rope_inv) == tp.HD // 2 and not torch.allclose(torch.tensor(shape.rope_inv), plain)
    assert (shape.rope_scale > 1.0) == (kind == "yarn")
    monkeypatch.setattr(tp, "rot", _scaled_rot(target))
    ids = tp.PROMPT * 3                               # positions past original_max (16) for llama3
    _, logits = fh.catch_up(drafter.head, tp._state(target, drafter, ids), ids[-1])
    ours = widen(logits[0], drafter.head.vocab_ids, target.vocab)
    ref = tp.ref_eagle3(t, target, ids)
    finite = ~torch.isinf(ref)
    assert torch.equal(torch.isinf(ours), ~finite)
    torch.testing.assert_close(ours[finite], ref[finite], atol=1e-4, rtol=1e-4)
    tp._greedy_equals_ar(target, "eagle3", path)


def test_dynamic_rope_refused(tmp_path):
    target = _target(SCALINGS["llama3"])
    path, _ = tp.eagle3_folder(tmp_path / "e3", target)
    cfg = json.loads((tmp_path / "e3/config.json").read_text())
    (tmp_path / "e3/config.json").write_text(json.dumps(
        cfg | {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}))
    tp._fails(target, "eagle3", path, "EAGLE-3 drafter", "rope_scaling dynamic is not supported")
