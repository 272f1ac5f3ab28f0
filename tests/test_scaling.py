"""τ by training data: the chart (specviz.viz.scaling), its record (assets/scaling.json) checked
against the model-card lines it cites, and the Models & guide tab that shows both."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from specviz.viz import scaling

ROOT = Path(__file__).resolve().parents[1]
RECORD = json.loads((ROOT / "assets" / "scaling.json").read_text(encoding="utf-8"))
SOURCE = r"[0-9a-f]{40}:assets/[\w-]+\.md:\d+"        # commit:path:line of a model card
TAUS = ("heldout_tau", "heldout_all_positions_tau", "engine_tau")


def point(drafter, rnd, tokens, **taus):
    src = {k.replace("_tau", "_source"): f"c{rnd}:assets/{drafter}.md:16" for k in taus}
    extra = ({"engine_strategy": drafter, "engine_round": rnd, "engine_command": "bench"}
             if "engine_tau" in taus else {})
    return {"drafter": drafter, "round": rnd, "sequences": tokens // 100,
            "total_tokens": 2 * tokens, "response_tokens": tokens,
            "source": f"c{rnd}:assets/{drafter}.md:9", **taus, **src, **extra}


TINY = [point("a", 1, 1000, heldout_tau=1.2, engine_tau=1.1),
        point("a", 2, 10000, heldout_tau=1.8, engine_tau=1.4),
        point("b", 1, 1000, heldout_tau=1.5),
        point("b", 2, 10000, heldout_tau=1.6, heldout_all_positions_tau=1.9),
        point("c", 2, 10000, heldout_all_positions_tau=2.0)]     # one point, old score only


def test_one_legend_entry_and_colour_per_drafter_on_log_axes():
    fig = scaling.scaling_figure(TINY)
    groups = {t.legendgroup for t in fig.data}
    assert groups == {"a", "b", "c"}
    assert sorted(t.name for t in fig.data if t.showlegend) == ["a", "b", "c"]
    for g in groups:
        assert len({t.line.color for t in fig.data if t.legendgroup == g}) == 1
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"
    assert "earlier training rounds on this CPU" in fig.layout.title.text


def test_traces_hold_each_kind_of_tau_where_it_was_measured():
    fig = scaling.scaling_figure(TINY)
    by = {(t.legendgroup, t.xaxis, t.mode): t for t in fig.data if len(t.x)}
    a = by[("a", "x", "lines+markers")]
    assert list(a.x) == [1000, 10000] and list(a.y) == [1.2, 1.8]
    assert list(by[("a", "x2", "lines+markers")].y) == [1.1, 1.4]   # engine τ, right panel
    assert "<br>engine τ: 1.40 (a, measured in round 2)<br>" in \
        by[("a", "x2", "lines+markers")].hovertext[1]
    hollow = by[("b", "x", "markers")]
    assert list(hollow.y) == [1.9] and hollow.marker.symbol == "circle-open"
    assert hollow.marker.color == hollow.line.color          # an open symbol strokes in it
    c = by[("c", "x", "markers")]                            # a lone point still shows
    assert list(c.x) == [10000] and "c2:assets/c.md:16" in c.hovertext[0]
    assert scaling.cite("0123456789abcdef:assets/a.md:9") == "0123456789:assets/a.md:9"
    assert "round 2 weights" in a.hovertext[1] and "c2:assets/a.md:9" in a.hovertext[1]
    assert "tokens with prompts, summed over rounds" in a.hovertext[1]
    assert "summed" not in a.hovertext[0]                    # round 1: nothing to sum
    assert not any(k[:2] == ("c", "x2") for k in by)         # no engine τ, no trace


def test_distinct_tokens_place_a_point_that_saw_data_twice():
    twice = point("a", 3, 20000, heldout_tau=2.0) | {"distinct_response_tokens": 15000}
    fig = scaling.scaling_figure(TINY + [twice])
    a = next(t for t in fig.data if t.legendgroup == "a" and t.xaxis == "x" and len(t.x))
    assert list(a.x) == [1000, 10000, 15000]
    assert "15,000 distinct response tokens (20,000 summed over rounds" in a.hovertext[2]
    assert "10,000 distinct response tokens" in a.hovertext[1] and "summed over rounds:" \
        not in a.hovertext[1]
    assert "trained on 15,000 distinct response tokens" in scaling.caption(TINY + [twice])


def test_caption_states_the_scale_and_the_ranking_at_each_size():
    assert scaling.rankings(TINY) == {1000: ["b", "a"], 10000: ["a", "b"]}
    text = scaling.caption(TINY)
    assert "Measured in earlier training rounds on this CPU" in text
    assert "10⁵-10⁶ samples" in text and "CPU-scale" in text
    assert "1,000 distinct response tokens: `b` > `a`" in text
    assert "10,000 distinct response tokens: `a` > `b`" in text


def test_record_points_are_positive_and_cite_their_card():
    pts = RECORD["points"]
    assert RECORD["note"] and pts
    for p in pts:
        assert p["response_tokens"] > 0 and p["total_tokens"] > p["response_tokens"]
        assert p["sequences"] > 0 and p["round"] >= 1
        assert re.fullmatch(SOURCE, p["source"])
        assert p["source"].split(":")[1] == f"assets/{p['drafter']}.md"
        present = [k for k in TAUS if p.get(k) is not None]
        assert present, p
        for k in present:
            assert p[k] > 0
            assert re.fullmatch(SOURCE, p[k.replace("_tau", "_source")])
        if "engine_tau" in present:
            assert p["engine_command"].startswith("python -m specviz bench")
        if "distinct_response_tokens" in p:
            assert 0 < p["distinct_response_tokens"] < p["response_tokens"]
            assert all(re.fullmatch(SOURCE, s) for s in p["distinct_sources"])
    assert len({(p["drafter"], p["round"]) for p in pts}) == len(pts)


def test_record_shows_a_ranking_change():
    ranks = list(scaling.rankings(RECORD["points"]).values())
    assert len(ranks) >= 2
    assert any([d for d in a if d in b] != [d for d in b if d in a]
               for a, b in zip(ranks, ranks[1:]))


def card_line(source: str) -> str:
    commit, path, line = source.split(":")
    try:
        text = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"no git history for {commit} here (a shallow or exported copy)")
    return text.splitlines()[int(line) - 1]


def numbers(line: str) -> set[float]:
    return {float(x) for x in re.findall(r"\d+\.\d+", line)}


@pytest.mark.parametrize("p", RECORD["points"], ids=lambda p: f"{p['drafter']}-r{p['round']}")
def test_every_number_is_on_the_card_line_it_cites(p):
    data = card_line(p["source"])
    assert (f"{p['sequences']} sequences, {p['total_tokens']} tokens "
            f"({p['response_tokens']} response tokens)") in data
    if "distinct_response_tokens" in p:       # the distinct data sets, each on its card's line
        counts = [int(re.search(r"\((\d+) response tokens\)", card_line(s)).group(1))
                  for s in p["distinct_sources"]]
        assert sum(counts) == p["distinct_response_tokens"], counts
    for k in TAUS:
        if p.get(k) is not None:
            line = card_line(p[k.replace("_tau", "_source")])
            assert p[k] in numbers(line), (k, line)
    if p.get("engine_tau") is not None:
        assert card_line(p["engine_source"]).startswith(f"| `{p['engine_strategy']}`")
        commit, path, _ = p["engine_source"].split(":")
        assert f"`{p['engine_command']}`" in subprocess.run(
            ["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True,
            text=True).stdout


def test_guide_tab_builds_with_the_chart(tiny_target):
    import gradio as gr

    from specviz.ui import guide

    with gr.Blocks() as demo:
        guide.build(tiny_target, {})
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    assert {"guide-models", "guide-cost", "guide-scaling", "guide-scaling-caption"} <= set(by_id)
    plot = json.loads(by_id["guide-scaling"].value["plot"])
    assert {t["legendgroup"] for t in plot["data"]} == {p["drafter"] for p in RECORD["points"]}
    assert "earlier training rounds on this CPU" in plot["layout"]["title"]["text"]
    assert "Measured in earlier training rounds on this CPU" in by_id["guide-scaling-caption"].value


def test_guide_tau_counts_only_traces_at_default_settings():
    """The guide's per-strategy τ pools the greedy demo traces recorded at the strategy's
    defaults: DSpark's threshold walkthrough traces are another setting and stay out."""
    from specviz.ui import guide

    assert guide.at_defaults("dspark", {"temperature": 0.0})
    assert not guide.at_defaults("dspark", {"scheduler": "threshold", "threshold": 0.2})
    assert not guide.at_defaults("no-such-strategy", {})
    traces = sorted((guide.ROOT / "demos" / "traces").glob("dspark-*.jsonl"))
    defaults = [p for p in traces if "threshold" not in p.stem]   # dspark-<prompt id>, greedy
    assert len(guide.measured_tau()["dspark"]) == len(defaults) == 3 < len(traces)
