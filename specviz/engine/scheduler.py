"""Verify-length policies for a batch of R requests: how many of each request's drafted tokens
go to the target this step (ALGORITHMS.md §6, DESIGN.md §5 `serve-bench`).

Boundary: pure functions on per-request prefix-survival curves (a[r][j-1] = a_j, the drafter's
estimate that drafts 1..j of request r are all accepted; non-increasing) and an SPS callable
(batch tokens -> target verify steps per second). No torch, no model calls.

Policies, selected by id:
- `fixed:G`: G drafts per request (fewer where fewer were drafted);
- `threshold:T`: cut each request at its first a_j < T;
- `dspark`: Algorithm 1, greedy by prefix survival (ties: smaller j first), with the early
  break that keeps the decision to verify draft j independent of draft j itself;
- `dspark-prod`: the production variant: the budget K from Algorithm 1 on the confidences of
  two steps before (which cannot depend on this step's drafts), then the K best (r, j) by
  current survival, with no break (the first two steps, which have no history, use `dspark`).

Non-anticipation (ALGORITHMS.md §0): a_j must be computed before draft j is drawn; every
policy here decides draft j from a_1..a_j and from entries sorted before it, never from a_{j+1}.

A curve is a list, or a lazy curve: an object whose `a(j)` gives a_j (None past the chain's
end) and may draft up to x_{j-1} to compute it (dspark.BlockCursor). The policies ask for a_j
only while they may still verify x_j, so a sequential drafter stops at the first draft no
policy would verify; `Decision.curves` holds the a_j that were asked for.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

Curves = Sequence[Any]          # per request: a list of a_j, or a lazy curve with a(j)
SPS = Callable[[int], float]

POLICY_HELP = "fixed:G, threshold:T, dspark or dspark-prod"


@dataclass(frozen=True)
class Decision:
    """One step's verify lengths and why."""
    curves: list[list[float]]     # per request: the a_j the policy looked at
    lengths: list[int]            # drafts verified per request
    reasons: list[str]            # per request, one line
    expected_tokens: float        # sum over requests of 1 + a_1 + .. + a_l (scheduler's estimate)
    batch_tokens: int             # sum over requests of 1 + l (the root is always verified)
    sps: float                    # SPS(batch_tokens): the operating point used
    budget: int | None = None     # dspark-prod: K, the number of draft slots


def at(curve: Any, j: int) -> float | None:
    """a_j (1-based) of a list or a lazy curve; None past the end of the chain."""
    if hasattr(curve, "a"):
        return curve.a(j)
    return curve[j - 1] if j <= len(curve) else None


class _Asked:
    """A lazy curve that keeps the a_j asked for (j = 1, 2, .. in order)."""

    def __init__(self, curve: Any):
        self.curve, self.values = curve, []

    def a(self, j: int) -> float | None:
        while len(self.values) < j:
            v = self.curve.a(len(self.values) + 1)
            if v is None:
                return None
            self.values.append(v)
        return self.values[j - 1]


def known(curve: Any) -> list[float]:
    """The a_j of a list, or those asked of a lazy curve so far."""
    return list(curve.values) if isinstance(curve, _Asked) else list(curve)


def _decision(curves: Curves, lengths: list[int], reasons: list[str], sps: SPS,
              budget: int | None = None) -> Decision:
    seen = [known(c) for c in curves]
    b = len(curves) + sum(lengths)
    return Decision(seen, lengths, reasons, sum(1.0 + sum(a[:n]) for a, n in zip(seen, lengths)),
                    b, sps(b), budget)


def _ranked(curves: Curves):
    """(r, j, a_j) by a_j descending, ties smaller j then smaller r first: a k-way merge of the
    chains (each non-increasing), so that request r's a_{j+1} is asked for only once its
    (r, j) has been taken."""
    heap = [(-a, 1, r) for r, c in enumerate(curves) if (a := at(c, 1)) is not None]
    heapq.heapify(heap)
    while heap:
        neg, j, r = heapq.heappop(heap)
        yield r, j, -neg
        if (a := at(curves[r], j + 1)) is not None:
            heapq.heappush(heap, (-a, j + 1, r))


