"""The Learn tab: narrated walkthroughs over recorded traces, and the rejection-sampling explorer.

Boundary: a walkthrough script (demos/walkthroughs/*.json: title, intro, trace, steps) + its
trace -> slides; each slide's narration is generated from that step's real events by
viz.narrate. No model is needed, so a class runs without waiting for one.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr

from specviz.events import TraceError, read_trace
from specviz.viz.charts import confidence_figure, kv_figure
from specviz.viz.explorer import explorer_figure, explorer_text, rejection
from specviz.viz.narrate import narrate
from specviz.viz.panel import message_html
from specviz.viz.steps import fold
from specviz.viz.tokens import tokens_html
from specviz.viz.tree import tree_figure

DEMOS = Path(__file__).resolve().parents[2] / "demos"
NOTE_WIDTH = 52   # the tree view can share its row with the confidence and KV charts
EXPLORER_START = [["the", 0.50, 0.20], ["a", 0.30, 0.60], ["this", 0.15, 0.10], ["my", 0.05, 0.10]]


def scripts() -> dict[str, dict]:
    out = {}
    for path in sorted((DEMOS / "walkthroughs").glob("*.json")):
        script = json.loads(path.read_text(encoding="utf-8"))
        out[script["title"]] = script
    return out


def has_confidence(view) -> bool:
    """Whether the run's drafter reports confidences (then the Learn tab shows that chart)."""
    return any(s.schedule or any(c is not None for c in s.draft.confidence)
               for s in view.steps if s.draft)


def slide(script: dict | None, index: int) -> list:
    """[header, narration, tokens, tree, confidence, kv, index] for slide `index` (clamped)."""
    if not script:
        return [message_html("Choose a walkthrough.", "info"), "", "", None,
                gr.update(value=None, visible=False), None, 0]
    try:
        events = read_trace(DEMOS / "traces" / script["trace"])
    except TraceError as exc:
        return [message_html(f"This walkthrough's trace cannot be read: {exc}"), "", "", None,
                gr.update(value=None, visible=False), None, 0]
    view = fold(events)
    numbers = script.get("steps") or [s.step for s in view.steps]
    index = max(0, min(int(index), len(numbers)))   # slide 0 is the introduction
    step = next(s for s in view.steps if s.step == numbers[index - 1]) if index else None
    confidence = gr.update(value=confidence_figure(step), visible=has_confidence(view))
    if step is None:
        header = (f"<h3>{html.escape(script['title'])}</h3><p>{html.escape(script['intro'])}</p>"
                  f"<p><i>Slide 0 of {len(numbers)}. Press Next.</i></p>")
        return [header, "", tokens_html(view, 0), tree_figure(None), confidence,
                kv_figure(view, 0), 0]
    header = (f"<h3>{html.escape(script['title'])}</h3><p><i>Slide {index} of {len(numbers)}: decoding step "
              f"{step.step}</i></p>")
    return [header, narrate(step, view.start), tokens_html(view, step.step),
            tree_figure(step, f"Draft tree, step {step.step}", NOTE_WIDTH), confidence,
            kv_figure(view, step.step), index]


def explore(rows) -> list:
    rows = rows.values.tolist() if hasattr(rows, "values") else rows or []
    try:
        tokens = [str(r[0]) for r in rows]
        r = rejection([float(x[1]) for x in rows], [float(x[2]) for x in rows])
    except (ValueError, TypeError, IndexError) as exc:
        return [gr.skip(), message_html(f"Enter non-negative numbers for p and q ({exc}).")]
    return [explorer_figure(tokens, r), explorer_text(tokens, r)]


def build() -> None:
    found = scripts()
    gr.Markdown("A guided walkthrough of real recorded runs, one decoding step per slide: "
                "what the drafter proposes, how the target verifies it, what the KV cache does.")
    with gr.Row():
        choice = gr.Dropdown(list(found), value=next(iter(found), None), label="walkthrough",
                             elem_id="learn-pick")
        prev_btn = gr.Button("◀ Previous", elem_id="learn-prev")
        next_btn = gr.Button("Next ▶", variant="primary", elem_id="learn-next")
    first = slide(found.get(choice.value), 0)
    header = gr.HTML(first[0], elem_id="learn-header")
    narration = gr.HTML(first[1], elem_id="learn-narration", elem_classes=["sv-narration"])
    tokens = gr.HTML(first[2], elem_id="learn-tokens", elem_classes=["sv-tokens-box"])
    with gr.Row():
        tree = gr.Plot(first[3], label="draft tree", elem_id="learn-tree")
        confidence = gr.Plot(first[4]["value"], label="confidence prefix",
                             elem_id="learn-confidence", visible=first[4]["visible"])
        kv = gr.Plot(first[5], label="KV cache", elem_id="learn-kv")
    index = gr.State(0)
    outputs = [header, narration, tokens, tree, confidence, kv, index]
    choice.change(lambda t: slide(found.get(t), 0), choice, outputs, api_visibility="private")
    prev_btn.click(lambda t, i: slide(found.get(t), i - 1), [choice, index], outputs,
                   api_visibility="private")
    next_btn.click(lambda t, i: slide(found.get(t), i + 1), [choice, index], outputs,
                   api_visibility="private")

    gr.Markdown("### Rejection-sampling explorer\nEdit the target's **p** and the draft's **q** "
                "over a few tokens (each column is renormalized). A drafted token x is kept with "
                "probability min(1, p(x)/q(x)); after a rejection the target samples from the "
                "residual norm(max(0, p − q)). Together this gives exactly p.")
    with gr.Row():
        table = gr.Dataframe(EXPLORER_START, headers=["token", "p (target)", "q (draft)"],
                             datatype=["str", "number", "number"], type="array",
                             interactive=True, elem_id="learn-explorer", scale=1)
        figure = gr.Plot(explorer_figure([r[0] for r in EXPLORER_START],
                                         rejection([r[1] for r in EXPLORER_START],
                                                   [r[2] for r in EXPLORER_START])),
                         label="p, q, acceptance and residual", scale=2)
    explanation = gr.HTML(explore(EXPLORER_START)[1])
    table.change(explore, table, [figure, explanation], api_visibility="private")
