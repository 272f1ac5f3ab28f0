"""The Replay tab: open a shipped or uploaded trace, scrub it with the Playground's views,
download it, export the figures.

Boundary: trace file -> validated events (events.read_trace + metrics.replay) -> Views.render.
A bad file is a message on the page, never an exception.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from specviz import metrics
from specviz.events import TraceError, read_trace
from specviz.ui import views
from specviz.viz.panel import message_html

TRACES = Path(__file__).resolve().parents[2] / "demos" / "traces"


def shipped() -> list[str]:
    return sorted(p.name for p in TRACES.glob("*.jsonl"))


def load(path: str | None) -> tuple[list, str]:
    """(validated events, a one-line summary); TraceError says what is wrong with the file."""
    if not path:
        raise TraceError("choose a shipped trace or upload one")
    events = read_trace(path)
    summary = metrics.replay(events)
    return events, (f"{Path(path).name}: {summary['strategy']}, {summary['new_tokens']} tokens, "
                    f"τ {summary['mean_accepted_length']:.2f} (totals re-checked)")


def build() -> None:
    with gr.Row():
        pick = gr.Dropdown(shipped(), value=None, label="shipped trace (demos/traces)",
                           elem_id="rp-pick")
        upload = gr.File(label="or upload a trace (.jsonl)", file_types=[".jsonl"],
                         type="filepath", elem_id="rp-upload", height=90)
        with gr.Column():
            download = gr.File(label="download this trace", elem_id="rp-download",
                               interactive=False, height=60)
            export_btn = gr.Button("Export figures (HTML)", elem_id="rp-export")
            exported = gr.File(label="figures", interactive=False, height=60)
    message = gr.HTML(elem_id="rp-message")
    v = views.layout("rp")
    events_state = gr.State([])
    outputs = [message, *v.outputs, events_state, download]

    def show(path: str | None) -> dict:
        try:
            events, note = load(path)
        except TraceError as exc:
            return {message: message_html(f"Cannot open this trace: {exc}")}
        return {message: message_html(note, "info"), **v.render(events, 1),
                events_state: events, download: path}

    pick.change(lambda name: show(str(TRACES / name) if name else None), pick, outputs,
                api_visibility="private")
    upload.upload(show, upload, outputs, api_visibility="private")
    v.slider.release(lambda ev, s: v.render(ev, s, slider=False) if ev else {},
                     [events_state, v.slider], v.outputs[:-1], queue=False,
                     api_visibility="private")
    export_btn.click(lambda ev, s: views.export_figures(ev, s) if ev else None,
                     [events_state, v.slider], exported, api_visibility="private")
