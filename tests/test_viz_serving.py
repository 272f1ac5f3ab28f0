"""viz/serving.py from hand-built serving events: lanes (escaping, progress, per-request numbers,
waiting requests), the per-step verify budget, the SPS curve with operating points, and the
policy comparison; then the Serving tab's form check. No model."""
from __future__ import annotations

import dataclasses

import pytest

from specviz import serving_metrics
from specviz.events import (BatchScheduled, BatchVerified, RequestFinished, RequestJoined,
                            RequestStepped, ServeStarted)
from specviz.viz import serving

CURVE = [[1.0, 50.0], [4.0, 40.0], [8.0, 25.0]]


def run(policy="dspark", confidence="calibrated", budget=None):
    """Requests 0 and 1 join before step 1, request 2 before step 2; step 1 verifies 2 + 1
    drafts, step 2 verifies 1 + 0 + 2. Request 1 finishes (eos) after step 2."""
    events = [
        ServeStarted(strategy="dspark", policy=policy, settings={}, target_id="t",
                     drafter_id="dspark", device="cpu", dtype="float32", confidence=confidence,
                     sps_curve=CURVE, seed=0, t=0.0),
        RequestJoined(step=0, request=0, prompt_ids=[1, 2, 3], max_new_tokens=8, seed=0, t=0.5),
        RequestJoined(step=0, request=1, prompt_ids=[4, 5], max_new_tokens=4, seed=1, t=1.0),
        BatchScheduled(step=1, requests=[0, 1], survival=[[0.9, 0.6, 0.2], [0.7, 0.3]],
                       verify_lens=[2, 1], reasons=["Algorithm 1: slots down to a_j = 0.60"] * 2,
                       expected_tokens=4.2, batch_tokens=5, sps_point=[5.0, 36.0], draft_s=0.1,
                       budget=budget, t=1.1),
        BatchVerified(step=1, input_tokens=5, cache_before=5, cache_after=9, verify_s=0.2, t=1.3),
        RequestStepped(step=1, request=0, drafted=[10, 11, 12], verify_len=2, n_accepted=2,
                       new_tokens=[10, 11, 13], source="bonus", t=1.3),
        RequestStepped(step=1, request=1, drafted=[20, 21], verify_len=1, n_accepted=0,
                       new_tokens=[22], source="argmax", t=1.3),
        RequestJoined(step=1, request=2, prompt_ids=[6], max_new_tokens=8, seed=2, t=1.5),
        BatchScheduled(step=2, requests=[0, 1, 2], survival=[[0.5], [0.8, 0.4], [0.95, 0.9]],
                       verify_lens=[1, 0, 2], reasons=["r0 <why>", "r1", "r2"],
                       expected_tokens=5.35, batch_tokens=6, sps_point=[6.0, 32.0], draft_s=0.1,
                       budget=budget, t=1.6),
        BatchVerified(step=2, input_tokens=6, cache_before=10, cache_after=13, verify_s=0.2,
                      t=1.8),
        RequestStepped(step=2, request=0, drafted=[14], verify_len=1, n_accepted=0,
                       new_tokens=[15], source="argmax", t=1.8),
        RequestStepped(step=2, request=1, drafted=[23, 24], verify_len=0, n_accepted=0,
                       new_tokens=[2], source="bonus", t=1.8),
        RequestStepped(step=2, request=2, drafted=[30, 31], verify_len=2, n_accepted=1,
                       new_tokens=[30, 32], source="argmax", t=1.8),
        RequestFinished(step=2, request=1, token_ids=[22, 2], stop_reason="eos", text="x",
                        joined_t=0.9, t=1.9),
    ]
    return events


def finished(events):
    """The run completed: the two running requests finish at 2.5 s, then ServeFinished."""
    out = list(events)
    for rid, toks in ((0, [10, 11, 13, 15]), (2, [30, 32])):
        out.append(RequestFinished(step=2, request=rid, token_ids=toks,
                                   stop_reason="max_new_tokens", text="", joined_t=0.4, t=2.5))
    return out + [serving_metrics.finish(out, 2.5)]


def decode(ids):
    return f"<script>{len(ids)}</script>"


