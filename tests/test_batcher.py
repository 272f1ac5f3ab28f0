"""The app's shared batch: concurrent requests share one batched engine, each gets exactly its
own single-request output (greedy), its own events, and can be cancelled."""
from __future__ import annotations

import threading

import pytest

from specviz import runner, serving_metrics
from specviz.batcher import Batcher
from specviz.bench import greedy_match
from specviz.engine.decode import BadRequest, GenSettings
from specviz.engine.sps import SpsCurve
from specviz.events import RequestFinished, RequestJoined, RequestStepped
from specviz.metrics import CONTRACT_KEYS

PROMPTS = ["Name three fruits.", "Write one sentence about the sea.",
           "What is 2 + 2? Answer briefly."]
SPS = SpsCurve.from_points([[1, 20.0], [8, 15.0], [32, 8.0], [64, 4.0]])


def drain(ticket) -> list:
    out = []
    while (item := ticket.events.get(timeout=120)) is not None:
        assert not isinstance(item, BaseException), item
        out.append(item)
    return out


@pytest.mark.parametrize("strategy", ["ar", "dflash"])
def test_concurrent_requests_each_get_their_own_ar_output(target, strategy):
    batcher = Batcher(target, sps=SPS)
    gens = [GenSettings(max_new_tokens=n) for n in (12, 20, 16)]
    ids = [runner.encode(target, p) for p in PROMPTS]
    results: dict[int, list] = {}

    def client(i: int) -> None:
        results[i] = drain(batcher.submit(strategy, ids[i], gens[i]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    steps_shared = 0
    for i, events in results.items():
        assert isinstance(events[0], RequestJoined) and isinstance(events[-1], RequestFinished)
        assert {e.request for e in events if hasattr(e, "request")} == {events[0].request}
        got = serving_metrics.request_tokens(events)
        ref = runner.generate(target, strategy="ar", prompt_ids=ids[i], gen=gens[i]).token_ids
        assert greedy_match(target, ids[i], ref, got), (i, ref, got)
        m = serving_metrics.request_metrics(events, wall_s=1.0)
        assert set(CONTRACT_KEYS) <= set(m) and m["new_tokens"] == len(got)
        assert m["mean_accepted_length"] == pytest.approx(m["new_tokens"] / m["target_forwards"])
        steps_shared = max(steps_shared, max(len(e.requests) for e in events
                                             if type(e).__name__ == "BatchScheduled"))
    assert len(results) == len(PROMPTS)
    assert steps_shared >= 2      # the requests really rode in the same forwards


def test_cancel_takes_a_request_out_between_steps(target):
    batcher = Batcher(target, sps=SPS)
    ticket = batcher.submit("ar", runner.encode(target, "Write a long essay about rivers."),
                            GenSettings(max_new_tokens=400))
    first = ticket.events.get(timeout=120)
    assert isinstance(first, RequestJoined)
    while not isinstance(ticket.events.get(timeout=120), RequestStepped):
        pass
    batcher.cancel(ticket)
    rest = drain(ticket)
    fin = rest[-1]
    assert isinstance(fin, RequestFinished) and fin.stop_reason == "cancelled"
    assert len(fin.token_ids) < 400


def test_bad_requests_fail_at_submit(target):
    batcher = Batcher(target, sps=SPS)
    with pytest.raises(BadRequest, match="context"):
        batcher.submit("ar", [1] * (target.max_len + 5), GenSettings(max_new_tokens=4))
    with pytest.raises(ValueError, match="not served by the shared batch"):
        batcher.submit("eagle2", [1, 2, 3], GenSettings(max_new_tokens=4))
    assert Batcher.batchable("dspark") and not Batcher.batchable("dspark", {"window": "8"})
