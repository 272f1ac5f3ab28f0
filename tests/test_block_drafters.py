"""MTP, DFlash and DSpark: block layout, the Markov bias, confidences and truncation, and greedy
equality with `ar` (random weights on the tiny target; shipped weights on the real one)."""
from __future__ import annotations

import pytest
import torch

from specviz import events as ev
from specviz import strategies
from specviz.drafters.base import DrafterUnavailable
from specviz.drafters.dflash import BlockBackbone, DFlashDrafter
from specviz.drafters.dspark import DSparkDrafter, DSparkModel, DSparkSettings
from specviz.drafters.layers import LayerShape
from specviz.drafters.mtp import MtpDrafter, MtpModule
from specviz.engine.cost import ForwardCost, prefix_schedule
from specviz.engine.decode import GenSettings, run
from specviz.engine.sampling import SamplingParams
from specviz.train import init
from specviz.train.blocks import block_hidden, block_mask

TINY_TAPS = (1, 2, 3)
TINY_VOCAB = torch.arange(100, 600)


def tiny_backbone(t, layers=2):
    torch.manual_seed(1)
    bb = BlockBackbone(LayerShape.of(t), TINY_VOCAB, t.vocab, layers, TINY_TAPS)
    init.block_backbone(bb, t)
    return bb.eval()


def tiny_dspark(t, block=8):
    torch.manual_seed(2)
    m = DSparkModel(LayerShape.of(t), TINY_VOCAB, t.vocab, block=block, taps=TINY_TAPS)
    init.block_backbone(m.backbone, t)
    torch.nn.init.normal_(m.w2.weight, std=0.5)        # a visible Markov bias
    return m.eval()


def tiny_mtp(t):
    torch.manual_seed(3)
    m = MtpModule(LayerShape.of(t), TINY_VOCAB, tap=t.n_layers)
    init.mtp_module(m, t)
    return m.eval()


def decode(t, prompt, drafter, n=24):
    out, events = [], list(run(t, prompt, GenSettings(max_new_tokens=n), drafter))
    for e in events:
        if isinstance(e, ev.Accepted):
            out += e.new_tokens
    return out, events


def test_block_mask_layout():
    m = block_mask(torch.tensor([[3, 7]]), torch.ones(1, 10, dtype=torch.bool), 4)[0]
    assert m.shape == (8, 10 + 8)
    assert m[:4, :3].all() and not m[:4, 3:10].any()           # block 0: context before anchor 3
    assert m[4:, :7].all() and not m[4:, 7:10].any()
    assert m[:4, 10:14].all() and not m[:4, 14:].any()          # its own rows only, non-causal
    assert m[4:, 14:].all() and not m[4:, 10:14].any()


def test_training_block_equals_inference_block(tiny_target):
    """[anchor, MASK...] at positions a.. over context < a: the batched training forward and the
    drafter's cached forward agree row for row."""
    t = tiny_target
    bb = tiny_backbone(t)
    ids = t.encode("Tell me about volcanoes.")
    feats = t.forward(ids, t.new_cache(), taps=TINY_TAPS).taps
    x = bb.block_input(t.embed, torch.tensor([ids[5]]), 4)[0]
    assert torch.equal(x[0], t.embed.weight[ids[5]]) and torch.equal(x[1], x[3])
    assert torch.equal(x[1], bb.mask_embed.detach())
    batch = {"tokens": torch.tensor([ids]), "valid": torch.ones(1, len(ids))}
    batch |= {f"h{k}": v[None] for k, v in feats.items()}
    with torch.no_grad():
        train_h = block_hidden(bb, t.embed, batch, torch.tensor([[5, 9]]), 4)[0]
    for j, a in enumerate((5, 9)):
        cache = DFlashDrafter(t, bb, 4)
        state = cache.start(ids[:a + 1], {k: v[:a] for k, v in feats.items()})
        assert torch.allclose(cache.block_hidden(state, t.embed, ids[a], 4), train_h[j], atol=1e-5)
        assert cache.cache_len(state) == a


