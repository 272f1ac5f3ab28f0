"""viz from synthetic events: tree nodes, colours and accepted path, KV drops, confidence prefix,
tokens escaping, narration and the explorer. No model, no torch."""
from __future__ import annotations

import dataclasses
import sys

import pytest

from specviz.events import (Accepted, DraftProposed, KVUpdated, RunFinished, RunStarted,
                            ScheduleDecided, Verified)
from specviz.viz import charts, compare, explorer, legend, narrate, panel, steps, tokens, tree


def start(prompt="<script>alert(1)</script>", temperature=0.0):
    return RunStarted(strategy="dspark", settings={"temperature": temperature}, target_id="t",
                      drafter_id="d", device="cpu", dtype="float32", prompt_ids=[1, 2],
                      prompt_pieces=[prompt, "!"], seed=0)


def tree_step(step=1, before=10):
    """root -> a(1), b(2); a -> c(3); c -> d(4, truncated by the schedule). Path 0-1-3, bonus."""
    return [
        DraftProposed(step=step, tokens=[5, 6, 7, 8, 9], pieces=["r", "a", "<b>", "c", "d"],
                      parents=[-1, 0, 0, 1, 3], depths=[0, 1, 1, 2, 3],
                      q=[None, 0.9, 0.1, 0.5, 0.2], confidence=[None, 0.9, 0.3, 0.6, 0.2],
                      draft_s=0.01, t=0.1),
        ScheduleDecided(step=step, confidence=[0.9, 0.6, 0.2], survival=[0.9, 0.54, 0.11],
                        verify_len=2, reason="threshold", threshold=0.5, t=0.11),
        Verified(step=step, p=[None, 0.8, 0.05, 0.7], argmax=[None, 6, 6, 8],
                 argmax_pieces=[None, "a", "a", "c"], draw=[None, 0.3, None, 0.4], verify_s=0.05,
                 input_tokens=4, t=0.2),
        Accepted(step=step, path=[0, 1, 3], n_accepted=2, token=11, piece="e", source="bonus",
                 new_tokens=[6, 8, 11], t=0.21),
        KVUpdated(step=step, target_before=before + 4, target_after=before + 3,
                  kept=[before, before + 1, before + 3], dropped=[before + 2], t=0.22),
    ]


def plain_step(step, before):
    return [
        DraftProposed(step=step, tokens=[11], pieces=["e"], parents=[-1], depths=[0], q=[None],
                      confidence=[None], draft_s=0.0, fallback=True, note="no match", t=0.3),
        Verified(step=step, p=[None], argmax=[None], argmax_pieces=[None], draw=[None],
                 verify_s=0.04, input_tokens=1, t=0.34),
        Accepted(step=step, path=[0], n_accepted=0, token=12, piece="f", source="argmax",
                 new_tokens=[12], t=0.35),
        KVUpdated(step=step, target_before=before + 1, target_after=before + 1, kept=[before],
                  dropped=[], t=0.36),
    ]


def run_events():
    evs = [start(), *tree_step(1, 10), *plain_step(2, 13)]
    fin = RunFinished(new_tokens=4, target_forwards=2, wall_s=0.4, draft_s=0.01, verify_s=0.09,
                      other_s=0.3, mean_accepted_length=2.0, acceptance_by_position=[1.0, 1.0],
                      tokens_per_s=10.0, stop_reason="max_new_tokens", text="ace f", t=0.4)
    return evs + [fin]


def test_statuses():
    s = steps.fold(run_events()).steps[0]
    assert s.node_status() == ["root", "accepted", "rejected", "accepted", "pending"]
    assert s.extra_kind() == "bonus"
    assert [st for _, st, _ in s.committed()] == ["accepted", "accepted", "bonus"]
    plain = steps.fold(run_events()).steps[1]
    assert plain.extra_kind() == "target"


def test_tree_figure_nodes_colours_and_path():
    s = steps.fold(run_events()).steps[0]
    fig = tree.tree_figure(s)
    nodes = {t.name: t for t in fig.data if t.mode == "markers+text"}
    assert {k: len(v.x) for k, v in nodes.items()} == {
        "root": 1, "accepted": 2, "rejected": 1, "pending": 1, "bonus": 1}
    assert sum(len(t.x) for t in nodes.values()) == 5 + 1    # draft nodes + the target's token
    assert nodes["accepted"].marker.color == legend.color("accepted")
    assert nodes["rejected"].marker.color == legend.color("rejected")
    assert nodes["bonus"].marker.color == legend.color("bonus")
    path = next(t for t in fig.data if t.name == tree.PATH_TRACE)
    assert len(path.x) == 4                                 # root, a, c, bonus
    assert list(path.x) == sorted(path.x)                   # left to right, one per depth
    # q sets the size; the piece "<b>" is escaped for Plotly
    assert nodes["accepted"].marker.size[0] > nodes["rejected"].marker.size[0]
    assert nodes["rejected"].text[0] == "&lt;b&gt;"
    assert "confidence = 0.300" in nodes["rejected"].hovertext[0]


