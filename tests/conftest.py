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


@pytest.fixture(scope="session")
def app_url():
    """The real app (`python app.py`, embedded model, CPU, one thread) on a free localhost port,
    launched once per test session in a subprocess; its log goes to artifacts/app.log."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "artifacts").mkdir(exist_ok=True)
    log = open(root / "artifacts" / "app.log", "w")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--device", "cpu",
                             "--threads", "1"], cwd=root, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 180
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"the app did not start; see {log.name}")
            time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=20)
    log.close()
