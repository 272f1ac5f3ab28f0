"""Retrieval drafting: prompt lookup plus a persistent cross-request n-gram store.

Boundary: token ids only, no model. The last n tokens (n = 3..1) are matched against the
request's own prompt + output and against the n-gram store built from earlier requests of this
process (the store belongs to one drafter object, which belongs to one target: a new target
version gets a new, empty store). Several continuations become a token tree (top branches by
frequency, common prefixes merged), so tree verification is exercised by a real drafter.

A match-quality gate keeps the loop honest on hardware where verifying several tokens costs
more than one plain step. Each kind of match, (source, n) with source the request's own context
or the cross-request store, keeps a running mean of the draft tokens it got accepted, with a
prior (longer matches and the request's own context are trusted more). The state is updated from
past steps only, so candidates never depend on this step's target output. A step uses the
available kind with the best mean:
- below `min_expected` the step falls back to a plain target step, marked `fallback` in its
  event (a gated kind is re-probed every `reprobe` gated steps);
- otherwise the tree depth follows the mean, read as a geometric acceptance run with per-token
  rate a = m / (1 + m). Under greedy decoding with the target's measured cost model, the depth
  maximises expected tokens per verify second (`cost.best_budget`; depth 0 gates the step).
  Otherwise (sampling: a seed must fix the output, and timings differ run to run) drafting
  stops where a^depth < `tail` (a weak match drafts 2-3 tokens, a strong one up to
  `max_draft`). The tree gets 1.5 x depth nodes at most.
Continuations stop at a special token (chat-template markers are never worth drafting across).
"""
from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch

from specviz.engine.cost import ForwardCost, best_budget
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree

NS = (3, 2, 1)
CONTEXT, STORE = "context", "store"
# expected accepted tokens before any evidence, per kind of match (source, n)
PRIOR = {(CONTEXT, 3): 2.0, (CONTEXT, 2): 1.0, (CONTEXT, 1): 0.5,
         (STORE, 3): 1.0, (STORE, 2): 0.5, (STORE, 1): 0.25}
PRIOR_WEIGHT = 2.0                  # worth this many observed drafts


@dataclass(frozen=True)
class NgramSettings:
    max_draft: int = 8        # tokens per branch
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
    tries: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)
    gated: Counter = field(default_factory=Counter)
    last_kind: tuple[str, int] | None = None

    def expected(self, kind: tuple[str, int]) -> float:
        return (self.accepted[kind] + PRIOR[kind] * PRIOR_WEIGHT) / (self.tries[kind] + PRIOR_WEIGHT)

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
        kind = max(kinds, key=state.expected)          # ties: the first (longest, own context)
        expected = state.expected(kind)
        where = f"n={kind[1]} match in the {kind[0]}"
        if self.cost is not None and sp.greedy:
            depth = depth_for_cost(expected, s.max_draft, self.cost)
            why = "no draft depth pays for its verify time" if depth == 0 else ""
        else:
            depth, why = depth_for(expected, s.tail, s.max_draft), ""
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
        state.last_kind = kind
        top = [c for c, _ in cut.most_common(s.branches)]
        tree = trie(root, top, min(s.budget, (3 * depth + 1) // 2))
        tree.note = f"{where}, {len(top)} continuation(s), expected {expected:.2f} accepted"
        return tree

    def commit(self, state: NgramState, tokens: list[int], feats) -> None:
        # tokens = root + accepted nodes, as they entered the target cache
        if state.last_kind:
            state.tries[state.last_kind] += 1
            state.accepted[state.last_kind] += len(tokens) - 1
        start = len(state.tokens)
        state.tokens.extend(tokens)
        state.add(start)

    def cache_len(self, state: NgramState) -> None:
        return None


def depth_for(expected: float, tail: float, max_draft: int) -> int:
    """Draft depth for a match kind whose drafts got `expected` tokens accepted on average:
    with per-token acceptance a = m / (1 + m) (a geometric run of mean m), the smallest depth
    with a^depth < tail, within 1..max_draft."""
    if expected <= 0:
        return 1
    a = expected / (1.0 + expected)
    return max(1, min(max_draft, math.ceil(math.log(tail) / math.log(a))))


def depth_for_cost(expected: float, max_draft: int, cost: ForwardCost) -> int:
    """Greedy decoding with a measured cost model: the depth (0..max_draft) that maximises
    expected tokens per verify second, with the same geometric reading of the mean (draft token
    i is accepted with probability a^i, a = m / (1 + m)); drafting itself costs ~nothing."""
    a = expected / (1.0 + expected) if expected > 0 else 0.0
    return best_budget([a ** i for i in range(1, max_draft + 1)], 0.0, cost)


def trie(root: int, continuations: list[tuple[int, ...]], budget: int) -> DraftTree:
    """Merge continuations (best first) into a depth-ordered token tree of at most `budget`
    draft nodes."""
    nodes: list[tuple[int, int, int]] = []          # (depth, parent key, token) in insert order
    key_of: dict[tuple[int, ...], int] = {(): 0}
    for cont in continuations:
        for d in range(1, len(cont) + 1):
            prefix = cont[:d]
            if prefix in key_of:
                continue
            if len(nodes) >= budget:
                break
            key_of[prefix] = len(nodes) + 1
            nodes.append((d, key_of[cont[:d - 1]], cont[d - 1]))
    order = sorted(range(len(nodes)), key=lambda i: nodes[i][0])   # stable: depth order
    new_id = {0: 0} | {old + 1: new + 1 for new, old in enumerate(order)}
    tokens = [root] + [nodes[i][2] for i in order]
    parents = [-1] + [new_id[nodes[i][1]] for i in order]
    return DraftTree(tokens, parents)
