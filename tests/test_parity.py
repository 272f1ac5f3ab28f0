"""Train/inference parity for every learned drafter (issue 19): on one small sequence, the
training forward (the one each Trainable's loss and evaluation use) and the engine's drafting
give the same next-token distributions at the same positions.

The engine side drafts with temperature 1 (so every draft position returns its q row) after
the prefill the engine does (`engine.decode.run`: target features of prompt[:-1], root =
prompt[-1]); the training side then teacher-forces the tokens the engine drafted, on a batch
laid out as `data.TrainData` cuts it (tokens, h{tap} target features, valid, loss_mask). The
drafters are tiny random ones on the tiny random target, with every weight perturbed so that no
path (context attention, position, mask) is silently the identity.
"""
from __future__ import annotations

import pytest
import torch

from specviz.drafters.dflash import BlockBackbone, DFlashDrafter
from specviz.drafters.draft import DraftLMDrafter, DraftModel, DraftSettings
from specviz.drafters.dspark import DSparkDrafter, DSparkModel, DSparkSettings
from specviz.drafters.eagle import Eagle1Head, Eagle2Settings, EagleDrafter
from specviz.drafters.eagle3 import Eagle3Drafter, Eagle3Head, Eagle3Settings
from specviz.drafters.layers import LayerShape
from specviz.drafters.mtp import MtpDrafter, MtpModule
from specviz.drafters.peagle import PEagleDrafter, PEagleHead, PEagleSettings
from specviz.engine.sampling import SamplingParams
from specviz.models.masks import depths
from specviz.train import init
from specviz.train.blocks import BlockTrainable, block_hidden
from specviz.train.distill import head_logits
from specviz.train.draft import DraftTrainable
from specviz.train.heads import Eagle1Trainable, Eagle3Trainable, PEagleTrainable
from specviz.train.mtp import MtpTrainable
from specviz.train.unroll import unroll

PROMPT = "The quick brown fox jumps over the lazy dog because"
SP = SamplingParams(temperature=1.0)
TAPS = (1, 2, 3)
# exact maths in fp32: training forwards outside bf16 autocast and unpacked drafters alike
TOL = 2e-5


def vocab_with(ids: list[int], n: int = 2048) -> torch.Tensor:
    """A sorted draft vocabulary holding `ids` (so teacher-forced tokens are in it)."""
    rest = torch.randperm(49152, generator=torch.Generator().manual_seed(0))[:n]
    return torch.unique(torch.cat([rest, torch.tensor(ids)]))


def perturb(module: torch.nn.Module, seed: int, std: float = 0.05) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * std)
    return module.eval()


def engine_rows(t, drafter, prompt: list[int], seed: int = 0):
    """Draft once as the engine does after prefill: (drafted tokens, their q rows [n, V])."""
    feats = t.forward(prompt[:-1], t.new_cache(), taps=drafter.taps).taps if drafter.taps else {}
    state = drafter.start(list(prompt), feats)
    tree = drafter.draft(state, prompt[-1], SP, torch.Generator().manual_seed(seed))
    return tree.tokens[1:], torch.stack(tree.q_rows[1:])


def batch_of(t, tokens: list[int], taps) -> dict:
    """A training batch of one sequence, as TrainData.batch gives it (fp32 features)."""
    with torch.inference_mode():
        o = t.model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    b = {"tokens": torch.tensor([tokens]), "valid": torch.ones(1, len(tokens)),
         "loss_mask": torch.ones(1, len(tokens))}
    for k in taps:
        h = o.last_hidden_state if k == t.n_layers else o.hidden_states[k]
        b[f"h{k}"] = h.float().clone()
    return b


def assert_same(train_logits: torch.Tensor, vocab: torch.Tensor, rows: torch.Tensor):
    """train_logits [n, Vd] over the draft vocabulary vs the engine's q rows [n, V]."""
    p_train = torch.softmax(train_logits.float(), -1)
    p_engine = rows[:, vocab]
    assert torch.allclose(p_engine.sum(-1), torch.ones(len(rows)), atol=1e-4)
    err = (p_train - p_engine).abs().max().item()
    assert err < TOL, f"train vs engine probabilities differ by {err:.2e}"
    assert torch.equal(p_train.argmax(-1), p_engine.argmax(-1))


