"""Taking turns: run a blocking call one step at a time in a thread of its own, so the bench
can interleave decoders step by step, Hugging Face `generate` (which cannot be stepped from
outside) as well as the engine's own runs.

Boundary: `in_turns(work)` runs `work(pause)` in a worker thread that stops at every `pause()`
until the caller asks for the next turn; `Streamer` is a `generate` streamer that pauses at
each step. Only one side runs at a time. Nothing here knows about models or events.

Why: on a shared machine the speed of the CPU drifts by 10-30% over seconds, so two decoders
timed one after the other differ by that much on the same work. Taking turns every step puts
both under the same conditions within ~0.1 s, and each one's time is the sum of its own turns.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Generator, TypeVar

T = TypeVar("T")


class _Abandoned(Exception):
    """Raised inside the worker when the caller stops taking turns."""


def in_turns(work: Callable[[Callable[[], None]], T]) -> Generator[float, None, T]:
    """A generator that runs `work(pause)` in a worker thread one turn per `next()`: a turn runs
    from one `pause()` to the next (or to the end), and yields its own duration in seconds,
    timed in the worker (the hand-over between threads is not counted). Returns what `work`
    returns; an exception in `work` is raised here. Closing the generator early stops the
    worker at its next pause."""
    go, paused = threading.Semaphore(0), threading.Semaphore(0)
    state: dict = {"busy": 0.0, "done": False, "stop": False}

    def pause() -> None:
        state["busy"] = time.perf_counter() - state["t"]
        paused.release()
        go.acquire()
        if state["stop"]:
            raise _Abandoned
        state["t"] = time.perf_counter()

    def main() -> None:
        go.acquire()
        state["t"] = time.perf_counter()
        try:
            if not state["stop"]:
                state["result"] = work(pause)
        except _Abandoned:
            pass
        except BaseException as exc:  # handed to the caller's thread
            state["error"] = exc
        state["busy"] = time.perf_counter() - state["t"]
        state["done"] = True
        paused.release()

    worker = threading.Thread(target=main, name="specviz-turns", daemon=True)
    worker.start()
    try:
        while True:
            go.release()
            paused.acquire()
            if state["done"]:
                break
            yield state["busy"]
    finally:
        if not state["done"]:
            state["stop"] = True
            go.release()
        worker.join()
    if "error" in state:
        raise state["error"]
    yield state["busy"]
    return state["result"]


class Streamer:
    """A `generate` streamer that pauses after every step (transformers calls `put` with the
    prompt, then with each step's new tokens, and `end` when done)."""

    def __init__(self, pause: Callable[[], None]):
        self.pause = pause

    def put(self, value) -> None:
        self.pause()

    def end(self) -> None:
        pass
