"""The app's shared batched engine: concurrent requests with batchable settings share one
BatchEngine per strategy, stepped by one worker thread (continuous batching across users) whose
torch work runs on the process's compute thread (compute.py).

Boundary: `submit` -> a Ticket with its own event queue; `cancel` takes it out between steps.
The worker admits new requests between steps, steps every engine that has members, and gives
each ticket the events a single run of its request would emit (its RunStarted, per step
DraftProposed .. KVUpdated as the engine tells that request's part, RunFinished), so the
single-run views, metrics and API contract serve it unchanged. A ticket's queue ends with None. Batchable: a chain strategy of `serve.FULL_CHAIN` at its
default settings; the verify lengths are DSpark's Algorithm 1 on the target's SPS curve
(measured once, then cached). The engine work is engine/batch.py; no UI imports here.
"""
from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field

from specviz import compute, metrics, strategies
from specviz import events as ev
from specviz.engine.batch import BatchEngine
from specviz.engine.decode import GenSettings, check_prompt
from specviz.engine.scheduler import parse_policy
from specviz.engine.sps import SpsCurve, profile
from specviz.models.target import Target
from specviz.serve import FULL_CHAIN, batch_drafter

POLICY = "dspark"


@dataclass
class Ticket:
    """One request in the shared batch: its id and its events as they happen (then None)."""
    id: int
    run: list[ev.Event]                   # its single-run events so far, RunStarted first
    events: queue.Queue = field(default_factory=queue.Queue)

    @property
    def started(self) -> ev.RunStarted:
        return self.run[0]


class Batcher:
    def __init__(self, target: Target, policy: str = POLICY, sps: SpsCurve | None = None):
        """sps: the target's SPS curve (default: sps.profile, on the first batched request)."""
        self.target, self.policy = target, parse_policy(policy)
        self._cv = threading.Condition()
        self._engines: dict[str, BatchEngine] = {}
        self._joins: list[tuple[Ticket, GenSettings]] = []
        self._cancels: set[int] = set()
        self._tickets: dict[int, Ticket] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._sps = sps

    @staticmethod
    def batchable(strategy: str, settings=None) -> bool:
        """A chain strategy the batched engine serves, at its default settings (`settings`: the
        strategy's settings dataclass, or None)."""
        return strategy in FULL_CHAIN and (settings is None
                                           or settings == strategies.parse_settings(strategy))

    def submit(self, started: ev.RunStarted, gen: GenSettings) -> Ticket:
        """Queue a request (its RunStarted: strategy and prompt) for the next step boundary;
        BadRequest / ValueError at once for a request the engine would refuse."""
        if not self.batchable(started.strategy):
            raise ValueError(f"{started.strategy!r} is not served by the shared batch")
        gen.check()
        check_prompt(self.target, started.prompt_ids, gen)
        ticket = Ticket(next(self._ids), [started])
        with self._cv:
            self._joins.append((ticket, gen))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="specviz-batcher")
                self._thread.start()
            self._cv.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        with self._cv:
            self._cancels.add(ticket.id)
            self._cv.notify()

    # --- the worker ---------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._joins or self._cancels
                    or any(e.members for e in self._engines.values()))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._busy():
                    self._cv.wait()
                joins, self._joins = self._joins, []
                cancels, self._cancels = self._cancels, set()
            compute.call(self._round, joins, cancels)   # the torch work: on the compute thread

    def _round(self, joins: list[tuple[Ticket, GenSettings]], cancels: set[int]) -> None:
        """Admit, cancel, then step every engine that has members once."""
        for ticket, gen in joins:
            self._join(ticket, gen)
        for rid in cancels:
            for engine in self._engines.values():
                fin = engine.cancel(rid)
                if fin is not None:
                    self._route([fin])
        for strategy, engine in list(self._engines.items()):
            if engine.members:
                self._step(strategy, engine)

    def _join(self, ticket: Ticket, gen: GenSettings) -> None:
        strategy = ticket.started.strategy
        try:
            engine = self._engines.get(strategy)
            if engine is None:
                if self._sps is None:
                    self._sps = profile(self.target)
                drafter, _, _ = batch_drafter(self.target, strategy)
                engine = BatchEngine(self.target, drafter, self.policy, self._sps)
                self._engines[strategy] = engine
            self._tickets[ticket.id] = ticket
            engine.join(ticket.id, ticket.started.prompt_ids, gen, views=True)
            ticket.events.put(ticket.started)
        except Exception as exc:  # noqa: BLE001 - the caller sees it as its request's error
            self._tickets.pop(ticket.id, None)
            ticket.events.put(exc)
            self._end(ticket)

    def _step(self, strategy: str, engine: BatchEngine) -> None:
        members = list(engine.members)
        try:
            events = engine.step()
        except Exception as exc:  # noqa: BLE001 - every request of this batch fails with it
            del self._engines[strategy]  # its cache may be half-updated: start a fresh one
            for rid in (m.id for m in members):
                ticket = self._tickets.pop(rid, None)
                if ticket is not None:
                    ticket.events.put(exc)
                    self._end(ticket)
            return
        for m in members:                # each request's step, then who finished
            ticket = self._tickets.get(m.id)
            if ticket is not None and m.views:
                ticket.run += m.views
                for e in m.views:
                    ticket.events.put(e)
        self._route(events)

    def _route(self, events: list[ev.Event]) -> None:
        """A request that left the batch (finished or cancelled): its RunFinished, then the end."""
        for e in events:
            if isinstance(e, ev.RequestFinished) and e.request in self._tickets:
                ticket = self._tickets.pop(e.request)
                ticket.events.put(metrics.finish(ticket.run, e.stop_reason, e.text,
                                                 e.t - e.joined_t))
                self._end(ticket)

    @staticmethod
    def _end(ticket: Ticket) -> None:
        ticket.events.put(None)
