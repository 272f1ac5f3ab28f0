"""The learned drafters of issue 3 (draft, eagle1, eagle2, eagle3, peagle): head forward and
draft-tree shapes on the tiny random target, greedy equality with `ar` through the real decode
loop (random drafter weights), lossless sampling runs, and the shipped weights on the real
target."""
from __future__ import annotations

import pytest
import torch

from specviz import strategies
from specviz.drafters.base import DrafterUnavailable
from specviz.drafters import feature_heads as fh
from specviz.drafters.draft import DraftLMDrafter, DraftModel, DraftSettings
from specviz.drafters.eagle import STATIC_TREE, Eagle1Head, Eagle2Settings, EagleDrafter
from specviz.drafters.eagle3 import Eagle3Drafter, Eagle3Head, Eagle3Settings
from specviz.drafters.layers import widen
from specviz.drafters.peagle import PEagleDrafter, PEagleHead, PEagleSettings
from specviz import events as ev
from specviz.engine.cost import Acceptance, ForwardCost
from specviz.engine.decode import GenSettings, run
from specviz.engine import sampling
from specviz.engine.sampling import SamplingParams
from specviz.train import init
from specviz.train.unroll import unroll_mask

PROMPTS = ["What is the capital of France?", "Write a Python function that adds two numbers."]


DEAR = ForwardCost([1, 2], [0.04, 1.0])


def vocab(n=1024):
    return torch.randperm(49152, generator=torch.Generator().manual_seed(0))[:n].sort().values


@pytest.fixture(scope="module")
def heads(tiny_target):
    torch.manual_seed(1)
    v = vocab()
    return {"eagle1": Eagle1Head(tiny_target, v).eval(),
            "eagle3": Eagle3Head(tiny_target, v).eval(),
            "peagle": PEagleHead(tiny_target, v).eval(),
            "draft": init.draft_model(DraftModel(tiny_target, v), tiny_target).eval()}


def drafters(heads):
    return {
        "eagle1": EagleDrafter(heads["eagle1"], None),
        "eagle2": EagleDrafter(heads["eagle1"], Eagle2Settings(top_k=4, depth=4, total_tokens=12)),
        "eagle3": Eagle3Drafter(heads["eagle3"], Eagle3Settings(top_k=3, depth=5, total_tokens=10)),
        "eagle3-chain": Eagle3Drafter(heads["eagle3"], Eagle3Settings(mode="chain", gamma=4)),
        "peagle": PEagleDrafter(heads["peagle"], PEagleSettings(k=4)),
        "peagle-tree": PEagleDrafter(heads["peagle"], PEagleSettings(k=4, tree=9)),
        "draft": DraftLMDrafter(heads["draft"], DraftSettings(gamma=4, min_confidence=0.0)),
        # a random tiny draft is never 99% sure: the chain stops after its first token
        "draft-stop": DraftLMDrafter(heads["draft"], DraftSettings(gamma=4, min_confidence=0.99)),
        # a verify that costs 25x a plain step: no draft token pays, every step is a plain one
        "draft-dear": DraftLMDrafter(heads["draft"], DraftSettings(gamma=4), DEAR),
    }


def tokens_of(events) -> list[int]:
    return [t for e in events if isinstance(e, ev.Accepted) for t in e.new_tokens]


@pytest.mark.parametrize("name", ["eagle1", "eagle3", "peagle"])
def test_head_forward_shapes(tiny_target, heads, name):
    head = heads[name]
    T = 7
    feats = {k: torch.randn(T, tiny_target.hidden) for k in head.taps}
    g = head.fuse(feats)[None]
    emb = head.embed(torch.randint(0, 1000, (1, T)))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    out, logits, kv = head(g, emb, torch.arange(T), None, mask)
    assert out.shape == (1, T, tiny_target.hidden)
    assert logits.shape == (1, T, len(head.vocab_ids))
    assert kv[0][0].shape[2] == T


