"""Pure tree helpers (specviz.engine.tree) and the n-gram drafter's continuation trie.

Boundary: structure only, no model: depths, children, the ancestor mask, root-to-leaf paths,
the additive 4D mask handed to the target, DraftTree validation and truncation.
"""
from __future__ import annotations

import gc

import pytest
import torch

from specviz.drafters.ngram import (CONTEXT, Evidence, NgramDrafter, NgramSettings, depth_for, prune,
                                    trie)
from specviz.engine.cost import ForwardCost, best_budget
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree, after_chain, children, paths
from specviz.models.masks import additive_mask, ancestor_mask, depths

#         0
#       /   \
#      1     2
#     / \     \
#    3   4     5
#    |
#    6
PARENTS = [-1, 0, 0, 1, 1, 2, 3]


def reference_mask(parents: list[int]) -> torch.Tensor:
    """M[i, j] = j is i or an ancestor of i, by walking up from every node."""
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def test_depths_and_children():
    assert depths(PARENTS) == [0, 1, 1, 2, 2, 2, 3]
    assert children(PARENTS) == [[1, 2], [3, 4], [5], [6], [], [], []]
    assert depths([-1]) == [0]
    assert children([-1]) == [[]]


def test_after_chain_puts_a_stem_under_the_root():
    assert after_chain(3, [-1, 0, 0, 1]) == [-1, 0, 1, 2, 3, 3, 4]
    assert after_chain(0, [-1, 0, 0]) == [-1, 0, 0]
    assert depths(after_chain(2, [-1, 0, 0])) == [0, 1, 2, 3, 3]


def test_ancestor_mask_recurrence():
    m = ancestor_mask(PARENTS)
    assert m.dtype == torch.bool and m.shape == (7, 7)
    assert torch.equal(m, reference_mask(PARENTS))
    # the ALGORITHMS.md §1 recurrence, checked literally
    assert torch.all(m.diagonal())
    assert torch.all(m[:, 0])
    for j, p in enumerate(PARENTS):
        if p >= 0:
            assert torch.all(m[j] >= m[p])
    # siblings and cousins never see each other
    assert not m[2, 1] and not m[1, 2] and not m[5, 3] and not m[6, 4]
    assert m.sum().item() == 1 + 2 + 2 + 3 + 3 + 3 + 4


