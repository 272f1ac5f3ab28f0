"""The instruction stream and the append-only response shards (issue 19: data at 10x scale)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from specviz.train import shards, sources

ROOT = Path(__file__).resolve().parents[1]


def test_stream_has_20k_distinct_instructions_in_a_stable_order():
    items = sources.take(20_000)
    assert len({x["prompt"] for x in items}) == 20_000
    assert [x["index"] for x in items] == list(range(20_000))
    assert set(sources.SOURCES[sources.VERSION]) == {x["source"] for x in items}
    assert sources.take(5, start=19_995) == items[-5:]          # a prefix never changes
    assert sources.take(3, seed=1) != items[:3]


def test_every_committed_shard_answers_its_stream_version_and_versions_do_not_overlap():
    """Version 1 is still the stream shards 1-38 answered (each row's source, in index order),
    and version 2 repeats none of the version-1 instructions those shards answered."""
    answered = {}
    for path in shards.shard_paths():
        m = shards.meta(path)
        if m["stream"] == "pool" and m["seed"] == 0:
            raw = load_file(str(path))
            got = [m["sources"][i] for i in raw["source"]]
            want = sources.take(m["count"], m["first"], version=m["stream_version"])
            assert [x["source"] for x in want] == got, path.name
            assert raw["index"].tolist() == [x["index"] for x in want]
            answered.setdefault(m["stream_version"], []).extend(x["prompt"] for x in want)
    assert len(answered["1"]) == sources.PRIOR["2"][0][1]
    assert not set(answered["1"]) & {x["prompt"] for x in sources.take(20_000, version="2")}
    later = {x["prompt"] for x in sources.take(20_000, version="4")}
    assert not (set(answered["2"]) | set(answered["3"])) & later   # PRIOR["4"]


def test_stream_never_uses_the_dev_demo_or_probe_prompts():
    texts = set()
    for path in (ROOT.parent / "shared/prompts/dev.jsonl", ROOT / "demos/prompts.jsonl",
                 ROOT / "data/probe.jsonl"):
        if path.exists():
            texts |= {json.loads(x).get("prompt") for x in path.read_text().splitlines()
                      if x.strip()}
    assert texts, "no dev or demo prompts found to compare with"
    for version in sources.SOURCES:
        assert not texts & {x["prompt"] for x in sources.take(20_000, version=version)}
    written = shards.self_items(ROOT / shards.SHARD_DIR, 0, 10**9)   # the target's own instructions
    assert written and not texts & {x["prompt"] for x in written}


def test_shards_append_resume_and_read_back(tiny_target, tmp_path):
    t, out = tiny_target, tmp_path / "responses"
    kw = dict(batch=3, max_new_tokens=6, shard_seqs=4, log=lambda s: None)
    first = shards.extend(t, out, target_tokens=10**6, max_shards=1, **kw)
    assert first == {"shards": 1, "sequences": 4, "response_tokens": first["response_tokens"]}
    one = shards.shard_paths(out)[0].read_bytes()
    (out / "shard-00002.tmp").write_bytes(b"a shard killed mid-write")     # ignored on resume
    shards.extend(t, out, target_tokens=10**6, max_shards=1, **kw)
    paths = shards.shard_paths(out)
    assert [p.name for p in paths] == ["shard-00001.safetensors", "shard-00002.safetensors"]
    assert paths[0].read_bytes() == one                                     # never rewritten
    raw = load_file(str(paths[1]))
    assert raw["tokens"].dtype == np.uint16 and raw["offsets"][-1] == len(raw["tokens"])
    m = shards.meta(paths[1])
    assert (m["stream"], m["first"], m["count"], m["seed"]) == ("pool", 4, 4, 0)
    assert m["fingerprint"] == t.fingerprint and m["stream_version"] == sources.VERSION

    rows = shards.read(out, t.fingerprint)
    items = sources.take(8)
    assert [r["index"] for r in rows] == list(range(8))
    assert [r["prompt_ids"] for r in rows] == [t.encode(x["prompt"]) for x in items]
    assert [r["category"] for r in rows] == [x["source"] for x in items]
    assert all(1 <= len(r["response_ids"]) <= 6 for r in rows)
    total = sum(len(r["response_ids"]) for r in rows)
    assert shards.extend(t, out, target_tokens=total, **kw)["shards"] == 2  # target reached
    with pytest.raises(ValueError, match="another target"):
        shards.read(out, fingerprint="another")
    shards.extend(t, out, target_tokens=10**6, seed=1, max_shards=1, **kw)   # another stream
    m = shards.meta(shards.shard_paths(out)[2])
    assert (m["stream"], m["first"], m["seed"]) == ("pool", 0, 1)
    again = shards.read(out)
    assert len({tuple(r["prompt_ids"]) for r in again}) == len(again) >= 8
