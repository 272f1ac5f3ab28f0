"""The cost model that schedulers use: how long one target forward takes, by width, on this
machine, and the rate rule that decides how much of a draft is worth verifying.

Boundary: timing a Target (once per Target, on first use, over a short synthetic context) and
pure arithmetic on the drafter's own acceptance estimates. It drafts nothing and never changes
what verification accepts, only how many draft nodes reach it.

On a GPU a forward of 64 tokens costs about what one token does, so the rule keeps the whole
draft. On a 2-core CPU it does not (about 40 ms for 1 token, 47 ms for 8 and 90 ms for 32 with
the packed kernels), so verifying low-probability nodes costs more time than they can save.
"""
from __future__ import annotations

import dataclasses
import itertools
import operator
import time
import weakref
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from specviz.engine.scheduler import algorithm1

if TYPE_CHECKING:
    from specviz.engine.tree import DraftTree

WIDTHS = (1, 2, 4, 8, 16, 32, 64)
CONTEXT = 64


class ForwardCost:
    """Seconds of one target forward over `width` new tokens, interpolated between measured
    widths (linear beyond the last; one measured width is a flat cost)."""

    def __init__(self, widths: Sequence[int], seconds: Sequence[float]):
        if not widths or len(widths) != len(seconds) or list(widths) != sorted(set(widths)):
            raise ValueError("a cost model needs increasing widths, one time each")
        self.widths, self.seconds = list(widths), list(seconds)

    def __call__(self, width: int) -> float:
        w, s = self.widths, self.seconds
        if len(w) == 1:
            return s[0]
        i = next((j for j in range(1, len(w)) if width <= w[j]), len(w) - 1)
        slope = (s[i] - s[i - 1]) / (w[i] - w[i - 1])
        return max(s[0], s[i - 1] + slope * (width - w[i - 1]))

    @classmethod
    def measure(cls, target, reps: int = 4, widths: Sequence[int] = WIDTHS,
                context: int = CONTEXT) -> "ForwardCost":
        """Tree-masked forwards after a `context`-token prefix (less for a short-context model),
        the widths taken in turn `reps` times; each width's fastest run counts (a busy moment
        slows one run, never speeds it up), and a wider forward never counts as cheaper than a
        narrower one."""
        from specviz.models.target import Target

        n = max(1, min(context, target.max_len // 2))     # a short-context model: less
        prefix = [(17 * i) % target.vocab for i in range(1, n + 1)]
        cache = target.new_cache()
        target.forward(prefix, cache, logits_for="last")
        widths = [w for w in widths if n + w <= target.max_len] or [1]
        times: list[list[float]] = [[] for _ in widths]
        sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
        for _ in range(reps):
            for j, width in enumerate(widths):
                parents = None if width == 1 else [-1] + list(range(width - 1))
                sync()
                t = time.perf_counter()
                target.forward((prefix * width)[:width], cache, parents=parents)
                sync()                 # CUDA runs asynchronously: time the work, not the launch
                times[j].append(time.perf_counter() - t)
                Target.crop(cache, n)
        return cls(widths, list(itertools.accumulate(map(min, times), max)))


class Acceptance:
    """How often the verifier accepts a draft token the drafter gave probability q: one Beta
    estimate per tenth of [0, 1], centred on q itself until the request's own verified nodes
    say otherwise (greedy verification accepts a draft that matches the target's argmax, so
    acceptance need not equal q)."""

    BINS = 10

    def __init__(self, prior: float = 4.0):
        self.prior = prior
        self.tested = [0] * self.BINS
        self.accepted = [0] * self.BINS
        self.pending = None            # the draft tree awaiting its verdict

    def expect(self, tree):
        """Hold a drafted tree (tokens, parents, confidence as draft probabilities) until
        `settle` learns from its verdict; returns the tree."""
        self.pending = tree
        return tree

    def settle(self, committed: Sequence[int]) -> None:
        """Learn from the held tree's verdict (`committed` = root and the accepted draft tokens)."""
        if self.pending is not None:
            t, self.pending = self.pending, None
            self.observe(t.parents, t.tokens, t.confidence, committed)

    def _bin(self, q: float) -> int:
        return min(max(int(q * self.BINS), 0), self.BINS - 1)

    def __call__(self, q: float) -> float:
        b = self._bin(q)
        centre = (b + 0.5) / self.BINS
        return (self.accepted[b] + self.prior * centre) / (self.tested[b] + self.prior)

    def observe(self, parents: Sequence[int], tokens: Sequence[int], probs: Sequence[float | None],
                committed: Sequence[int]) -> None:
        """Learn from one verified tree: walking the accepted path (`committed` = root and the
        accepted draft tokens), every child of an accepted node was tested; one was accepted."""
        node = 0
        for nxt in list(committed[1:]) + [None]:
            hit = None
            for i in (i for i in range(1, len(parents)) if parents[i] == node):
                accepted = hit is None and tokens[i] == nxt
                if accepted:
                    hit = i
                if probs[i] is not None:
                    self.tested[self._bin(probs[i])] += 1
                    self.accepted[self._bin(probs[i])] += accepted
            if hit is None:
                return
            node = hit


_measured: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def forward_cost(target) -> ForwardCost:
    """The target's cost model, measured the first time it is asked for."""
    if target not in _measured:
        _measured[target] = ForwardCost.measure(target)
    return _measured[target]


def rate(values: Sequence[float], n: int, draft_s: float, cost: Callable[[int], float]) -> float:
    """Expected tokens per second when the first n draft nodes are verified."""
    return (1.0 + sum(values[:n])) / (draft_s + cost(1 + n))


def best_budget(values: Sequence[float], draft_s: float, cost: Callable[[int], float]) -> int:
    """How many of the draft nodes to verify: the n maximising expected tokens per second,
    (1 + sum(values[:n])) / (draft_s + cost(1 + n)).

    values: each node's estimated probability of being accepted (for a tree, the product of the
    draft probabilities along its path), best first, with parents before children, so that any
    prefix is a valid tree. draft_s: the drafter's time this step. The 1 is the token every
    verify yields; 1 + n is the verify width (root + n nodes)."""
    best_n, best_rate, gain = 0, 1.0 / (draft_s + cost(1)), 1.0
    for n, v in enumerate(values, 1):
        gain += v
        r = gain / (draft_s + cost(1 + n))
        if r > best_rate:
            best_n, best_rate = n, r
    return best_n


def prefix_schedule(survival: Sequence[float], cost: Callable[[int], float]) -> int:
    """DSpark's hardware-aware prefix scheduler (ALGORITHMS.md §6, Algorithm 1) for one request:
    how many drafts to verify. survival[j-1] = a_j, the draft's estimate that drafts 1..j are
    all accepted (non-increasing). Verify steps per second at width B are 1 / cost(B). The batch
    version (`scheduler.algorithm1`) with R = 1: its early break means draft j is kept or dropped
    from a_1..a_j alone, before any later draft is looked at."""
    return algorithm1([list(survival)], lambda b: 1.0 / cost(b))[0]


def worth_drafting(values: Sequence[float], new_nodes: int, new_gain: float, draft_s: float,
                   level_s: float, cost: Callable[[int], float]) -> bool:
    """Whether one more drafting level can raise the rate: true when `new_nodes` more nodes
    worth `new_gain` in all, drafted in another `level_s` seconds and verified with the best
    prefix of `values` (sorted), beat that prefix alone. For a tree level the caller passes an
    upper bound: one child per frontier node carrying all of its parent's value (the children
    of a node share at most its probability)."""
    n = best_budget(values, draft_s, cost)
    now = rate(values, n, draft_s, cost)
    more = (1.0 + sum(values[:n]) + new_gain) / (draft_s + level_s + cost(1 + n + new_nodes))
    return more > now


def verify_prefix(values: list[float], draft_s: float, cost: ForwardCost) -> tuple[int, str]:
    """Greedy decoding with a cost model: how many tokens of a drafted chain to verify, the
    prefix maximising expected tokens per second (values[j]: the estimated chance that tokens
    1..j+1 are all accepted), and a note for the step's event when that cuts the chain."""
    n = best_budget(values, draft_s, cost)
    return n, (f"; verifying the first {n}, the prefix worth its time" if n < len(values) else "")


def chain_values(acceptance: Acceptance, confidences: list[float]) -> list[float]:
    """A chain's values for `verify_prefix`: products of the learnt acceptance of each token's
    draft probability."""
    return list(itertools.accumulate((acceptance(c) for c in confidences), operator.mul))


def budget_chain(tree: "DraftTree", acceptance: Acceptance, cost: ForwardCost | None,
                 draft_s: float, greedy: bool) -> "DraftTree":
    """A chain drafted whole (one block forward, or a module reused gamma times), cut under
    greedy decoding with a cost model to the prefix worth its verify time (`verify_prefix` over
    `chain_values` of its confidences, the note saying so), then held by `acceptance` until its
    verdict."""
    if cost is not None and greedy:
        n, cut = verify_prefix(chain_values(acceptance, tree.confidence[1:]), draft_s, cost)
        tree = dataclasses.replace(tree.truncate(n), note=tree.note + cut)
    return acceptance.expect(tree)
