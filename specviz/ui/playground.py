"""The Playground tab: one prompt, one strategy and its settings, live per-step views.

Boundary: form -> session.stream (a batchable request rides in the app's shared batch) ->
Views.render. Stop sets the run's threading.Event (looked
up by the browser session), so the engine stops at the next step boundary. Per-session state:
the run's events and this session's measured `ar` speeds (for "speedup vs ar").
"""
from __future__ import annotations

import hashlib
import threading
from typing import Any

import gradio as gr

from specviz import strategies
from specviz.events import RunFinished, write_trace
from specviz.runner import RunSpec
from specviz.batcher import Batcher
from specviz.bench import read_prompts
from specviz.events import TraceError
from specviz.ui import downloads, replay, session, views
from specviz.viz.panel import message_html

# The tab opens on a recorded run of its default strategy and prompt, already drawn.
RECORDED = replay.TRACES / "ngram-copy-list.jsonl"
DEFAULT_PROMPT = next(p.prompt for p in read_prompts(replay.TRACES.parent / "prompts.jsonl")
                      if p.id == "copy-list")
_cancels: dict[str, threading.Event] = {}


def cancel_for(request: gr.Request | None) -> threading.Event:
    """A fresh cancel flag for this browser session's run (replacing its previous one)."""
    ev = threading.Event()
    key = getattr(request, "session_hash", None)
    if key:
        _cancels[key] = ev
    return ev


def stop(request: gr.Request) -> str:
    ev = _cancels.get(getattr(request, "session_hash", None))
    if ev is None or ev.is_set():
        return message_html("Nothing is running.", "info")
    ev.set()
    return message_html("Stopping at the end of this step…", "info")


def strategy_choices(unavailable: dict[str, str | None]) -> list[tuple[str, str]]:
    return [(f"{sp.id} — {sp.label}" + (" (unavailable)" if unavailable.get(sp.id) else ""), sp.id)
            for sp in strategies.REGISTRY.values()]


# What each strategy setting does, by field name (the same name means the same knob in every
# strategy's settings dataclass); valid ranges are checked by the dataclasses themselves.
SETTING_HELP = {
    "gamma": "γ: tokens drafted per step, as a chain (at most)",
    "min_confidence": "without the cost model (sampling, or auto_budget=false): stop the chain "
                      "after a token the draft itself gives less probability than this (0 = "
                      "always draft γ)",
    "k": "tokens proposed by ONE drafter forward",
    "mode": "tree (EAGLE-2 dynamic tree) or chain",
    "top_k": "tree: children expanded per node",
    "depth": "tree: levels drafted (deepest draft position)",
    "total_tokens": "tree: best nodes kept and sent to the target (verify budget, at most)",
    "auto_budget": "greedy: stop drafting, and send only the best draft tokens, once more "
                   "would cost more time than they save (measured forward cost; acceptance "
                   "learnt from this request's verified drafts). false = the classic rule "
                   "(EAGLE-2's whole tree; the draft model's min_confidence; all k of P-EAGLE; "
                   "DFlash's whole block; all γ "
                   "of MTP, whose default is false)",
    "block_size": "block: positions drafted by one forward",
    "tree": "one-forward drafters: verify a tree of this many nodes, the likeliest by "
            "cumulative draft probability over each position's top tokens (Medusa-style), "
            "instead of the published chain (0)",
    "threshold": "threshold scheduler (and every sampled run): cut the draft where the prefix "
                 "survival a_j falls below this (0 = never cut)",
    "scheduler": "greedy: hardware (DSpark's Algorithm 1: verify the prefix that maximises "
                 "expected tokens x verify steps/s at the measured cost) or threshold",
    "markov": "Markov head on (true) or the backbone alone (false, an ablation)",
    "window": "context positions the drafter attends to (0 = all)",
    "path": "a drafter folder or hub id in a published layout (EAGLE-3, EAGLE-1, DFlash, "
            "DSpark) instead of the shipped weights; empty = shipped",
    "precision": "the drafter's linear layers on CPU: bf16 halves the weights each draft "
                 "forward reads; auto = bf16 where the CPU multiplies bfloat16 natively (AMX, "
                 "AVX512-BF16), else fp32. Only what is proposed can change: the target stays "
                 "fp32 and decides every token",
    "max_draft": "tokens per matched continuation (at most: weak matches draft fewer)",
    "branches": "distinct continuations merged into the tree (greedy decoding verifies only "
                "the nodes worth their measured verify time)",
    "budget": "draft nodes at most",
    "min_expected": "skip drafting when fewer accepted tokens are expected (0 = no floor; under "
                    "greedy decoding a step is also skipped when no depth pays for its verify)",
    "reprobe": "after this many skipped steps of one match kind, draft once more",
    "tail": "sampling: draft depth stops where the modelled chance the run is still accepted "
            "drops below this (greedy decoding uses the measured cost instead)",
    "store": "also match against earlier requests (cross-request store)",
}


def settings_rows(strategy: str) -> list[list[str]]:
    """[setting, default value, meaning] rows of the strategy's settings (none for ar)."""
    s = strategies.parse_settings(strategy) if strategy in strategies.REGISTRY else None
    return [[k, str(v).lower() if isinstance(v, bool) else str(v), SETTING_HELP.get(k, "")]
            for k, v in strategies.settings_dict(s).items()]


def settings_view(strategy: str) -> gr.Dataframe:
    rows = settings_rows(strategy)
    return gr.Dataframe(rows or [["", "", ""]], label=f"{strategy} settings (edit the values)",
                        visible=bool(rows))


