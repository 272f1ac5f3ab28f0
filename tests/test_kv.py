"""Tree attention and KV-cache surgery of the Target wrapper, against plain recomputation.

Boundary: `models.target.Target` on the tiny random Llama (fp32, CPU), in sdpa, eager and
specviz's grouped sdpa attention. A tree forward (additive mask, positions past + depth) must give every node the
logits (and features) of a causal forward over its root-to-node path; after `keep` (tree
compaction to a possibly non-contiguous path) or `crop` (rollback), the next logits must equal
those of a fresh forward over the accepted sequence; and the decode loop, fed a tree whose
accepted paths skip nodes, reproduces plain greedy decoding. Tolerance 1e-5.
"""
from __future__ import annotations

import copy

import pytest
import torch

from specviz import events as ev
from specviz.engine import decode
from specviz.engine.decode import GenSettings
from specviz.engine.tree import DraftTree, after_chain, paths
from specviz.models.kernels import GROUPED_SDPA, use_grouped_sdpa
from specviz.models.target import Target

ATOL = 1e-5
PROMPT = [812, 3304, 17, 906, 44, 2391, 5]

#          0
#       /  |  \
#      1   2   3
#     / \   \
#    4   5   6
#    |       |
#    7       8
TREE = DraftTree([PROMPT[-1], 101, 202, 303, 404, 505, 606, 707, 808],
                 [-1, 0, 0, 0, 1, 1, 2, 4, 6])


@pytest.fixture(scope="module", params=["sdpa", "eager", GROUPED_SDPA])
def tt(request, tiny_target) -> Target:
    """The tiny target with the attention implementation under test (a private copy, so the
    shared session fixture is left as it was). Its 4 query heads share 2 key/value heads, so
    GROUPED_SDPA's grouped path runs for every masked multi-token forward."""
    model = copy.deepcopy(tiny_target.model)
    model.set_attn_implementation("eager" if request.param == "eager" else "sdpa")
    if request.param == GROUPED_SDPA:
        use_grouped_sdpa(model)
    assert model.config._attn_implementation == request.param
    return Target(model, tiny_target.tokenizer, f"tiny-{request.param}")


def fresh(t: Target, tokens: list[int], taps: tuple[int, ...] = ()):
    """Logits (and taps) of the last position of a causal forward over tokens from scratch."""
    out = t.forward(tokens, t.new_cache(), taps=taps)
    return out.logits[-1], {k: v[-1] for k, v in out.taps.items()}


def prefilled(t: Target):
    cache = t.new_cache()
    t.forward(PROMPT[:-1], cache)
    return cache


def node_path(parents: list[int], i: int) -> list[int]:
    """Node ids from depth 1 down to node i (empty for the root, already in PROMPT)."""
    path = []
    while i > 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def test_tree_forward_matches_per_path_causal_forwards(tt):
    cache = prefilled(tt)
    past = Target.cache_len(cache)
    taps = (2, tt.n_layers)
    out = tt.forward(TREE.tokens, cache, parents=TREE.parents, taps=taps)
    assert out.logits.shape == (len(TREE), tt.vocab)
    assert Target.cache_len(cache) == past + len(TREE)
    for i in range(len(TREE)):
        seq = PROMPT + [TREE.tokens[j] for j in node_path(TREE.parents, i)]
        want, want_taps = fresh(tt, seq, taps)
        torch.testing.assert_close(out.logits[i], want, atol=ATOL, rtol=0, msg=f"node {i}")
        for k in taps:
            torch.testing.assert_close(out.taps[k][i], want_taps[k], atol=ATOL, rtol=0)


def test_prompt_and_tree_in_one_forward(tt):
    """The first verify of a tree drafter carries the prompt as the tree's stem: every node
    still gets its root-to-node path's logits, and the cache holds prompt + tree."""
    cache = tt.new_cache()
    stem = PROMPT[:-1]
    out = tt.forward(stem + TREE.tokens, cache, parents=after_chain(len(stem), TREE.parents),
                     logits_for=len(TREE))
    assert out.logits.shape == (len(TREE), tt.vocab)
    assert Target.cache_len(cache) == len(stem) + len(TREE)
    for i in range(len(TREE)):
        seq = PROMPT + [TREE.tokens[j] for j in node_path(TREE.parents, i)]
        torch.testing.assert_close(out.logits[i], fresh(tt, seq)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("grouped", [False, True])
def test_grouped_sdpa_keeps_heads_grouped(tiny_target, monkeypatch, grouped):
    """A masked multi-token forward (a tree after a cached prefix) attends with enable_gqa under
    grouped sdpa, where transformers' sdpa copies keys/values per group first."""
    model = copy.deepcopy(tiny_target.model)
    model.set_attn_implementation("sdpa")
    t = Target(use_grouped_sdpa(model) if grouped else model, tiny_target.tokenizer, "tiny")
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(k.get("enable_gqa", False)) or sdpa(*a, **k))
    cache = prefilled(t)
    calls.clear()
    t.forward(TREE.tokens, cache, parents=TREE.parents)
    assert calls == [grouped] * t.n_layers


