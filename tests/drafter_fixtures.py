"""Fixtures for drafter and training tests: a small feature file built from the tiny random
target (its own greedy answers to a few pool instructions and to a few it wrote itself), the same
pipeline as the real data."""
from __future__ import annotations

import pytest

from specviz.train import data as D


@pytest.fixture(scope="session")
def tiny_data(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-data")
    responses = D.generate_responses(tiny_target, 24, out_dir=out, batch=24, max_new_tokens=32,
                                     stdlib_chunks=2, self_instruct=4)
    path = D.build_features(tiny_target, responses, out / "data.safetensors")
    return path

