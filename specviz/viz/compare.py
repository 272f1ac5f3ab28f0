"""The race: lanes of several runs on one prompt, and the comparison charts once they finish.

Boundary: {strategy: events} -> lanes HTML, a table (rows) and bar charts. Speedups are against
the `ar` lane of the same race; "identical to ar" compares token ids (meaningful under greedy).
"""
from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.events import Event
from specviz.metrics import token_ids
from specviz.viz.panel import run_metrics
from specviz.viz.steps import fold
from specviz.viz.tokens import tokens_html

TABLE_HEADERS = ["strategy", "new tokens", "tokens/s", "speedup vs ar", "τ", "target forwards",
                 "identical to ar"]


def identical_to_ar(runs: dict[str, list[Event]]) -> dict[str, bool | None]:
    ref = token_ids(runs["ar"]) if "ar" in runs else None
    return {sid: None if ref is None else token_ids(ev) == ref for sid, ev in runs.items()}


def lanes_html(runs: dict[str, list[Event]], max_new_tokens: int, greedy: bool) -> str:
    same = identical_to_ar(runs) if greedy else {}
    out = ['<div class="sv-lanes">']
    for sid, events in runs.items():
        m = run_metrics(events)
        done = m["new_tokens"] / max(1, max_new_tokens)
        badge = ('<span class="sv-badge sv-badge-ok">identical to ar</span>'
                 if same.get(sid) and sid != "ar" and _finished(events) else "")
        out.append(
            f'<div class="sv-lane"><div class="sv-lane-h"><b>{html.escape(sid)}</b> '
            f'{m["new_tokens"]} tokens · {m["tokens_per_s"]:.1f} tok/s · '
            f'τ {m["mean_accepted_length"]:.2f} {badge}</div>'
            f'<div class="sv-progress"><span style="width:{min(100.0, 100 * done):.0f}%"></span>'
            f'</div>{tokens_html(fold(events), prompt=False)}</div>')
    out.append("</div>")
    return "".join(out)


def _finished(events: list[Event]) -> bool:
    return bool(events) and type(events[-1]).__name__ == "RunFinished"


def table_rows(runs: dict[str, list[Event]], greedy: bool) -> list[list[Any]]:
    ms = {sid: run_metrics(ev) for sid, ev in runs.items()}
    ar = ms.get("ar", {}).get("tokens_per_s")
    same = identical_to_ar(runs)
    rows = []
    for sid, m in ms.items():
        speed = round(m["tokens_per_s"] / ar, 2) if ar else None
        ident = ("n/a (sampling)" if not greedy else "yes" if same[sid] else "no")
        rows.append([sid, m["new_tokens"], round(m["tokens_per_s"], 1), speed,
                     round(m["mean_accepted_length"], 2), m["target_forwards"], ident])
    return rows


def compare_figure(runs: dict[str, list[Event]]) -> go.Figure:
    ms = {sid: run_metrics(ev) for sid, ev in runs.items()}
    ar = ms.get("ar", {}).get("tokens_per_s")
    names = list(ms)
    fig = make_subplots(rows=1, cols=4, subplot_titles=(
        "tokens/s", "speedup vs ar", "τ (tokens / verify)", "acceptance by position"))
    fig.add_trace(go.Bar(x=names, y=[ms[n]["tokens_per_s"] for n in names], showlegend=False,
                         marker_color="#1c7ed6"), 1, 1)
    fig.add_trace(go.Bar(x=names, y=[ms[n]["tokens_per_s"] / ar if ar else 0 for n in names],
                         showlegend=False, marker_color="#1a9850"), 1, 2)
    fig.add_trace(go.Bar(x=names, y=[ms[n]["mean_accepted_length"] for n in names],
                         showlegend=False, marker_color="#7048e8"), 1, 3)
    for n in names:
        acc = ms[n]["acceptance_by_position"]
        if acc:
            fig.add_trace(go.Scatter(x=list(range(1, len(acc) + 1)), y=acc, name=n,
                                     mode="lines+markers"), 1, 4)
    fig.add_hline(y=1.0, line=dict(dash="dot", color="#868e96"), row=1, col=2)
    fig.update_layout(height=320, margin=dict(l=40, r=10, t=40, b=40), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.2))
    return fig
