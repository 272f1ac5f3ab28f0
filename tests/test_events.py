"""Events, JSONL traces and replay: exact round trips, and a clear TraceError for every kind of
malformed trace.

Boundary: `specviz.events` and `specviz.metrics` on a hand-built run that holds every event type
(with unicode, control characters, None entries and floats that need all 17 digits), plus one
real engine run on the tiny random Llama.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specviz import events as ev
from specviz import metrics
from specviz.drafters.ngram import NgramDrafter, NgramSettings
from specviz.engine import decode
from specviz.engine.decode import GenSettings


def hand_run() -> list[ev.Event]:
    body: list[ev.Event] = [
        ev.RunStarted(strategy="ngram", settings={"max_new_tokens": 8, "temperature": 0.7,
                                                  "nested": {"a": [1, 2.5, None]}},
                      target_id="SmolLM2-135M-Instruct", drafter_id="ngram", device="cpu",
                      dtype="float32", prompt_ids=[1, 2, 3], prompt_pieces=["héllo", " 🚀", "\n\t\x00\""],
                      seed=7),
        # step 1: a 3-node tree, confidence-truncated to depth 2, one draft accepted
        ev.DraftProposed(step=1, tokens=[3, 10, 11, 12], pieces=["\n", "a", "b", "日本"],
                         parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2], q=[None, 0.5, None, 0.1 + 0.2],
                         confidence=[None, 0.9, None, 0.75], draft_s=0.001234, note="n=2 match",
                         t=0.01),
        ev.ScheduleDecided(step=1, confidence=[0.9, 0.75], survival=[0.9, 0.675], verify_len=2,
                           reason="threshold", threshold=0.5, sps_point=[8.0, 11.1], t=0.011),
        ev.Verified(step=1, p=[None, 0.8, 0.1, 1 / 3], argmax=[None, 10, 10, 12],
                    argmax_pieces=[None, "a", "a", "c"], draw=[None, 0.3, None, 0.9],
                    verify_s=0.05, input_tokens=4, t=0.06),
        ev.Accepted(step=1, path=[0, 1], n_accepted=1, token=13, piece="d", source="residual",
                    new_tokens=[10, 13], t=0.061),
        ev.KVUpdated(step=1, target_before=6, target_after=4, kept=[2, 3], dropped=[4, 5], t=0.062),
        # step 2: a fallback plain step that ends the run
        ev.DraftProposed(step=2, tokens=[13], pieces=["d"], parents=[-1], depths=[0], q=[None],
                         confidence=[None], draft_s=0.0001, fallback=True, note="no match", t=0.07),
        ev.Verified(step=2, p=[None], argmax=[None], argmax_pieces=[None], draw=[None],
                    verify_s=0.04, input_tokens=1, t=0.11),
        ev.Accepted(step=2, path=[0], n_accepted=0, token=2, piece="</s>", source="sample",
                    new_tokens=[2], t=0.111),
        ev.KVUpdated(step=2, target_before=4, target_after=5, kept=[4], dropped=[],
                     drafter_before=3, drafter_after=4, t=0.112),
    ]
    return body + [metrics.finish(body, "eos", "a d ✓", 0.12)]


RUN = hand_run()


def lines_of(events) -> list[str]:
    return [ev.dumps(e) for e in events]


def write_lines(tmp_path, lines: list[str], name: str = "t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def edit(line: str, **changes) -> str:
    d = json.loads(line)
    for k, v in changes.items():
        if v is ...:
            del d[k]
        else:
            d[k] = v
    return json.dumps(d)


def test_hand_run_covers_every_event_type():
    assert {type(e).__name__ for e in RUN} == set(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", RUN, ids=lambda e: type(e).__name__)
def test_event_round_trips_exactly(event):
    line = ev.dumps(event)
    assert "\n" not in line
    back = ev.from_dict(json.loads(line))
    assert back == event and type(back) is type(event)
    assert ev.dumps(back) == line


def test_trace_file_round_trip_and_replay(tmp_path):
    path = tmp_path / "run.jsonl"
    ev.write_trace(RUN, path)
    back = ev.read_trace(path)
    assert back == RUN
    assert (0.1 + 0.2) in back[1].q                     # not 0.3: all digits survive
    assert back[0].prompt_pieces == ["héllo", " 🚀", "\n\t\x00\""]
    assert metrics.replay(back) == metrics.replay(RUN)
    assert metrics.summarize(back[:-1]) == metrics.summarize(RUN[:-1])


def test_metrics_of_the_hand_run():
    m = metrics.replay(RUN)
    assert m["strategy"] == "ngram" and m["text"] == "a d ✓" and m["stop_reason"] == "eos"
    assert m["new_tokens"] == 3 and m["target_forwards"] == 2
    assert m["mean_accepted_length"] == 1.5
    assert m["acceptance_by_position"] == [1.0, 0.0]    # depth 1: 1 of 1; depth 2: 0 of 1
    assert m["wall_s"] == 0.12 and m["tokens_per_s"] == pytest.approx(25.0)
    assert m["draft_s"] == pytest.approx(0.001334) and m["verify_s"] == pytest.approx(0.09)
    assert set(metrics.CONTRACT_KEYS) <= set(m)
    s = metrics.summarize(RUN)
    assert s["verified_tokens"] == 5 and s["fallback_steps"] == 1 and s["rollback_tokens"] == 2


def test_real_engine_trace_round_trips(tiny_target, tmp_path):
    prompt = tiny_target.encode("one two three one two three one two", chat=False)
    drafter = NgramDrafter(NgramSettings(min_expected=0.0, store=False))
    settings = GenSettings(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=3)
    run = list(decode.run(tiny_target, prompt, settings, drafter, strategy="ngram"))
    assert any(len(e.tokens) > 1 for e in run if isinstance(e, ev.DraftProposed))
    path = tmp_path / "real.jsonl"
    ev.write_trace(run, path)
    back = ev.read_trace(path)
    assert back == run
    m = metrics.replay(back)
    assert m == metrics.replay(run) and m["new_tokens"] == run[-1].new_tokens


# --- malformed traces -------------------------------------------------------------------------

GOOD = lines_of(RUN)


def _with(i: int, line: str) -> list[str]:
    return GOOD[:i] + [line] + GOOD[i + 1:]


MALFORMED = {
    "bad JSON line": (_with(2, GOOD[2][:-5]), r"line 3: not valid JSON"),
    "JSON that is not an object": (_with(2, "[1, 2]"), r"line 3: expected a JSON object, got list"),
    "unknown event type": (_with(1, edit(GOOD[1], type="DraftRejected")),
                           r"line 2: unknown event type 'DraftRejected'"),
    "missing type": (_with(1, edit(GOOD[1], type=...)), r"line 2: unknown event type None"),
    "missing field": (_with(1, edit(GOOD[1], step=...)), r"line 2: DraftProposed lacks fields \['step'\]"),
    "unknown field": (_with(3, edit(GOOD[3], colour="red")),
                      r"line 4: Verified has unknown fields \['colour'\]"),
    "NaN number": (_with(1, GOOD[1].replace('"draft_s": 0.001234', '"draft_s": NaN')),
                   r"line 2: DraftProposed.draft_s: non-finite number nan"),
    "Infinity in a list": (_with(3, GOOD[3].replace("0.8", "Infinity")),
                           r"line 4: Verified.p: non-finite number inf"),
    "NaN in nested settings": (_with(0, GOOD[0].replace("2.5", "NaN")),
                               r"line 1: RunStarted.settings: non-finite number nan"),
    "string step": (_with(4, edit(GOOD[4], step="1")), r"line 5: Accepted.step should be int, got '1'"),
    "string token list": (_with(4, edit(GOOD[4], new_tokens="ab")),
                          r"line 5: Accepted.new_tokens should be list\[int\]"),
    "null where a string belongs": (_with(4, edit(GOOD[4], piece=None)),
                                    r"line 5: Accepted.piece should be str, got None"),
    "truncated (no RunFinished)": (GOOD[:-1], r"truncated: it does not end with RunFinished"),
    "cut inside the last line": (GOOD[:-1] + [GOOD[-1][:40]], r"line 11: not valid JSON"),
    "does not start with RunStarted": (GOOD[1:], r"must start with RunStarted"),
    "empty file": ([], r"trace is empty"),
    "only blank lines": (["", "   ", ""], r"trace is empty"),
    "wrong schema version": (_with(0, edit(GOOD[0], schema=2)),
                             r"schema version 2 is not supported \(this specviz reads version 1\)"),
    "two runs": (GOOD + GOOD, r"exactly one run"),
    "steps going backwards": (GOOD[:6] + [edit(GOOD[6], step=0)] + GOOD[7:],
                              r"step numbers go backwards at DraftProposed step 0"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_trace_raises_trace_error(case, tmp_path):
    lines, message = MALFORMED[case]
    path = write_lines(tmp_path, lines)
    with pytest.raises(ev.TraceError, match=message):
        ev.read_trace(path)


@pytest.mark.parametrize("field, value", [("new_tokens", 4), ("target_forwards", 3),
                                          ("acceptance_by_position", [1.0, 0.5]),
                                          ("verify_s", 0.08), ("tokens_per_s", 26.0)])
def test_tampered_totals_fail_replay(tmp_path, field, value):
    path = write_lines(tmp_path, GOOD[:-1] + [edit(GOOD[-1], **{field: value})])
    events = ev.read_trace(path)                        # well-formed, so it reads
    with pytest.raises(ev.TraceError, match=f"trace totals do not match its steps .*{field}"):
        metrics.replay(events)


def test_tampered_step_fails_replay(tmp_path):
    # step 2 claims an accepted draft although only its root was verified
    lines = GOOD[:8] + [edit(GOOD[8], n_accepted=1, path=[0, 0])] + GOOD[9:]
    events = ev.read_trace(write_lines(tmp_path, lines))
    with pytest.raises(ev.TraceError, match="step 2: 1 tokens accepted from a draft verified to depth 0"):
        metrics.replay(events)
    # a step that is inconsistent only with the totals
    lines = GOOD[:4] + [edit(GOOD[4], new_tokens=[10, 13, 14])] + GOOD[5:]
    with pytest.raises(ev.TraceError, match="new_tokens"):
        metrics.replay(ev.read_trace(write_lines(tmp_path, lines)))


def test_unreadable_traces(tmp_path):
    with pytest.raises(ev.TraceError, match="cannot read trace"):
        ev.read_trace(tmp_path / "missing.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD[0].encode() + b"\n\xff\xfe\n")
    with pytest.raises(ev.TraceError, match="is not UTF-8 text"):
        ev.read_trace(path)


def test_writing_refuses_non_finite_numbers(tmp_path):
    bad = replace(RUN[1], draft_s=float("nan"))
    with pytest.raises(ValueError):
        ev.write_trace([RUN[0], bad], tmp_path / "x.jsonl")
