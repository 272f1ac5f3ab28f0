"""Events -> numbers. Pure Python: no torch, no UI.

Everything the CLI contract reports (DESIGN.md §5) is computed here from the event stream
alone, so a trace recorded anywhere replays to the same numbers.
"""
from __future__ import annotations

from typing import Any, Iterable

from specviz.events import (Accepted, DraftProposed, Event, KVUpdated, RunFinished, RunStarted,
                            TraceError, Verified)

CONTRACT_KEYS = ("new_tokens", "wall_s", "tokens_per_s", "target_forwards", "mean_accepted_length",
                 "acceptance_by_position", "draft_s", "verify_s")


def token_ids(events: Iterable[Event]) -> list[int]:
    """The new tokens of a run, in order (what its Accepted events committed)."""
    return [t for e in events if isinstance(e, Accepted) for t in e.new_tokens]


def acceptance_by_position(events: Iterable[Event]) -> list[float]:
    """Rate at which draft depth j (1-based, list index j-1) was accepted when it was verified."""
    offered: list[int] = []
    hit: list[int] = []
    depths: list[int] = []
    deepest = 0
    for e in events:
        if isinstance(e, DraftProposed):
            depths = e.depths
        elif isinstance(e, Verified):
            deepest = max(depths[:len(e.p)], default=0)
            while len(offered) < deepest:
                offered.append(0)
                hit.append(0)
            for j in range(deepest):
                offered[j] += 1
        elif isinstance(e, Accepted):
            if e.n_accepted > deepest:  # only a hand-edited trace gets here
                raise TraceError(f"step {e.step}: {e.n_accepted} tokens accepted from a draft "
                                 f"verified to depth {deepest}")
            for j in range(e.n_accepted):
                hit[j] += 1
    return [h / o if o else 0.0 for h, o in zip(hit, offered)]


def summarize(events: list[Event]) -> dict[str, Any]:
    """The contract metrics (and a few more) of one run's events."""
    steps = [e for e in events if isinstance(e, Accepted)]
    verifies = [e for e in events if isinstance(e, Verified)]
    drafts = [e for e in events if isinstance(e, DraftProposed)]
    new_tokens = sum(len(e.new_tokens) for e in steps)
    wall_s = max((e.t for e in events), default=0.0)
    draft_s = sum(e.draft_s for e in drafts)
    verify_s = sum(e.verify_s for e in verifies)
    forwards = len(verifies)
    return {
        "new_tokens": new_tokens,
        "wall_s": wall_s,
        "tokens_per_s": new_tokens / wall_s if wall_s > 0 else 0.0,
        "target_forwards": forwards,
        "mean_accepted_length": new_tokens / forwards if forwards else 0.0,
        "acceptance_by_position": acceptance_by_position(events),
        "draft_s": draft_s,
        "verify_s": verify_s,
        "other_s": max(0.0, wall_s - draft_s - verify_s),
        "verified_tokens": sum(e.input_tokens for e in verifies),
        "fallback_steps": sum(1 for e in drafts if e.fallback),
        "rollback_tokens": sum(len(e.dropped) for e in events if isinstance(e, KVUpdated)),
    }


def finish(events: list[Event], stop_reason: str, text: str, t: float) -> RunFinished:
    m = summarize(events)
    m["wall_s"] = t
    m["tokens_per_s"] = m["new_tokens"] / t if t > 0 else 0.0
    m["other_s"] = max(0.0, t - m["draft_s"] - m["verify_s"])
    return RunFinished(**{k: m[k] for k in ("new_tokens", "target_forwards", "wall_s", "draft_s",
                                            "verify_s", "other_s", "mean_accepted_length",
                                            "acceptance_by_position", "tokens_per_s")},
                       stop_reason=stop_reason, text=text, t=t)


def from_finished(fin: RunFinished) -> dict[str, Any]:
    return {k: getattr(fin, k) for k in CONTRACT_KEYS} | {"other_s": fin.other_s,
                                                          "stop_reason": fin.stop_reason}


def replay(events: list[Event]) -> dict[str, Any]:
    """Recompute a validated trace's metrics and check them against its RunFinished."""
    start, fin = events[0], events[-1]
    assert isinstance(start, RunStarted) and isinstance(fin, RunFinished)
    again = finish(events[:-1], fin.stop_reason, fin.text, fin.t)
    if again != fin:
        bad = [k for k in CONTRACT_KEYS if getattr(again, k) != getattr(fin, k)]
        raise TraceError(f"trace totals do not match its steps (differs in {', '.join(bad)})")
    return {"strategy": start.strategy, "text": fin.text} | from_finished(fin)
