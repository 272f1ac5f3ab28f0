"""Retrieval drafting: prompt lookup plus a persistent cross-request n-gram store.

Boundary: token ids only, no model. The last n tokens (n = 3..1) are matched against the
request's own prompt + output and against the n-gram store built from earlier requests of this
process (the store belongs to one drafter object, which belongs to one target: a new target
version gets a new, empty store). Several continuations become a token tree (top branches by
frequency, common prefixes merged), so tree verification is exercised by a real drafter.

A match-quality gate keeps the loop honest on hardware where verifying several tokens costs
more than one plain step. Each kind of match, (source, n) with source the request's own context
or the cross-request store, keeps its record (`Evidence`): how often its first draft token was
accepted, and how often a later draft token was accepted once its parent was. Copying is
bimodal (a match either is a copy, and then runs on, or fails at once), which these two rates
capture and a single mean does not. Copying is also bursty (inside a copied passage the next
match usually goes on copying; in free text the same kind of match seldom does), so each kind
keeps two records: one for steps right after a step that accepted a draft token ("hot"), one
for the others. Priors trust longer matches and the request's own context
more. The record is updated from past steps only, so candidates never depend on this step's
target output. A step uses the available kind with the most expected accepted tokens:
- below `min_expected` the step falls back to a plain target step, marked `fallback` in its
  event (a gated kind is re-probed every `reprobe` gated steps);
- otherwise the tree depth follows the kind's survival curve s_i (draft tokens 1..i all
  accepted). Under greedy decoding with the target's measured cost model, the depth maximises
  expected tokens per verify second (`cost.best_budget`; depth 0 gates the step). Otherwise
  (sampling: a seed must fix the output, and timings differ run to run) drafting stops where
  s_i < `tail` (a weak match drafts 2-3 tokens, a copy up to `max_draft`). The tree gets
  1.5 x depth nodes at most.
Continuations stop at a special token (chat-template markers are never worth drafting across).
"""
from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch

from specviz.engine.cost import ForwardCost, best_budget
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree

NS = (3, 2, 1)
CONTEXT, STORE = "context", "store"
# expected accepted tokens before any evidence, per kind of match (source, n), read as a
# geometric run: every draft token accepted with rate m / (1 + m)
PRIOR = {(CONTEXT, 3): 2.0, (CONTEXT, 2): 1.0, (CONTEXT, 1): 0.5,
         (STORE, 3): 1.0, (STORE, 2): 0.5, (STORE, 1): 0.25}
PRIOR_WEIGHT = 2.0                  # worth this many observed draft tokens, for each rate


@dataclass
class Evidence:
    """One kind of match's record: drafts and how many had their first token accepted; draft
    tokens after the first that were verified with their parent accepted, and how many of
    those were accepted."""
    drafts: int = 0
    first: int = 0
    later_tries: int = 0
    later: int = 0

    def record(self, depth: int, accepted: int) -> None:
        self.drafts += 1
        self.first += accepted >= 1
        self.later_tries += max(0, min(accepted + 1, depth) - 1)
        self.later += max(0, accepted - 1)

    def survival(self, prior_mean: float, depth: int) -> list[float]:
        """s_i for i = 1..depth: the chance that draft tokens 1..i are all accepted."""
        a, w = prior_mean / (1.0 + prior_mean), PRIOR_WEIGHT
        r1 = (self.first + a * w) / (self.drafts + w)
        rc = (self.later + a * w) / (self.later_tries + w)
        return [r1 * rc ** i for i in range(depth)]


@dataclass(frozen=True)
class NgramSettings:
    max_draft: int = 10       # tokens per branch
    branches: int = 3         # distinct continuations merged into the tree
    budget: int = 12          # draft nodes at most (root excluded)
    min_expected: float = 0.2  # gate: expected accepted tokens per draft (0 disables)
    reprobe: int = 12          # after this many gated steps of one kind, draft once more
    tail: float = 0.1          # depth: stop where the modelled run survival drops below this
    store: bool = True         # use the cross-request store

    def check(self) -> None:
        if not (1 <= self.max_draft <= 64 and 1 <= self.branches <= 16 and 1 <= self.budget <= 256):
            raise ValueError("ngram: max_draft must be in 1..64, branches in 1..16, budget in 1..256")
        if not 0 <= self.min_expected <= 64 or self.reprobe < 1 or not 0 < self.tail < 1:
            raise ValueError("ngram: min_expected must be in 0..64, reprobe >= 1, tail in (0, 1)")


