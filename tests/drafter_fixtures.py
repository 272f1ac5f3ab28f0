"""Fixtures for drafter and training tests: a small feature folder built from the tiny random
target (its own greedy answers to a few instructions of the stream and to a few it wrote
itself, in two response shards, plus two raw source chunks), the same pipeline as the real
data."""
from __future__ import annotations

import pytest

from specviz.train import data as D
from specviz.train import shards


@pytest.fixture(scope="session")
def tiny_data(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-data")
    shards.extend(tiny_target, out / "responses", target_tokens=10**9, batch=24,
                  max_new_tokens=32, shard_seqs=24, self_instruct=4, log=lambda s: None,
                  max_shards=2)
    D.build_features(tiny_target, out / "responses", out / "features", stdlib_chunks=2,
                     log=lambda s: None)
    return out / "features"

