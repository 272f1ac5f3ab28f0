"""Batched serving, drawn: per-request lanes, each step's verify budget, the SPS curve with the
operating points, and policies compared on throughput against per-user speed.

Boundary: serving-run events (ServeStarted .. ServeFinished, events.py) -> HTML and Plotly
figures. Pure: no torch; token text comes from a `decode` callable the caller passes, and model
text is always HTML-escaped. Numbers of finished requests and runs are `serving_metrics`'s.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import plotly.graph_objects as go

from specviz import serving_metrics
from specviz.events import (BatchScheduled, Event, RequestFinished, RequestJoined,
                            RequestStepped, ServeFinished, ServeStarted)
from specviz.viz import legend
from specviz.viz.legend import ROOT, color

PROMPT_CHARS = 70                          # a lane shows this much of its prompt
SHOWN_PAST_CUT = 3                         # a_j values shown after a request's cut
TABLE_HEADERS = ["policy", "throughput tok/s", "mean per-user tok/s", "τ (tokens / slot)",
                 "mean batch tokens", "steps", "greedy match"]
CONFIDENCE = {
    "calibrated": "a_j calibrated (DSpark's survival head)",
    "uncalibrated": "a_j uncalibrated (products of the drafter's own probabilities)",
    "none": "no drafts (ar: each request verifies its root only)",
}

Decode = Callable[[list[int]], str]


@dataclass
class Lane:
    """One request of a serving run, so far."""
    joined: RequestJoined
    tokens: list[int] = field(default_factory=list)
    slots: int = 0                                   # batched steps it took part in
    finished: RequestFinished | None = None


@dataclass
class ServeView:
    start: ServeStarted | None = None
    lanes: dict[int, Lane] = field(default_factory=dict)
    scheduled: list[BatchScheduled] = field(default_factory=list)
    stepped: dict[tuple[int, int], RequestStepped] = field(default_factory=dict)  # (step, req)
    finished: ServeFinished | None = None
    now: float = 0.0                                 # the latest event's time


def fold(events: list[Event]) -> ServeView:
    v = ServeView()
    for e in events:
        v.now = max(v.now, e.t)
        if isinstance(e, ServeStarted):
            v.start = e
        elif isinstance(e, RequestJoined):
            v.lanes[e.request] = Lane(e)
        elif isinstance(e, BatchScheduled):
            v.scheduled.append(e)
        elif isinstance(e, RequestStepped):
            lane = v.lanes[e.request]
            lane.tokens += e.new_tokens
            lane.slots += 1
            v.stepped[(e.step, e.request)] = e
        elif isinstance(e, RequestFinished):
            v.lanes[e.request].finished = e
        elif isinstance(e, ServeFinished):
            v.finished = e
    return v


def confidence_label(kind: str) -> str:
    return CONFIDENCE.get(kind, kind)


def _lane_html(rid: int, label: str, lane: Lane | None, decode: Decode, now: float,
               rows: dict[int, dict[str, Any]], stopped: bool) -> str:
    head = f'<b>#{rid}</b> <span class="sv-serve-prompt">{html.escape(label)}</span>'
    if lane is None:
        return (f'<div class="sv-lane sv-serve-lane sv-serve-waiting"><div class="sv-lane-h">'
                f'{head}</div><div class="sv-status">waiting to arrive</div></div>')
    n, cap = len(lane.tokens), max(1, lane.joined.max_new_tokens)
    if lane.finished is not None:
        speed = rows[rid]["tokens_per_s"]
        state = f"finished ({lane.finished.stop_reason})"
    else:
        span = now - lane.joined.t
        speed, state = (n / span if span > 0 else 0.0), "stopped" if stopped else "running"
    tau = n / lane.slots if lane.slots else 0.0
    return (f'<div class="sv-lane sv-serve-lane"><div class="sv-lane-h">{head}</div>'
            f'<div class="sv-status">{n}/{cap} tokens · {speed:.1f} tok/s · τ {tau:.2f} · '
            f'{state}</div>'
            f'<div class="sv-progress"><span style="width:{min(100.0, 100 * n / cap):.0f}%">'
            f'</span></div><div class="sv-serve-text">{html.escape(decode(lane.tokens))}</div>'
            f'</div>')


def lanes_html(events: list[Event], decode: Decode, labels: dict[int, str] | None = None,
               title: str = "", stopped: bool = False) -> str:
    """One lane per request: id, prompt head, text so far, progress, its tokens/s and τ.
    `labels`: request id -> its prompt (or a name); requests in it that have not joined yet
    show as waiting. The header names the policy and how its a_j are calibrated; `stopped`:
    the run was cancelled before it finished."""
    v = fold(events)
    labels = labels or {}
    rows = {r["id"]: r for r in serving_metrics.requests(events)}
    ids = sorted(set(labels) | set(v.lanes))
    new = sum(len(lane.tokens) for lane in v.lanes.values())
    state = ("finished" if v.finished else "stopped" if stopped else "running" if v.start
             else "not started")
    kind = v.start.confidence if v.start else ""
    badge = (f'<span class="sv-badge sv-conf-{html.escape(kind)}">'
             f'{html.escape(confidence_label(kind))}</span>' if kind else "")
    policy = f"policy {v.start.policy} · {v.start.strategy}" if v.start else ""
    out = [f'<div class="sv-serve-run"><div class="sv-lane-h"><b>{html.escape(title)}</b> '
           f'{html.escape(policy)} {badge}</div>'
           f'<div class="sv-status">{state}: {len(v.scheduled)} steps · {new} tokens · '
           f'{new / v.now if v.now > 0 else 0.0:.1f} tok/s in all</div><div class="sv-lanes">']
    for rid in ids:
        label = labels.get(rid)
        if label is None:
            label = f"{len(v.lanes[rid].joined.prompt_ids)} prompt tokens"
        label = " ".join(label.split())
        if len(label) > PROMPT_CHARS:
            label = label[:PROMPT_CHARS - 1] + "…"
        out.append(_lane_html(rid, label, v.lanes.get(rid), decode, v.now, rows, stopped))
    out.append("</div></div>")
    return "".join(out)


def _survival_text(a: list[float], n: int) -> str:
    """a_j values with a bar after the last verified one, and up to SHOWN_PAST_CUT after it:
    '0.97 0.88 ┆ 0.41 0.12 0.03 …'."""
    shown = [f"{x:.2f}" for x in a[:n + SHOWN_PAST_CUT]]
    more = " …" if len(a) > n + SHOWN_PAST_CUT else ""
    return " ".join(shown[:n] + ["┆"] + shown[n:]) + more if a else "none drafted"


def _layout(fig: go.Figure, title: str, height: int = 340) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=55, r=10, t=45, b=40),
                      legend=dict(orientation="h", y=-0.22), plot_bgcolor="white",
                      hovermode="closest")
    return fig


def budget_figure(events: list[Event], title: str = "") -> go.Figure:
    """Per step, stacked: the slots each request got in the verify forward (its root + its
    verified drafts); hover gives its a_j curve cut where the policy cut it, and why. Lines:
    the scheduler's expected tokens and the tokens actually committed."""
    v = fold(events)
    kind = confidence_label(v.start.confidence) if v.start else ""
    fig = _layout(go.Figure(), f"{title}verify budget per step" + (f" · {kind}" if kind else ""))
    fig.update_xaxes(title="batched step", dtick=1 if len(v.scheduled) <= 20 else None)
    fig.update_yaxes(title="tokens in the verify forward", rangemode="tozero")
    fig.update_layout(barmode="stack")
    if not v.scheduled:
        fig.add_annotation(text="no steps yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5)
        return fig
    per: dict[int, tuple[list[int], list[int], list[str]]] = {}
    for b in v.scheduled:
        budget = f"<br>budget K = {b.budget}" if b.budget is not None else ""
        for rid, a, n, why in zip(b.requests, b.survival, b.verify_lens, b.reasons):
            st = v.stepped.get((b.step, rid))
            got = (f"<br>accepted {st.n_accepted} of {n} → +{len(st.new_tokens)} tokens"
                   if st else "")
            xs, ys, hover = per.setdefault(rid, ([], [], []))
            xs.append(b.step)
            ys.append(1 + n)
            hover.append(f"request {rid} · step {b.step}<br>root + {n} of {len(a)} drafts"
                         f"<br>a_j: {_survival_text(a, n)}{got}<br>{html.escape(why)}{budget}")
    for k, rid in enumerate(sorted(per)):
        xs, ys, hover = per[rid]
        fig.add_trace(go.Bar(x=xs, y=ys, name=f"request {rid}", hovertext=hover,
                             hoverinfo="text",
                             marker_color=legend.REQUESTS[k % len(legend.REQUESTS)]))
    steps = [b.step for b in v.scheduled]
    fig.add_trace(go.Scatter(
        x=steps, y=[b.expected_tokens for b in v.scheduled], mode="lines+markers",
        name="expected tokens (Σ 1 + a_1..a_l)", line=dict(color=ROOT, dash="dot"),
        hovertext=[f"step {b.step}: expected {b.expected_tokens:.2f} of {b.batch_tokens} batch "
                   f"tokens" for b in v.scheduled], hoverinfo="text"))
    committed = [sum(len(st.new_tokens) for (s, _), st in v.stepped.items() if s == step)
                 for step in steps]
    fig.add_trace(go.Scatter(x=steps, y=committed, mode="markers", name="tokens committed",
                             marker=dict(color=color("accepted"), size=9, symbol="diamond"),
                             hovertext=[f"step {s}: {c} tokens committed"
                                        for s, c in zip(steps, committed)], hoverinfo="text"))
    return fig


def sps_figure(runs: dict[str, list[Event]]) -> go.Figure:
    """The measured SPS curve (verify steps/s against batch tokens) and, per run, the points
    its steps operated at (marker area grows with the number of steps at that point)."""
    fig = _layout(go.Figure(), "SPS curve (measured here) and each step's operating point")
    fig.update_xaxes(title="batch tokens (every request's root + its verified drafts)",
                     type="log")
    fig.update_yaxes(title="verify steps / s", rangemode="tozero")
    views = {label: fold(events) for label, events in runs.items()}
    curve = next((v.start.sps_curve for v in views.values() if v.start and v.start.sps_curve), [])
    if curve:
        fig.update_xaxes(tickvals=[b for b, _ in curve])
        fig.add_trace(go.Scatter(
            x=[b for b, _ in curve], y=[s for _, s in curve], mode="lines+markers",
            name="SPS(B), measured", line=dict(color=color("target"), width=2),
            hovertext=[f"B = {b:g}: {s:.1f} steps/s ({1000 / s:.0f} ms a forward)"
                       for b, s in curve], hoverinfo="text"))
    for k, (label, v) in enumerate(views.items()):
        at: dict[int, list[BatchScheduled]] = {}
        for b in v.scheduled:
            at.setdefault(b.batch_tokens, []).append(b)
        points = sorted(at.items())
        fig.add_trace(go.Scatter(
            x=[b for b, _ in points], y=[bs[0].sps_point[1] for _, bs in points],
            mode="markers", name=f"{label}: steps", opacity=0.8,
            marker=dict(size=[8 + 4 * math.sqrt(len(bs)) for _, bs in points],
                        color=legend.REQUESTS[-1 - k], line=dict(color="white", width=1)),
            hovertext=[_point_hover(label, b, bs) for b, bs in points], hoverinfo="text"))
    if not curve and not any(v.scheduled for v in views.values()):
        fig.add_annotation(text="run a policy to see the curve", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def _point_hover(label: str, b: int, steps: list[BatchScheduled]) -> str:
    sps = steps[0].sps_point[1]
    expected = sum(s.expected_tokens for s in steps) / len(steps)
    names = ", ".join(str(s.step) for s in steps[:12]) + (" …" if len(steps) > 12 else "")
    return (f"{html.escape(label)}: {len(steps)} step(s) at B = {b} (steps {names})"
            f"<br>SPS {sps:.1f} steps/s · expected {expected:.2f} tokens a step"
            f"<br>≈ {expected * sps:.0f} tokens/s expected (the objective τ·SPS)")


def comparison_figure(rows: dict[str, dict[str, Any]]) -> go.Figure:
    """One labelled point per policy run: total throughput against mean per-user tokens/s.
    `rows`: label -> `serving_metrics.summarize` of that run."""
    fig = _layout(go.Figure(), "Policies: total throughput against per-user speed "
                               "(up and right is better)", height=360)
    fig.update_xaxes(title="mean per-user tokens/s", rangemode="tozero")
    fig.update_yaxes(title="throughput, tokens/s (all requests)", rangemode="tozero")
    labels = list(rows)
    top = max((m["throughput_tokens_per_s"] for m in rows.values()), default=0.0)
    fig.update_yaxes(range=[0, 1.25 * top or 1.0])          # room for the labels above
    fig.add_trace(go.Scatter(
        x=[rows[k]["mean_per_request_tokens_per_s"] for k in labels],
        y=[rows[k]["throughput_tokens_per_s"] for k in labels], mode="markers+text",
        text=[html.escape(k) for k in labels], showlegend=False,
        textposition=["top center" if i % 2 == 0 else "bottom center" for i in range(len(labels))],
        marker=dict(size=13, color=[legend.REQUESTS[-1 - i] for i in range(len(labels))]),
        hovertext=[f"{html.escape(k)}: {rows[k]['throughput_tokens_per_s']:.1f} tok/s in all, "
                   f"{rows[k]['mean_per_request_tokens_per_s']:.1f} per user, "
                   f"τ {rows[k]['mean_accepted_length']:.2f}" for k in labels],
        hoverinfo="text"))
    return fig


def table_rows(rows: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """TABLE_HEADERS rows; a row's optional "greedy_match" is a rate, a note, or None (not
    checked)."""
    out = []
    for label, m in rows.items():
        match = m.get("greedy_match")
        out.append([label, round(m["throughput_tokens_per_s"], 1),
                    round(m["mean_per_request_tokens_per_s"], 1),
                    round(m["mean_accepted_length"], 2), round(m["mean_batch_tokens"], 1),
                    m["steps"], "not checked" if match is None else
                    f"{match:.2f}" if isinstance(match, float) else match])
    return out