@pytest.fixture(scope="module")
def prompt(tiny_target):
    return tiny_target.encode(PROMPT)[:12]


# --- feature heads: the training-time unroll vs fh.chain / the P-EAGLE block -----------------
@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_feature_head_chain(tiny_target, prompt, name):
    t, L = tiny_target, len(prompt) - 1
    torch.manual_seed(1)
    make = {"eagle1": Eagle1Head, "eagle3": Eagle3Head}[name]
    head = make(t, vocab_with(prompt))
    trainable = {"eagle1": Eagle1Trainable, "eagle3": Eagle3Trainable}[name](head)
    perturb(head, 2)
    gamma = 4
    # Eagle3Drafter in chain mode only calls fh.chain, the chain drafting of every feature head
    drafter = Eagle3Drafter(head, Eagle3Settings(mode="chain", gamma=gamma))
    toks, rows = engine_rows(t, drafter, prompt)
    batch = batch_of(t, prompt + toks[:-1], trainable.taps)
    with torch.no_grad():
        steps = unroll(trainable.module, batch, gamma)
    # chain i = L - 1 (f_{L-1} with the root) at step j predicts token L + 1 + j
    assert_same(torch.stack([lg[0, L - 1] for _, lg in steps]), head.vocab_ids, rows)


@pytest.mark.parametrize("name", ["eagle2", "eagle3"])
def test_feature_head_tree(tiny_target, prompt, name):
    """Every node of an EAGLE-2 dynamic tree (tree attention mask, depth positions) has the
    probability the training unroll, teacher-forced along the node's path, gives its token."""
    t, L = tiny_target, len(prompt) - 1
    torch.manual_seed(1)
    if name == "eagle2":
        head = Eagle1Head(t, vocab_with(prompt))
        drafter = EagleDrafter(head, Eagle2Settings(top_k=3, depth=3, total_tokens=22,
                                                    auto_budget=False))
    else:
        head = Eagle3Head(t, vocab_with(prompt))
        drafter = Eagle3Drafter(head, Eagle3Settings(top_k=3, depth=3, total_tokens=22,
                                                     auto_budget=False))
    perturb(head, 8)
    feats = t.forward(prompt[:-1], t.new_cache(), taps=head.taps).taps
    tree = drafter.draft(drafter.start(list(prompt), feats), prompt[-1], SamplingParams(), None)
    assert max(depths(tree.parents)) == 3 and len(tree.tokens) == 22   # every recorded node
    for i in range(1, len(tree.tokens)):
        path = [i]
        while tree.parents[path[-1]] > 0:
            path.append(tree.parents[path[-1]])
        toks = [tree.tokens[j] for j in reversed(path)]
        batch = batch_of(t, prompt + toks[:-1], head.taps)
        with torch.no_grad():
            logits = unroll(head, batch, len(toks))[-1][1][0, L - 1]
        p = torch.softmax(logits.float(), -1)[torch.searchsorted(head.vocab_ids, toks[-1])]
        assert abs(float(p) - tree.confidence[i]) < TOL, f"node {i}"


def test_peagle(tiny_target, prompt):
    t, L = tiny_target, len(prompt) - 1
    torch.manual_seed(1)
    head = PEagleHead(t, vocab_with(prompt))
    trainable = PEagleTrainable(head, k=4)
    perturb(head, 3)
    drafter = PEagleDrafter(head, PEagleSettings(k=4, auto_budget=False))
    toks, rows = engine_rows(t, drafter, prompt)
    batch = batch_of(t, prompt + toks[:-1], trainable.taps)
    with torch.no_grad():
        steps = trainable.unrolled(batch, trainable.steps)
    assert_same(torch.stack([lg[0, L - 1] for _, lg in steps]), head.vocab_ids, rows)


def test_draft_model(tiny_target, prompt):
    t, L = tiny_target, len(prompt) - 1
    torch.manual_seed(1)
    model = init.draft_model(DraftModel(t, vocab_with(prompt)), t)
    trainable = DraftTrainable(model)
    perturb(model, 4)
    drafter = DraftLMDrafter(model, DraftSettings(gamma=4, min_confidence=0.0, auto_budget=False))
    toks, rows = engine_rows(t, drafter, prompt)
    assert len(toks) == 4
    with torch.no_grad():
        logits = trainable.module(torch.tensor([prompt + toks[:-1]]))[0]   # row t -> token t+1
    assert_same(logits[L:L + 4], model.vocab_ids, rows)


