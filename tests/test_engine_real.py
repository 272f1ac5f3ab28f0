"""The engine on the real embedded SmolLM2-135M-Instruct: losslessness of `ngram` against `ar`,
trace round trips, stops, cancellation and awkward text."""
from __future__ import annotations

import copy
import threading

import pytest

from specviz import events as ev
from specviz import metrics, runner
from specviz.bench import greedy_match
from specviz.engine.decode import BadRequest, GenSettings

PROMPTS = [
    "Summarize in one sentence: The river flooded the old town after three days of heavy rain, "
    "and the mayor asked residents to move to higher ground while volunteers filled sandbags.",
    "List the days of the week, separated by commas.",
    "Write a Python function that reverses a string.",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ngram_greedy_equals_ar(target, prompt):
    ids = runner.encode(target, prompt)
    s = GenSettings(max_new_tokens=48)
    ar = runner.generate(target, strategy="ar", prompt_ids=ids, gen=s)
    ng = runner.generate(target, strategy="ngram", prompt_ids=ids, gen=s)
    assert greedy_match(target, ids, ar.token_ids, ng.token_ids)
    assert ng.finished.new_tokens == len(ng.token_ids)
    assert ar.finished.target_forwards == len(ar.token_ids)


def test_ngram_drafts_a_tree_and_compacts(target):
    """Copy-heavy prompt: the drafter proposes, some drafts are accepted, tree steps compact."""
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    ids = runner.encode(target, f"Repeat exactly, three times: {text}")
    res = runner.generate(target, strategy="ngram", prompt_ids=ids, gen=GenSettings(max_new_tokens=60))
    drafts = [e for e in res.events if isinstance(e, ev.DraftProposed)]
    assert any(len(d.tokens) > 1 for d in drafts)
    assert res.finished.mean_accepted_length > 1.2
    kv = [e for e in res.events if isinstance(e, ev.KVUpdated)]
    for e in kv:
        assert e.target_after == e.target_before - len(e.dropped)
        # the root and the accepted path now sit contiguously from the root's position (the
        # path may take a later branch, so its source positions need not be contiguous)
        assert e.target_after == e.kept[0] + len(e.kept)


def test_trace_round_trip(target, tmp_path):
    ids = runner.encode(target, "Give me two fruit names.")
    res = runner.generate(target, strategy="ngram", prompt_ids=ids,
                          gen=GenSettings(max_new_tokens=16, temperature=0.8, seed=3))
    path = tmp_path / "run.jsonl"
    ev.write_trace(res.events, path)
    back = ev.read_trace(path)
    assert back == res.events
    assert metrics.replay(back)["mean_accepted_length"] == res.finished.mean_accepted_length


def test_unicode_emoji_and_control_characters(target):
    ids = runner.encode(target, "Translate 🙂 and «ça va?» into English.\x07\tThanks — 谢谢")
    res = runner.generate(target, strategy="ngram", prompt_ids=ids, gen=GenSettings(max_new_tokens=10))
    start = res.events[0]
    assert isinstance(start, ev.RunStarted) and "🙂" in "".join(start.prompt_pieces)
    assert res.finished.new_tokens == len(res.token_ids) > 0


def test_eos_stop(target):
    ids = runner.encode(target, "Answer with one word: what color is the sky on a clear day?")
    res = runner.generate(target, strategy="ar", prompt_ids=ids, gen=GenSettings(max_new_tokens=64))
    assert res.finished.stop_reason == "eos"
    assert res.token_ids[-1] in target.eos_ids


def test_cancellation_stops_between_steps(target):
    cancel = threading.Event()
    ids = runner.encode(target, "Write a long essay about rivers.")
    seen = []
    for e in runner.stream(target, strategy="ar", prompt_ids=ids, gen=GenSettings(max_new_tokens=200),
                               cancel=cancel):
        seen.append(e)
        if isinstance(e, ev.Accepted) and e.step == 3:
            cancel.set()
    fin = seen[-1]
    assert isinstance(fin, ev.RunFinished) and fin.stop_reason == "cancelled"
    assert fin.new_tokens == 3


def test_prompt_longer_than_context_is_refused(target):
    ids = [100] * (target.max_len + 5)
    with pytest.raises(BadRequest, match="context"):
        list(runner.stream(target, strategy="ar", prompt_ids=ids, gen=GenSettings(max_new_tokens=4)))


def test_context_limit_stops_cleanly(target):
    """A target whose context ends 6 tokens after the prompt (a copy with a smaller max_len, so
    the test needs no 8k-token prefill)."""
    ids = runner.encode(target, "Count from one to twenty in words, separated by spaces.")
    small = copy.copy(target)
    small.max_len = len(ids) + 6
    for strategy in ("ar", "ngram"):
        res = runner.generate(small, strategy=strategy, prompt_ids=ids, gen=GenSettings(max_new_tokens=50))
        assert res.finished.stop_reason == "context"
        assert len(ids) + res.finished.new_tokens <= small.max_len
