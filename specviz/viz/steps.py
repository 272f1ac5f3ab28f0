"""Fold an event stream into per-step records, and classify every draft node.

Boundary: the one place that decides what a node's status is (accepted / rejected / pending)
and what kind the target's own token is (bonus / corrected / plain). Views read these records;
none re-derives statuses from raw events.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specviz.events import (Accepted, DraftProposed, Event, KVUpdated, RunFinished, RunStarted,
                            ScheduleDecided, Verified)


@dataclass
class Step:
    step: int
    draft: DraftProposed | None = None
    schedule: ScheduleDecided | None = None
    verified: Verified | None = None
    accepted: Accepted | None = None
    kv: KVUpdated | None = None

    @property
    def n_nodes(self) -> int:
        return len(self.draft.tokens) if self.draft else 0

    @property
    def n_verified(self) -> int:
        """Nodes that went through the target (root included); the rest were truncated."""
        return len(self.verified.p) if self.verified else 0

    def node_status(self) -> list[str]:
        """Per draft node: "root", "accepted", "rejected" or "pending"."""
        path = set(self.accepted.path) if self.accepted else set()
        out = []
        for i in range(self.n_nodes):
            if i == 0:
                out.append("root")
            elif i in path:
                out.append("accepted")
            elif i < self.n_verified and self.accepted:
                out.append("rejected")
            else:
                out.append("pending")
        return out

    def extra_kind(self) -> str | None:
        """What the target's own token of this step is: "bonus", "corrected" or "target"."""
        if not self.accepted:
            return None
        if self.accepted.source == "bonus":
            return "bonus"
        end = self.accepted.path[-1]
        had_children = any(par == end for par in self.draft.parents[1:self.n_verified])
        return "corrected" if had_children else "target"

    def committed(self) -> list[tuple[str, str, int | None]]:
        """The tokens this step added, as (piece, status, node id or None for the target's)."""
        if not self.accepted:
            return []
        a = self.accepted
        items = [(self.draft.pieces[i], "accepted", i) for i in a.path[1:]]
        items.append((a.piece, self.extra_kind(), None))
        return items[:len(a.new_tokens)]


@dataclass
class RunView:
    start: RunStarted | None = None
    steps: list[Step] = field(default_factory=list)
    finished: RunFinished | None = None

    @property
    def complete_steps(self) -> list[Step]:
        return [s for s in self.steps if s.kv is not None]


def fold(events: list[Event]) -> RunView:
    view = RunView()
    for e in events:
        if isinstance(e, RunStarted):
            view.start = e
        elif isinstance(e, RunFinished):
            view.finished = e
        else:
            if not view.steps or view.steps[-1].step != e.step:
                view.steps.append(Step(e.step))
            s = view.steps[-1]
            kind = {DraftProposed: "draft", ScheduleDecided: "schedule", Verified: "verified",
                    Accepted: "accepted", KVUpdated: "kv"}[type(e)]
            setattr(s, kind, e)
    return view


def events_upto(events: list[Event], step: int) -> list[Event]:
    """The events of steps 1..step (RunStarted included, RunFinished only when step is last)."""
    last = max((getattr(e, "step", 0) for e in events), default=0)
    return [e for e in events
            if getattr(e, "step", 0) <= step and (step >= last or not isinstance(e, RunFinished))]
