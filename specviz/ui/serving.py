"""The Serving tab: R requests share one batched engine; one or two verify-length policies run
in turn on the same requests, side by side.

Boundary: form -> checked serving set-up (one-line UserErrors) -> a worker thread that steps,
on the compute thread (compute.py), the serving of policy A, then policy B (engine/batch.serve),
and optionally checks each request against its own `ar` output -> the figures of
viz/serving.py, redrawn as steps arrive. Stop (the browser session's cancel flag) ends the run
at the next step boundary. Per-user state: the finished runs' metrics of the current settings,
for the comparison chart and table.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from specviz import serve as serving
from specviz import serving_metrics
from specviz.bench import Prompt, greedy_match, read_prompts
from specviz.engine.batch import serve
from specviz.engine.decode import BadRequest, GenSettings
from specviz.engine.scheduler import POLICY_HELP, Policy, parse_policy
from specviz.engine.sps import cache_file, profile
from specviz.events import Event, RequestFinished, ServeFinished
from specviz.ui import session
from specviz.ui.playground import cancel_for, stop
from specviz.viz.panel import message_html
from specviz.viz.serving import (TABLE_HEADERS, budget_figure, comparison_figure, lanes_html,
                                 sps_figure, table_rows)

PROMPTS = Path(__file__).resolve().parents[2] / "demos" / "prompts.jsonl"
POLICIES = ["dspark", "dspark-prod", "fixed:1", "fixed:2", "fixed:4", "fixed:8", "threshold:0.5"]
NO_POLICY = "none"
MAX_REQUESTS = 16
LANES_EVERY_S = 0.3        # lanes redraw at most this often while running
FIGURES_EVERY_S = 1.5      # the Plotly figures, which cost the browser more, less often
ARRIVALS = {"all at once": "all", "poisson": "poisson"}

NOTE = """**How a batch decides who gets verified.** Each step, every request's drafter proposes a
chain and an estimate a_j that drafts 1..j all survive verification. Every verified token takes
a slot in the target's one batched forward, and the forward gets slower as the batch grows:
that is the **SPS curve** (verify steps per second against batch tokens), measured on this
machine. DSpark's **Algorithm 1** hands out slots one at a time, highest a_j first, while the
expected tokens per second, τ·SPS(B), still rises: slots go where the expected accepted tokens
per unit of hardware cost are highest. It stops at the **first** slot that does not pay. That
early break keeps it lossless: whether draft j is verified depends only on a_1..a_j and the
slots ranked before it, never on what comes after (ALGORITHMS.md §0, §6). `fixed:G` verifies
G drafts per request whatever they are worth; `threshold:T` cuts each request alone, blind to
the batch's cost; `dspark-prod` takes its budget from confidences two steps old and fills it
best-first with no break. DSpark's a_j come from its calibrated confidence head; the other
drafters' a_j are products of their own draft probabilities, **uncalibrated**."""


@dataclasses.dataclass(frozen=True)
class Setup:
    """A checked form: what to serve and how."""
    strategy: str
    policies: list[Policy]
    prompts: list[Prompt]
    requests: int
    arrival: str
    gen: GenSettings
    check: bool

    @property
    def key(self) -> str:
        """Runs with the same key serve the same requests: their metrics compare."""
        return repr((self.strategy, [p.prompt for p in self.prompts], self.requests, self.arrival,
                     self.gen))


def setup(unavailable: dict[str, str | None], *, strategy: Any, policy_a: Any,
          policy_b: Any, requests: Any, arrival: Any, rate: Any, max_new_tokens: Any,
          temperature: Any, seed: Any, prompts: Any, check: Any) -> Setup:
    """Validate form values; every failure is a UserError with the fix."""
    if strategy not in serving.FULL_CHAIN:
        raise session.UserError(f"Choose a chain strategy: {', '.join(serving.FULL_CHAIN)}.")
    if unavailable.get(strategy):
        raise session.UserError(f"{strategy} is unavailable: {unavailable[strategy]}")
    try:
        chosen = [parse_policy(str(p)) for p in (policy_a, policy_b) if p and p != NO_POLICY]
        n = int(requests)
        gen = GenSettings(max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                          seed=int(seed))
        gen.check()
        pattern = ARRIVALS.get(arrival)
        if pattern is None:
            raise ValueError(f"arrival pattern: choose {' or '.join(ARRIVALS)}")
        if pattern == "poisson":
            pattern = f"poisson:{float(rate):g}"
        serving.arrivals(pattern, 1, 0)                      # checks the rate
    except (BadRequest, ValueError, TypeError) as exc:
        raise session.UserError(f"Bad settings: {exc}") from None
    if not chosen:
        raise session.UserError(f"Choose policy A ({POLICY_HELP}).")
    if len(chosen) == 2 and chosen[0] == chosen[1]:
        raise session.UserError(f"Policies A and B are both {chosen[0].id}; choose another B "
                                f"or {NO_POLICY}.")
    if not 1 <= n <= MAX_REQUESTS:
        raise session.UserError(f"Requests: choose 1 to {MAX_REQUESTS}.")
    lines = [x.strip() for x in (prompts or "").splitlines() if x.strip()]
    listed = ([Prompt(f"prompt {i + 1}", "custom", x, None) for i, x in enumerate(lines)]
              if lines else read_prompts(PROMPTS))
    return Setup(strategy, chosen, listed, n, pattern, gen, bool(check))


