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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

Curves = Sequence[Sequence[float]]
SPS = Callable[[int], float]

POLICY_HELP = "fixed:G, threshold:T, dspark or dspark-prod"


@dataclass(frozen=True)
class Decision:
    """One step's verify lengths and why."""
    lengths: list[int]            # drafts verified per request
    reasons: list[str]            # per request, one line
    expected_tokens: float        # sum over requests of 1 + a_1 + .. + a_l (scheduler's estimate)
    batch_tokens: int             # sum over requests of 1 + l (the root is always verified)
    sps: float                    # SPS(batch_tokens): the operating point used
    budget: int | None = None     # dspark-prod: K, the number of draft slots


def expected(curves: Curves, lengths: Sequence[int]) -> float:
    return sum(1.0 + sum(a[:n]) for a, n in zip(curves, lengths))


def _decision(curves: Curves, lengths: list[int], reasons: list[str], sps: SPS,
              budget: int | None = None) -> Decision:
    b = len(curves) + sum(lengths)
    return Decision(lengths, reasons, expected(curves, lengths), b, sps(b), budget)


def _order(curves: Curves) -> list[tuple[int, int]]:
    """All (r, j), j 1-based, by survival descending; ties: smaller j first, then smaller r."""
    return sorted(((r, j) for r, a in enumerate(curves) for j in range(1, len(a) + 1)),
                  key=lambda rj: (-curves[rj[0]][rj[1] - 1], rj[1], rj[0]))


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
    for r, j in _order(curves):
        lengths[r] = j
        b += 1
        tau += curves[r][j - 1]
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
    for r, j in _order(curves)[:max(0, k)]:
        lengths[r] = max(lengths[r], j)
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
        curves = [list(a) for a in curves]
        self.history = (self.history + [curves])[-3:]
        return decide(self.policy, curves, sps, self.history[0] if len(self.history) == 3 else None)


def decide(policy: Policy, curves: Curves, sps: SPS, old: Curves | None = None) -> Decision:
    """The verify lengths for one step. `old`: dspark-prod's curves from two steps before."""
    kind = policy.kind
    if kind == "fixed":
        g = int(policy.value)
        lengths = [min(g, len(a)) for a in curves]
        return _decision(curves, lengths, [f"fixed: {g} per request"] * len(curves), sps)
    if kind == "threshold":
        t = policy.value
        lengths = [next((j for j, x in enumerate(a) if x < t), len(a)) for a in curves]
        reasons = [f"a_{n + 1} = {a[n]:.2f} < {t:g}" if n < len(a) else f"all a_j >= {t:g}"
                   for a, n in zip(curves, lengths)]
        return _decision(curves, lengths, reasons, sps)
    if kind == "dspark" or (kind == "dspark-prod" and old is None):
        lengths = algorithm1(curves, sps)
        floor = min((a[n - 1] for a, n in zip(curves, lengths) if n), default=None)
        why = "Algorithm 1" + (" (no history yet)" if kind == "dspark-prod" else "") + \
            (f": slots down to a_j = {floor:.2f}" if floor is not None else ": no draft pays")
        return _decision(curves, lengths, [why] * len(curves), sps)
    if kind == "dspark-prod":
        k = sum(algorithm1(old, sps))
        lengths = top_k(curves, k)
        return _decision(curves, lengths,
                         [f"top-{k} by a_j (budget from two steps before)"] * len(curves), sps, k)
    raise ValueError(f"unknown policy kind {kind!r}")