def test_draft_tree_shapes(tiny_target, heads):
    ids = tiny_target.encode(PROMPTS[0])
    feats = tiny_target.forward(ids[:-1], tiny_target.new_cache(), taps=(1, 2, 4)).taps
    sp = SamplingParams()
    d = drafters(heads)
    expect = {"eagle1": len(STATIC_TREE) + 1, "eagle2": 12, "eagle3": 10, "eagle3-chain": 5,
              "peagle": 5, "peagle-tree": 10, "draft": 5, "draft-stop": 2, "draft-dear": 1}
    for name, drafter in d.items():
        state = drafter.start(ids, feats)
        tree = drafter.draft(state, ids[-1], sp, None)
        assert len(tree) == expect[name], name
        assert tree.tokens[0] == ids[-1]
        assert ("stopped" in tree.note) == (name in ("draft-stop", "draft-dear"))
        assert max(tree.depths) <= {"eagle2": 4, "eagle3": 5}.get(name, 6)
        if not name.startswith("draft"):   # draft entries are dropped: only committed positions stay cached
            assert drafter.cache_len(state) == len(ids) - 1


@pytest.mark.parametrize("name", ["eagle1", "eagle2", "eagle3", "eagle3-chain", "peagle",
                                  "peagle-tree", "draft", "draft-stop", "draft-dear"])
def test_greedy_equals_ar_tiny(tiny_target, heads, name):
    drafter = drafters(heads)[name]
    for prompt in PROMPTS:
        ids = tiny_target.encode(prompt)
        s = GenSettings(max_new_tokens=16)
        ar = tokens_of(run(tiny_target, ids, s))
        spec = list(run(tiny_target, ids, s, drafter, strategy=name))
        assert tokens_of(spec) == ar, name
        assert spec[-1].target_forwards <= len(ar)


def paths(tree) -> dict[tuple[int, ...], float]:
    """Each drafted node as its token path from the root -> the product of q along it."""
    out = {}
    for i in range(1, len(tree)):
        path, score, j = [], 1.0, i
        while j > 0:
            path.append(tree.tokens[j])
            score *= tree.confidence[j]
            j = tree.parents[j]
        out[tuple(reversed(path))] = score
    return out


def test_dynamic_tree_skips_only_nodes_that_cannot_place(tiny_target, heads, monkeypatch):
    """A tree of the 7 best nodes is the best 7 of the whole expansion (no node ever skipped),
    while the frontier nodes that could no longer place among them were never run."""
    ids = tiny_target.encode(PROMPTS[0])
    torch.manual_seed(2)
    head = Eagle3Head(tiny_target, vocab()).eval()
    head.head_w.mul_(40)            # peaked draft distributions: deep nodes compete for a place
    feats = tiny_target.forward(ids[:-1], tiny_target.new_cache(), taps=head.taps).taps
    start = Eagle3Drafter(head, None).start
    rows = []
    run_nodes = fh.Expander.run
    monkeypatch.setattr(fh.Expander, "run", lambda self, nodes: rows.append(len(nodes))
                        or run_nodes(self, nodes))
    whole = fh.dynamic_tree(head, start(ids, feats), ids[-1], 4, 5, 128)
    assert rows == [4] * 4 and len(whole) == 1 + 4 + 4 * 16     # all recorded, none skipped
    rows.clear()
    best = fh.dynamic_tree(head, start(ids, feats), ids[-1], 4, 5, 8)
    assert sum(rows) < 16 and max(best.depths) >= 3, (rows, best.depths)
    ranked = sorted(paths(whole).items(), key=lambda t: (-t[1], len(t[0])))[:7]
    kept = paths(best)
    assert set(kept) == {p for p, _ in ranked}
    assert all(kept[p] == pytest.approx(q, rel=1e-5) for p, q in ranked)


def test_greedy_pick_is_the_widened_pick(heads):
    head = heads["eagle3"]
    for seed in range(20):
        logits = torch.randn(len(head.vocab_ids), generator=torch.Generator().manual_seed(seed))
        fast = fh.pick(head, logits, SamplingParams(), None)
        full = sampling.pick(widen(logits, head.vocab_ids, head.vocab), SamplingParams(), None)
        assert fast[:3] == full[:3] and fast[3] == pytest.approx(full[3], rel=1e-6)


class Trusting(Acceptance):
    def __call__(self, q: float) -> float:
        return 0.9


