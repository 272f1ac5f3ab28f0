"""Taking turns: run a blocking call one step at a time, so the bench can interleave decoders
step by step, Hugging Face `generate` (which cannot be stepped from outside) as well as the
engine's own runs.

Boundary: `in_turns(work)` runs `work(pause)` as a greenlet that stops at every `pause()` until
the caller asks for the next turn; `Streamer` is a `generate` streamer that pauses at each step.
Only one side runs at a time. Nothing here knows about models or events.

Why: on a shared machine the speed of the CPU drifts by 10-30% over seconds, so two decoders
timed one after the other differ by that much on the same work. Taking turns every step puts
both under the same conditions within ~0.1 s, and each one's time is the sum of its own turns.

Why greenlets and not threads: every OS thread that runs torch's parallel CPU ops keeps an
OpenMP thread team of its own (GNU libgomp), and once a process holds more team threads than
CPUs, libgomp stops spinning between parallel regions and puts its threads to sleep after each
one. On a 2-core machine a target forward then took 52 ms instead of 38 (for every runner, at
every step, so lockstep ratios measured a slower machine than any single run sees). Greenlets
are switched within the calling thread: one OpenMP team, the speed of a plain run. They share
that thread's state, too: a caller whose works change thread-local state across a pause (torch's
RNG, its grad mode) keeps that state apart itself (bench.py does).
"""
from __future__ import annotations

import time
from typing import Callable, Generator, TypeVar

import greenlet

T = TypeVar("T")


def in_turns(work: Callable[[Callable[[], None]], T]) -> Generator[float, None, T]:
    """A generator that runs `work(pause)` in a greenlet one turn per `next()`: a turn runs from
    one `pause()` to the next (or to the end), and yields its own duration in seconds (the
    hand-over is not counted). Returns what `work` returns; an exception in `work` is raised
    here. Closing the generator early stops the work at its pause (raising GreenletExit there,
    so its `finally` blocks and context managers run)."""
    busy = [0.0, 0.0]           # (start of the current turn, length of the last one)

    def pause() -> None:
        busy[1] = time.perf_counter() - busy[0]
        worker.parent.switch()
        busy[0] = time.perf_counter()

    def main() -> T:
        busy[0] = time.perf_counter()
        out = work(pause)
        busy[1] = time.perf_counter() - busy[0]
        return out

    worker = greenlet.greenlet(main)
    try:
        while True:
            worker.parent = greenlet.getcurrent()   # whoever asks for this turn gets it back
            out = worker.switch()
            if worker.dead:
                break
            yield busy[1]
    finally:
        if not worker.dead:
            worker.throw()                          # GreenletExit: unwinds the paused work
    yield busy[1]
    return out


class Streamer:
    """A `generate` streamer that pauses after every step (transformers calls `put` with the
    prompt, then with each step's new tokens, and `end` when done)."""

    def __init__(self, pause: Callable[[], None]):
        self.pause = pause

    def put(self, value) -> None:
        self.pause()

    def end(self) -> None:
        pass
