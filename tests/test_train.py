"""The training pipeline on the tiny random target: feature folder layout, the loss goes down,
and a checkpoint saves, reloads and resumes; weights ship with a card and load back."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from specviz.drafters import weights
from specviz.drafters.eagle import Eagle1Head
from specviz.drafters.eagle3 import Eagle3Head
from specviz.train import data as D
from specviz.train.heads import Eagle3Trainable
from specviz.train.config import TrainConfig
from specviz.train.loop import earlier_paragraphs, init_from, load_checkpoint, train
from specviz.train.pool import extract_instruction, meta_prompts
from specviz.train.unroll import shift, soft_ce, unroll_mask

from drafter_fixtures import tiny_data  # noqa: F401 (fixture)


def test_self_instruct_extraction():
    assert {c for c, _ in meta_prompts()} >= {"chat", "code", "math", "writing"}
    said = 'A student might ask: "How do plants know which way is up?" That is a good one.'
    assert extract_instruction(said) == "How do plants know which way is up?"
    assert extract_instruction("\n**Write a haiku about autumn rain.**\nSure!") == \
        "Write a haiku about autumn rain."
    assert extract_instruction("Ok.") is None and extract_instruction("x" * 500) is None
    # a preamble ending in a colon gives way to the request after it
    assert extract_instruction("Here's a simple math word problem:\n\nTom has 3 apples and buys 5 "
                               "more. How many?") == "Tom has 3 apples and buys 5 more. How many?"
    # the assistant's own voice (an offer to help, a restatement of the meta-prompt) is no request
    assert extract_instruction("I’m ready to help. What's your programming task?") is None
    assert extract_instruction('Sure! "Write a request to a helpful assistant, please."') is None
    # an interjection needs its punctuation: a request may start with the same word
    assert extract_instruction("Great Wall of China: who built it, and why?") == \
        "Great Wall of China: who built it, and why?"
    assert extract_instruction("Great! Okay.\nGreat Wall facts: list five of them.") == \
        "Great Wall facts: list five of them."


def test_data_folder_layout(tiny_target, tiny_data):
    assert sorted(p.name for p in tiny_data.iterdir()) == [
        "shard-00001.safetensors", "shard-00002.safetensors", "stdlib.safetensors"]
    taps = D.taps_for(tiny_target.n_layers)
    total = 0
    for path in sorted(tiny_data.iterdir()):
        with safe_open(str(path), framework="pt") as f:
            n = f.get_slice("tokens").get_shape()[0]
            assert f.get_tensor("seq_starts")[-1] == n
            assert f.get_slice("loss_mask").get_shape() == [n]
            assert f.get_slice("topk_ids").get_shape() == [n, D.TOPK]
            assert all(f.get_slice(f"h{i}").get_shape() == [n, tiny_target.hidden]
                       and f.get_slice(f"h{i}").get_dtype() == "F16" for i in taps)
            assert f.metadata()["source"] in (path.name, "stdlib")
        total += n
    d = D.TrainData(tiny_data, taps=taps)
    assert d.n_tokens == total == sum(d.lengths)
    assert d.heldout_ids and d.train_ids and not set(d.heldout_ids) & set(d.train_ids)
    assert d.fingerprint == tiny_target.fingerprint
    assert d.meta["self_instruct"] == "4"            # the target's own instructions, answered
    assert d.meta["stdlib_chunks"] == "2" and d.meta["files"] == "3"
    written = (tiny_data.parent / "responses" / "self-instructions.jsonl").read_text().splitlines()
    assert len(written) == 4 and all(json.loads(x)["id"].startswith("self-") for x in written)
    b = d.batch(np.random.default_rng(0), 3, 16)
    assert b["tokens"].shape == (3, 16) and b["topk_p"].shape == (3, 16, D.TOPK)
    assert all(b[f"h{i}"].shape == (3, 16, tiny_target.hidden) for i in taps)


def make(tiny_target, tiny_data):
    data = D.TrainData(tiny_data, taps=(2, 2, 1))
    torch.manual_seed(0)
    return Eagle3Trainable(Eagle3Head(tiny_target, data.vocab_by_mass(1024, tiny_target.vocab)),
                           steps=3), data


def test_loss_goes_down_and_checkpoint_resumes(tiny_target, tiny_data, tmp_path):
    tr, data = make(tiny_target, tiny_data)
    cfg = TrainConfig("eagle3", steps=24, batch_size=4, seq_len=32, lr=3e-3, warmup=2,
                      eval_every=12, eval_batches=1, out_dir=str(tmp_path), ship=False)
    out = train(tr, data, cfg)
    log = (tmp_path / "eagle3" / "log.jsonl").read_text().splitlines()
    losses = [json.loads(x)["loss"] for x in log]
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    assert out["step"] == 24 and 1.0 <= out["final_eval"]["tau"] <= 4.0
    assert all(p.dtype == torch.float32 for p in tr.module.parameters())   # autocast or not

    # reload: the saved parameters come back into a fresh module
    tr2, _ = make(tiny_target, tiny_data)
    params = {k: p for k, p in tr2.module.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values())
    state = load_checkpoint(cfg, params, opt)
    assert state["step"] == 24
    for k, p in tr.module.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), params[k].detach())

    # resume: continues from step 24 to 30
    cfg.steps, cfg.resume = 30, True
    out = train(tr2, data, cfg)
    assert out["step"] == 30
    assert len((tmp_path / "eagle3" / "log.jsonl").read_text().splitlines()) == 30

    # resuming a finished run trains no further and still finishes (evaluates, saves)
    out = train(tr2, data, cfg)
    assert out["step"] == 30
    assert len((tmp_path / "eagle3" / "log.jsonl").read_text().splitlines()) == 30


def test_training_precision():
    from specviz.models import kernels
    from specviz.train.loop import bf16_autocast
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert bf16_autocast("auto", cpu) == kernels.native_bf16()   # AMX / AVX512-BF16 CPUs
    assert bf16_autocast("auto", gpu) and bf16_autocast("bf16", gpu)
    assert not bf16_autocast("fp32", cpu) and not bf16_autocast("fp32", gpu)
    for dev in (cpu, gpu):
        with pytest.raises(ValueError, match="precision must be one of"):
            bf16_autocast("fp8", dev)


def test_the_frozen_lm_head_follows_the_runs_precision():
    """distill.head_logits computes in fp32 unless the run's bf16 autocast is on: a bf16 cast of
    its own made the MTP and block trainers' steps 8-15x slower on CPUs without native bfloat16,
    where the run itself trains in fp32."""
    from specviz.train.distill import head_logits
    g = torch.Generator().manual_seed(0)
    hn, w = torch.randn(5, 64, generator=g), torch.randn(300, 64, generator=g)
    fp32 = head_logits(hn, w)
    assert fp32.dtype == torch.float32 and torch.equal(fp32, torch.nn.functional.linear(hn, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = head_logits(hn, w)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)
    assert torch.allclose(bf16, fp32, rtol=2e-2, atol=0.2)


def test_ship_and_load(tiny_target, tiny_data, tmp_path, capsys):
    from specviz.drafters import eagle3
    tr, data = make(tiny_target, tiny_data)
    with weights.use(tmp_path):   # the assets folder read and written inside
        cfg = TrainConfig("eagle3", steps=2, batch_size=2, seq_len=16, eval_every=100, eval_batches=1,
                          out_dir=str(tmp_path / "ck"))
        train(tr, data, replace(cfg, note="A round note."), tiny_target)
        assert (tmp_path / "eagle3.md").read_text().count("held-out") >= 2
        assert "|\n\nA round note.\n\nReproduce:" in (tmp_path / "eagle3.md").read_text()
        assert "of the starting weights" not in (tmp_path / "eagle3.md").read_text()
        cover = re.search(r"\| draft vocabulary \| (\d+) tokens, covering ([\d.]+)% of the held-out",
                          (tmp_path / "eagle3.md").read_text())
        assert cover and 0 < float(cover[2]) <= 100
        card = tmp_path / "eagle3.md"
        assert "| response shards seen over rounds | 1-2 |" in card.read_text()
        # a card that names shards seen before: the next round adds its own to them
        card.write_text(card.read_text().replace("seen over rounds | 1-2 |", "seen over rounds | 5-9 |")
                        + "\n## Measured with the engine (round 1)\n\nτ 1.5\n")
        # a fine-tuning round's card adds its data to what the previous weights were trained on,
        # and keeps the earlier rounds' paragraphs below its own, and the earlier weights'
        # sections below its own header
        for rnd in (2, 3):
            capsys.readouterr()
            note = "" if rnd == 2 else "Round 3 note."
            ck = str(tmp_path / f"ck{rnd}")
            train(tr, data, replace(cfg, init="shipped", note=note, out_dir=ck), tiny_target)
            # a round on shards the weights already saw says so (round 2's weights saw 5-9 only)
            warned = "already trained on response shards 1-2 of this data" in capsys.readouterr().out
            assert warned == (rnd == 3)
            n = rnd * int(data.meta["response_tokens"])
            text = card.read_text()
            assert f"{rnd * int(data.meta['sequences'])} sequences" in text
            assert f"({n} response tokens)" in text
            assert text.count("held-out simulated chain τ of the starting weights") == 1
            assert text.count("## Measured with the engine (round 1)\n\nτ 1.5\n") == 1
            assert text.index("Reproduce:") < text.index("## Measured") and text.count("# `eagle3`") == 1
            paragraphs = "Round 3 note.\n\nA round note." if rnd == 3 else "A round note."
            assert f"|\n\n{paragraphs}\n\nReproduce:" in text and text.count("A round note.") == 1
            assert "\n\n\n" not in text.split("## ")[0]
            # the card names the shards, and a feature folder of its own is in the command
            assert data.meta["shards"] == "1-2" and "answers to the offline instruction stream " \
                "(`specviz/train/sources.py`), response shards 1-2 and to" in text
            assert f"--data {data.folder}` with S a folder" in text
            assert f" --data {data.folder}`." in text
            assert text.count("| response shards seen over rounds | 1-2, 5-9 |") == 1
        head = eagle3.load_head(tiny_target)
        assert torch.equal(head.vocab_ids, tr.module.vocab_ids)
        with pytest.raises(Exception, match="another target"):
            weights.load("eagle3", "0" * 16)


def test_earlier_paragraphs_are_the_prose_between_header_table_and_sections():
    """Round paragraphs sit above or below the Reproduce paragraph and may hold tables of their
    own; the description above the header table, Reproduce and the sections are not kept."""
    card = ("# `d`\n\nWhat it is.\n\n| | |\n|---|---|\n| steps | 9 |\n\nRound 3: text.\n\n"
            "| run | τ |\n|---|---|\n| 3a | 2.0 |\n\nAfter the table.\n\nReproduce: a\nb `x`.\n\n"
            "Round 2: older.\n\n## Measured\n\nfigures\n")
    assert earlier_paragraphs(card) == ("\nRound 3: text.\n\n| run | τ |\n|---|---|\n| 3a | 2.0 |"
                                        "\n\nAfter the table.\n\nRound 2: older.\n")
    assert earlier_paragraphs("# `d`\n\n| a | b |\n\nReproduce: x\n\n## S\n\ny\n") == ""
    assert earlier_paragraphs("") == ""


def test_fine_tuning_starts_from_shipped_weights(tiny_target, tiny_data):
    """`--init shipped`: the shipped vocabulary is kept and every trained parameter is loaded;
    weights that do not fit are refused."""
    tr, _ = make(tiny_target, tiny_data)
    with torch.no_grad():
        for p in tr.module.parameters():
            p.add_(0.5)
    tensors, _ = tr.export()
    vocab = tensors.pop("vocab_ids")
    args = type("Args", (), {"shipped_vocab": vocab, "data": "unused"})()
    assert torch.equal(D.drafter_vocab(args, tiny_target.vocab, 1024), vocab.long())
    fresh, _ = make(tiny_target, tiny_data)
    init_from(fresh.module, tensors)
    for (k, a), b in zip(tr.module.state_dict().items(), fresh.module.state_dict().values()):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="do not fit"):
        init_from(fresh.module, tensors | {"extra.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="missing"):
        first = next(k for k, p in fresh.module.named_parameters() if p.requires_grad)
        init_from(fresh.module, {k: v for k, v in tensors.items() if k != first})


def test_fine_tuning_keeps_the_vocabulary_wherever_it_is_stored(tiny_target):
    """The shipped vocabulary is found under each drafter's key (DSpark nests it in its
    backbone), and a module built for another vocabulary is refused, not silently loaded."""
    from specviz.drafters.dspark import DSparkModel
    from specviz.drafters.layers import LayerShape
    v = torch.arange(5)
    assert torch.equal(D.shipped_vocab({"backbone.vocab": v, "w1.weight": torch.ones(2)}), v)
    assert torch.equal(D.shipped_vocab({"vocab": v}), v)
    t = {"vocab_ids": v, "x": torch.ones(1)}
    assert torch.equal(D.shipped_vocab(t), v) and "vocab_ids" not in t
    assert D.shipped_vocab({"fc.weight": torch.ones(1)}) is None

    def dspark(vocab):
        return DSparkModel(LayerShape.of(tiny_target), vocab, tiny_target.vocab, block=4,
                           n_layers=1, taps=(1, 2, 3))

    tensors = dspark(torch.arange(100, 200)).state_dict()
    vocab = D.shipped_vocab(tensors)
    assert torch.equal(vocab, torch.arange(100, 200))
    with pytest.raises(ValueError, match="another vocabulary"):
        init_from(dspark(vocab.flip(0)), tensors)              # same size, other order
    init_from(dspark(vocab), tensors)


def test_a_new_draft_vocabulary_keeps_each_tokens_rows(tiny_target):
    """`--draft-vocab N --init shipped`: a DSpark drafter built for a new vocabulary takes the
    shipped weights; W1 and W2 rows follow their tokens, a token new to the vocabulary starts
    from the "other" W1 row it used while outside and a zero W2 row, and every other weight is
    loaded unchanged."""
    from specviz.drafters.dspark import DSparkModel
    from specviz.drafters.layers import LayerShape
    from specviz.train.init import revocab

    def dspark(vocab):
        return DSparkModel(LayerShape.of(tiny_target), vocab, tiny_target.vocab, block=4,
                           n_layers=1, taps=(1, 2, 3))

    old, new = torch.arange(100, 200), torch.arange(150, 400)     # 50 kept, 200 new tokens
    shipped = dspark(old)
    with torch.no_grad():
        for p in shipped.parameters():
            p.add_(torch.randn_like(p))
    tensors = shipped.state_dict()
    grown = dspark(new)
    init_from(grown, revocab(grown, dict(tensors), D.shipped_vocab(dict(tensors))))
    assert torch.equal(grown.backbone.vocab, new)
    for tok in (150, 199):                                       # kept: the same rows
        i, j = tok - 100, tok - 150
        assert torch.equal(grown.w1.weight[j], shipped.w1.weight[i])
        assert torch.equal(grown.w2.weight[j], shipped.w2.weight[i])
    assert torch.equal(grown.w1.weight[60], shipped.w1.weight[-1])   # token 210: "other" row
    assert torch.equal(grown.w1.weight[-1], shipped.w1.weight[-1])
    assert not grown.w2.weight[60].any()
    assert torch.equal(grown.conf.weight, shipped.conf.weight)
    prev = torch.tensor([160, 210, 5])                           # kept, new, outside both
    e_old, _ = shipped.markov(prev)
    e_new, _ = grown.markov(prev)
    torch.testing.assert_close(e_new, e_old)                     # W1 rows: what it read before


def test_draft_vocab_option_selects_the_vocabulary_anew(tiny_target, tiny_data):
    """`--draft-vocab N`: the N tokens with the most mass in the data, even when fine-tuning
    (which otherwise keeps the shipped vocabulary)."""
    args = type("Args", (), {"shipped_vocab": None, "draft_vocab": 300, "data": tiny_data})()
    got = D.drafter_vocab(args, tiny_target.vocab, 1024)
    assert torch.equal(got, D.draft_vocab(tiny_data, 300, tiny_target.vocab)) and len(got) == 300
    args.draft_vocab = 0
    assert len(D.drafter_vocab(args, tiny_target.vocab, 1024)) == 1024
    data = D.TrainData(tiny_data)
    assert data.coverage(torch.arange(tiny_target.vocab)) == 1.0
    top30 = D.draft_vocab(tiny_data, 30, tiny_target.vocab)
    assert data.coverage(torch.tensor([], dtype=torch.long)) == 0
    top3 = D.draft_vocab(tiny_data, 3, tiny_target.vocab)
    assert 0 < data.coverage(top3) <= data.coverage(top30) <= data.coverage(got) <= 1


def test_drafter_flags_reach_the_reproduce_line():
    """The options that shape a drafter are typed back in its card's Reproduce command."""
    from specviz.train.cli import drafter_flags, parser
    args = parser().parse_args(["--drafter", "eagle3", "--draft-vocab", "8192", "--ttt-steps",
                                "7", "--precision", "fp32"])
    assert drafter_flags(args) == " --draft-vocab 8192 --ttt-steps 7 --precision fp32"
    assert drafter_flags(parser().parse_args(["--drafter", "dspark"])) == ""
    assert drafter_flags(parser().parse_args(["--drafter", "dspark", "--position-decay", "3"])
                         ) == " --position-decay 3"
    assert drafter_flags(parser().parse_args(["--drafter", "dspark", "--ce-weight", "0.7"])
                         ) == " --ce-weight 0.7"


