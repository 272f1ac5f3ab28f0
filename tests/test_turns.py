"""turns.in_turns: a blocking call run one turn at a time in a greenlet. Pure Python."""
from __future__ import annotations

import threading
import time

import pytest

from specviz import turns


def counting(name: str, log: list[str], n: int, nap: float = 0.0):
    def work(pause):
        for i in range(n):
            log.append(f"{name}{i}")
            time.sleep(nap)
            pause()
        log.append(f"{name}-end")
        return name.upper()
    return work


def drive(gen):
    """Exhaust a turns generator: (its turns, its return value)."""
    out = []
    while True:
        try:
            out.append(next(gen))
        except StopIteration as stop:
            return out, stop.value


def test_two_calls_take_turns_step_by_step():
    log: list[str] = []
    a, b = turns.in_turns(counting("a", log, 3)), turns.in_turns(counting("b", log, 2))
    next(a), next(b), next(a), next(b)
    assert log == ["a0", "b0", "a1", "b1"]
    rest_a, value_a = drive(a)
    rest_b, value_b = drive(b)
    assert (value_a, value_b) == ("A", "B")
    assert log == ["a0", "b0", "a1", "b1", "a2", "a-end", "b-end"]
    assert len(rest_a) == 2 and len(rest_b) == 1        # turns: 4 for a, 3 for b in all


def test_a_turn_counts_its_own_time_only():
    log: list[str] = []
    gen = turns.in_turns(counting("a", log, 3, nap=0.02))
    times = []
    for t in gen:
        times.append(t)
        time.sleep(0.5)      # the caller's time between turns is not the worker's
    assert len(times) == 4
    assert all(0.015 <= t < 0.4 for t in times[:3]) and times[3] < 0.4


def test_an_error_in_the_call_is_raised_to_the_caller():
    def work(pause):
        pause()
        raise ValueError("boom")
    gen = turns.in_turns(work)
    next(gen)
    with pytest.raises(ValueError, match="boom"):
        next(gen)


def test_closing_early_stops_the_worker():
    log: list[str] = []
    cleaned = []

    def work(pause):
        try:
            counting("a", log, 100)(pause)
        finally:
            cleaned.append(True)

    gen = turns.in_turns(work)
    next(gen), next(gen)
    gen.close()
    assert log == ["a0", "a1"]                 # it never ran another step
    assert cleaned == [True]                   # and it unwound (its finally blocks ran)


def test_turns_run_on_the_callers_thread():
    """No thread of their own: torch's OpenMP team is per OS thread, and a second team on a
    2-core machine slows every parallel op (turns.py's docstring)."""
    seen = []

    def work(pause):
        seen.append(threading.get_ident())
        pause()
        seen.append(threading.get_ident())
        return "done"

    before = threading.active_count()
    a, b = turns.in_turns(work), turns.in_turns(work)
    next(a), next(b)
    assert threading.active_count() == before
    assert drive(a)[1] == drive(b)[1] == "done"
    assert seen == [threading.get_ident()] * 4


def test_streamer_pauses_at_every_put():
    calls = []
    s = turns.Streamer(lambda: calls.append("pause"))
    s.put([1, 2]), s.put([3]), s.end()
    assert calls == ["pause", "pause"]