def test_tree_mask_matters(tt):
    """The same tokens run as a causal chain give different logits at a sibling: the test above
    would notice a mask that is silently ignored."""
    chain = tt.forward(TREE.tokens, prefilled(tt)).logits
    tree = tt.forward(TREE.tokens, prefilled(tt), parents=TREE.parents).logits
    assert (chain[2] - tree[2]).abs().max() > 1e-3
    torch.testing.assert_close(chain[1], tree[1], atol=ATOL, rtol=0)   # node 1 sees the same


@pytest.mark.parametrize("path", [p for p in paths(TREE.parents)] + [[0, 2], [0], [0, 1]])
def test_keep_compacts_to_accepted_path(tt, path):
    cache = prefilled(tt)
    past = Target.cache_len(cache)
    tt.forward(TREE.tokens, cache, parents=TREE.parents)
    Target.keep(cache, past, path)
    assert Target.cache_len(cache) == past + len(path)
    accepted = PROMPT + [TREE.tokens[i] for i in path[1:]]
    nxt = 4242
    got = tt.forward([nxt], cache).logits[-1]
    torch.testing.assert_close(got, fresh(tt, accepted + [nxt])[0], atol=ATOL, rtol=0)


def test_crop_rolls_back_a_chain(tt):
    cache = prefilled(tt)
    past = Target.cache_len(cache)
    draft = [PROMPT[-1], 11, 12, 13, 14, 15]
    tt.forward(draft, cache)
    Target.crop(cache, past + 3)                    # root + 2 accepted drafts
    assert Target.cache_len(cache) == past + 3
    Target.crop(cache, past + 5)                    # cropping to a longer length is a no-op
    assert Target.cache_len(cache) == past + 3
    got = tt.forward([99], cache).logits[-1]
    torch.testing.assert_close(got, fresh(tt, PROMPT + [11, 12, 99])[0], atol=ATOL, rtol=0)


def test_several_tree_steps_stay_exact(tt):
    """Three draft -> verify -> compact rounds, as the decode loop does them: the committed
    sequence's next logits always equal a fresh forward's."""
    cache = prefilled(tt)
    committed = list(PROMPT)
    for step, path in enumerate([[0, 2, 6, 8], [0, 3], [0, 1, 5]]):
        tree = DraftTree([committed[-1], *(t + 1000 * step for t in TREE.tokens[1:])], TREE.parents)
        past = Target.cache_len(cache)
        assert past == len(committed) - 1
        out = tt.forward(tree.tokens, cache, parents=tree.parents)
        # the tree's own logits at the last accepted node are the committed sequence's
        committed += [tree.tokens[i] for i in path[1:]]
        torch.testing.assert_close(out.logits[path[-1]], fresh(tt, committed)[0], atol=ATOL, rtol=0)
        Target.keep(cache, past, path)
        committed.append(int(out.logits[path[-1]].argmax()))
    got = tt.forward([committed[-1]], cache).logits[-1]
    torch.testing.assert_close(got, fresh(tt, committed)[0], atol=ATOL, rtol=0)


class OracleTreeDrafter:
    """Knows the target's greedy continuation `ref`; drafts root -> [wrong, right -> [wrong,
    right -> right]], so every accepted path skips nodes and the loop must compact the cache."""

    taps = ()

    def __init__(self, prompt: list[int], ref: list[int], vocab: int):
        self.prompt, self.ref, self.vocab = prompt, ref, vocab

    def start(self, prompt_ids, feats):
        return {"n": len(prompt_ids)}

    def draft(self, state, root, sp, generator) -> DraftTree:
        i = state["n"] - len(self.prompt)
        right = self.ref[i:i + 3]
        wrong = [(t + 1) % self.vocab for t in right]
        return DraftTree([root, wrong[0], right[0], wrong[1], right[1], right[2]],
                         [-1, 0, 0, 2, 2, 4])

    def commit(self, state, tokens, feats):
        state["n"] += len(tokens)

    def cache_len(self, state):
        return None


def test_decode_loop_with_tree_compaction_equals_ar(tt, monkeypatch):
    def new_tokens(events):
        return [t for e in events if isinstance(e, ev.Accepted) for t in e.new_tokens]

    n = 10
    ref = new_tokens(decode.run(tt, PROMPT, GenSettings(max_new_tokens=n + 3)))
    drafter = OracleTreeDrafter(PROMPT, ref, tt.vocab)
    forwards = []
    monkeypatch.setattr(tt, "forward",
                        lambda *a, **k: forwards.append(1) or Target.forward(tt, *a, **k))
    events = list(decode.run(tt, PROMPT, GenSettings(max_new_tokens=n), drafter))
    assert len(forwards) == 3       # one per step: the prompt rides along with the first tree
    assert new_tokens(events) == ref[:n]
    assert [e.path for e in events if isinstance(e, ev.Accepted)] == [[0, 2, 4, 5]] * 2 + [[0, 2]]
    first_kv = next(e for e in events if isinstance(e, ev.KVUpdated))
    past = len(PROMPT) - 1
    assert first_kv.kept == [past + i for i in (0, 2, 4, 5)] and first_kv.target_after == past + 4
