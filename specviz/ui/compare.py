"""The Compare tab: a race of several strategies on one prompt and seed, `ar` always included.

Boundary: form -> session.race (lanes advance one step each in turn) -> lanes HTML while
running, then a table, bar charts and the "identical to ar" badge under greedy.
"""
from __future__ import annotations

import time

import gradio as gr

from specviz import strategies
from specviz.ui import session
from specviz.ui.playground import DEFAULT_PROMPT, cancel_for, stop
from specviz.viz.compare import TABLE_HEADERS, compare_figure, lanes_html, table_rows
from specviz.viz.panel import message_html

UPDATE_EVERY_S = 0.3


def build(target, unavailable: dict[str, str | None], gpu=lambda f: f) -> None:
    others = [sid for sid in strategies.REGISTRY if sid != "ar"]
    with gr.Row():
        with gr.Column(scale=2):
            prompt = gr.Textbox(DEFAULT_PROMPT, lines=3, label="prompt", elem_id="cmp-prompt")
            with gr.Row():
                run_btn = gr.Button("Race", variant="primary", elem_id="cmp-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="cmp-stop")
        with gr.Column(scale=1):
            chosen = gr.CheckboxGroup(
                [(sid + (" (unavailable)" if unavailable.get(sid) else ""), sid) for sid in others],
                value=[sid for sid in others if not unavailable.get(sid)][:3],
                label="strategies (ar is always included)", elem_id="cmp-strategies")
            with gr.Row():
                max_new = gr.Number(64, label="max new tokens", precision=0)
                temperature = gr.Number(0.0, label="temperature")
                seed = gr.Number(0, label="seed", precision=0)
    message = gr.HTML(elem_id="cmp-message")
    lanes = gr.HTML(elem_id="cmp-lanes")
    table = gr.Dataframe(headers=TABLE_HEADERS, label="results", elem_id="cmp-table",
                         interactive=False)
    chart = gr.Plot(label="comparison", elem_id="cmp-chart")

    @gpu
    def race(prompt, chosen, max_new, temperature, seed, request: gr.Request):
        cancel = cancel_for(request)
        try:
            reqs = [session.prepare(target, prompt=prompt, strategy=sid, max_new_tokens=max_new,
                                    temperature=temperature, seed=seed)
                    for sid in ["ar", *[c for c in chosen if c != "ar"]]]
            n, greedy = reqs[0].gen.max_new_tokens, reqs[0].gen.temperature == 0
            yield message_html("Racing…", "info"), "", None, None
            last, runs = 0.0, {}
            for runs in session.race(target, reqs, cancel):
                if time.perf_counter() - last >= UPDATE_EVERY_S:
                    last = time.perf_counter()
                    yield gr.skip(), lanes_html(runs, n, greedy), gr.skip(), gr.skip()
            yield ("", lanes_html(runs, n, greedy), table_rows(runs, greedy), compare_figure(runs))
        except session.UserError as exc:
            yield message_html(str(exc)), gr.skip(), gr.skip(), gr.skip()

    run_btn.click(race, [prompt, chosen, max_new, temperature, seed],
                  [message, lanes, table, chart], concurrency_id="engine",
                  concurrency_limit=session.ENGINE_CONCURRENCY, api_visibility="private")
    stop_btn.click(stop, None, message, queue=False, api_visibility="private")
