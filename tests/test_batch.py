"""The batched engine (engine/batch.py), SPS profiling, serving events and metrics, serve-bench.

- Greedy: every request of a batch equals its own single-request `ar` output (tie-aware), for
  requests of different lengths that join at different steps, with `dspark` and `dflash`
  drafters, through compactions of the shared cache row.
- Sampling: a batched request reproduces the single-request run with the same seed token for
  token when the policy cuts where the single-request drafter does (dspark threshold, dflash
  whole block): same drafts, same RNG draws, the same verification.
- A serving trace round-trips to identical serving metrics; `replay` reads it.
- serve-bench prints the DESIGN.md §5 JSON shape.
The real embedded model is used for the engine tests, with short outputs; the SPS curve there is
a fixed one (measuring takes time), the profiler itself runs on the tiny random model.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from specviz import events as ev
from specviz import metrics, serve, serving_metrics, strategies
from specviz.__main__ import main
from specviz.bench import greedy_match
from specviz.engine import batch, sps
from specviz.engine.batch import BatchEngine, Incoming
from specviz.engine.cost import ForwardCost
from specviz.engine.decode import GenSettings, run
from specviz.engine.scheduler import parse_policy
from specviz.models.target import Target

PROMPTS = ["Why is the sky blue?", "Write a haiku about the sea.",
           "List three prime numbers and explain why they are prime."]
# a CPU-like curve: 40 ms for one token, 47 ms for 8, 90 ms for 32
CURVE = sps.SpsCurve(ForwardCost([1, 8, 32, 64], [0.040, 0.047, 0.090, 0.150]))


def drain(engine: BatchEngine, out: list, joins: dict[int, tuple]) -> None:
    """Step until the batch is empty; joins[step] = (id, prompt ids, settings) joins before it."""
    while engine.members or joins:
        if engine.steps in joins:
            out.append(engine.join(*joins.pop(engine.steps)))
        out += engine.step()


@pytest.mark.parametrize("strategy,policy", [("dspark", "dspark"), ("dflash", "dspark-prod")])
def test_batched_greedy_equals_each_requests_own_ar(target, monkeypatch, strategy, policy):
    monkeypatch.setattr(batch, "COMPACT_MIN", 4)           # compact often: exercise it
    kept = []
    keep = Target.keep
    monkeypatch.setattr(Target, "keep", staticmethod(lambda c, s, r: (kept.append(len(r)),
                                                                       keep(c, s, r))))
    drafter, kind, _ = serve.batch_drafter(target, strategy)
    assert kind == ("calibrated" if strategy == "dspark" else "uncalibrated")
    ids = [target.encode(p) for p in PROMPTS]
    gens = [GenSettings(max_new_tokens=n) for n in (16, 24, 20)]
    engine = BatchEngine(target, drafter, parse_policy(policy), CURVE)
    out = [engine.join(0, ids[0], gens[0]), engine.join(1, ids[1], gens[1])]
    drain(engine, out, {2: (2, ids[2], gens[2])})          # request 2 joins after two steps
    assert kept                                            # the row was compacted
    done = {e.request: e for e in out if isinstance(e, ev.RequestFinished)}
    for i in range(3):
        ref = metrics.token_ids(run(target, ids[i], gens[i]))
        assert greedy_match(target, ids[i], ref, done[i].token_ids), (strategy, i)
    sched = [e for e in out if isinstance(e, ev.BatchScheduled)]
    assert any(len(e.requests) == 3 for e in sched) and len(sched[0].requests) == 2
    assert any(n > 0 for e in sched for n in e.verify_lens)           # drafts were verified
    assert not engine.members and Target.cache_len(engine.cache) == 0


@pytest.mark.parametrize("strategy,overrides,policy", [
    ("dspark", {"scheduler": "threshold", "threshold": 0.2}, "threshold:0.2"),
    ("dflash", {}, "fixed:15")])
def test_batched_sampling_reproduces_single_request_runs(target, strategy, overrides, policy):
    single = strategies.drafter_for(
        target, strategy, dataclasses.replace(strategies.parse_settings(strategy), **overrides))
    drafter, _, _ = serve.batch_drafter(target, strategy)
    ids = [target.encode(p) for p in PROMPTS[:2]]
    gens = [GenSettings(max_new_tokens=14, temperature=0.8, top_p=0.95, seed=s) for s in (3, 4)]
    events = list(batch.serve(target, drafter, [Incoming(i, ids[i], gens[i]) for i in range(2)],
                              parse_policy(policy), CURVE, strategy=strategy))
    done = {e.request: e.token_ids for e in events if isinstance(e, ev.RequestFinished)}
    for i in range(2):
        assert done[i] == metrics.token_ids(run(target, ids[i], gens[i], single)), i


def test_serving_trace_round_trips_to_identical_metrics(target, tmp_path, capsys):
    drafter, kind, sdict = serve.batch_drafter(target, "dspark")
    ids = [target.encode(p) for p in PROMPTS]
    incoming = [Incoming(i, ids[i], GenSettings(max_new_tokens=8 + 2 * i), arrival=0.0)
                for i in range(3)]
    events = list(batch.serve(target, drafter, incoming, parse_policy("dspark"), CURVE,
                              strategy="dspark", strategy_settings=sdict, confidence=kind,
                              sps_curve=CURVE.points(), seed=0))
    path = tmp_path / "serve.jsonl"
    ev.write_trace(events, path)
    back = ev.read_trace(path)
    assert back == events
    m = serving_metrics.replay(back)
    assert m == serving_metrics.replay(events)
    assert m["requests"] == 3 and m["new_tokens"] == 8 + 10 + 12
    assert m["mean_batch_tokens"] >= 3 and m["mean_accepted_length"] >= 1
    assert [r["new_tokens"] for r in m["request_rows"]] == [8, 10, 12]
    assert main(["replay", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput_tokens_per_s"] == \
        m["throughput_tokens_per_s"]
    # a tampered total is caught
    lines = path.read_text().splitlines()
    fin = json.loads(lines[-1]) | {"new_tokens": 999}
    path.write_text("\n".join(lines[:-1] + [json.dumps(fin)]) + "\n")
    with pytest.raises(ev.TraceError):
        serving_metrics.replay(ev.read_trace(path))


def test_serve_events_round_trip_and_trace_shape():
    body = [ev.ServeStarted(strategy="dspark", policy="dspark", settings={"k": [1, None]},
                            target_id="m", drafter_id="dspark", device="cpu", dtype="float32",
                            confidence="calibrated", sps_curve=[[1.0, 25.0], [8.0, 21.0]], seed=0),
            ev.RequestJoined(step=0, request=0, prompt_ids=[1, 2], max_new_tokens=4, seed=0, t=0.1),
            ev.BatchScheduled(step=1, requests=[0], survival=[[0.9, 0.5]], verify_lens=[1],
                              reasons=["Algorithm 1"], expected_tokens=1.9, batch_tokens=2,
                              sps_point=[2.0, 24.0], draft_s=0.01, t=0.2),
            ev.BatchVerified(step=1, input_tokens=2, cache_before=1, cache_after=3, verify_s=0.04,
                             t=0.25),
            ev.RequestStepped(step=1, request=0, drafted=[5, 6], verify_len=1, n_accepted=1,
                              new_tokens=[5, 7], source="argmax", t=0.26),
            ev.RequestFinished(step=1, request=0, token_ids=[5, 7], stop_reason="max_new_tokens",
                               text="ab", joined_t=0.1, t=0.27)]
    events = body + [serving_metrics.finish(body, 0.3)]
    assert {type(e) for e in events} == set(ev.SERVE_TYPES)
    for e in events:
        assert ev.from_dict(json.loads(ev.dumps(e))) == e
    ev.validate(events)
    fin = events[-1]
    assert fin.new_tokens == 2 and fin.mean_accepted_length == 2.0 and fin.mean_batch_tokens == 2
    assert fin.mean_per_request_tokens_per_s == pytest.approx(2 / 0.17)
    with pytest.raises(ev.TraceError):          # a single-run event inside a serving trace
        ev.validate(events[:-1] + [ev.Accepted(step=1, path=[0], n_accepted=0, token=1, piece="",
                                                source="argmax", new_tokens=[1])] + events[-1:])
    with pytest.raises(ev.TraceError):
        ev.validate(events[:-1])


def test_survival_is_known_before_each_token():
    from specviz.engine.tree import DraftTree, Schedule
    import torch
    greedy = DraftTree.chain(0, [5, 6], confidence=[0.5, 0.4])
    assert batch.survival(greedy) == [0.5, pytest.approx(0.2)]
    rows = [torch.tensor([0.7, 0.3]), torch.tensor([0.6, 0.4])]
    sampled = DraftTree.chain(0, [1, 0], q=[0.3, 0.6], q_rows=rows, confidence=[0.3, 0.6])
    assert batch.survival(sampled) == [pytest.approx(0.7), pytest.approx(0.42)]  # not q(x_j)
    calibrated = DraftTree.chain(0, [1], schedule=Schedule([0.8, 0.5], [0.8, 0.4], 2, ""))
    assert batch.survival(calibrated) == [0.8]


def test_sps_profile_is_measured_once_and_cached(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(sps, "REPS", 1)
    curve = sps.profile(tiny_target)
    pts = curve.points()
    assert [b for b, _ in pts] == [float(b) for b in sps.BATCH_TOKENS]
    assert all(a[1] >= b[1] > 0 for a, b in zip(pts, pts[1:]))      # never faster when wider
    assert sps.cache_file(tiny_target).is_file()
    monkeypatch.setattr(sps, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = sps.profile(tiny_target)
    assert again.points() == pts and again(10) == pytest.approx(curve(10))
    assert curve(6) <= curve(4) and curve(6) >= curve(8)              # interpolated


def test_unbatchable_strategies_and_bad_arrivals_are_refused(target):
    with pytest.raises(ValueError, match="chains"):
        serve.batch_drafter(target, "eagle2")
    with pytest.raises(ValueError):
        serve.arrivals("poisson:0", 3, 0)
    times = serve.arrivals("poisson:2", 4, 7)
    assert times[0] == 0.0 and times == sorted(times) and times == serve.arrivals("poisson:2", 4, 7)


def test_serve_bench_json_contract(capsys, tmp_path, target, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    path = sps.cache_file(target)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"points": CURVE.points()}))          # no measuring in a test
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "qa", "prompt": "Count to five."}) + "\n"
                       + json.dumps({"id": "b", "category": "chat", "prompt": "Say hi."}) + "\n")
    code = main(["serve-bench", "--strategy", "dflash", "--prompts", str(prompts), "--requests",
                 "3", "--policies", "fixed:2,dspark", "--max-new-tokens", "6", "--threads", "2",
                 "--json"])
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    assert d["settings"]["requests"] == 3 and d["sps_curve"] == CURVE.points()
    assert list(d["policies"]) == ["fixed:2", "dspark"]
    for p in d["policies"].values():
        for k in ("throughput_tokens_per_s", "mean_per_request_tokens_per_s",
                  "mean_accepted_length", "mean_batch_tokens", "greedy_match_rate"):
            assert isinstance(p[k], float)
        assert p["greedy_match_rate"] == 1.0
        assert [r["id"] for r in p["requests"]] == ["a", "b", "a#2"]
        for r in p["requests"]:
            assert {"id", "new_tokens", "tokens_per_s", "mean_accepted_length",
                    "greedy_match"} <= set(r) and r["new_tokens"] == 6