def _text(p: Prompt) -> str:
    """A prompt as one line of text (a chat prompt: its last message)."""
    return p.prompt if isinstance(p.prompt, str) else str(p.prompt[-1].get("content", ""))


def _work(target, s: Setup, cancel: threading.Event) -> Iterator[tuple[str, str, Any]]:
    """The comparison as (kind, label, payload) items (stepped on the compute thread)."""
    if not cache_file(target).is_file():
        yield ("note", "", "Measuring the SPS curve (once per model and device)…")
    sps = profile(target)
    drafter, kind, settings = serving.batch_drafter(target, s.strategy)
    incoming, names = serving.requests_of(target, s.prompts, s.requests,
                                          s.gen.max_new_tokens, s.gen, s.arrival)
    yield ("requests", "", {x.id: f"{name}: {_text(s.prompts[x.id % len(s.prompts)])}"
                            for x, name in zip(incoming, names)})
    done: dict[str, list[Event]] = {}
    for policy in s.policies:
        yield ("note", policy.id, f"Serving {len(incoming)} requests with {policy.id}…")
        events = done.setdefault(policy.id, [])
        for e in serve(target, drafter, incoming, policy, sps, strategy=s.strategy,
                       strategy_settings=settings, confidence=kind, sps_curve=sps.points(),
                       seed=s.gen.seed):
            events.append(e)
            yield ("event", policy.id, e)
            if cancel.is_set():
                return
    if s.check and s.gen.sampling.greedy:
        yield ("note", "", "Checking each request against its own ar output…")
        refs = serving.ar_reference(target, incoming)
        for label, events in done.items():
            got = [e for e in events if isinstance(e, RequestFinished)]
            ok = [greedy_match(target, incoming[e.request].prompt_ids, refs[e.request],
                               e.token_ids) for e in got]
            yield ("match", label, sum(ok) / len(ok))


