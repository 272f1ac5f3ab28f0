"""The feature folder (issue 19: data at 10x scale): one feature file per response shard, built
once and extended shard by shard; TrainData reads its crops lazily."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specviz.train import data as D
from specviz.train import shards

from drafter_fixtures import tiny_data  # noqa: F401 (fixture)

SHARDS = ["shard-00001.safetensors", "shard-00002.safetensors"]


@pytest.fixture
def responses(tiny_data, tmp_path):
    """A copy of the tiny response shards, to append to."""
    out = tmp_path / "responses"
    shutil.copytree(tiny_data.parent / "responses", out)
    return out


def build(target, responses, folder, **kw) -> dict:
    return D.build_features(target, responses, folder, log=lambda s: None, **kw)


def splits(d: D.TrainData) -> dict[tuple, bool]:
    """Each sequence of the folder (its tokens) -> whether it is held out."""
    held = set(d.heldout_ids)
    return {tuple(d.crop(s, 0, d.lengths[s])["tokens"].tolist()): s in held
            for s in d.train_ids + d.heldout_ids}


def test_building_again_skips_and_appending_builds_only_the_new_shard(tiny_target, responses,
                                                                       tmp_path):
    t, feats = tiny_target, tmp_path / "features"
    first = build(t, responses, feats)
    assert first["built"] == SHARDS and not first["skipped"] and not first["removed"]
    stamps = {p.name: p.stat().st_mtime_ns for p in feats.iterdir()}
    again = build(t, responses, feats)
    assert not again["built"] and again["skipped"] == SHARDS
    assert again["tokens"] == first["tokens"] == D.TrainData(feats).n_tokens
    before = splits(D.TrainData(feats))

    shards.extend(t, responses, target_tokens=10**9, batch=24, max_new_tokens=32, shard_seqs=24,
                  max_shards=1, log=lambda s: None)
    more = build(t, responses, feats)
    assert more["built"] == ["shard-00003.safetensors"] and more["skipped"] == SHARDS
    assert {p.name: p.stat().st_mtime_ns for p in feats.iterdir() if p.name in stamps} == stamps
    after = splits(D.TrainData(feats))
    assert len(after) > len(before)
    assert {k: after[k] for k in before} == before          # no old sequence changed split

    # a shard that only repeats earlier prompts adds nothing (shards.read drops repeats)
    shutil.copy(responses / SHARDS[0], responses / "shard-00004.safetensors")
    dup = build(t, responses, feats)
    assert not dup["built"] and not (feats / "shard-00004.safetensors").exists()
    assert dup["tokens"] == more["tokens"]


def test_stale_files_are_rebuilt_and_unplanned_ones_removed(tiny_target, responses, tmp_path):
    t, feats = tiny_target, tmp_path / "features"
    n1 = len(shards.read(responses)) - 1                     # cut the second shard short
    cut = build(t, responses, feats, max_seqs=n1, stdlib_chunks=2)
    assert cut["built"] == SHARDS + ["stdlib.safetensors"]
    assert D.TrainData(feats).meta["sequences"] == str(n1 + 2)
    full = build(t, responses, feats)
    assert full["built"] == SHARDS[1:] and full["skipped"] == SHARDS[:1]
    assert full["removed"] == ["stdlib.safetensors"]

    path = feats / SHARDS[0]                                # a file of another target
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
    save_file(load_file(str(path)), str(path), metadata=meta | {"fingerprint": "0" * 16})
    with pytest.raises(D.FeatureError, match="another target"):
        D.TrainData(feats)
    assert build(t, responses, feats)["built"] == SHARDS[:1]
    assert D.TrainData(feats).meta["files"] == "2"           # whole again

    (responses / SHARDS[1]).write_bytes((responses / SHARDS[1]).read_bytes() + b" ")
    assert D.stale_files(feats, responses) == SHARDS[1:]


def test_train_data_errors(tmp_path, tiny_data):
    with pytest.raises(D.FeatureError, match="no feature files.*--build-data"):
        D.TrainData(tmp_path / "nothing")
    (tmp_path / "data.safetensors").write_bytes(b"")
    with pytest.raises(D.FeatureError, match="folder of per-shard files"):
        D.TrainData(tmp_path / "data.safetensors")
    with pytest.raises(D.FeatureError, match=r"layer\(s\) \[99\]"):
        D.TrainData(tiny_data, taps=(99,))


def test_crops_are_the_source_sequences_and_their_target_features(tiny_target, tiny_data):
    t = tiny_target
    rows = shards.read(tiny_data.parent / "responses") + D.stdlib_chunk_rows(t.tokenizer, 2)
    d = D.TrainData(tiny_data, taps=(2, t.n_layers))
    assert len(d.lengths) == len(rows)
    for s, r in enumerate(rows):
        c = d.crop(s, 0, 10**6)
        assert c["tokens"].tolist() == r["prompt_ids"] + r["response_ids"]
        assert c["loss_mask"].tolist() == [0] * len(r["prompt_ids"]) + [1] * len(r["response_ids"])
        assert (s in d.heldout_ids) == (D.is_heldout(r) and d.lengths[s] > 2)
    s = len(rows) - 3                                       # in the second shard's file
    seq = rows[s]["prompt_ids"] + rows[s]["response_ids"]
    with torch.inference_mode():
        o = t.model.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        top = torch.softmax(t.lm_head(o.last_hidden_state[0]).float(), -1).topk(D.TOPK, -1)
    c = d.crop(s, 3, 5)
    assert c["tokens"].tolist() == seq[3:8] and c["valid"].tolist() == [1.0] * 5
    torch.testing.assert_close(c["h2"], o.hidden_states[2][0, 3:8].half().float())
    torch.testing.assert_close(c[f"h{t.n_layers}"], o.last_hidden_state[0, 3:8].half().float())
    assert torch.equal(c["topk_ids"][:, 0], top.indices[3:8, 0])

    b = d.batch(np.random.default_rng(0), 8, 16)
    seqs = [r["prompt_ids"] + r["response_ids"] for r in rows]
    for tok, valid in zip(b["tokens"].tolist(), b["valid"].tolist()):
        n = int(sum(valid))
        assert any(tok[:n] == q[i:i + n] for q in seqs for i in range(len(q) - n + 1))
        assert tok[n:] == [0] * (16 - n)


def test_train_data_holds_handles_not_feature_tensors(tiny_target, tiny_data):
    d = D.TrainData(tiny_data, taps=D.taps_for(tiny_target.n_layers))
    held = [x for v in vars(d).values() for x in (v if isinstance(v, list) else [v])]
    assert not [x for x in held if isinstance(x, torch.Tensor) and x.numel() >= d.n_tokens]
    assert len(d.files) == 3 and all(hasattr(f, "get_slice") for f in d.files)
    mass = torch.zeros(tiny_target.vocab)                   # the same sums, crop by crop
    for s in range(len(d.lengths)):
        c = d.crop(s, 0, d.lengths[s])
        mass.index_add_(0, c["topk_ids"].flatten(), c["topk_p"].flatten())
        mass.index_add_(0, c["tokens"], torch.ones(len(c["tokens"])))
    vocab = d.vocab_by_mass(512, tiny_target.vocab)         # streamed file by file
    assert torch.equal(vocab, mass.topk(512).indices.sort().values)


def test_shard_span_names_the_shards_of_a_feature_folder():
    names = ["shard-00001.safetensors", "shard-00002.safetensors", "shard-00003.safetensors",
             "shard-00007.safetensors", "stdlib", "shard-00009.safetensors"]
    assert D.shard_span(names) == "1-3, 7, 9" and D.shard_span(["stdlib"]) == ""
    # and a span reads back as the shard numbers it names
    assert D.span_numbers("1-3, 7, 9") == {1, 2, 3, 7, 9} and D.span_numbers("") == set()
    assert D.span_of(D.span_numbers("192-205, 99-109, 100")) == "99-109, 192-205"


def test_crops_reach_the_response_of_a_long_prompt():
    mask = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)
    starts = torch.tensor([0, 8, 12, 16])            # responses at 6, none, none
    assert D.first_ones(mask, starts).tolist() == [6, 4, 4]


def test_every_crop_of_a_sequence_with_a_response_holds_response_tokens(tiny_data):
    data = D.TrainData(tiny_data, taps=())
    rng = np.random.default_rng(0)
    b = data.batch(rng, 64, 8)
    assert (b["loss_mask"].sum(1) > 0).all()


def test_a_sequence_that_fits_is_cropped_whole_prompt_included(tiny_data):
    data = D.TrainData(tiny_data, taps=())
    longest = int(max(data.lengths))
    b = data.batch(np.random.default_rng(1), 64, longest)
    whole = {tuple(data.crop(s, 0, longest)["tokens"].tolist()) for s in data.sequences(False)}
    for tok, valid in zip(b["tokens"].tolist(), b["valid"].tolist()):
        assert tuple(tok[:int(sum(valid))]) in whole          # starts at the prompt's first token


def test_batched_feature_passes_match_one_sequence_at_a_time(tiny_target, responses, tmp_path):
    """--feature-batch (right-padded, masked passes of sequences of similar length, for a GPU)
    writes the same sequences in the same order, with features equal to the exact one-at-a-time
    pass up to float rounding."""
    one = build(tiny_target, responses, tmp_path / "one")
    many = build(tiny_target, responses, tmp_path / "many", batch=5)
    assert one["built"] == many["built"] == SHARDS
    for name in SHARDS:
        a, b = load_file(str(tmp_path / "one" / name)), load_file(str(tmp_path / "many" / name))
        assert a.keys() == b.keys()
        lengths = a["seq_starts"].diff()
        assert len(set(lengths.tolist())) > 1               # padding really happened
        for k in ("tokens", "seq_starts", "loss_mask", "split"):
            assert torch.equal(a[k], b[k]), k
        for k in [k for k in a if k.startswith("h")] + ["topk_p"]:
            torch.testing.assert_close(a[k].float(), b[k].float(), atol=2e-3, rtol=2e-3)
        assert (a["topk_ids"][:, 0] == b["topk_ids"][:, 0]).float().mean() > 0.99


def test_a_training_folder_refuses_other_feature_files(tiny_data, tmp_path):
    """A probe's answers written into a training feature folder (`train probe --data` pointed at
    it) would be trained on: TrainData refuses the mix instead of reading it."""
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_data, mixed)
    shutil.copy(mixed / SHARDS[0], mixed / "probe.safetensors")
    with pytest.raises(D.FeatureError, match="mixes training features with probe.safetensors"):
        D.TrainData(mixed)
    names = [p.name for p in D.training_files(mixed)]
    assert names == [p.name for p in D.training_files(tiny_data)] and names[:2] == SHARDS