def test_markov_bias_exact(tiny_target):
    """p_k = softmax(U_k + W2 W1[x_prev]) over the draft vocabulary, W1 row "other" for ids
    outside it; the drafter widens to the target vocabulary with -inf elsewhere."""
    t = tiny_target
    m = tiny_dspark(t)
    prev = torch.tensor([150, 599, 40000])
    e, bias = m.markov(prev)
    rows = m.w1.weight[torch.tensor([50, 499, 500])]            # 40000 -> the "other" row
    assert torch.equal(e, rows)
    assert torch.allclose(bias, rows @ m.w2.weight.T, atol=1e-6)
    ids = t.encode("Tell me about volcanoes.")
    feats = t.forward(ids[:-1], t.new_cache(), taps=TINY_TAPS).taps
    logits = {}
    for markov in (True, False):
        d = DSparkDrafter(t, m, DSparkSettings(block_size=8, threshold=0.0, markov=markov))
        state = d.start(ids, feats)
        U = d.head.logits(d.block_hidden(state, t.embed, ids[-1], 8))
        tree = d.draft(d.start(ids, feats), ids[-1], SamplingParams(temperature=1.0),
                       torch.Generator().manual_seed(0))
        logits[markov] = U, tree
    U, tree = logits[True]
    _, first_bias = m.markov(torch.tensor(ids[-1]))
    q_row = tree.q_rows[1]
    expect = torch.softmax(U[0] + first_bias, -1)
    assert torch.allclose(q_row[TINY_VOCAB], expect, atol=1e-5)
    assert q_row[:100].sum() == 0 and q_row[600:].sum() == 0
    assert torch.allclose(logits[False][1].q_rows[1][TINY_VOCAB], torch.softmax(U[0], -1), atol=1e-5)


def confident_dspark(t):
    """A tiny DSpark whose confidence head is biased up (so prefixes are long), a prompt and
    its target features."""
    m = tiny_dspark(t)
    with torch.no_grad():
        m.conf.bias.fill_(2.0)
    ids = t.encode("Write a haiku about rain.")
    return m, ids, t.forward(ids[:-1], t.new_cache(), taps=TINY_TAPS).taps


def test_confidence_prefix_and_truncation(tiny_target):
    t = tiny_target
    m, ids, feats = confident_dspark(t)
    d = DSparkDrafter(t, m, DSparkSettings(block_size=8, threshold=0.6))
    tree = d.draft(d.start(ids, feats), ids[-1], SamplingParams(), None)
    s = tree.schedule
    assert all(0 < c < 1 for c in s.confidence) and len(s.survival) == 8
    assert all(a >= b for a, b in zip(s.survival, s.survival[1:]))
    first_below = next((k for k, a in enumerate(s.survival) if a < 0.6), 8)
    assert s.verify_len == first_below and s.threshold == 0.6
    assert tree.confidence[1:] == s.confidence
    _, events = decode(t, ids, DSparkDrafter(t, m, DSparkSettings(block_size=8, threshold=0.6)), 16)
    steps = [e for e in events if isinstance(e, (ev.ScheduleDecided, ev.Verified))]
    for sched, ver in zip(steps[::2], steps[1::2]):
        assert ver.input_tokens <= sched.verify_len + 1


@pytest.mark.parametrize("kind", ["mtp", "dflash", "dflash-window", "dflash-tree", "dspark",
                                  "dspark-no-markov", "dspark-tree", "dspark-tree-no-markov"])
def test_greedy_equals_ar_random_weights(tiny_target, kind):
    t = tiny_target
    tree = 10 if "tree" in kind else 0
    if kind == "mtp":
        drafter = MtpDrafter(t, tiny_mtp(t), 3)
    elif kind.startswith("dflash"):
        drafter = DFlashDrafter(t, tiny_backbone(t), 8, window=6 if kind.endswith("window") else 0,
                                tree=tree)
    else:
        drafter = DSparkDrafter(t, tiny_dspark(t), DSparkSettings(
            block_size=8, threshold=0.0, markov="no-markov" not in kind, tree=tree))
    for text in ("Write a poem about cats.", "What is 17 + 25?"):
        ids = t.encode(text)
        assert decode(t, ids, drafter, 30)[0] == decode(t, ids, None, 30)[0]


@pytest.mark.parametrize("kind,drafts", [("mtp", 3), ("dflash", 7)])
@pytest.mark.parametrize("cost,all_", [(ForwardCost([1], [0.04]), True),        # width is free
                                       (ForwardCost([1, 2], [0.04, 1.0]), False)])  # 1 s a token
def test_chain_verifies_the_prefix_worth_its_time(tiny_target, kind, drafts, cost, all_):
    """Under greedy decoding with a cost model, mtp and dflash send only the drafts that pay for
    their verify time (all of them when width is free, none when it is dear); either way the
    output is ar's, and every draft carries its draft probability as its confidence."""
    t = tiny_target
    ids = t.encode("What is 17 + 25?")
    drafter = (MtpDrafter(t, tiny_mtp(t), 3, cost) if kind == "mtp"
               else DFlashDrafter(t, tiny_backbone(t), 8, cost=cost))
    out, events = decode(t, ids, drafter, 20)
    assert out == decode(t, ids, None, 20)[0]
    proposed = [e for e in events if isinstance(e, ev.DraftProposed)][1:]   # step 1: no feature yet
    assert proposed and all(len(d.tokens) - 1 == (drafts if all_ else 0) for d in proposed[:-1])
    assert all(0 < c <= 1 for d in proposed for c in d.confidence[1:])


