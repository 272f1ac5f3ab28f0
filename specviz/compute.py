"""The process's one compute thread: the app runs its torch work there, and only there.

Boundary: `call(fn, *args)` runs `fn` on that thread and returns its result (or raises its
exception); `iterate(items)` advances an iterator there, one item per task, so that the runs of
several users interleave item by item (event by event for engine runs) on the one thread. A
call made on the compute thread itself runs at once, and so does every call after
`run_inline()` (a ZeroGPU Space, where the engine must run inside the request's own GPU-decorated
call). Nothing here knows about models.

Why: every OS thread that runs torch's parallel CPU ops keeps an OpenMP thread team of its own
(GNU libgomp), and once a process holds more team threads than CPUs, libgomp puts them to sleep
after every parallel region instead of spinning. A forward is hundreds of small regions, so each
one then waits for its threads to wake: on a 2-core machine the embedded target's forward took
52 ms instead of 38, for every run, as soon as the model had been loaded on one thread and run
on another (the app served `ar` at 15-17 tok/s through its API where a plain run makes 24).
With one thread for all of it there is one team, whatever the number of users.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")

_here = threading.local()
_inline = False
_tasks: queue.SimpleQueue = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _serve() -> None:
    """The compute thread: run the queued tasks in order, for the life of the process (a daemon:
    it never holds up the interpreter's exit)."""
    _here.compute = True
    while True:
        fn, args, kwargs, done = _tasks.get()
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)


def on_compute_thread() -> bool:
    return getattr(_here, "compute", False)


def run_inline() -> None:
    """From now on, run every call on the caller's own thread."""
    global _inline
    _inline = True


def call(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) on the compute thread (at once when already there), after the tasks
    queued before it."""
    global _thread
    if _inline or on_compute_thread():
        return fn(*args, **kwargs)
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_serve, name="specviz-compute", daemon=True)
            _thread.start()
    done: Future = Future()
    _tasks.put((fn, args, kwargs, done))
    return done.result()


def iterate(items: Iterator[T]) -> Iterator[T]:
    """The items of `items`, each one computed on the compute thread. Stopping early closes
    `items` there too (a generator's `finally` blocks run on the thread that ran its body)."""
    end = object()
    try:
        while (item := call(next, items, end)) is not end:
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            call(close)
