"""Engine glue for the UI: build a request from form values, run it off the event loop, race lanes.

Boundary: form values -> a checked `runner.RunSpec`; engine runs (runner.events) stepped on the
process's compute thread (compute.py) by a worker thread that pushes events to a queue, so
rendering never slows the engine's clock, or in the app's shared batch (batcher.py), whose
worker pushes each request's events to its ticket; user-facing errors become one-line
`UserError`s. No Gradio components here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from typing import Any, Iterator

import torch

from specviz import compute, metrics, runner, strategies
from specviz.batcher import Batcher
from specviz.drafters.base import DrafterUnavailable
from specviz.engine.decode import BadRequest, GenSettings
from specviz.events import Event, KVUpdated, RunFinished
from specviz.runner import RunSpec

ENGINE_CONCURRENCY = 2   # engine runs at once per process (Gradio concurrency_id "engine")
# Playground users and API callers wait in queues this wide (batchable requests share one
# batched engine); their runs that cannot batch take one of SINGLE_RUNS
USERS_AT_ONCE = 16
SINGLE_RUNS = threading.BoundedSemaphore(ENGINE_CONCURRENCY)


class UserError(Exception):
    """A problem the page shows as a message; the session goes on."""


def prepare(target, *, prompt: str, strategy: str, overrides: dict[str, Any] | None = None,
            max_new_tokens: Any, temperature: Any, top_p: Any = 1.0, seed: Any = 0,
            chat: bool = True) -> RunSpec:
    """Validate form values and build a request; every failure is a UserError with the fix."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("Enter a prompt first.")
    try:
        gen = GenSettings(max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                          top_p=float(top_p), seed=int(seed))
        gen.check()
        spec = compute.call(runner.prepare, target, strategy=strategy, prompt_ids=[], gen=gen,
                            overrides=overrides)   # builds the drafter: torch work
    except strategies.UnknownStrategy as exc:
        raise UserError(str(exc)) from None
    except DrafterUnavailable as exc:
        raise UserError(f"{strategy} is unavailable: {exc}") from None
    except (BadRequest, ValueError, TypeError) as exc:
        raise UserError(f"Bad settings: {exc}") from None
    ids = target.encode(prompt, chat=chat)
    if len(ids) + 1 >= target.max_len:
        raise UserError(f"The prompt has {len(ids)} tokens; the model's context is "
                        f"{target.max_len} tokens. Shorten it.")
    return dataclasses.replace(spec, prompt_ids=ids)


def friendly(exc: BaseException) -> UserError:
    """An engine failure as the one-line message the page shows."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return UserError("Out of memory: try fewer new tokens, a smaller tree or draft budget, "
                         "or a smaller model.")
    if isinstance(exc, BadRequest):
        return UserError(str(exc))
    return UserError(f"The run failed: {type(exc).__name__}: {exc}")


def in_thread(items: Iterator[Any], name: str,
              gate: contextlib.AbstractContextManager = contextlib.nullcontext()) -> queue.Queue:
    """Advance `items` on the compute thread (compute.iterate) from a daemon thread that holds
    `gate` meanwhile, so the page's loop never slows the engine: the queue gets every item,
    then the exception it raised (if any), then None."""
    q: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            with gate:
                for item in compute.iterate(items):
                    q.put(item)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the page as a message
            q.put(exc)
        q.put(None)

    threading.Thread(target=work, daemon=True, name=name).start()
    return q


def stream(target, req: RunSpec, cancel: threading.Event, every_s: float = 0.25,
           batcher: Batcher | None = None) -> Iterator[list[Event]]:
    """The run's events so far: after the first step, then at most every `every_s` seconds at a
    step boundary, and once at the end. A batchable request (given a `batcher`) rides in the
    app's shared batch, which tells its steps as a single run would; any other runs alone, at
    most ENGINE_CONCURRENCY at once, its steps on the compute thread. Setting `cancel` (or
    closing the iterator) stops it at a step boundary."""
    ticket = None
    if batcher is not None and batcher.batchable(req.strategy, req.settings):
        try:
            ticket = batcher.submit(runner.started(target, req), req.gen)
        except (BadRequest, ValueError) as exc:
            raise UserError(str(exc)) from None
        q = ticket.events
    else:
        q = in_thread(runner.events(target, req, cancel), "specviz-run", SINGLE_RUNS)
    events: list[Event] = []
    last = 0.0
    try:
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                if ticket is not None and cancel.is_set():
                    batcher.cancel(ticket)
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise friendly(item)
            events.append(item)
            now = time.perf_counter()
            first = isinstance(item, KVUpdated) and item.step == 1
            # at most every `every_s` at a step boundary (not only when the queue is empty: a
            # fast drafter's next step is usually queued already, which starved the updates)
            if isinstance(item, RunFinished) or first or (
                    isinstance(item, KVUpdated) and now - last >= every_s):
                last = now
                yield list(events)
    finally:
        cancel.set()
        if ticket is not None:
            batcher.cancel(ticket)


def race(target, reqs: list[RunSpec], cancel: threading.Event) -> Iterator[dict[str, list[Event]]]:
    """Advance several runs one step each in turn (lanes side by side), their steps on the
    compute thread.

    Each lane's clock counts only its own work: the time a lane spends suspended while the
    others step is subtracted from its event times, and its totals are recomputed from them.
    """
    gens = {r.strategy: compute.iterate(runner.events(target, r, cancel)) for r in reqs}
    runs: dict[str, list[Event]] = {sid: [] for sid in gens}
    paused = {sid: 0.0 for sid in gens}
    left_at: dict[str, float] = {}
    try:
        while gens:
            for sid in list(gens):
                if sid in left_at:
                    paused[sid] += time.perf_counter() - left_at[sid]
                for e in gens[sid]:
                    e = dataclasses.replace(e, t=max(0.0, e.t - paused[sid]))
                    if isinstance(e, RunFinished):
                        e = metrics.finish(runs[sid], e.stop_reason, e.text, e.t)
                        del gens[sid]
                    runs[sid].append(e)
                    if isinstance(e, (KVUpdated, RunFinished)):
                        break
                left_at[sid] = time.perf_counter()
            yield runs
    except Exception as exc:  # noqa: BLE001
        raise friendly(exc) from None
    finally:
        cancel.set()