def overrides(rows: Any) -> dict[str, str]:
    rows = rows.values.tolist() if hasattr(rows, "values") else rows or []
    return {str(r[0]): str(r[1]) for r in rows if r and r[0]}


def strategy_help(strategy: str, unavailable: dict[str, str | None]) -> str:
    sp = strategies.REGISTRY.get(strategy)
    if sp is None:
        return ""
    text = f"**{sp.id}**: {sp.summary}"
    if sp.caveat:
        text += f"\n\n*Caveat:* {sp.caveat}"
    if sp.settings is None:
        text += "\n\nThis strategy has no settings of its own."
    if unavailable.get(strategy):
        text += f"\n\n**Unavailable:** {unavailable[strategy]}"
    return text


def ar_key(req: RunSpec) -> str:
    """Same prompt and generation settings -> same key (the `ar` reference to compare with)."""
    return hashlib.sha1(repr((req.prompt_ids, req.gen)).encode()).hexdigest()


def save_trace(events) -> str | None:
    if not events or not isinstance(events[-1], RunFinished):
        return None
    path = downloads.new_path("specviz-trace.jsonl")
    write_trace(events, path)
    return str(path)


def build(target, unavailable: dict[str, str | None], batcher: Batcher, gpu=lambda f: f) -> None:
    with gr.Row():
        with gr.Column(scale=2):
            prompt = gr.Textbox(DEFAULT_PROMPT, lines=3, label="prompt", elem_id="pg-prompt")
            with gr.Row():
                run_btn = gr.Button("Run", variant="primary", elem_id="pg-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="pg-stop")
                trace_file = gr.File(label="trace (JSONL)", elem_id="pg-trace", height=60)
            chat = gr.Checkbox(True, label="chat template")
            with gr.Accordion("generation settings", open=False, elem_id="pg-settings-acc"):
                with gr.Row():
                    max_new = gr.Number(128, label="max new tokens", precision=0,
                                        elem_id="pg-max-new")
                    temperature = gr.Number(0.0, label="temperature (0 = greedy)",
                                            elem_id="pg-temperature")
                    top_p = gr.Number(1.0, label="top-p")
                    seed = gr.Number(0, label="seed", precision=0)
        with gr.Column(scale=1):
            strategy = gr.Dropdown(strategy_choices(unavailable), value="ngram", label="strategy",
                                   elem_id="pg-strategy")
            about = gr.Markdown(strategy_help("ngram", unavailable))
            settings = gr.Dataframe(settings_rows("ngram"), headers=["setting", "value", "meaning"],
                                    datatype=["str", "str", "str"], static_columns=[0, 2],
                                    type="array", label="ngram settings (edit the values)",
                                    column_widths=["30%", "18%", "52%"], wrap=True,
                                    elem_id="pg-settings")
    try:
        recorded, note = replay.load(str(RECORDED))
        intro = message_html(f"A recorded run ({note}). Press Run to decode it live.", "info")
    except TraceError:
        recorded, intro = [], ""
    message = gr.HTML(intro, elem_id="pg-message")
    v = views.layout("pg", recorded)
    events_state = gr.State(recorded)
    ar_speeds_state = gr.State({})   # ar_key -> ar tokens/s measured in this session
    ref = gr.State(None)          # the shown run's ar tokens/s, if measured

    strategy.change(lambda s: (settings_view(s), strategy_help(s, unavailable)), strategy,
                    [settings, about], queue=False)

    @gpu
    def go(prompt, chat, strategy, rows, max_new, temperature, top_p, seed, ar_speeds,
           request: gr.Request):
        cancel = cancel_for(request)
        try:
            req = session.prepare(target, prompt=prompt, strategy=strategy,
                                  overrides=overrides(rows), max_new_tokens=max_new,
                                  temperature=temperature, top_p=top_p, seed=seed, chat=chat)
            key = ar_key(req)
            events = []
            # Text only until the first step: redrawing four Plotly figures here would keep
            # the browser busy just when the first step arrives (the previous run's figures
            # are dimmed instead, see views.render).
            yield {message: message_html("Running…", "info"), **v.render([], text_only=True),
                   events_state: [], ref: None, trace_file: None}
            for n, events in enumerate(session.stream(target, req, cancel, batcher=batcher)):
                yield {**v.render(events, None, ar_speeds.get(key), text_only=n == 0),
                       events_state: events}
            fin = events[-1] if events else None
            if strategy == "ar" and isinstance(fin, RunFinished) and fin.stop_reason != "cancelled":
                ar_speeds = ar_speeds | {key: fin.tokens_per_s}
            note = "Stopped." if fin and fin.stop_reason == "cancelled" else ""
            yield {message: message_html(note, "info") if note else "",
                   **v.render(events, None, ar_speeds.get(key)), events_state: events,
                   ar_speeds_state: ar_speeds, ref: ar_speeds.get(key),
                   trace_file: save_trace(events)}
        except session.UserError as exc:
            yield {message: message_html(str(exc))}

    run_btn.click(go, [prompt, chat, strategy, settings, max_new, temperature, top_p, seed,
                       ar_speeds_state],
                  [message, *v.outputs, events_state, ar_speeds_state, ref, trace_file],
                  concurrency_id="playground", concurrency_limit=session.USERS_AT_ONCE,
                  api_visibility="private")
    stop_btn.click(stop, None, message, queue=False, api_visibility="private")
    v.slider.release(lambda ev, s, r: v.render(ev, s, r, slider=False) if ev else {},
                     [events_state, v.slider, ref], v.outputs[:-1], queue=False,
                     api_visibility="private")

