"""The app's shared batch: concurrent requests share one batched engine; each gets exactly its
own single-request output (greedy), told as a single run's events (so the Playground's views
and the API's metrics serve it unchanged), and can be cancelled."""
from __future__ import annotations

import threading

import pytest

from specviz import metrics, runner
from specviz.batcher import Batcher
from specviz.bench import greedy_match
from specviz.engine.decode import BadRequest, GenSettings
from specviz.engine.sps import SpsCurve
from specviz.events import EVENT_TYPES, KVUpdated, RunFinished, RunStarted, validate
from specviz.strategies import parse_settings

PROMPTS = ["Name three fruits.", "Write one sentence about the sea.",
           "What is 2 + 2? Answer briefly."]
SPS = SpsCurve.from_points([[1, 20.0], [8, 15.0], [32, 8.0], [64, 4.0]])


def drain(ticket) -> list:
    out = []
    while (item := ticket.events.get(timeout=120)) is not None:
        assert not isinstance(item, BaseException), item
        out.append(item)
    return out


def submit(batcher, target, strategy: str, ids: list[int], gen: GenSettings):
    spec = runner.prepare(target, strategy=strategy, prompt_ids=ids, gen=gen)
    return batcher.submit(runner.started(target, spec), gen)


@pytest.mark.parametrize("strategy", ["ar", "dflash", "dspark"])
def test_concurrent_requests_each_get_their_own_ar_output(target, strategy):
    batcher = Batcher(target, sps=SPS)
    gens = [GenSettings(max_new_tokens=n) for n in (12, 20, 16)]
    ids = [runner.encode(target, p) for p in PROMPTS]
    results: dict[int, list] = {}

    def client(i: int) -> None:
        results[i] = drain(submit(batcher, target, strategy, ids[i], gens[i]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == len(PROMPTS)
    for i, events in results.items():
        assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
        assert all(type(e).__name__ in EVENT_TYPES for e in events)
        validate(events)                  # a well-formed single run: replayable as a trace
        assert metrics.replay(events)["new_tokens"] == len(metrics.token_ids(events))
        assert events[0].prompt_ids == ids[i]
        got = metrics.token_ids(events)
        ref = runner.generate(target, strategy="ar", prompt_ids=ids[i], gen=gens[i]).token_ids
        assert greedy_match(target, ids[i], ref, got), (i, ref, got)
        fin = events[-1]
        assert fin.mean_accepted_length == pytest.approx(fin.new_tokens / fin.target_forwards)
    # the requests rode in the same forwards: the batch held more tokens than a request's own
    events = results[0]
    batch = [e.sps_point[0] for e in events if type(e).__name__ == "ScheduleDecided"]
    own = [e.input_tokens for e in events if type(e).__name__ == "Verified"]
    assert any(b > n for b, n in zip(batch, own))


def test_cancel_takes_a_request_out_between_steps(target):
    batcher = Batcher(target, sps=SPS)
    ticket = submit(batcher, target, "ar", runner.encode(target, "Write a long essay about rivers."),
                    GenSettings(max_new_tokens=400))
    assert isinstance(ticket.events.get(timeout=120), RunStarted)
    while not isinstance(ticket.events.get(timeout=120), KVUpdated):
        pass
    batcher.cancel(ticket)
    fin = drain(ticket)[-1]
    assert isinstance(fin, RunFinished) and fin.stop_reason == "cancelled"
    assert fin.new_tokens < 400


def test_bad_requests_fail_at_submit(target):
    batcher = Batcher(target, sps=SPS)
    with pytest.raises(BadRequest, match="context"):
        submit(batcher, target, "ar", [1] * (target.max_len + 5), GenSettings(max_new_tokens=4))
    with pytest.raises(ValueError, match="not served by the shared batch"):
        submit(batcher, target, "eagle2", [1, 2, 3], GenSettings(max_new_tokens=4))
    assert Batcher.batchable("dspark") and Batcher.batchable("dspark", parse_settings("dspark"))
    assert not Batcher.batchable("dspark", parse_settings("dspark", {"window": "8"}))