def algorithm1(curves: Curves, sps: SPS, early_break: bool = True) -> list[int]:
    """DSpark's hardware-aware prefix scheduler (Algorithm 1). Extends the batch one (r, j) at
    a time, best survival first, while tau * SPS(B) grows, and stops at the first entry that
    does not raise it. `early_break=False` is the biased global search (ALGORITHMS.md §0,
    DSpark Appendix A): it exists only so that tests can show the bias."""
    R = len(curves)
    lengths = [0] * R
    if R == 0:
        return lengths
    b, tau = R, float(R)
    best, chosen = tau * sps(b), list(lengths)
    for r, j, a in _ranked(curves):
        lengths[r] = j
        b += 1
        tau += a
        theta = tau * sps(b)
        if theta > best:
            best, chosen = theta, list(lengths)
        elif early_break:
            break
    return chosen


def top_k(curves: Curves, k: int) -> list[int]:
    """The k best (r, j) by survival (ties smaller j first): a prefix of each request, since
    survival never rises along a chain."""
    lengths = [0] * len(curves)
    if k <= 0:
        return lengths
    for n, (r, j, _) in enumerate(_ranked(curves), 1):
        lengths[r] = j
        if n == k:
            break
    return lengths


@dataclass(frozen=True)
class Policy:
    """A parsed policy id."""
    kind: str                     # "fixed" | "threshold" | "dspark" | "dspark-prod"
    value: float = 0.0            # G for fixed, T for threshold

    @property
    def id(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{int(self.value)}"
        if self.kind == "threshold":
            return f"threshold:{self.value:g}"
        return self.kind


def parse_policy(text: str) -> Policy:
    kind, _, arg = text.strip().partition(":")
    if kind in ("dspark", "dspark-prod") and not arg:
        return Policy(kind)
    if kind == "fixed":
        try:
            g = int(arg)
        except ValueError:
            g = -1
        if g < 0:
            raise ValueError(f"policy {text!r}: fixed:G needs an integer G >= 0")
        return Policy(kind, g)
    if kind == "threshold":
        try:
            t = float(arg)
        except ValueError:
            t = -1.0
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"policy {text!r}: threshold:T needs T in [0, 1]")
        return Policy(kind, t)
    raise ValueError(f"unknown policy {text!r}; choose from: {POLICY_HELP}")


@dataclass
class Scheduler:
    """A policy with the little history `dspark-prod` needs (the curves of past steps)."""
    policy: Policy
    history: list[list[list[float]]] = field(default_factory=list)

    def decide(self, curves: Curves, sps: SPS) -> Decision:
        old = self.history[-2] if len(self.history) >= 2 else None
        d = decide(self.policy, curves, sps, old)
        self.history = (self.history + [d.curves])[-2:]
        return d


def decide(policy: Policy, curves: Curves, sps: SPS, old: Curves | None = None) -> Decision:
    """The verify lengths for one step. `old`: dspark-prod's curves from two steps before."""
    kind = policy.kind
    curves = [_Asked(c) if hasattr(c, "a") else c for c in curves]
    if kind == "fixed":
        g = int(policy.value)
        lengths = [next((j - 1 for j in range(1, g + 1) if at(c, j) is None), g) for c in curves]
        return _decision(curves, lengths, [f"fixed: {g} per request"] * len(curves), sps)
    if kind == "threshold":
        t = policy.value
        lengths, reasons = [], []
        for c in curves:
            j = 1
            while (a := at(c, j)) is not None and a >= t:
                j += 1
            lengths.append(j - 1)
            reasons.append(f"a_{j} = {a:.2f} < {t:g}" if a is not None else f"all a_j >= {t:g}")
        return _decision(curves, lengths, reasons, sps)
    if kind == "dspark" or (kind == "dspark-prod" and old is None):
        lengths = algorithm1(curves, sps)
        floor = min((at(c, n) for c, n in zip(curves, lengths) if n), default=None)
        why = "hardware-aware scheduler: Algorithm 1 over the batch" + \
            (" (no history yet)" if kind == "dspark-prod" else "") + \
            (f", slots down to a_j = {floor:.2f}" if floor is not None else ", no draft pays")
        return _decision(curves, lengths, [why] * len(curves), sps)
    if kind == "dspark-prod":
        k = sum(algorithm1(old, sps))
        lengths = top_k(curves, k)
        return _decision(curves, lengths,
                         [f"top-{k} by a_j (budget from two steps before)"] * len(curves), sps, k)
    raise ValueError(f"unknown policy kind {kind!r}")
