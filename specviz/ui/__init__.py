"""The Gradio app: tabs wired to the engine (Playground, Compare, Serving) and to recorded
traces (Learn, Replay), the model overview, and the `/speculate` API (batchable calls share the
app's batched engine, batcher.py).

Boundary: `build(target)` returns the Blocks; theme and css are handed to `launch()` by app.py.
The target is loaded once per process and shared; everything per user lives in gr.State.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from specviz import compute, strategies
from specviz.batcher import Batcher
from specviz.ui import api, compare, guide, learn, playground, replay, serving, session

CSS = Path(__file__).resolve().parents[2] / "assets" / "app.css"
THEME = gr.themes.Soft(primary_hue="indigo", secondary_hue="green")


def build(target, gpu=lambda f: f) -> gr.Blocks:
    """gpu: a decorator for functions that run the engine (spaces.GPU on a ZeroGPU Space)."""
    unavailable = compute.call(strategies.available, target)   # builds every drafter
    # one shared batch per app: Playground users and API callers with batchable requests
    batcher = Batcher(target)
    with gr.Blocks(title="specviz — speculative decoding, step by step",
                   delete_cache=(3600, 3600)) as demo:   # hourly: drop cached files over 1 h
        gr.Markdown("# specviz — see and measure speculative decoding\n"
                    f"Target `{target.model_id}` on `{target.device}`. A drafter proposes "
                    "tokens, the target verifies them all in one forward pass, and the output "
                    "is exactly the target's.", elem_id="sv-title")
        with gr.Tabs():
            with gr.Tab("Playground", id="playground"):
                playground.build(target, unavailable, batcher, gpu)
            with gr.Tab("Compare", id="compare"):
                compare.build(target, unavailable, gpu)
            with gr.Tab("Serving", id="serving"):
                serving.build(target, unavailable, gpu)
            with gr.Tab("Learn", id="learn"):
                learn.build()
            with gr.Tab("Replay", id="replay"):
                replay.build()
            with gr.Tab("Models & guide", id="guide"):
                guide.build(target, unavailable)
        # API callers queue on their own: batchable requests share the batch (session.py)
        speculate, speculate_stream = api.make(target, batcher, gpu)
        gr.api(speculate, api_name="speculate", concurrency_id="api",
               concurrency_limit=session.USERS_AT_ONCE)
        gr.api(speculate_stream, api_name="speculate_stream", concurrency_id="api",
               concurrency_limit=session.USERS_AT_ONCE)
    return demo


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = 7860, **kw) -> None:
    demo.queue(default_concurrency_limit=8).launch(
        server_name=host, server_port=port, theme=THEME, css_paths=[CSS], **kw)
