"""Retrieval drafting: prompt lookup plus a persistent cross-request n-gram store.

Boundary: token ids only, no model. The last n tokens (n = 3..1) are matched against the
request's own prompt + output and against the n-gram store built from earlier requests of this
process (the store belongs to one drafter object, which belongs to one target: a new target
version gets a new, empty store). Several continuations become a token tree (top branches by
frequency, common prefixes merged), so tree verification is exercised by a real drafter.

A match-quality gate keeps the loop honest on hardware where verifying several tokens costs
more than one plain step: per match length n, a running mean of accepted drafts with a prior
(longer matches are trusted more), computed from past steps only, so candidates never depend on
this step's target output. Below `min_expected` the step falls back to a plain target step,
marked `fallback` in its event; a gated n is re-probed every `reprobe` gated steps. Continuations
stop at a special token (chat-template markers are never worth drafting across).
"""
from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch

from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree

NS = (3, 2, 1)
PRIOR = {3: 2.0, 2: 1.0, 1: 0.5}   # expected accepted tokens before any evidence, per n
PRIOR_WEIGHT = 2.0                  # worth this many observed drafts


@dataclass(frozen=True)
class NgramSettings:
    max_draft: int = 8        # tokens per branch
    branches: int = 3         # distinct continuations merged into the tree
    budget: int = 12          # draft nodes at most (root excluded)
    min_expected: float = 0.7  # gate: expected accepted tokens per draft (0 disables)
    reprobe: int = 12          # after this many gated steps at one n, draft once more
    store: bool = True         # use the cross-request store

    def check(self) -> None:
        if not (1 <= self.max_draft <= 64 and 1 <= self.branches <= 16 and 1 <= self.budget <= 256):
            raise ValueError("ngram: max_draft must be in 1..64, branches in 1..16, budget in 1..256")
        if not 0 <= self.min_expected <= 64 or self.reprobe < 1:
            raise ValueError("ngram: min_expected must be in 0..64 and reprobe >= 1")


@dataclass
class NgramState:
    tokens: list[int]          # committed tokens except the root (mirrors the target cache)
    index: dict[tuple[int, ...], list[int]] = field(default_factory=lambda: defaultdict(list))
    tries: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)
    gated: Counter = field(default_factory=Counter)
    last_n: int = 0

    def expected(self, n: int) -> float:
        return (self.accepted[n] + PRIOR[n] * PRIOR_WEIGHT) / (self.tries[n] + PRIOR_WEIGHT)

    def add(self, start: int) -> None:
        """Index every n-gram ending at positions >= start."""
        for end in range(start, len(self.tokens)):
            for n in NS:
                if end - n + 1 >= 0:
                    self.index[tuple(self.tokens[end - n + 1:end + 1])].append(end)


class NgramDrafter:
    taps: tuple[int, ...] = ()

    def __init__(self, settings: NgramSettings = NgramSettings(), stop_ids: frozenset[int] = frozenset(),
                 store_limit: int = 200_000):
        self.settings = settings
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
    def _candidates(self, state: NgramState, root: int) -> tuple[int, Counter]:
        s, toks = self.settings, state.tokens + [root]
        for n in NS:
            if len(toks) < n:
                continue
            key = tuple(toks[-n:])
            found: Counter = Counter()
            for end in state.index.get(key, ()):
                found[self._cut(toks[end + 1:end + 1 + s.max_draft])] += 1
            if s.store:
                with self._lock:
                    found.update(self.store.get(key, Counter()))
            if found:
                return n, found
        return 0, Counter()

    def _cut(self, cont: list[int]) -> tuple[int, ...]:
        """A continuation up to and including its first special token."""
        for i, t in enumerate(cont):
            if t in self.stop_ids:
                return tuple(cont[:i + 1])
        return tuple(cont)

    def draft(self, state: NgramState, root: int, sp: SamplingParams,
              generator: torch.Generator | None) -> DraftTree:
        s = self.settings
        n, found = self._candidates(state, root)
        state.last_n = 0
        if not found:
            return DraftTree.root_only(root, fallback=True, note="no n-gram match (n = 3..1)")
        expected = state.expected(n)
        if expected < s.min_expected:
            state.gated[n] += 1
            if state.gated[n] < s.reprobe:
                return DraftTree.root_only(
                    root, fallback=True,
                    note=f"n={n} match below quality gate ({expected:.2f} < {s.min_expected:.2f} "
                         f"expected accepted tokens)")
        state.gated[n] = 0
        state.last_n = n
        top = [c for c, _ in found.most_common(s.branches)]
        tree = trie(root, top, s.budget)
        tree.note = f"n={n} match, {len(top)} continuation(s), expected {expected:.2f} accepted"
        return tree

    def commit(self, state: NgramState, tokens: list[int], feats) -> None:
        # tokens = root + accepted nodes, as they entered the target cache
        if state.last_n:
            state.tries[state.last_n] += 1
            state.accepted[state.last_n] += len(tokens) - 1
        start = len(state.tokens)
        state.tokens.extend(tokens)
        state.add(start)

    def cache_len(self, state: NgramState) -> None:
        return None


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
