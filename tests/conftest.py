"""Shared fixtures: the real embedded target (loaded once per session) and a tiny random Llama
that uses the real tokenizer, for fast model-level tests."""
from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def target():
    from specviz.models.target import Target
    return Target.load("embedded", device="cpu")


@pytest.fixture(scope="session")
def tiny_target():
    """A 2-layer random Llama with the embedded model's tokenizer (vocab 49152), fp32, CPU."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specviz.models.loading import embedded_folder
    from specviz.models.target import Target

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    model.requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(embedded_folder())
    t = Target(model, tok, "tiny-random-llama")
    return t