def test_empty_and_chain_tree():
    assert len(tree.tree_figure(None).data) == 0
    fig = tree.tree_figure(steps.fold(run_events()).steps[1])
    assert {t.name for t in fig.data if t.mode == "markers+text"} == {"root", "plain step"}


def test_deep_tree_labels_only_what_the_target_looked_at():
    """A 16-deep block draft of which 1 token was verified: the 15 pending nodes keep their
    hover text but no label (16 labels in a row collide)."""
    n = 16
    evs = [start(),
           DraftProposed(step=1, tokens=list(range(100, 101 + n)),
                         pieces=["r"] + [f"t{i}" for i in range(n)], parents=list(range(-1, n)),
                         depths=list(range(n + 1)), q=[None] + [1.0] * n,
                         confidence=[None] + [0.5] * n, draft_s=0.01, t=0.1),
           Verified(step=1, p=[None, 0.9], argmax=[None, 101], argmax_pieces=[None, "t0"],
                    draw=[None, None], verify_s=0.05, input_tokens=2, t=0.2),
           Accepted(step=1, path=[0, 1], n_accepted=1, token=7, piece="x", source="bonus",
                    new_tokens=[101, 7], t=0.21),
           KVUpdated(step=1, target_before=12, target_after=12, kept=[10, 11], dropped=[], t=0.22)]
    fig = tree.tree_figure(steps.fold(evs).steps[0])
    nodes = {t.name: t for t in fig.data if t.mode == "markers+text"}
    assert len(nodes["pending"].x) == n - 1
    assert set(nodes["pending"].text) == {""} and all(nodes["pending"].hovertext)
    assert list(nodes["accepted"].text) == ["t0"]


def test_a_wide_level_grows_the_tree_figure_and_labels_beside_its_nodes():
    """A block drafter's tree: 12 candidates at one position. Each keeps its label, set beside
    the node, and the figure grows so that the stacked labels do not overlap."""
    n = 12
    evs = [start(),
           DraftProposed(step=1, tokens=list(range(100, 101 + n)),
                         pieces=["r"] + [f"t{i}" for i in range(n)], parents=[-1] + [0] * n,
                         depths=[0] + [1] * n, q=[None] + [1.0 / n] * n,
                         confidence=[None] + [1.0 / n] * n, draft_s=0.01, t=0.1),
           Verified(step=1, p=[None] + [0.05] * n, argmax=[None] + [7] * n,
                    argmax_pieces=[None] + ["x"] * n, draw=[None] * (n + 1), verify_s=0.05,
                    input_tokens=n + 1, t=0.2),
           Accepted(step=1, path=[0], n_accepted=0, token=7, piece="x", source="corrected",
                    new_tokens=[7], t=0.21),
           KVUpdated(step=1, target_before=12, target_after=11, kept=[10],
                     dropped=list(range(11, 11 + n)), t=0.22)]
    wide = tree.tree_figure(steps.fold(evs).steps[0])
    assert wide.layout.height >= tree.ROW_PX * n
    labelled = [t for t in wide.data if t.mode == "markers+text" and "t3" in list(t.text)]
    assert labelled and labelled[0].textposition == "middle right"
    narrow = tree.tree_figure(steps.fold(run_events()).steps[0])
    assert narrow.layout.height == tree.HEIGHT
    assert {t.textposition for t in narrow.data if t.mode == "markers+text"} == {"top center"}


def test_tree_note_is_escaped_and_wrapped():
    evs = run_events()
    long = "EAGLE-2 <dynamic> tree: " + "a long explanation of the step " * 6
    evs[1] = dataclasses.replace(evs[1], note=long)
    fig = tree.tree_figure(steps.fold(evs).steps[0], "Draft tree, step 1")
    title = fig.layout.title.text
    lines = title.split("<sup>")[1].removesuffix("</sup>").split("<br>")
    assert len(lines) > 1 and all(len(x) <= tree.NOTE_WIDTH + 8 for x in lines)
    assert "&lt;dynamic&gt;" in title and "<dynamic>" not in title
    assert fig.layout.margin.t >= 50 + 14 * len(lines) and fig.layout.title.yanchor == "top"


def test_kv_drops():
    fig = charts.kv_figure(steps.fold(run_events()))
    line = next(t for t in fig.data if t.name == "target cache")
    assert list(line.y) == [14, 13, 14, 14]
    drops = next(t for t in fig.data if t.name == "rollback / compaction")
    assert list(drops.x) == [1] and list(drops.y) == [13]
    assert "dropped 1 (12)" in drops.hovertext[0] and "kept 10-11, 13" in drops.hovertext[0]


def test_acceptance_by_position():
    fig = charts.acceptance_figure(steps.fold(run_events()), upto=1)
    bars, rate = fig.data
    assert list(bars.marker.color) == [legend.color("accepted")] * 2
    assert list(rate.y) == [1.0, 1.0]


