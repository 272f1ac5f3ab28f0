"""Draft trees for the one-forward drafters (the `tree` setting of peagle, dflash and dspark).

A block drafter proposes every position of its draft from one forward, and the papers verify
that block as a chain. Medusa showed the other use of per-position distributions: a tree over
each position's top tokens. This is its best-first form, EAGLE-2's selection rule on the same
scores: the N nodes of highest cumulative draft log-probability, where the children of a node
at depth k are the likeliest tokens of position k + 1 (for P-EAGLE and DFlash the same list
under every parent; DSpark's Markov head conditions it on the parent's token). A child never
outscores its parent, so the N best nodes are a tree, and nodes come out best first, parents
before children.

Every node is a deterministic (top-k) choice, so sampling verifies it with the deterministic
rule (ALGORITHMS.md §0: accept x with p(x), else drop x from p): the tree is lossless whatever
tokens it holds. Under greedy decoding with the target's cost model, only the best prefix of the
ranked nodes worth its verify time goes to the target (`cost.best_budget`), as for EAGLE-2.

Boundary: selection over draft log-probabilities and the verify budget; the drafters run their
forward and say how a node's children are found.
"""
from __future__ import annotations

import heapq
import itertools
import math
from typing import Callable

import torch

from specviz.engine.cost import Acceptance, ForwardCost, best_budget
from specviz.engine.tree import DraftTree

# (depth of the children, the parent's draft-vocabulary id or None for the root)
#   -> (log q of the children, their draft-vocabulary ids), best first
Children = Callable[[int, "int | None"], tuple[list[float], list[int]]]


MAX_NODES = 64


def check_tree(nodes: int) -> None:
    """The `tree` setting: 0 (the published chain) or a node budget."""
    if not 0 <= nodes <= MAX_NODES:
        raise ValueError(f"tree must be in 0..{MAX_NODES} (draft-tree nodes; 0 = the chain)")


def per_position(logq: torch.Tensor, width: int) -> Children:
    """Children that do not depend on the parent (P-EAGLE, DFlash): row k-1 of logq [K, Vd]
    gives depth k's top `width` tokens, found once for every parent."""
    v, ix = logq.topk(min(width, logq.shape[-1]))
    vals, ids = v.tolist(), ix.tolist()
    return lambda depth, parent: (vals[depth - 1], ids[depth - 1])


def best_first(children: Children, nodes: int, depth: int) -> list[tuple[int, int, float]]:
    """The `nodes` best nodes by cumulative log q, at most `depth` deep, best first: (draft id,
    parent (an earlier index; -1 = the root), q). Lazy: a popped node pushes its next sibling
    and its best child, each of which scores no higher than it."""
    out: list[tuple[int, int, float]] = []
    heap: list[tuple] = []      # (-score, push order, parent score, depth, rank, parent, kids)
    order = itertools.count()

    def push(base: float, d: int, rank: int, parent: int, kids: tuple[list[float], list[int]]):
        if rank < len(kids[0]):     # the push order breaks ties: nothing after it is compared
            score = base + kids[0][rank]
            heapq.heappush(heap, (-score, next(order), base, d, rank, parent, kids))

    push(0.0, 1, 0, -1, children(1, None))
    while heap and len(out) < nodes:
        neg, _, base, d, rank, parent, kids = heapq.heappop(heap)
        out.append((kids[1][rank], parent, math.exp(kids[0][rank])))
        push(base, d, rank + 1, parent, kids)
        if d < depth:
            push(-neg, d + 1, 0, len(out) - 1, children(d + 1, kids[1][rank]))
    return out


def to_draft_tree(root: int, ranked: list[tuple[int, int, float]], vocab_ids: torch.Tensor,
                  note: str) -> DraftTree:
    """Ranked (draft id, parent, q) nodes -> a DraftTree in depth order (target ids; the
    confidence of each node is its q)."""
    depths: list[int] = []
    for _, p, _ in ranked:                       # parents come first in the ranking
        depths.append(1 if p < 0 else depths[p] + 1)
    ids = vocab_ids[torch.tensor([d for d, _, _ in ranked], dtype=torch.long,
                                 device=vocab_ids.device)].tolist() if ranked else []
    return DraftTree.in_depth_order(root, ids, [p for _, p, _ in ranked], depths,
                                    [q for _, _, q in ranked], note)


def draft_tree(root: int, children: Children, nodes: int, depth: int, vocab_ids: torch.Tensor,
               acceptance: Acceptance, cost: ForwardCost | None, draft_s: float, greedy: bool,
               note: str) -> DraftTree:
    """The best `nodes`-node tree (`best_first`), cut under greedy decoding with a cost model to
    the ranked prefix worth its verify time, then held by `acceptance` until its verdict."""
    ranked = best_first(children, nodes, depth)
    note += f": the best {len(ranked)} nodes by cumulative draft probability"
    if cost is not None and greedy:
        values: list[float] = []
        for _, p, q in ranked:
            values.append(acceptance(q) * (values[p] if p >= 0 else 1.0))
        n = best_budget(values, draft_s, cost)
        if n < len(ranked):
            note += f"; verifying the best {n}, the prefix worth its time"
        ranked = ranked[:n]
    return acceptance.expect(to_draft_tree(root, ranked, vocab_ids, note))