def test_the_cli_defaults_are_the_train_configs():
    """One home for the run defaults: the `train` options start at TrainConfig's values, and
    reading them loads no drafter or training loop (a fresh interpreter, so nothing is cached)."""
    import subprocess
    import sys
    code = ("import sys; from specviz.train.cli import parser; "
            "a = parser().parse_args(['--drafter', 'eagle3']); "
            "print(a.minutes, a.steps, a.batch_size, a.seq_len, a.lr, a.warmup, a.eval_every, "
            "a.seed, a.out_dir); "
            "print(sorted(m for m in sys.modules if m.startswith('specviz.drafters') "
            "or m == 'specviz.train.loop'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    c = TrainConfig("eagle3")
    assert out[0] == (f"{c.minutes} {c.steps} {c.batch_size} {c.seq_len} {c.lr} {c.warmup} "
                      f"{c.eval_every} {c.seed} {c.out_dir}")
    assert out[1] == "[]"


def test_ttt_steps_reach_the_eagle3_trainable(tiny_target):
    """`--ttt-steps N` sets the unroll length of EAGLE-3's training-time test; 0 keeps 4."""
    from specviz.train.heads import TTT_STEPS, eagle3
    args = type("Args", (), {"shipped_vocab": torch.arange(100, 300), "ttt_steps": 7})()
    assert eagle3(tiny_target, args).steps == 7
    args.ttt_steps = 0
    assert eagle3(tiny_target, args).steps == TTT_STEPS == 4


def test_eagle1_unrolled_loss_feeds_the_head_its_own_features(tiny_target, tiny_data):
    """`--ttt-steps N` unrolls EAGLE-1's loss (HASS): step 0 is the published one-step loss,
    step j regresses f_{i+1+j} from the head's own step j-1 feature, and the total weighs
    step j by 0.8^j; 0 keeps the published single step."""
    from specviz.train.heads import Eagle1Trainable, eagle1
    vocab = D.TrainData(tiny_data, taps=(1,)).vocab_by_mass(512, tiny_target.vocab)
    args = type("Args", (), {"shipped_vocab": vocab, "ttt_steps": 3})()
    assert eagle1(tiny_target, args).steps == 3
    args.ttt_steps = 0
    assert eagle1(tiny_target, args).steps == 1
    torch.manual_seed(0)
    head = Eagle1Head(tiny_target, vocab)
    data = D.TrainData(tiny_data, taps=head.taps)
    one, three = Eagle1Trainable(head, noise=0.0), Eagle1Trainable(head, noise=0.0, steps=3)
    batch = {k: v.float() if v.is_floating_point() else v
             for k, v in data.batch(np.random.default_rng(0), 2, 16).items()}
    loss1, s1 = one.loss(batch, torch.Generator().manual_seed(0))
    loss3, s3 = three.loss(batch, torch.Generator().manual_seed(0))
    torch.testing.assert_close(s3["reg0"], s1["reg0"])
    torch.testing.assert_close(s3["ce0"], s1["ce0"])
    torch.testing.assert_close(loss1, s1["reg0"] + 0.1 * s1["ce0"])
    torch.testing.assert_close(loss3, sum(0.8 ** j * (s3[f"reg{j}"] + 0.1 * s3[f"ce{j}"])
                                          for j in range(3)))
    # step 1 reads the head's own step-0 feature, not the target's: re-run it by hand
    f = batch[f"h{head.taps[0]}"]
    out0, _, kv = head(f, head.embed(shift(batch["tokens"], 1)), torch.arange(16), None,
                       unroll_mask(16, 0))
    out1, lg1, _ = head(out0, head.embed(shift(batch["tokens"], 2)), torch.arange(16) + 1, kv,
                        unroll_mask(16, 1))
    _, w = soft_ce(lg1, batch, three.t2d, 2)
    reg = torch.nn.functional.smooth_l1_loss(out1, shift(f, 2), reduction="none").mean(-1)
    assert loss3.requires_grad and s3["reg1"] > 0
    assert abs(float(((reg * w).sum() / w.sum()).detach()) - float(s3["reg1"])) < 1e-4


def test_position_decay_reaches_the_block_trainables_loss_weights(tiny_target):
    """`--position-decay G` sets the block drafters' position weights exp(-(k-1)/G); 0 keeps the
    published 7 (B = 16) and 4 (B = 8); other drafters refuse it."""
    from specviz.train.blocks import dflash_b8, dflash_b16, labels
    from specviz.train.cli import main, parser
    args = parser().parse_args(["--drafter", "dflash-b16", "--position-decay", "2.5"])
    args.shipped_vocab = torch.arange(100, 300)
    tr = dflash_b16(tiny_target, args)
    assert tr.gamma_w == 2.5
    batch = {"tokens": torch.zeros(1, 40, dtype=torch.long), "valid": torch.ones(1, 40),
             "loss_mask": torch.ones(1, 40)}
    _, w = labels(batch, torch.tensor([[3]]), 16, 1, tr.gamma_w)
    assert torch.allclose(w[0, 0, 1:], torch.exp(-torch.arange(15) / 2.5)) and w[0, 0, 0] == 0
    args.position_decay = 0
    assert dflash_b16(tiny_target, args).gamma_w == 7.0 and dflash_b8(tiny_target, args).gamma_w == 4.0
    with pytest.raises(SystemExit):
        main(["--drafter", "eagle3", "--position-decay", "3"])


def test_ce_weight_reaches_the_dspark_trainable(tiny_target):
    """`--ce-weight W` sets DSpark's CE share (0 keeps the published 0.1); the loss itself is
    checked in test_block_drafters."""
    from specviz.train import blocks
    from specviz.train.cli import parser
    args = parser().parse_args(["--drafter", "dspark", "--ce-weight", "0.7"])
    args.shipped_vocab = torch.arange(100, 300)
    tr = blocks.dspark(tiny_target, args)
    assert tr.ce_weight == 0.7
    args.ce_weight = 0
    assert blocks.dspark(tiny_target, args).ce_weight == blocks.CE_WEIGHT == 0.1


def test_a_deeper_block_drafter_grows_from_shallower_weights(tiny_target):
    """`--layers 3 --init shipped` on 2-layer weights: the third layer starts as the identity,
    so the grown drafter computes what the shipped one did; only appended layers may be new."""
    from specviz.drafters.dflash import BlockBackbone
    from specviz.drafters.layers import LayerShape
    from specviz.train import init
    from specviz.train.loop import grown_layers

    def backbone(layers):
        torch.manual_seed(layers)
        bb = BlockBackbone(LayerShape.of(tiny_target), torch.arange(100, 300), tiny_target.vocab,
                           layers, (1, 2, 3))
        return init.block_backbone(bb, tiny_target).eval()

    two = backbone(2)
    with torch.no_grad():
        for p in two.parameters():
            p.add_(0.01 * torch.randn_like(p))      # trained: no longer the identity start
    tensors = two.state_dict()
    three = backbone(3)
    assert grown_layers(three, tensors) == ["layers.2."]
    init_from(three, tensors)
    feats = {t: torch.randn(1, 5, tiny_target.hidden) for t in (1, 2, 3)}
    x = torch.randn(1, 4, tiny_target.hidden)
    pos, ctx = torch.arange(5, 9), torch.arange(5)
    with torch.no_grad():
        want = two(x, pos, two.context_kv(two.fuse(feats), ctx))
        got = three(x, pos, three.context_kv(three.fuse(feats), ctx))
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="missing"):    # a missing middle layer is no growth
        init_from(backbone(3), {k: v for k, v in tensors.items() if not k.startswith("layers.0.")})