def test_ancestor_mask_of_a_chain_is_causal():
    assert torch.equal(ancestor_mask([-1, 0, 1, 2]), torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_paths_root_to_leaf():
    assert paths(PARENTS) == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]
    assert paths([-1, 0, 1]) == [[0, 1, 2]]
    assert paths([-1]) == [[0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_additive_mask(dtype):
    past = 3
    m = additive_mask(PARENTS, past, dtype)
    n = len(PARENTS)
    assert m.shape == (1, 1, n, past + n) and m.dtype == dtype
    m = m[0, 0]
    # every node sees the whole committed prefix
    assert torch.all(m[:, :past] == 0)
    # inside the tree block: 0 where the ancestor mask allows, finfo.min elsewhere
    blocked = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype)
    expect = torch.where(reference_mask(PARENTS), torch.zeros((), dtype=dtype), blocked)
    assert torch.equal(m[:, past:], expect)
    assert set(m.unique().tolist()) == {0.0, torch.finfo(dtype).min}


def test_additive_mask_without_past():
    m = additive_mask([-1, 0, 0], 0, torch.float32)[0, 0]
    lo = torch.finfo(torch.float32).min
    assert m.tolist() == [[0, lo, lo], [0, 0, lo], [0, lo, 0]]


@pytest.mark.parametrize("parents, why", [
    ([0, 0], "root"),             # root's parent must be -1
    ([-1, 1], "precede"),         # a node cannot be its own parent
    ([-1, 0, 3, 1], "precede"),   # parent after the child
    ([-1, -1], "precede"),        # two roots
    ([-1, 0, 1, 0], "depth order"),
])
def test_draft_tree_rejects_bad_parents(parents, why):
    with pytest.raises(ValueError, match=why):
        DraftTree(list(range(len(parents))), parents)


def test_draft_tree_rejects_mismatched_lengths_and_empty():
    with pytest.raises(ValueError):
        DraftTree([1, 2, 3], [-1, 0])
    with pytest.raises(ValueError):
        DraftTree([], [])


def test_draft_tree_defaults_and_chain():
    t = DraftTree([9, 8, 7], [-1, 0, 0])
    assert t.q == [None] * 3 and t.q_rows == [None] * 3 and t.confidence == [None] * 3
    c = DraftTree.chain(5, [6, 7, 8], q=[0.5, 0.25, 0.125], confidence=[0.9, 0.8, 0.7])
    assert c.tokens == [5, 6, 7, 8]
    assert c.parents == [-1, 0, 1, 2]
    assert c.depths == [0, 1, 2, 3]
    assert c.q == [None, 0.5, 0.25, 0.125]
    assert c.q_rows == [None] * 4
    assert c.confidence == [None, 0.9, 0.8, 0.7]
    assert len(c) == 4
    r = DraftTree.root_only(3, note="x", fallback=True)
    assert r.tokens == [3] and r.parents == [-1] and r.fallback and r.note == "x"


def test_truncate_keeps_a_prefix():
    rows = [None, torch.tensor([0.5, 0.5]), None, None, torch.tensor([1.0, 0.0]), None, None]
    t = DraftTree(list(range(10, 17)), PARENTS, q=[None, .1, .2, .3, .4, .5, .6], q_rows=rows,
                  confidence=[None, .9, .8, .7, .6, .5, .4], fallback=True, note="n")
    for d, keep in [(0, 1), (1, 3), (2, 6), (3, 7), (9, 7)]:
        s = t.truncate(d)
        assert len(s) == keep
        assert s.tokens == t.tokens[:keep] and s.parents == t.parents[:keep]
        assert s.q == t.q[:keep] and s.confidence == t.confidence[:keep]
        assert len(s.q_rows) == keep and all(a is b for a, b in zip(s.q_rows, rows))
        assert max(s.depths) == min(d, 3)
        assert s.fallback and s.note == "n"


def test_trie_merges_common_prefixes_in_depth_order():
    t = trie(100, [((1, 2, 3), 5), ((1, 2, 4), 3), ((5, 6), 2)], budget=16)
    assert t.tokens[0] == 100 and t.parents[0] == -1
    # same prefix (1, 2) is shared; the set of root-to-leaf token paths is the continuations
    got = {tuple(t.tokens[i] for i in p[1:]) for p in paths(t.parents)}
    assert got == {(1, 2, 3), (1, 2, 4), (5, 6)}
    assert len(t) == 1 + 6
    assert t.depths == sorted(t.depths)
    assert t.depths == [0, 1, 1, 2, 2, 3, 3]
    # best continuation first within each depth (stable sort of insertion order)
    assert t.tokens[1:3] == [1, 5]
    # confidence: the share of the counts passing through each node
    share = {t.tokens[i]: c for i, c in enumerate(t.confidence)}
    assert share[100] is None and share[1] == share[2] == 0.8 and share[3] == 0.5
    assert share[4] == 0.3 and share[5] == share[6] == 0.2


def test_trie_budget_counts_draft_nodes():
    t = trie(0, [((1, 2, 3, 4), 1), ((1, 7, 8), 1), ((9,), 1)], budget=5)
    assert len(t) - 1 == 5
    got = {tuple(t.tokens[i] for i in p[1:]) for p in paths(t.parents)}
    # the best continuation fully, then as much of the next as fits; the third gets nothing
    assert got == {(1, 2, 3, 4), (1, 7)}
    assert trie(0, [((1, 2, 3), 1)], budget=0).tokens == [0]
    assert trie(0, [((1, 2), 1), ((1, 2), 1)], budget=8).tokens == [0, 1, 2]


def test_prune_keeps_the_nodes_worth_their_verify_time():
    """Under a cost model a rare branch is dropped while the common path stays whole; the
    result is still a valid depth-ordered tree whose kept nodes keep their parents."""
    t = trie(0, [((1, 2, 3, 4), 9), ((5, 6), 1)], budget=16)
    cost = ForwardCost([1, 2, 64], [0.040, 0.041, 0.105])      # 1 ms per extra verified token
    pruned = prune(t, [0.9, 0.85, 0.8, 0.75], cost)
    got = {tuple(pruned.tokens[i] for i in p[1:]) for p in paths(pruned.parents)}
    assert got == {(1, 2, 3, 4)}                                 # the 0.1-share branch does not pay
    assert pruned.confidence == [None, 0.9, 0.9, 0.9, 0.9]
    free = ForwardCost([1, 64], [0.040, 0.040])
    assert len(prune(t, [0.9, 0.85, 0.8, 0.75], free)) == len(t)   # free verifies keep everything
    assert prune(t, [0.01] * 4, cost).tokens == [0]              # nothing pays: root only


def test_ngram_store_carries_tokens_across_requests():
    """A finished request's prompt and output join the store when the next request starts,
    even after its state is gone."""
    d = NgramDrafter(NgramSettings(min_expected=0.0))
    first = d.start([1, 2, 3, 4, 5, 6, 7], {})
    d.commit(first, [7, 8, 9], {})        # root 7 and accepted 8, 9 entered the target cache
    del first
    gc.collect()
    second = d.start([40, 41, 5, 6], {})  # root 6 after "5": only the store knows what follows
    tree = d.draft(second, 6, SamplingParams(), None)
    assert tree.tokens == [6, 7, 8, 9] and tree.parents == [-1, 0, 1, 2]
    assert not tree.fallback


def test_ngram_depth_follows_the_survival_curve():
    assert depth_for([0.5, 0.2, 0.05, 0.01], 0.1) == 3       # s_3 < 0.1: the third is drafted
    assert depth_for([0.9] * 8, 0.1) == 8                     # never below: the whole curve
    assert depth_for([0.0], 0.1) == 1
    geometric = lambda a: [a ** i for i in range(1, 17)]       # noqa: E731
    depths = [depth_for(geometric(a / 40), 0.1) for a in range(1, 40)]
    assert depths == sorted(depths)


def test_ngram_evidence_tells_copies_from_misses():
    """Copying is bimodal: a kind whose drafts either fail at once or run to the end keeps a
    high rate for later tokens, so it still drafts deep; the first-token rate falls."""
    ev = Evidence()
    for accepted in (8, 0, 0, 8, 0, 8):
        ev.record(depth=8, accepted=accepted)
    assert (ev.drafts, ev.first, ev.later_tries, ev.later) == (6, 3, 21, 21)
    s = ev.survival(prior_mean=0.5, depth=8)
    assert 0.45 < s[0] < 0.46 and 0.94 < s[1] / s[0] < 0.95   # (3 + 2/3)/8, (21 + 2/3)/23
    assert all(x >= y for x, y in zip(s, s[1:]))
    assert depth_for(s, 0.1) == 8
    miss = Evidence()
    miss.record(depth=4, accepted=1)                              # first accepted, second not
    assert (miss.later_tries, miss.later) == (1, 0)


def test_ngram_depth_under_a_cost_model():
    flat = ForwardCost([1, 2, 64], [0.040, 0.046, 0.046])       # wider verifies are free
    assert best_budget([0.3 ** i for i in range(1, 9)], 0.0, flat) == 8
    steep = ForwardCost([1, 2], [0.040, 0.060])                 # 20 ms per drafted token
    d = NgramDrafter(NgramSettings(min_expected=0.0), cost=steep)
    state = d.start([1, 2, 3, 9, 1, 2], {})
    for n in (1, 2, 3):                                         # weak kinds: 20 failed drafts
        for _ in range(20):
            state.evidence[(CONTEXT, n, False)].record(depth=3, accepted=0)
    tree = d.draft(state, 3, SamplingParams(), None)
    assert tree.fallback and "pays" in tree.note
    sampled = d.draft(state, 3, SamplingParams(temperature=1.0), None)   # no timing under sampling
    assert not sampled.fallback


def test_ngram_keeps_copy_bursts_apart_from_free_text():
    """A kind of match that keeps failing in free text is gated there, yet still drafts right
    after a step that accepted a draft token (inside a copy), where it has its own record."""
    d = NgramDrafter(NgramSettings())
    state = d.start([1, 2, 3, 9, 1, 2], {})
    for n in (1, 2, 3):
        for _ in range(20):
            state.evidence[(CONTEXT, n, False)].record(depth=3, accepted=0)
    assert d.draft(state, 3, SamplingParams(), None).fallback
    state.hot = True
    tree = d.draft(state, 3, SamplingParams(), None)
    assert not tree.fallback and tree.tokens[:2] == [3, 9]
    d.commit(state, [3, 9], {})                  # one draft token accepted: still hot
    assert state.hot and state.evidence[(CONTEXT, 1, True)].first == 1
    d.draft(state, 1, SamplingParams(), None)
    d.commit(state, [1], {})                     # none accepted: cold again
    assert not state.hot


def test_ngram_uses_the_match_kind_that_pays_off():
    """The request's own context is trusted first; once its drafts keep failing, the store's
    continuation (a different kind of match) takes over, drafted only as deep as it is trusted."""
    d = NgramDrafter(NgramSettings(min_expected=0.0))
    first = d.start([1, 2, 3, 4, 5, 6, 7], {})
    d.commit(first, [7, 8, 9, 10, 11], {})
    state = d.start([5, 6, 20, 21, 5, 6], {})     # "5 6" continues as 20 21 here, 7 8 in the store
    tree = d.draft(state, 6, SamplingParams(), None)
    assert tree.tokens[:2] == [6, 20] and "context" in tree.note
    for _ in range(3):                            # three context drafts, none accepted
        state.evidence[(CONTEXT, 2, False)].record(depth=2, accepted=0)
    tree = d.draft(state, 6, SamplingParams(), None)
    assert tree.tokens == [6, 7, 8, 9] and "store" in tree.note   # depth 3 at s_3 = 1/27 < 0.1
