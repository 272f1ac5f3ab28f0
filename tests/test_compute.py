"""compute.py: the app's torch work runs on one thread (one OpenMP team per process), whoever
asks for it: single runs, races, the shared batch and the Serving tab."""
from __future__ import annotations

import threading

import pytest

from specviz import compute, metrics, runner
from specviz.engine.decode import GenSettings


def compute_ident() -> int:
    return compute.call(threading.get_ident)


def test_calls_run_on_one_thread_other_than_the_callers():
    seen = {compute_ident()}
    workers = [threading.Thread(target=lambda: seen.add(compute_ident())) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(seen) == 1 and threading.get_ident() not in seen


def test_a_call_from_the_compute_thread_runs_at_once_and_errors_reach_the_caller():
    assert compute.call(lambda: compute.call(lambda: 7)) == 7     # no deadlock on itself

    def boom():
        raise ValueError("boom")
    with pytest.raises(ValueError, match="boom"):
        compute.call(boom)


def test_iterate_computes_each_item_there_and_closes_early_there():
    where, closed = [], []

    def items():
        try:
            for i in range(10):
                where.append(threading.get_ident())
                yield i
        finally:
            closed.append(threading.get_ident())

    it = compute.iterate(items())
    assert [next(it), next(it), next(it)] == [0, 1, 2]
    it.close()
    assert set(where) == set(closed) == {compute_ident()}
    assert list(compute.iterate(iter([1, 2]))) == [1, 2]          # any iterator


@pytest.fixture
def forwards_on(target, monkeypatch):
    """The threads that ran the target's forwards."""
    seen: set[int] = set()
    forward = target.forward

    def spy(*args, **kw):
        seen.add(threading.get_ident())
        return forward(*args, **kw)

    monkeypatch.setattr(target, "forward", spy)
    return seen


def test_the_apps_single_runs_and_races_run_on_the_compute_thread(target, forwards_on):
    from specviz.ui import session

    def prepare(strategy):
        return session.prepare(target, prompt="Name a colour.", strategy=strategy,
                               max_new_tokens=6, temperature=0.0)

    req = prepare("ngram")             # builds the drafter (and its cost model) there too
    runs = list(session.stream(target, req, threading.Event()))
    lanes = list(session.race(target, [req, prepare("ar")], threading.Event()))
    assert metrics.token_ids(runs[-1]) == metrics.token_ids(lanes[-1]["ar"])   # ngram: lossless
    assert forwards_on == {compute_ident()}


def test_the_shared_batch_steps_on_the_compute_thread(target, forwards_on):
    from specviz.batcher import Batcher
    from specviz.engine.sps import SpsCurve

    batcher = Batcher(target, sps=SpsCurve.from_points([[1, 20.0], [8, 15.0]]))
    gen = GenSettings(max_new_tokens=5)
    spec = runner.prepare(target, strategy="ar", prompt_ids=runner.encode(target, "Hi."), gen=gen)
    ticket = batcher.submit(runner.started(target, spec), gen)
    while (item := ticket.events.get(timeout=120)) is not None:
        assert not isinstance(item, BaseException), item
    assert forwards_on == {compute_ident()}