def test_confidence_prefix():
    s = steps.fold(run_events()).steps[0]
    fig = charts.confidence_figure(s)
    names = [t.name for t in fig.data]
    assert names == ["confidence c_k", "survival a_j"]
    assert list(fig.data[0].marker.color) == [legend.color("accepted")] * 2 + [
        legend.color("pending")]
    shapes = fig.layout.shapes
    assert any(sh.y0 == 0.5 and sh.y1 == 0.5 for sh in shapes)      # the threshold line
    assert any(sh.x0 == 2.5 and sh.x1 == 2.5 for sh in shapes)      # the truncation point
    cut = next(a for a in fig.layout.annotations if a.text.startswith("verify"))
    assert cut.text == "verify 2 (threshold)" and cut.xanchor == "right"   # left of a late cut
    long = "hardware-aware scheduler: best (1 + a_1 + .. + a_j) x verify steps/s; 60 ms"
    evs = run_events()
    evs[2] = dataclasses.replace(evs[2], reason=long, verify_len=1)
    cut = next(a for a in charts.confidence_figure(steps.fold(evs).steps[0]).layout.annotations
               if a.text.startswith("verify"))
    assert cut.text == "verify 1 (hardware-aware scheduler)" and cut.hovertext == long
    assert cut.xanchor == "left"
    none = charts.confidence_figure(steps.fold(run_events()).steps[1])
    assert "no confidence" in none.layout.annotations[0].text


def test_tokens_escape_and_hover():
    out = tokens.tokens_html(steps.fold(run_events()), upto=1)
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "&lt;b&gt;" in out                                          # rejected node, escaped
    assert "p = 0.800" in out and "q = 0.900" in out and "draw = 0.300" in out


def test_metrics_panel_and_speedup():
    evs = run_events()
    m = panel.run_metrics(evs)
    assert m["new_tokens"] == 4 and m["tokens_per_s"] == 10.0
    assert "2.00×" in panel.metrics_html(m, ar_tokens_per_s=5.0)
    assert "run ar" in panel.metrics_html(m)
    assert "&lt;x&gt;" in panel.message_html("<x>")


def test_narration_mentions_real_numbers():
    view = steps.fold(run_events())
    text = narrate.narrate(view.steps[0], view.start)
    assert "argmax" in text or "most likely" in text
    assert "bonus" in text and "threshold 0.5" in text and "dropped" in text
    assert "c<sub>3</sub> = 0.20" in text and "a<sub>2</sub> = 0.54" in text
    assert "a<sub>3</sub> = 0.11 is below the threshold 0.5" in text and "first 2 draft" in text
    sampled = narrate.narrate(view.steps[0], start(temperature=0.7))
    assert "min(1, p/q) = 0.89" in sampled and "the draw was 0.30" in sampled


def test_compare_identical_to_ar():
    evs = run_events()
    runs = {"ar": evs, "dspark": evs}
    rows = compare.table_rows(runs, greedy=True)
    assert rows[1][0] == "dspark" and rows[1][3] == 1.0 and rows[1][-1] == "yes"
    assert "identical to ar" in compare.lanes_html(runs, 4, greedy=True)
    assert len(compare.compare_figure(runs).data) >= 3


def test_explorer_maths():
    r = explorer.rejection([0.5, 0.5], [1.0, 0.0])
    assert r["acceptance"] == pytest.approx(0.5)
    assert r["accept"] == [0.5, 1.0]
    assert r["residual"] == [0.0, 1.0]
    with pytest.raises(ValueError):
        explorer.rejection([0, 0], [1, 0])


def test_verify_cost_figure():
    fig = charts.verify_cost_figure([1, 8, 16], [0.040, 0.046, 0.058], "cpu")
    line = fig.data[0]
    assert list(line.x) == [1, 8, 16] and [round(y) for y in line.y] == [40, 46, 58]
    assert "1.45x one token" in line.hovertext[2]
    assert "cpu" in fig.layout.title.text


def test_viz_imports_no_torch():
    import subprocess
    code = ("import sys, specviz.viz.tree, specviz.viz.charts, specviz.viz.compare, "
            "specviz.viz.narrate, specviz.viz.explorer; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shipped_walkthroughs_render_every_slide():
    """Each demos/walkthroughs script names a shipped trace and steps that exist in it; every
    slide narrates its step, and confidence walkthroughs show the confidence chart."""
    from specviz.ui import learn

    found = learn.scripts()
    assert found
    for title, script in found.items():
        n = len(script["steps"])
        for i in range(n + 1):
            header, narration, _, _, confidence, _, index = learn.slide(script, i)
            assert index == i and "sv-msg-error" not in header, title
            assert (i == 0) == (narration == ""), title
        if script["trace"].startswith("dspark"):
            assert confidence["visible"] and "Schedule." in narration