def test_a_deeper_peagle_grows_from_shallower_weights(tiny_target, tiny_data):
    """`train --drafter peagle --layers 3 --init shipped` on 2-layer weights: the appended layer's
    output projections are zeroed on loading (P-EAGLE's fresh layers are not the identity), so
    the grown head drafts what the shipped one did; the trainer builds the depth asked for."""
    from argparse import Namespace

    from specviz.drafters.peagle import PEagleHead
    from specviz.train.heads import peagle

    vocab = torch.arange(100, 300)
    torch.manual_seed(0)
    two = PEagleHead(tiny_target, vocab, layers=2).eval()
    tensors = two.state_dict()
    three = peagle(tiny_target, Namespace(layers=3, shipped_vocab=vocab, data=str(tiny_data))).module
    assert len(three.layers) == 3
    init_from(three.eval(), tensors)
    g, emb = torch.randn(1, 4, tiny_target.hidden), torch.randn(1, 4, tiny_target.hidden)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    with torch.no_grad():
        torch.testing.assert_close(three(g, emb, torch.arange(4), mask=mask)[1],
                                   two(g, emb, torch.arange(4), mask=mask)[1])


def test_a_deeper_draft_model_grows_from_shallower_weights(tiny_target, tiny_data):
    """`train --drafter draft --layers 4 --init shipped` on 2-layer weights: the appended HF Llama
    layers start as the identity, so the grown draft model drafts what the shipped one did; a
    fresh deeper one starts from evenly spaced target layers."""
    from argparse import Namespace

    from specviz.drafters.draft import DraftModel
    from specviz.train import init
    from specviz.train.draft import draft

    vocab = torch.arange(100, 300)
    two = init.draft_model(DraftModel(tiny_target, vocab), tiny_target)
    with torch.no_grad():
        for p in two.lm.model.layers.parameters():
            p.add_(0.01 * torch.randn_like(p))      # trained: no longer the target's layers
    tensors = two.shipped()
    four = draft(tiny_target, Namespace(layers=4, shipped_vocab=vocab, data=str(tiny_data)))
    assert len(four.module.lm.model.layers) == 4
    last = tiny_target.n_layers - 1
    assert four.module.source_layers == init.layers_from(tiny_target.n_layers, 4)
    assert four.module.source_layers[0] == 0 and four.module.source_layers[-1] == last
    assert init.layers_from(tiny_target.n_layers, 2) == [0, last]
    init_from(four.export_root, tensors)
    tokens = torch.randint(100, 300, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(four.module.eval()(tokens), two.eval()(tokens))


def test_fine_tuning_the_draft_model_loads_its_lm(tiny_target, tiny_data):
    """The draft LM ships its inner LlamaForCausalLM's keys (`export_root`); they load back."""
    from specviz.drafters.draft import DraftModel
    from specviz.train import init
    from specviz.train.draft import DraftTrainable
    vocab = D.TrainData(tiny_data).vocab_by_mass(512, tiny_target.vocab)
    tr = DraftTrainable(init.draft_model(DraftModel(tiny_target, vocab), tiny_target))
    tensors, _ = tr.export()
    tensors.pop("vocab_ids")
    fresh = DraftTrainable(DraftModel(tiny_target, vocab))
    init_from(fresh.export_root, tensors)
    assert tensors and set(tensors) <= set(fresh.export_root.state_dict())
    assert all(torch.equal(tensors[k], v) for k, v in fresh.export_root.state_dict().items()
               if k in tensors)


def test_drafters_import_nothing_from_train():
    """specviz/drafters/ is inference only: training lives in specviz/train/ (issue 19)."""
    import ast
    from pathlib import Path
    import specviz.drafters
    bad = []
    for f in sorted(Path(specviz.drafters.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{f.name}: {n}" for n in names if n.startswith("specviz.train")]
    assert not bad, bad


def test_greedy_mix_moves_label_mass_onto_the_greedy_token():
    """`--greedy-mix λ`: labels (1-λ)·p + λ·onehot(argmax) sum to 1; a row whose greedy token lies
    outside the draft vocabulary (probability 0 after to_draft) keeps p; λ = 0 is p itself."""
    from specviz.train.distill import target_probs, with_greedy
    p = torch.tensor([[0.5, 0.3, 0.1], [0.0, 0.6, 0.2]])
    got = with_greedy(p, 0.5)
    torch.testing.assert_close(got[0], torch.tensor([0.5 * 5 / 9 + 0.5, 0.5 * 3 / 9, 0.5 * 1 / 9]))
    torch.testing.assert_close(got[1], target_probs(p[1:])[0])
    torch.testing.assert_close(got.sum(-1), torch.ones(2))
    assert with_greedy(p, 0.0) is p


@pytest.mark.parametrize("argv", [["--drafter", "eagle3", "--position-decay", "3"],
                                  ["--drafter", "dflash-b16", "--ce-weight", "0.5"],
                                  ["--drafter", "dspark", "--ce-weight", "1.5"],
                                  ["--drafter", "mtp", "--layers", "3"],
                                  ["--drafter", "dflash-b16", "--ttt-steps", "5"],
                                  ["--drafter", "peagle", "--ttt-steps", "3"],
                                  ["--drafter", "eagle3", "--greedy-mix", "1.5"],
                                  ["--drafter", "eagle3", "--ema", "1"],
                                  ["--drafter", "eagle3", "--draft-vocab", "10"],
                                  ["--drafter", "nope"],
                                  ["--build-data", "--feature-batch", "-1"]])
def test_bad_options_are_refused_before_the_target_loads(argv, monkeypatch, capsys):
    from specviz.train import cli

    def no_target(args):
        raise AssertionError("the target was loaded before the options were checked")
    monkeypatch.setattr(cli, "embedded_target", no_target)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_moving_average_of_the_weights_is_kept_resumed_and_shipped(tiny_target, tiny_data,
                                                                      tmp_path):
    """`ema`: the average starts at the starting weights, moves by (1 - decay) towards each
    step's weights, survives a resume through the checkpoint, and is what ships; the training
    trajectory itself is the run's without an average."""
    from specviz.drafters import eagle3
    tr, data = make(tiny_target, tiny_data)
    trained = lambda m: {k: p.detach().clone() for k, p in m.named_parameters() if p.requires_grad}
    start = trained(tr.module)
    cfg = TrainConfig("eagle3", steps=1, batch_size=2, seq_len=16, lr=3e-3, warmup=1,
                      eval_every=100, eval_batches=1, out_dir=str(tmp_path / "ck"), ema=0.75)
    with weights.use(tmp_path):
        train(tr, data, cfg, tiny_target)
        w1 = trained(tr.module)             # the module keeps its own weights, not the average
        ck = load_file(str(tmp_path / "ck" / "eagle3" / "ckpt.safetensors"))
        for k in start:
            assert torch.allclose(ck[f"ema/{k}"], 0.75 * start[k] + 0.25 * w1[k], atol=1e-6)
            assert torch.equal(ck[f"param/{k}"], w1[k]) and not torch.equal(w1[k], start[k])
        shipped = eagle3.load_head(tiny_target).state_dict()
        k = next(k for k in start if k in shipped and start[k].ndim == 2)
        assert torch.allclose(shipped[k].float(), ck[f"ema/{k}"], atol=2e-2)   # shipped as bf16
        assert not torch.allclose(shipped[k].float(), w1[k], atol=1e-4)
        train(tr, data, replace(cfg, steps=2, resume=True, ship=False))
        w2 = trained(tr.module)
        ck2 = load_file(str(tmp_path / "ck" / "eagle3" / "ckpt.safetensors"))
        assert torch.allclose(ck2[f"ema/{k}"], 0.75 * ck[f"ema/{k}"] + 0.25 * w2[k], atol=1e-6)
    plain, _ = make(tiny_target, tiny_data)   # the same run without an average takes the same steps
    train(plain, data, replace(cfg, steps=2, ema=0.0, ship=False, out_dir=str(tmp_path / "p")))
    assert all(torch.allclose(p, w2[n], atol=1e-6) for n, p in trained(plain.module).items())
    with pytest.raises(ValueError, match="decay"):
        train(plain, data, replace(cfg, ema=1.0, ship=False, out_dir=str(tmp_path / "q")))