def build(target, unavailable: dict[str, str | None], gpu=lambda f: f) -> None:
    gr.Markdown(NOTE, elem_id="srv-note")
    with gr.Row():
        with gr.Column(scale=2):
            prompts = gr.Textbox(lines=3, label="prompts (optional, one per line; empty: the "
                                 "demo prompts, cycling)", elem_id="srv-prompts")
            with gr.Row():
                run_btn = gr.Button("Serve", variant="primary", elem_id="srv-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="srv-stop")
        with gr.Column(scale=2):
            with gr.Row():
                requests = gr.Slider(1, MAX_REQUESTS, value=4, step=1, label="requests R",
                                     elem_id="srv-requests")
                strategy = gr.Dropdown(
                    [(sid + (" (unavailable)" if unavailable.get(sid) else ""), sid)
                     for sid in serving.FULL_CHAIN], value="dspark", label="strategy (chains)",
                    elem_id="srv-strategy")
            with gr.Row():
                policy_a = gr.Dropdown(POLICIES, value="dspark", allow_custom_value=True,
                                       label="policy A", elem_id="srv-policy-a")
                policy_b = gr.Dropdown([NO_POLICY, *POLICIES], value="fixed:4",
                                       allow_custom_value=True, label="policy B (optional)",
                                       elem_id="srv-policy-b")
            with gr.Row():
                arrival = gr.Radio(list(ARRIVALS), value="all at once", label="arrivals",
                                   elem_id="srv-arrival")
                rate = gr.Number(2.0, label="poisson rate (requests/s)", elem_id="srv-rate")
            with gr.Row():
                max_new = gr.Number(32, label="max new tokens", precision=0, elem_id="srv-max-new")
                temperature = gr.Number(0.0, label="temperature", elem_id="srv-temperature")
                seed = gr.Number(0, label="seed", precision=0)
            check = gr.Checkbox(False, label="check greedy match against ar (runs each request "
                                "alone afterwards: slower)", elem_id="srv-check")
    message = gr.HTML(elem_id="srv-message")
    with gr.Row():
        with gr.Column():
            lanes_a = gr.HTML(elem_id="srv-lanes-a")
            budget_a = gr.Plot(label="verify budget, policy A", elem_id="srv-budget-a")
        with gr.Column():
            lanes_b = gr.HTML(elem_id="srv-lanes-b")
            budget_b = gr.Plot(label="verify budget, policy B", elem_id="srv-budget-b")
    with gr.Row():
        sps_plot = gr.Plot(label="SPS curve", elem_id="srv-sps")
        compare_plot = gr.Plot(label="policies compared", elem_id="srv-compare")
    table = gr.Dataframe(headers=TABLE_HEADERS, label="policies on these requests (every "
                         "finished run of the same settings on this page)",
                         elem_id="srv-table", interactive=False)
    results = gr.State({})      # {"key": Setup.key, "rows": {policy: metrics}}

    @gpu
    def run(past, strategy, policy_a, policy_b, requests, arrival, rate, max_new_tokens,
            temperature, seed, prompts, check, request: gr.Request):
        cancel = cancel_for(request)
        try:
            s = setup(unavailable, strategy=strategy, policy_a=policy_a,
                      policy_b=policy_b, requests=requests, arrival=arrival, rate=rate,
                      max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                      prompts=prompts, check=check)
        except session.UserError as exc:
            yield {message: message_html(str(exc))}
            return
        labels_of = [p.id for p in s.policies]
        lanes, budgets = dict(zip(labels_of, (lanes_a, lanes_b))), dict(zip(labels_of,
                                                                           (budget_a, budget_b)))
        rows = dict(past.get("rows", {})) if past.get("key") == s.key else {}
        runs: dict[str, list[Event]] = {label: [] for label in labels_of}
        matches: dict[str, Any] = {}
        names: dict[int, str] = {}
        out = session.in_thread(_work(target, s, cancel), "specviz-serve")
        tags = dict(zip(labels_of, ("A: ", "B: ")))

        def view(figures: bool, note: str | None = None, only: str | None = None,
                 stopped: bool = False) -> dict:
            """Updates of every run's lanes and budget (or only run `only`'s), the SPS chart
            if `figures`, and the message if `note` is given."""
            upd: dict = {}
            if note is not None:
                upd[message] = message_html(note, "info") if note else ""
            for label, events in runs.items():
                if only not in (None, label):
                    continue
                upd[lanes[label]] = lanes_html(events, target.decode, names, tags[label],
                                               stopped)
                if figures:
                    upd[budgets[label]] = budget_figure(events, tags[label])
            if figures:
                upd[sps_plot] = sps_figure(runs)
            return upd

        first = {lanes_b: "", budget_b: None} if len(labels_of) == 1 else {}
        yield first | view(True, "Starting…")
        last_lanes = last_figs = 0.0
        try:
            while (item := out.get()) is not None:
                if isinstance(item, BaseException):
                    raise session.friendly(item)
                kind, label, payload = item
                if kind == "note":              # a phase begins: the last one drawn in full
                    yield view(True, payload)
                elif kind == "requests":
                    names = payload
                elif kind == "match":
                    matches[label] = payload
                elif kind == "event":
                    runs[label].append(payload)
                    now = time.perf_counter()
                    if now - last_figs >= FIGURES_EVERY_S:
                        last_figs = last_lanes = now
                        yield view(True, only=label)
                    elif now - last_lanes >= LANES_EVERY_S:
                        last_lanes = now
                        yield view(False, only=label)
        except session.UserError as exc:
            yield view(True) | {message: message_html(str(exc))}
            return
        finally:
            cancel.set()
        finished = {k: ev for k, ev in runs.items() if ev and isinstance(ev[-1], ServeFinished)}
        for label, events in finished.items():
            rows[label] = serving_metrics.summarize(events) | {"greedy_match": (
                matches.get(label) if s.gen.sampling.greedy else "n/a (sampling)")}
        stopped = len(finished) < len(runs)
        note = "Stopped; unfinished runs are left out of the comparison." if stopped else ""
        state = {"key": s.key, "rows": rows}
        yield view(True, note, stopped=stopped) | {
            compare_plot: comparison_figure(rows) if rows else None,
            table: table_rows(rows), results: state}

    run_btn.click(run, [results, strategy, policy_a, policy_b, requests, arrival, rate, max_new,
                        temperature, seed, prompts, check],
                  [message, lanes_a, lanes_b, budget_a, budget_b, sps_plot, compare_plot, table,
                   results], concurrency_id="engine",
                  concurrency_limit=session.ENGINE_CONCURRENCY, api_visibility="private")
    stop_btn.click(stop, None, message, queue=False, api_visibility="private")
