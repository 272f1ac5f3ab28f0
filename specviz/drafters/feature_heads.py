"""What the EAGLE-family drafters share: per-request state with a head cache of committed
positions, lazy catch-up, tree and chain drafting (training: train/unroll.py).

Boundary: drafting policy over a `head` (an nn.Module) with
- `taps`; `fuse(feats) -> g [.., d]`: real target features to the head's input feature;
- `embed(tokens) -> [.., d]` (the target's frozen embedding);
- `forward(g, emb, positions [n], past, mask) -> (out [b, n, d], logits [b, n, Vd], new_kv)`,
  past/new_kv a list of per-layer (k, v) [b, kv, P, hd]; mask [n, P + n] bool (True = attend);
- buffer `vocab_ids` [Vd]: draft index -> target token id (EAGLE-3's d2t, as ids).

Indexing (EAGLE's convention): head entry i is (g_i, token_{i+1}) at position i; its output
predicts token_{i+2}. With committed tokens x_0..x_{L-1} in the target cache and root x_L, the
entries 0..L-1 are all real (entry L-1 pairs f_{L-1} with the root) and are cached for good;
draft entries (g = the parent's output) extend the cache only during one `draft` call.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specviz.drafters import weights
from specviz.drafters.layers import widen
from specviz.engine.cost import Acceptance, ForwardCost, best_budget, worth_drafting
from specviz.engine import sampling
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree
from specviz.models.kernels import pack_linears


@dataclass
class HeadState:
    tokens: list[int]                                   # committed tokens except the root
    pending: list[dict[int, torch.Tensor]]              # target feats of tokens[cached:]
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    cached: int = 0                                     # head entries in kv
    acceptance: Acceptance = field(default_factory=Acceptance)   # learnt from verified drafts


def load_head(drafter_id: str, target, make):
    """A shipped feature head: `make(target, vocab_ids, config)` builds the module, then its
    weights load (fingerprint-checked by `weights.load`), on the target's device, in eval mode."""
    tensors, cfg = weights.load(drafter_id, target.fingerprint)
    head = make(target, tensors.pop("vocab_ids"), cfg)
    head.load_state_dict(tensors)
    return pack_linears(head.to(target.device).eval())


class HeadDrafter:
    """The Drafter plumbing every feature head shares: per-request HeadState, cheap commits
    (features queue up; the head catches up lazily in `draft`). Subclasses write `draft`."""

    def __init__(self, head, settings, cost: ForwardCost | None = None):
        self.head, self.settings, self.cost = head, settings, cost
        self.taps = head.taps

    def start(self, prompt_ids: list[int], feats: dict[int, torch.Tensor]) -> HeadState:
        return HeadState(list(prompt_ids[:-1]), [feats] if feats else [])

    def commit(self, state: HeadState, tokens: list[int], feats: dict[int, torch.Tensor]) -> None:
        state.acceptance.settle(tokens)
        state.tokens.extend(tokens)
        state.pending.append(feats)

    def cache_len(self, state: HeadState) -> int:
        return state.cached


def cat_kv(a, b):
    if a is None or b is None:
        return b if a is None else a
    return [(torch.cat([x[0], y[0]], 2), torch.cat([x[1], y[1]], 2)) for x, y in zip(a, b)]


