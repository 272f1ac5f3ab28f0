"""Draft trees from one forward's per-position distributions (drafters/block_tree.py): the best-
first selection is the brute-force best set, the tree is valid and depth-ordered, the verify
budget follows the cost model, and the drafters' `tree` setting drafts real trees of
deterministic nodes (the §0 rule that tests/test_sampling_stats.py proves lossless)."""
from __future__ import annotations

import math

import pytest
import torch

from specviz import strategies
from specviz.drafters import block_tree
from specviz.drafters.dflash import DFlashDrafter
from specviz.drafters.dspark import DSparkDrafter, DSparkSettings
from specviz.engine.cost import Acceptance, ForwardCost
from specviz.engine.sampling import SamplingParams
from test_block_drafters import TINY_TAPS, tiny_backbone, tiny_dspark


def brute_force(children, depth: int, width: int) -> dict[tuple[int, ...], float]:
    """Every path of at most `depth` draft ids through each node's top `width` children ->
    its cumulative log q."""
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), 0.0)]
    for d in range(1, depth + 1):
        nxt = []
        for path, score in frontier:
            vals, ids = children(d, path[-1] if path else None)
            for v, i in list(zip(vals, ids))[:width]:
                out[path + (i,)] = score + v
                nxt.append((path + (i,), score + v))
        frontier = nxt
    return out


def ranked_paths(ranked) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for tok, parent, _ in ranked:
        assert parent < len(paths)                   # parents come first
        paths.append((paths[parent] if parent >= 0 else ()) + (tok,))
    return paths


def conditional(logq: torch.Tensor, markov: torch.Tensor, width: int):
    """Children whose log q depends on the parent (DSpark's Markov head): row depth-1 plus the
    parent's bias row."""
    def children(depth, parent):
        row = logq[depth - 1] + (0 if parent is None else markov[parent])
        v, ix = torch.log_softmax(row, -1).topk(min(width, row.shape[-1]))
        return v.tolist(), ix.tolist()
    return children


@pytest.mark.parametrize("kind", ["per_position", "conditional"])
@pytest.mark.parametrize("nodes", [1, 5, 12])
def test_best_first_is_the_best_set(kind, nodes):
    g = torch.Generator().manual_seed(nodes)
    logq = torch.log_softmax(2 * torch.randn(3, 6, generator=g), -1)
    children = (block_tree.per_position(logq, nodes) if kind == "per_position"
                else conditional(logq, torch.randn(6, 6, generator=g), nodes))
    ranked = block_tree.best_first(children, nodes, depth=3)
    every = brute_force(children, 3, nodes)
    best = sorted(every.values(), reverse=True)[:nodes]
    got = [every[p] for p in ranked_paths(ranked)]
    assert len(ranked) == nodes
    assert got == sorted(got, reverse=True)                      # best first
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(got, best))
    for (tok, parent, q), path in zip(ranked, ranked_paths(ranked)):
        assert math.isclose(math.log(q), every[path] - (every[path[:-1]] if parent >= 0 else 0),
                            abs_tol=1e-6)


def test_to_draft_tree_is_depth_ordered_with_target_ids():
    ranked = [(0, -1, 0.6), (1, 0, 0.5), (2, -1, 0.3), (3, 1, 0.9), (4, 2, 0.8)]
    vocab = torch.tensor([10, 11, 12, 13, 14])
    tree = block_tree.to_draft_tree(7, ranked, vocab, "t")
    assert tree.depths == [0, 1, 1, 2, 2, 3]
    assert tree.tokens == [7, 10, 12, 11, 14, 13]
    assert tree.parents == [-1, 0, 0, 1, 2, 3]
    assert tree.confidence == [None, 0.6, 0.3, 0.5, 0.8, 0.9]
    assert tree.q_rows == [None] * 6                             # deterministic nodes


@pytest.mark.parametrize("cost,kept", [(None, 8), (ForwardCost([1], [0.04]), 8),
                                       (ForwardCost([1, 2], [0.04, 1.0]), 0)])
def test_budget_follows_the_cost_model(cost, kept):
    logq = torch.log_softmax(torch.randn(4, 20, generator=torch.Generator().manual_seed(0)), -1)
    tree = block_tree.draft_tree(5, block_tree.per_position(logq, 8), 8, 4, torch.arange(20),
                                 Acceptance(), cost, 0.001, True, "n")
    assert len(tree) == 1 + kept
    # sampling never uses the cost model: the whole tree goes to the target
    sampled = block_tree.draft_tree(5, block_tree.per_position(logq, 8), 8, 4, torch.arange(20),
                                    Acceptance(), cost, 0.001, False, "n")
    assert len(sampled) == 9


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(temperature=1.0)])
def test_block_drafters_draft_trees(tiny_target, kind, sp):
    t = tiny_target
    ids = t.encode("Write a poem about cats.")
    drafter = (DFlashDrafter(t, tiny_backbone(t), 8, tree=10) if kind == "dflash"
               else DSparkDrafter(t, tiny_dspark(t), DSparkSettings(block_size=8, tree=10)))
    feats = t.forward(ids[:-1], t.new_cache(), taps=TINY_TAPS).taps
    tree = drafter.draft(drafter.start(ids, feats), ids[-1], sp, torch.Generator().manual_seed(0))
    assert len(tree) == 11 and tree.tokens[0] == ids[-1]
    assert any(tree.parents.count(i) > 1 for i in range(len(tree)))   # it branches
    assert all(r is None for r in tree.q_rows)                         # deterministic nodes
    assert tree.schedule is None and "tree" in tree.note
    assert all(0 < c <= 1 for c in tree.confidence[1:])


@pytest.mark.parametrize("sid", ["peagle", "dflash", "dspark"])
def test_tree_setting_range(sid):
    assert strategies.parse_settings(sid, {"tree": "16"}).tree == 16
    for bad in ("-1", str(block_tree.MAX_NODES + 1)):
        with pytest.raises(ValueError, match="tree must be in"):
            strategies.parse_settings(sid, {"tree": bad})


def test_brute_force_counts_paths():
    """The reference itself: depth 2 over width 2 has 2 + 4 paths."""
    logq = torch.log_softmax(torch.randn(2, 5), -1)
    assert len(brute_force(block_tree.per_position(logq, 2), 2, 2)) == 6