@dataclass
class NgramState:
    tokens: list[int]          # committed tokens except the root (mirrors the target cache)
    index: dict[tuple[int, ...], list[int]] = field(default_factory=lambda: defaultdict(list))
    evidence: dict[tuple[str, int, bool], Evidence] = field(   # (source, n, hot)
        default_factory=lambda: defaultdict(Evidence))
    gated: Counter = field(default_factory=Counter)
    last_kind: tuple[str, int] | None = None
    last_depth: int = 0
    hot: bool = False          # the last step accepted a draft token

    def survival(self, kind: tuple[str, int], depth: int) -> list[float]:
        return self.evidence[kind + (self.hot,)].survival(PRIOR[kind], depth)

    def add(self, start: int) -> None:
        """Index every n-gram ending at positions >= start."""
        for end in range(start, len(self.tokens)):
            for n in NS:
                if end - n + 1 >= 0:
                    self.index[tuple(self.tokens[end - n + 1:end + 1])].append(end)


class NgramDrafter:
    taps: tuple[int, ...] = ()

    def __init__(self, settings: NgramSettings = NgramSettings(), stop_ids: frozenset[int] = frozenset(),
                 store_limit: int = 200_000, cost: ForwardCost | None = None):
        self.settings, self.cost = settings, cost
        self.stop_ids = stop_ids
        self.store: dict[tuple[int, ...], Counter] = {}
        self.store_limit = store_limit
        self._lock = threading.Lock()
        self._pending: list[list[int]] = []   # token lists of requests not yet folded

    # --- the cross-request store -----------------------------------------------------------
    def _fold(self, tokens: list[int]) -> None:
        L = self.settings.max_draft
        for end in range(len(tokens) - 1):
            cont = self._cut(tokens[end + 1:end + 1 + L])
            for n in NS:
                if end - n + 1 >= 0:
                    key = tuple(tokens[end - n + 1:end + 1])
                    self.store.setdefault(key, Counter())[cont] += 1
        while len(self.store) > self.store_limit:
            self.store.pop(next(iter(self.store)))

    def start(self, prompt_ids: list[int], feats) -> NgramState:
        state = NgramState(list(prompt_ids[:-1]))
        state.add(0)
        with self._lock:  # earlier requests join the store when a new one starts
            for tokens in self._pending:
                self._fold(tokens)
            self._pending = [state.tokens]  # a live list: folded as it stands at the next start
        return state

    # --- drafting ----------------------------------------------------------------------------
    def _kinds(self, state: NgramState, toks: list[int]) -> dict[tuple[str, int], tuple[int, ...]]:
        """The kinds of match (source, n) available for the last n tokens (n = 3..1), each with
        its key; continuations are gathered only for the kind a step uses."""
        out: dict[tuple[str, int], tuple[int, ...]] = {}
        for n in NS:
            if len(toks) < n:
                continue
            key = tuple(toks[-n:])
            if key in state.index:
                out[(CONTEXT, n)] = key
            if self.settings.store:
                with self._lock:
                    if key in self.store:
                        out[(STORE, n)] = key
        return out

    def _continuations(self, state: NgramState, toks: list[int], kind: tuple[str, int],
                       key: tuple[int, ...], depth: int) -> Counter:
        """Continuations of `key` from the kind's source, cut to `depth`, with their counts."""
        if kind[0] == CONTEXT:
            conts = Counter(self._cut(toks[end + 1:end + 1 + self.settings.max_draft])
                            for end in state.index[key])
        else:
            with self._lock:   # another request's start may fold into the store meanwhile
                conts = Counter(self.store.get(key, ()))
        cut: Counter = Counter()
        for cont, count in conts.items():
            cut[cont[:depth]] += count
        return cut

    def _cut(self, cont: list[int]) -> tuple[int, ...]:
        """A continuation up to and including its first special token."""
        for i, t in enumerate(cont):
            if t in self.stop_ids:
                return tuple(cont[:i + 1])
        return tuple(cont)

    def draft(self, state: NgramState, root: int, sp: SamplingParams,
              generator: torch.Generator | None) -> DraftTree:
        s = self.settings
        toks = state.tokens + [root]
        kinds = self._kinds(state, toks)
        state.last_kind = None
        if not kinds:
            return DraftTree.root_only(root, fallback=True, note="no n-gram match (n = 3..1)")
        survival = {k: state.survival(k, s.max_draft) for k in kinds}
        kind = max(kinds, key=lambda k: sum(survival[k]))   # ties: the first (longest, context)
        expected = sum(survival[kind])
        where = f"n={kind[1]} match in the {kind[0]}"
        if self.cost is not None and sp.greedy:
            depth = best_budget(survival[kind], 0.0, self.cost)   # drafting costs ~nothing
            why = "no draft depth pays for its verify time" if depth == 0 else ""
        else:
            depth, why = depth_for(survival[kind], s.tail), ""
        if expected < s.min_expected:
            why = f"{expected:.2f} < {s.min_expected:.2f} expected accepted tokens"
        if why:
            state.gated[kind] += 1
            if state.gated[kind] < s.reprobe:
                return DraftTree.root_only(root, fallback=True,
                                           note=f"{where} below quality gate ({why})")
            depth = max(depth, 1)
        state.gated[kind] = 0
        cut = self._continuations(state, toks, kind, kinds[kind], depth)
        if not cut:   # the store evicted the key since _kinds looked
            return DraftTree.root_only(root, fallback=True, note=f"{where} evicted meanwhile")
        top = cut.most_common(s.branches)
        tree = trie(root, top, min(s.budget, (3 * depth + 1) // 2))
        note = f"{where}, {len(top)} continuation(s), expected {expected:.2f} accepted"
        if self.cost is not None and sp.greedy:
            n = len(tree) - 1
            tree = prune(tree, survival[kind], self.cost)
            if len(tree) - 1 < n:
                note += f"; verifying the {len(tree) - 1} of {n} nodes worth their time"
        state.last_kind, state.last_depth = kind, max(tree.depths)
        tree.note = note
        return tree

    def commit(self, state: NgramState, tokens: list[int], feats) -> None:
        # tokens = root + accepted nodes, as they entered the target cache
        if state.last_kind:
            state.evidence[state.last_kind + (state.hot,)].record(state.last_depth, len(tokens) - 1)
        state.hot = len(tokens) > 1
        start = len(state.tokens)
        state.tokens.extend(tokens)
        state.add(start)

    def cache_len(self, state: NgramState) -> None:
        return None


def depth_for(survival: list[float], tail: float) -> int:
    """Draft depth without a cost model: the first i whose survival s_i drops below `tail`
    (that token is still drafted), else the whole curve; at least 1."""
    for i, s_i in enumerate(survival, 1):
        if s_i < tail:
            return i
    return max(1, len(survival))


def trie(root: int, continuations: list[tuple[tuple[int, ...], int]], budget: int) -> DraftTree:
    """Merge continuations with their counts (best first) into a depth-ordered token tree of at
    most `budget` draft nodes. A node's confidence is the share of the counts whose continuation
    passes through it (how often this path followed the match)."""
    total = sum(c for _, c in continuations) or 1
    nodes: list[tuple[int, int, int]] = []          # (depth, parent key, token) in insert order
    key_of: dict[tuple[int, ...], int] = {(): 0}
    share = [0.0]                                   # by key: counts through the node / total
    for cont, count in continuations:
        for d in range(1, len(cont) + 1):
            prefix = cont[:d]
            if prefix not in key_of:
                if len(nodes) >= budget:
                    break                           # its deeper prefixes cannot be in the tree
                key_of[prefix] = len(nodes) + 1
                nodes.append((d, key_of[cont[:d - 1]], cont[d - 1]))
                share.append(0.0)
            share[key_of[prefix]] += count / total
    order = sorted(range(len(nodes)), key=lambda i: nodes[i][0])   # stable: depth order
    new_id = {0: 0} | {old + 1: new + 1 for new, old in enumerate(order)}
    tokens = [root] + [nodes[i][2] for i in order]
    parents = [-1] + [new_id[nodes[i][1]] for i in order]
    return DraftTree(tokens, parents, confidence=[None] + [share[i + 1] for i in order])


def prune(tree: DraftTree, survival: list[float], cost: ForwardCost) -> DraftTree:
    """Greedy decoding with a cost model: keep the nodes worth their verify time. A node's value
    is its share times the kind's survival at its depth (a child never outvalues its parent, so
    ranking by (value, depth) puts parents first); `cost.best_budget` picks how many."""
    depth = tree.depths
    value = {i: tree.confidence[i] * survival[depth[i] - 1] for i in range(1, len(tree))}
    ranked = sorted(value, key=lambda i: (-value[i], depth[i], i))
    keep = [0] + sorted(ranked[:best_budget([value[i] for i in ranked], 0.0, cost)])
    new = {old: j for j, old in enumerate(keep)}
    return DraftTree([tree.tokens[i] for i in keep],
                     [-1] + [new[tree.parents[i]] for i in keep[1:]],
                     confidence=[tree.confidence[i] for i in keep])