def test_lanes_escape_text_and_show_each_request():
    labels = {0: "copy <b>list</b>", 1: "explain", 2: "code", 3: "late arrival"}
    h = serving.lanes_html(run(), decode, labels, title="A: ")
    assert "<script>" not in h and "&lt;script&gt;4&lt;/script&gt;" in h
    assert "<b>list" not in h and "copy &lt;b&gt;list&lt;/b&gt;" in h
    assert h.count('class="sv-lane sv-serve-lane') == 4
    assert "waiting to arrive" in h                      # request 3 has not joined
    # request 0 is running: 4 of 8 tokens, over 1.9 (the latest event) - 0.5 s, in 2 steps
    assert "4/8 tokens · 2.9 tok/s · τ 2.00 · running" in h
    assert 'style="width:50%"' in h
    # request 1 finished: serving_metrics' figure, 2 tokens over 1.9 - 0.9 s
    assert "2/4 tokens · 2.0 tok/s · τ 1.00 · finished (eos)" in h
    assert "policy dspark · dspark" in h and "calibrated" in h and "uncalibrated" not in h
    assert "running: 2 steps · 8 tokens" in h


def test_lanes_label_long_prompts_and_unlabelled_requests():
    h = serving.lanes_html(run(confidence="uncalibrated"), decode, {0: "word " * 40})
    assert "…" in h and "word " * 20 not in h           # cut and whitespace folded
    assert "2 prompt tokens" in h                         # request 1 has no label
    assert "uncalibrated" in h


def test_budget_stacks_each_requests_slots_with_its_a_j_and_reason():
    fig = serving.budget_figure(run(), "A: ")
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert list(bars) == ["request 0", "request 1", "request 2"]
    assert list(bars["request 0"].x) == [1, 2] and list(bars["request 0"].y) == [3, 2]
    assert list(bars["request 2"].x) == [2] and list(bars["request 2"].y) == [3]
    for step, b in ((1, 5), (2, 6)):                      # the stack is the batch tokens
        assert sum(y for t in bars.values() for x, y in zip(t.x, t.y) if x == step) == b
    hover = bars["request 0"].hovertext[0]
    assert "root + 2 of 3 drafts" in hover and "a_j: 0.90 0.60 ┆ 0.20" in hover
    assert "accepted 2 of 2 → +3 tokens" in hover and "slots down to a_j = 0.60" in hover
    assert "r0 &lt;why&gt;" in bars["request 0"].hovertext[1]     # reasons are escaped
    assert "a_j: ┆ 0.80 0.40" in bars["request 1"].hovertext[1]  # verified none of its drafts
    lines = {t.name: t for t in fig.data if t.type == "scatter"}
    assert list(lines["expected tokens (Σ 1 + a_1..a_l)"].y) == [4.2, 5.35]
    assert list(lines["tokens committed"].y) == [4, 4]
    assert fig.layout.barmode == "stack"
    assert "a_j calibrated" in fig.layout.title.text


def test_budget_hover_names_dspark_prod_budget_and_cuts_long_curves():
    events = run(policy="dspark-prod", confidence="uncalibrated", budget=3)
    long = dataclasses.replace(events[3], survival=[[0.9 ** k for k in range(1, 13)],
                                                    [0.7, 0.3]])
    fig = serving.budget_figure(events[:3] + [long] + events[4:])
    hover = fig.data[0].hovertext[0]
    assert "budget K = 3" in hover
    assert hover.count(" ") < 40 and "┆ 0.73 0.66 0.59 …" in hover
    assert "uncalibrated" in fig.layout.title.text


def test_sps_curve_and_operating_points_per_run():
    a, b = run(), run(policy="fixed:2")
    b[8] = dataclasses.replace(b[8], batch_tokens=5, sps_point=[5.0, 36.0])   # both steps at 5
    fig = serving.sps_figure({"dspark": a, "fixed:2": b})
    curve, pa, pb = fig.data
    assert list(curve.x) == [1.0, 4.0, 8.0] and list(curve.y) == [50.0, 40.0, 25.0]
    assert list(pa.x) == [5, 6] and list(pa.y) == [36.0, 32.0]
    assert list(pb.x) == [5] and pb.marker.size[0] > pa.marker.size[0]
    assert "2 step(s) at B = 5 (steps 1, 2)" in pb.hovertext[0]
    assert "≈ 151 tokens/s expected" in pa.hovertext[0]    # 4.2 expected × 36 steps/s


