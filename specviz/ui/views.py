"""The step views shared by Playground and Replay: components, and events -> their values.

Boundary: `layout` lays the views out, `Views.render` gives their values for (events, step) by
component; both tabs use the same pair, so a replayed trace looks exactly like a live run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import plotly.io as pio

from specviz.events import Event, RunFinished
from specviz.ui import downloads
from specviz.viz.charts import acceptance_figure, confidence_figure, kv_figure
from specviz.viz.panel import metrics_html, run_metrics
from specviz.viz.steps import events_upto, fold
from specviz.viz.tokens import tokens_html
from specviz.viz.tree import tree_figure


@dataclass
class Views:
    metrics: gr.HTML
    tokens: gr.HTML
    tree: gr.Plot
    acceptance: gr.Plot
    confidence: gr.Plot
    kv: gr.Plot
    slider: gr.Slider

    @property
    def outputs(self) -> list:
        return [self.metrics, self.tokens, self.tree, self.acceptance, self.confidence, self.kv,
                self.slider]

    def render(self, events: list[Event], step: int | None = None, ar_tps: float | None = None,
               status: str = "", text_only: bool = False, slider: bool = True) -> dict:
        """{component: value} for the run up to `step` (see `values`); slider=False leaves the
        step slider as it is (the slider's own handler)."""
        vals = values(events, step, ar_tps, status, text_only)
        if not slider:
            del vals["slider"]
        return {getattr(self, name): v for name, v in vals.items()}


def values(events: list[Event], step: int | None = None, ar_tps: float | None = None,
           status: str = "", text_only: bool = False) -> dict[str, Any]:
    """{view name: value} for the run up to `step` (None: the latest step, following live).
    text_only leaves the figures out (Run and the first live step: text shows fastest) and marks
    the metrics panel `sv-figures-pending`, which the css uses to dim the figures until they are
    redrawn."""
    view = fold(events)
    last = view.steps[-1].step if view.steps else 0
    step = last if step is None else max(0, min(int(step), last))
    m = run_metrics(events_upto(events, step))
    if not status and events and isinstance(events[-1], RunFinished):
        status = f"finished: {events[-1].stop_reason}"
    panel = metrics_html(m, ar_tps, status)
    if text_only:
        panel = f'<div class="sv-figures-pending">{panel}</div>'
    out: dict[str, Any] = {"metrics": panel, "tokens": tokens_html(view, step)}
    if not text_only:
        f = figures(events, step)
        out |= {k: f[k] for k in ("tree", "acceptance", "confidence", "kv")}
    out["slider"] = gr.update(minimum=0, maximum=max(1, last), value=step)
    return out


def layout(prefix: str, events: list[Event] | None = None, status: str = "") -> Views:
    """Create the view components inside the current Blocks context, showing `events` (a
    recorded run, at its last step) or an empty run: either way the browser loads plotly.js
    with the page, not on the first Run."""
    v = values(events or [], None, status=status)
    metrics = gr.HTML(v["metrics"] if events else None, elem_id=f"{prefix}-metrics")
    last = int(v["slider"]["maximum"])
    slider = gr.Slider(0, last, value=last if events else 0, step=1, label="step",
                       elem_id=f"{prefix}-step", interactive=True)
    tokens = gr.HTML(v["tokens"] if events else None, elem_id=f"{prefix}-tokens",
                     elem_classes=["sv-tokens-box"])
    with gr.Row():
        tree = gr.Plot(v["tree"], label="draft tree", elem_id=f"{prefix}-tree")
        confidence = gr.Plot(v["confidence"], label="confidence prefix",
                             elem_id=f"{prefix}-confidence")
    with gr.Row():
        acceptance = gr.Plot(v["acceptance"], label="accept / reject",
                             elem_id=f"{prefix}-acceptance")
        kv = gr.Plot(v["kv"], label="KV cache", elem_id=f"{prefix}-kv")
    return Views(metrics, tokens, tree, acceptance, confidence, kv, slider)


def figures(events: list[Event], step: int | None) -> dict[str, Any]:
    view = fold(events)
    last = view.steps[-1].step if view.steps else 0
    step = last if step is None else max(0, min(int(step), last))
    cur = next((s for s in view.steps if s.step == step), None)
    return {"step": step,
            "tree": tree_figure(cur, f"Draft tree, step {step}" if cur else "Draft tree"),
            "acceptance": acceptance_figure(view, step),
            "confidence": confidence_figure(cur),
            "kv": kv_figure(view, step)}


def export_figures(events: list[Event], step: int | None) -> str:
    """One standalone HTML file (plotly.js inlined, works offline) with the step's figures."""
    f = figures(events, step)
    parts = [pio.to_html(f[k], full_html=False, include_plotlyjs=(i == 0))
             for i, k in enumerate(("tree", "acceptance", "confidence", "kv"))]
    path = downloads.new_path(f"specviz-figures-step{f['step']}.html")
    path.write_text("<html><head><meta charset='utf-8'></head><body>" + "".join(parts) +
                    "</body></html>", encoding="utf-8")
    return str(path)