# --- MTP: the unrolled training steps vs the reused module -------------------------------------
def test_mtp(tiny_target, prompt):
    t, L = tiny_target, len(prompt) - 1
    torch.manual_seed(1)
    module = init.mtp_module(MtpModule(LayerShape.of(t), vocab_with(prompt), tap=t.n_layers), t)
    perturb(module, 5)
    gamma = 3
    trainable = MtpTrainable(t, module, steps=gamma)
    drafter = MtpDrafter(t, module, gamma)
    toks, rows = engine_rows(t, drafter, prompt)
    batch = batch_of(t, prompt + toks, trainable.taps)
    with torch.no_grad():
        outs = trainable.unroll(batch)
    # step j at crop index i = L - 1 (h_{L-1} with Emb(root)) predicts token L + j
    logits = torch.stack([head_logits(normed[0, L - 1], trainable.head) for normed, _ in outs])
    assert [int(row[L - 1]) for _, row in outs] == [L + j - 1 for j in range(1, gamma + 1)]
    assert_same(logits, module.vocab, rows)


# --- block drafters: block_hidden (training) vs one block forward over the context cache ------
@pytest.mark.parametrize("size", [4, 8])
def test_dflash(tiny_target, prompt, size):
    t, L = tiny_target, len(prompt) - 1
    torch.manual_seed(1)
    bb = BlockBackbone(LayerShape.of(t), vocab_with(prompt), t.vocab, 2, TAPS)
    init.block_backbone(bb, t)
    perturb(bb, 6, std=0.1)
    trainable = BlockTrainable(t, bb, size, off=1, gamma_w=4.0)
    toks, rows = engine_rows(t, DFlashDrafter(t, bb, size), prompt)
    batch = batch_of(t, prompt + toks, trainable.taps)      # the block's tokens do not matter
    with torch.no_grad():
        h = block_hidden(bb, t.embed, batch, torch.tensor([[L]]), size)[0, 0]
    assert_same(head_logits(h[1:], trainable.head), bb.vocab, rows)


def test_dflash_ignores_context_at_and_after_the_anchor(tiny_target, prompt):
    """The training mask hides positions >= anchor: changing them leaves the block unchanged,
    as at inference, where they are not in the cache yet."""
    t, L, size = tiny_target, len(prompt) - 1, 4
    torch.manual_seed(1)
    bb = perturb(init.block_backbone(BlockBackbone(LayerShape.of(t), vocab_with(prompt), t.vocab, 2,
                                                   TAPS), t), 6, std=0.1)
    a = batch_of(t, prompt + [11, 12, 13], TAPS)
    b = batch_of(t, prompt + [21, 22, 23], TAPS)
    b["h1"][:, L] += 1.0                      # the anchor's own feature is not context either
    with torch.no_grad():
        ha, hb = (block_hidden(bb, t.embed, x, torch.tensor([[L]]), size) for x in (a, b))
        hc = block_hidden(bb, t.embed, a, torch.tensor([[L - 1]]), size)
    assert torch.allclose(ha, hb, atol=1e-6)
    assert not torch.allclose(ha, hc, atol=1e-3)


def test_dspark(tiny_target, prompt):
    t, L, size = tiny_target, len(prompt) - 1, 6
    torch.manual_seed(1)
    m = DSparkModel(LayerShape.of(t), vocab_with(prompt), t.vocab, block=size, n_layers=2,
                    taps=TAPS)
    init.block_backbone(m.backbone, t)
    perturb(m, 7, std=0.1)
    trainable = BlockTrainable(t, m.backbone, size, off=0, gamma_w=7.0, dspark=m)
    settings = DSparkSettings(block_size=size, threshold=0.0, scheduler="threshold")
    toks, rows = engine_rows(t, DSparkDrafter(t, m, settings), prompt)
    assert len(toks) == size
    batch = batch_of(t, prompt + toks, trainable.taps)
    with torch.no_grad():
        h = block_hidden(m.backbone, t.embed, batch, torch.tensor([[L]]), size)[0, 0]
        _, bias = m.markov(batch["tokens"][0, L:L + size])   # teacher-forced x_{k-1} (k=0: root)
        logits = head_logits(h, trainable.head) + bias
    assert_same(logits, m.backbone.vocab, rows)