@torch.no_grad()
def catch_up(head, state: HeadState, root: int, extra: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Run the real entries not yet cached (the last one pairs with the root) and cache them;
    return (outputs [1 + m, d], logits [1 + m, Vd]) of the root entry and of the m `extra`
    entries ((g, emb) [1, m, d], run in the same forward at the next positions, causally after
    the real ones, never cached), or None when there is no feature yet (1-token prompt)."""
    L = len(state.tokens)
    if L == 0:
        return None
    if state.cached == L:
        raise RuntimeError("catch_up: the root entry is already cached")
    feats = {k: torch.cat([p[k] for p in state.pending]) for k in head.taps}
    dev = head.vocab_ids.device
    g = head.fuse({k: v.to(dev, torch.float32) for k, v in feats.items()})[None]
    emb = head.embed(torch.tensor([state.tokens[state.cached + 1:] + [root]], device=dev))
    n = L - state.cached
    if extra is not None:
        g, emb = torch.cat([g, extra[0]], 1), torch.cat([emb, extra[1]], 1)
    m = g.shape[1] - n
    pos = torch.arange(state.cached, L + m, device=dev)
    mask = torch.ones(n + m, L + m, dtype=torch.bool, device=dev)
    mask[:, state.cached:] = torch.ones(n + m, n + m, dtype=torch.bool, device=dev).tril()
    out, logits, kv = head(g, emb, pos, state.kv, mask)
    state.kv = cat_kv(state.kv, [(k[:, :, :n], v[:, :, :n]) for k, v in kv])
    state.cached, state.pending = L, []
    return out[0, n - 1:], logits[0, n - 1:]


def crop(state: HeadState) -> None:
    """Drop draft entries: keep the committed ones."""
    if state.kv is not None:
        state.kv = [(k[:, :, :state.cached], v[:, :, :state.cached]) for k, v in state.kv]


@dataclass
class Node:
    draft_id: int                 # index in the draft vocabulary
    parent: "Node | None"         # None: child of the root
    depth: int
    score: float                  # cumulative log q along the path
    prob: float                   # q of this token given its parent
    g: torch.Tensor               # the parent's output feature (this node's input)
    run: int = -1                 # position in the tree kv once run through the head
    anc: list[int] = field(default_factory=list)   # run indices of run ancestors


class Expander:
    """Runs batches of tree nodes through the head over the committed cache + tree entries."""

    def __init__(self, head, state: HeadState):
        self.head, self.state = head, state
        self.extra = None
        self.n_extra = 0

    @torch.no_grad()
    def run(self, nodes: list[Node]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (outputs [n, d], log q [n, Vd]) of the nodes (their children's inputs)."""
        head, P, E, n = self.head, self.state.cached, self.n_extra, len(nodes)
        dev = head.vocab_ids.device
        tree = [[False] * (E + n) for _ in range(n)]    # over the tree entries: ancestors, self
        for r, node in enumerate(nodes):
            node.anc = (node.parent.anc + [node.parent.run]) if node.parent else []
            for a in node.anc:
                tree[r][a] = True
            tree[r][E + r] = True
            node.run = E + r
        mask = torch.cat([torch.ones(n, P, dtype=torch.bool, device=dev),
                          torch.tensor(tree, device=dev)], 1)
        g = torch.stack([x.g for x in nodes])[None]
        tok = head.vocab_ids[torch.tensor([x.draft_id for x in nodes], device=dev)]
        pos = torch.tensor([P - 1 + x.depth for x in nodes], device=dev)
        out, logits, kv = head(g, head.embed(tok[None]), pos, cat_kv(self.state.kv, self.extra),
                               mask)
        self.extra = cat_kv(self.extra, kv)
        self.n_extra += n
        return out[0], F.log_softmax(logits[0].float(), -1)


def to_tree(head, root: int, chosen: list[Node], note: str) -> DraftTree:
    """Depth-ordered DraftTree from chosen nodes (parents always chosen too)."""
    index = {id(x): i for i, x in enumerate(chosen)}
    ids = head.vocab_ids.tolist()
    return DraftTree.in_depth_order(root, [ids[x.draft_id] for x in chosen],
                                    [index[id(x.parent)] if x.parent else -1 for x in chosen],
                                    [x.depth for x in chosen], [x.prob for x in chosen], note)


def children_of(parents: list[Node | None], outs: torch.Tensor, logq: torch.Tensor, k: int
                ) -> list[list[Node]]:
    """The k likeliest children of each parent, best first: row j of outs [n, d] / logq [n, Vd]
    is parents[j]'s output (its children's input) and log q (None: the root). One top-k and one
    exp for all parents: the same numbers as row by row, without per-element tensor reads."""
    v, ix = logq.topk(k)
    probs, logs, ids = v.exp().tolist(), v.tolist(), ix.tolist()
    return [[Node(i, p, p.depth + 1 if p else 1, (p.score if p else 0.0) + s, q, outs[j])
             for i, s, q in zip(ids[j], logs[j], probs[j])] for j, p in enumerate(parents)]


def floor(nodes: list[Node], keep: int) -> float:
    """The keep-th best score of `nodes` (-inf when there are fewer): whatever scores below it
    can never be among the `keep` best."""
    return heapq.nlargest(keep, (x.score for x in nodes))[-1] if len(nodes) >= keep else -math.inf


def dynamic_tree(head, state: HeadState, root: int, top_k: int, depth: int,
                 total_tokens: int, cost: ForwardCost | None = None) -> DraftTree:
    """EAGLE-2: expand the global top-k frontier by cumulative log q for `depth` levels, then
    keep the total_tokens-1 best recorded nodes (a valid tree: a child never outscores its
    parent, and sorting by (score, depth) puts parents first). A frontier node that scores
    below the (total_tokens-1)-th best recorded score is not expanded: neither it nor any
    descendant (scores only fall along a path) can be kept, so the tree is the same and
    drafting stops as soon as no frontier node can place.

    With a cost model (greedy decoding: the budget then never changes the output), drafting
    stops at the first level that cannot pay for itself, and only the best prefix of the
    ranked nodes that maximises expected tokens per second is verified (`cost.best_budget`).
    A node's value is the product along its path of the request's learnt acceptance of each
    draft probability (`cost.Acceptance`)."""
    t0 = time.perf_counter()
    first = catch_up(head, state, root)
    if first is None:
        return DraftTree.root_only(root, fallback=True, note="no target feature yet")
    ex = Expander(head, state)
    value: dict[int, float] = {}

    def worth(x: Node) -> float:
        if id(x) not in value:
            value[id(x)] = state.acceptance(x.prob) * (worth(x.parent) if x.parent else 1.0)
        return value[id(x)]

    def budget_values(nodes: list[Node]) -> list[float]:
        return sorted(map(worth, nodes), reverse=True)[:total_tokens - 1]

    frontier = children_of([None], first[0][:1], F.log_softmax(first[1][:1].float(), -1), top_k)[0]
    recorded = list(frontier)
    levels, level_s = 1, time.perf_counter() - t0
    for _ in range(depth - 1):
        low = floor(recorded, total_tokens - 1)
        frontier = [x for x in frontier if x.score >= low]
        if not frontier:
            break
        if cost is not None and not worth_drafting(
                budget_values(recorded), len(frontier), sum(map(worth, frontier)),
                time.perf_counter() - t0, level_s, cost):
            break
        t = time.perf_counter()
        outs, logq = ex.run(frontier)
        cands = [c for kids in children_of(frontier, outs, logq, top_k) for c in kids]
        recorded += cands
        frontier = sorted(cands, key=lambda x: -x.score)[:top_k]
        levels, level_s = levels + 1, time.perf_counter() - t
    crop(state)
    ranked = sorted(enumerate(recorded), key=lambda t: (-t[1].score, t[1].depth, t[0]))
    chosen = [x for _, x in ranked[:total_tokens - 1]]
    note = f"EAGLE-2 dynamic tree: top-k {top_k}, depth {levels} of {depth}, {len(chosen)} nodes"
    if cost is not None:
        values = [worth(x) for x in chosen]
        draft_s = time.perf_counter() - t0
        n = best_budget(values, draft_s, cost)
        note += (f"; verifying the best {n} (expected {1 + sum(values[:n]):.2f} tokens in "
                 f"{1000 * (draft_s + cost(1 + n)):.0f} ms with drafting)")
        chosen = chosen[:n]
    return state.acceptance.expect(to_tree(head, root, chosen, note))


def static_tree(head, state: HeadState, root: int, shape: list[tuple[int, ...]]) -> DraftTree:
    """EAGLE-1: a fixed tree of rank paths, e.g. (0,), (1,), (0, 0): rank-r child of each node."""
    first = catch_up(head, state, root)
    if first is None:
        return DraftTree.root_only(root, fallback=True, note="no target feature yet")
    ex = Expander(head, state)
    width = 1 + max(p[-1] for p in shape)
    by_path: dict[tuple[int, ...], Node] = {}
    kids = children_of([None], first[0][:1], F.log_softmax(first[1][:1].float(), -1), width)[0]
    for p in (p for p in shape if len(p) == 1):
        by_path[p] = kids[p[0]]
    for d in range(2, max(map(len, shape)) + 1):
        parents = sorted({p[:-1] for p in shape if len(p) == d})
        outs, logq = ex.run([by_path[p] for p in parents])
        for pp, kids in zip(parents, children_of([by_path[p] for p in parents], outs, logq, width)):
            for p in (p for p in shape if len(p) == d and p[:-1] == pp):
                by_path[p] = kids[p[-1]]
    crop(state)
    return to_tree(head, root, [by_path[p] for p in shape],
                   f"EAGLE-1 static tree: {len(shape)} nodes")


def chain(head, state: HeadState, root: int, gamma: int, sp: SamplingParams,
          generator: torch.Generator | None) -> DraftTree:
    """γ tokens drafted one by one; sampled from q when sp samples (lossless residuals)."""
    first = catch_up(head, state, root)
    if first is None:
        return DraftTree.root_only(root, fallback=True, note="no target feature yet")
    ex = Expander(head, state)
    out, logits = first[0][0], first[1][0]
    toks, qs, rows, confs, node = [], [], [], [], None
    for j in range(gamma):
        tok, q, row, conf = pick(head, logits, sp, generator)
        toks.append(tok)
        qs.append(q)
        rows.append(row)
        confs.append(conf)
        if j == gamma - 1:
            break
        d_id = int(torch.searchsorted(head.vocab_ids, torch.tensor(tok, device=out.device)))
        node = Node(d_id, node, j + 1, 0.0, q, out)
        outs, logq = ex.run([node])
        out, logits = outs[0], logq[0]
    crop(state)
    return DraftTree.chain(root, toks, q=qs if not sp.greedy else None,
                           q_rows=rows if not sp.greedy else None, confidence=confs,
                           note=f"chain of {gamma}")


def pick(head, logits: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None
         ) -> tuple[int, float, torch.Tensor | None, float]:
    """sampling.pick over the target vocabulary from [Vd] draft logits (`vocab_ids` sorted).
    Greedy needs no widened [V] row: the draft argmax maps to the target argmax (ties too, the
    ids being sorted), and the confidence is the draft softmax at it (the same up to float
    summation order; -inf entries add nothing)."""
    if sp.greedy:
        i = int(logits.argmax())
        return int(head.vocab_ids[i]), 1.0, None, float(torch.softmax(logits.float(), -1)[i])
    return sampling.pick(widen(logits.float(), head.vocab_ids, head.vocab), sp, generator)