@pytest.mark.parametrize("sid,overrides", [("mtp", {}), ("dflash", {"block_size": 8}),
                                           ("dflash", {}), ("dflash", {"tree": 16}), ("dspark", {}),
                                           ("dspark", {"markov": False}), ("dspark", {"tree": 16})])
def test_shipped_weights_greedy_equals_ar(target, sid, overrides):
    try:
        drafter = strategies.drafter_for(target, sid, strategies.parse_settings(sid, overrides))
    except DrafterUnavailable as exc:
        pytest.skip(str(exc))
    for text in SHIPPED_PROMPTS:
        ids = target.encode(text)
        if text not in _ar:
            _ar[text] = decode(target, ids, None)[0]
        assert decode(target, ids, drafter)[0] == _ar[text]


SHIPPED_PROMPTS = ("Explain what a binary search does.", "Give me two tips for sleeping well.")
_ar: dict[str, list[int]] = {}      # the ar reference, decoded once per prompt


def test_free_run_on_a_sequence_too_short_for_a_block(tiny_target):
    """Calibration walks every held-out sequence; one shorter than a block yields no rows (it
    crashed export once) rather than an error."""
    from specviz.train.blocks import BlockTrainable
    t = tiny_target
    m = tiny_dspark(t)
    tr = BlockTrainable(t, m.backbone, 8, off=0, gamma_w=7.0, dspark=m)
    ids = t.encode("Hi")[:5]
    feats = t.forward(ids, t.new_cache(), taps=TINY_TAPS).taps
    batch = {"tokens": torch.tensor([ids]), "valid": torch.ones(1, len(ids)),
             "loss_mask": torch.ones(1, len(ids))}
    batch |= {f"h{k}": v[None] for k, v in feats.items()}
    with torch.no_grad():
        hits, z = tr.free_run(batch)
    assert hits.shape == (0, 8) and hits.dtype == torch.bool
    assert z.shape == (0, 8)


def test_dspark_loss_mixes_ce_and_l1_by_its_ce_weight(tiny_target):
    """DSpark's training loss is w CE + (1 - w) L1 + BCE (w = `--ce-weight`, published 0.1), on
    a real sequence with the target's own top-4 distributions as labels."""
    from specviz.train.blocks import CE_WEIGHT, BlockTrainable
    t = tiny_target
    m = tiny_dspark(t)
    ids = t.encode("Write a haiku about rain, then explain it.")
    out = t.forward(ids, t.new_cache(), taps=TINY_TAPS)
    top = torch.softmax(out.logits.float(), -1).topk(4, -1)
    batch = {"tokens": torch.tensor([ids]), "valid": torch.ones(1, len(ids)),
             "loss_mask": torch.ones(1, len(ids)), "topk_ids": top.indices[None],
             "topk_p": (top.values / top.values.sum(-1, keepdim=True))[None]}
    batch |= {f"h{k}": v[None] for k, v in out.taps.items()}
    for w in (CE_WEIGHT, 0.7):
        tr = BlockTrainable(t, m.backbone, 8, off=0, gamma_w=7.0, dspark=m, ce_weight=w)
        loss, parts = tr.loss(batch, torch.Generator().manual_seed(1))
        assert parts["l1"].item() > 0 and parts["ce"].item() > 0
        torch.testing.assert_close(loss, w * parts["ce"] + (1 - w) * parts["l1"] + parts["bce"])


def test_hardware_scheduler_under_greedy(tiny_target):
    t = tiny_target
    m, ids, feats = confident_dspark(t)
    steep = ForwardCost([1, 2], [0.010, 0.014])          # 4 ms per verified draft
    d = DSparkDrafter(t, m, DSparkSettings(block_size=8), steep)
    tree = d.draft(d.start(ids, feats), ids[-1], SamplingParams(), None)
    s = tree.schedule
    assert s.threshold is None and "hardware-aware" in s.reason
    assert s.verify_len == prefix_schedule(s.survival, steep)
    # drafting stops at the first draft Algorithm 1 drops: no token is drawn past the cut
    assert len(tree) - 1 == s.verify_len and len(s.survival) == min(s.verify_len + 1, 8)
    sampled = d.draft(d.start(ids, feats), ids[-1], SamplingParams(temperature=1.0),
                      torch.Generator().manual_seed(0))
    assert sampled.schedule.threshold == 0.2              # sampling keeps the threshold rule