def test_figures_before_any_step():
    start = run()[:1]
    assert serving.budget_figure(start).layout.annotations[0].text == "no steps yet"
    fig = serving.sps_figure({"dspark": start})
    assert list(fig.data[0].y) == [50.0, 40.0, 25.0]      # the curve shows at once
    empty = serving.sps_figure({"dspark": []})
    assert empty.layout.annotations[0].text == "run a policy to see the curve"
    assert "not started" in serving.lanes_html([], decode, {0: "p"})


def test_comparison_and_table_one_row_per_policy():
    a = serving_metrics.summarize(finished(run()))
    b = serving_metrics.summarize(finished(run(policy="fixed:2")))
    b["throughput_tokens_per_s"] = 2.0
    rows = {"dspark": a | {"greedy_match": 1.0}, "fixed:2": b,
            "threshold:0.5": a | {"greedy_match": "n/a (sampling)"}}
    fig = serving.comparison_figure(rows)
    (pts,) = fig.data
    assert list(pts.text) == ["dspark", "fixed:2", "threshold:0.5"]
    assert pts.y[0] == pytest.approx(8 / 2.5) and pts.y[1] == 2.0
    assert pts.x[0] == pytest.approx(a["mean_per_request_tokens_per_s"])
    table = serving.table_rows(rows)
    assert [r[0] for r in table] == list(rows)
    assert table[0] == ["dspark", 3.2, round(a["mean_per_request_tokens_per_s"], 1),
                        round(8 / 5, 2), 5.5, 2, "1.00"]
    assert table[1][-1] == "not checked" and table[2][-1] == "n/a (sampling)"
    assert len(table[0]) == len(serving.TABLE_HEADERS)


FORM = dict(strategy="dspark", policy_a="dspark", policy_b="fixed:2", requests=4,
            arrival="all at once", rate=2.0, max_new_tokens=16, temperature=0.0, seed=0,
            prompts="", check=False)


def test_serving_tab_form_check():
    """The Serving tab's form: a checked set-up, or a one-line UserError saying what to fix."""
    from specviz.ui import serving as tab
    from specviz.ui.session import UserError

    s = tab.setup({}, **FORM)
    assert [p.id for p in s.policies] == ["dspark", "fixed:2"] and s.arrival == "all"
    assert len(s.prompts) >= 1 and s.gen.max_new_tokens == 16     # the demo prompts
    custom = tab.setup({}, **FORM | dict(prompts="one\n\n two \n", policy_b=tab.NO_POLICY,
                                         arrival="poisson", rate=0.5))
    assert [p.prompt for p in custom.prompts] == ["one", "two"]
    assert [p.id for p in custom.policies] == ["dspark"] and custom.arrival == "poisson:0.5"
    assert custom.key != s.key and tab.setup({}, **FORM).key == s.key
    bad = [(dict(policy_b="fixed:x"), "fixed:G needs an integer"),
           (dict(policy_b="dspark"), "both dspark"),
           (dict(requests=17), "1 to 16"),
           (dict(arrival="poisson", rate=0), "RATE > 0"),
           (dict(max_new_tokens=0), "Bad settings"),
           (dict(strategy="eagle2"), "Choose a chain strategy"),
           (dict(policy_a=tab.NO_POLICY, policy_b=tab.NO_POLICY), "Choose policy A")]
    for change, words in bad:
        with pytest.raises(UserError, match=words):
            tab.setup({}, **FORM | change)
    with pytest.raises(UserError, match="mtp is unavailable: no weights"):
        tab.setup({"mtp": "no weights"}, **FORM | dict(strategy="mtp"))


def test_lanes_of_a_stopped_run():
    h = serving.lanes_html(run(), decode, stopped=True)
    assert "stopped: 2 steps" in h and "running" not in h and "τ 2.00 · stopped" in h
    assert "finished: 2 steps" in serving.lanes_html(finished(run()), decode, stopped=True)