def test_draft_chain_follows_the_cost_model(tiny_target, heads):
    ids = tiny_target.encode(PROMPTS[0])
    # verifying more tokens costs nothing, and a verify is so slow that this machine's measured
    # drafting time (noisy under load) never decides whether one more token pays
    free = ForwardCost([1], [10.0])
    for cost, n in [(free, 4), (DEAR, 0)]:
        drafter = DraftLMDrafter(heads["draft"], DraftSettings(gamma=4, min_confidence=0.99), cost)
        state = drafter.start(ids, None)
        state.acceptance = Trusting()                    # this request's drafts were good so far
        tree = drafter.draft(state, ids[-1], SamplingParams(), None)
        assert len(tree) == 1 + n                        # min_confidence is for no cost model
        assert ("verifying the first 0" in tree.note) == (n == 0)
        # under sampling the cost model is off: the chain stops at min_confidence as before
        tree = drafter.draft(drafter.start(ids, None), ids[-1],
                             SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
        assert len(tree) == 2 and "confidence <" in tree.note


def test_peagle_verifies_the_prefix_worth_its_time(tiny_target, heads):
    ids = tiny_target.encode(PROMPTS[0])
    feats = tiny_target.forward(ids[:-1], tiny_target.new_cache(), taps=heads["peagle"].taps).taps
    free = ForwardCost([1], [0.04])
    for cost, n in [(free, 4), (DEAR, 0), (None, 4)]:
        drafter = PEagleDrafter(heads["peagle"], PEagleSettings(k=4), cost)
        state = drafter.start(ids, feats)
        state.acceptance = Trusting()
        tree = drafter.draft(state, ids[-1], SamplingParams(), None)
        assert len(tree) == 1 + n and ("verifying the first 0" in tree.note) == (n == 0)
        # under sampling the cost model is off: all k tokens go to the target
        sampled = drafter.draft(drafter.start(ids, feats), ids[-1],
                                SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
        assert len(sampled) == 5


@pytest.mark.parametrize("name", ["eagle2", "eagle3-chain", "peagle", "peagle-tree", "draft"])
def test_sampling_runs(tiny_target, heads, name):
    drafter = drafters(heads)[name]
    ids = tiny_target.encode(PROMPTS[1])
    out = list(run(tiny_target, ids, GenSettings(max_new_tokens=12, temperature=1.0, seed=3),
                   drafter, strategy=name))
    assert out[-1].new_tokens == 12


def test_unroll_mask():
    m = unroll_mask(3, 2)
    assert m.shape == (3, 9)
    assert m[2, :3].all() and not m[0, 1] and m[1, 4] and not m[1, 3] and m[2, 8]


@pytest.fixture(scope="module")
def ar_real(target):
    """`ar` tokens of the real target on PROMPTS (24 new tokens), computed once."""
    s = GenSettings(max_new_tokens=24)
    return {p: tokens_of(run(target, target.encode(p), s)) for p in PROMPTS}


@pytest.mark.parametrize("sid,overrides", [("draft", {}), ("eagle1", {}), ("eagle2", {}),
                                           ("eagle3", {}), ("peagle", {}), ("peagle", {"tree": 16})])
def test_shipped_weights_greedy_equal_ar(target, ar_real, sid, overrides):
    try:
        drafter = strategies.drafter_for(target, sid, strategies.parse_settings(sid, overrides))
    except DrafterUnavailable as exc:
        pytest.skip(str(exc))
    for prompt in PROMPTS:
        spec = list(run(target, target.encode(prompt), GenSettings(max_new_tokens=24), drafter,
                        strategy=sid))
        assert tokens_of(spec) == ar_real[prompt], sid
        assert spec[-1].mean_accepted_length > 1.0


def test_missing_weights_message(tiny_target, tmp_path, monkeypatch):
    from specviz.drafters import weights
    with pytest.raises(DrafterUnavailable, match="python -m specviz train --drafter eagle3"):
        weights.load("eagle3", tiny_target.fingerprint, assets=tmp_path)
    weights.save("eagle3", {"w": torch.ones(2)}, {}, "another", assets=tmp_path)
    with pytest.raises(DrafterUnavailable, match="another target"):
        weights.load("eagle3", tiny_target.fingerprint, assets=tmp_path)
