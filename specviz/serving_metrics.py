"""Serving-run events -> numbers. Pure Python: no torch, no UI.

Boundary: the metrics of a batched serving run (DESIGN.md §5 `serve-bench`), computed from its
events alone, so a serving trace recorded anywhere replays to the same numbers:
- throughput: all requests' new tokens over the run's wall time;
- per request: new tokens over its time in the system (joined -> finished), and new tokens
  over the batched steps it took part in (its mean accepted length);
- mean accepted length: all new tokens over all request-verify slots (one per request per step);
- mean batch tokens: tokens per batched target forward.
"""
from __future__ import annotations

from typing import Any

from specviz.events import (BatchScheduled, BatchVerified, Event, RequestFinished, RequestJoined,
                            RequestStepped, ServeFinished, ServeStarted, TraceError)

TOTAL_KEYS = ("requests", "steps", "new_tokens", "wall_s", "throughput_tokens_per_s",
              "mean_per_request_tokens_per_s", "mean_accepted_length", "mean_batch_tokens")


def requests(events: list[Event]) -> list[dict[str, Any]]:
    """Per finished request, in join order: id, new_tokens, tokens_per_s, mean_accepted_length,
    stop_reason, token_ids, text."""
    joined = [e.request for e in events if isinstance(e, RequestJoined)]
    slots = {r: 0 for r in joined}
    for e in events:
        if isinstance(e, RequestStepped):
            slots[e.request] = slots.get(e.request, 0) + 1
    done = {e.request: e for e in events if isinstance(e, RequestFinished)}
    out = []
    for r in joined:
        if r not in done:
            continue
        fin = done[r]
        n, span = len(fin.token_ids), fin.t - fin.joined_t
        out.append({"id": r, "new_tokens": n, "tokens_per_s": n / span if span > 0 else 0.0,
                    "mean_accepted_length": n / slots[r] if slots[r] else 0.0,
                    "stop_reason": fin.stop_reason, "token_ids": list(fin.token_ids),
                    "text": fin.text})
    return out


def summarize(events: list[Event]) -> dict[str, Any]:
    """The serving totals of a run's events (ServeFinished, if present, is not read)."""
    reqs = requests(events)
    steps = [e for e in events if isinstance(e, BatchVerified)]
    slots = sum(1 for e in events if isinstance(e, RequestStepped))
    new_tokens = sum(len(e.new_tokens) for e in events if isinstance(e, RequestStepped))
    wall_s = max((e.t for e in events if not isinstance(e, ServeFinished)), default=0.0)
    return {
        "requests": len(reqs),
        "steps": len(steps),
        "new_tokens": new_tokens,
        "wall_s": wall_s,
        "throughput_tokens_per_s": new_tokens / wall_s if wall_s > 0 else 0.0,
        "mean_per_request_tokens_per_s":
            sum(r["tokens_per_s"] for r in reqs) / len(reqs) if reqs else 0.0,
        "mean_accepted_length": new_tokens / slots if slots else 0.0,
        "mean_batch_tokens": sum(e.input_tokens for e in steps) / len(steps) if steps else 0.0,
    }


def finish(events: list[Event], t: float) -> ServeFinished:
    m = summarize(events)
    m["wall_s"] = t
    m["throughput_tokens_per_s"] = m["new_tokens"] / t if t > 0 else 0.0
    return ServeFinished(**m, t=t)


def report(events: list[Event]) -> dict[str, Any]:
    """A finished serving run's metrics: the totals and the per-request rows, plus the
    scheduler's mean expected tokens per step and its draft / verify time."""
    fin = events[-1]
    assert isinstance(fin, ServeFinished)
    sched = [e for e in events if isinstance(e, BatchScheduled)]
    return {k: getattr(fin, k) for k in TOTAL_KEYS} | {
        "draft_s": sum(e.draft_s for e in sched),
        "verify_s": sum(e.verify_s for e in events if isinstance(e, BatchVerified)),
        "mean_expected_tokens": sum(e.expected_tokens for e in sched) / len(sched) if sched else 0.0,
        "request_rows": requests(events)}


def replay(events: list[Event]) -> dict[str, Any]:
    """Recompute a validated serving trace's totals and check them against its ServeFinished."""
    start, fin = events[0], events[-1]
    assert isinstance(start, ServeStarted) and isinstance(fin, ServeFinished)
    again = finish(events[:-1], fin.t)
    if again != fin:
        bad = [k for k in TOTAL_KEYS if getattr(again, k) != getattr(fin, k)]
        raise TraceError(f"trace totals do not match its steps (differs in {', '.join(bad)})")
    return {"strategy": start.strategy, "policy": start.policy} | report(events)
