"""The rejection-sampling explorer (Learn tab): edit p and q, see what verification does.

Boundary: pure maths on small lists. p is the TARGET distribution, q the DRAFT distribution
(both renormalized here). A drafted token x is accepted with min(1, p(x)/q(x)); the total
acceptance probability is sum_x min(p(x), q(x)); on rejection the target samples from the
residual norm(max(0, p - q)), which makes the output distributed exactly as p.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from specviz.viz.legend import color


def normalize(xs: list[float]) -> list[float]:
    xs = [max(0.0, float(x)) for x in xs]
    total = sum(xs)
    if total <= 0:
        raise ValueError("each distribution needs some positive mass")
    return [x / total for x in xs]


def rejection(p: list[float], q: list[float]) -> dict[str, list[float] | float]:
    p, q = normalize(p), normalize(q)
    accept = [min(1.0, pi / qi) if qi > 0 else 1.0 for pi, qi in zip(p, q)]
    overlap = sum(min(pi, qi) for pi, qi in zip(p, q))
    excess = [max(0.0, pi - qi) for pi, qi in zip(p, q)]
    z = sum(excess)
    residual = [e / z for e in excess] if z > 0 else list(p)
    return {"p": p, "q": q, "accept": accept, "acceptance": overlap, "residual": residual}


def explorer_figure(tokens: list[str], r: dict) -> go.Figure:
    labels = [html.escape(t) for t in tokens]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=r["q"], name="q (draft)", marker_color="#7048e8"))
    fig.add_trace(go.Bar(x=labels, y=r["p"], name="p (target)", marker_color="#1c7ed6"))
    fig.add_trace(go.Bar(x=labels, y=r["residual"], name="residual norm(max(0, p − q))",
                         marker_color=color("corrected")))
    fig.add_trace(go.Scatter(x=labels, y=r["accept"], name="P(accept | drafted) = min(1, p/q)",
                             mode="lines+markers", line=dict(color=color("accepted"), width=3)))
    fig.update_layout(barmode="group", height=340, plot_bgcolor="white",
                      title=f"acceptance probability Σ min(p, q) = {r['acceptance']:.2f}",
                      margin=dict(l=40, r=10, t=50, b=40), legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(range=[0, 1.05])
    return fig


def explorer_text(tokens: list[str], r: dict) -> str:
    rows = "".join(
        f"<li><code>{html.escape(t)}</code>: drafted with q = {q:.2f}, target p = {p:.2f} → kept "
        f"with probability {a:.2f}; after a rejection it is resampled with {res:.2f}</li>"
        for t, p, q, a, res in zip(tokens, r["p"], r["q"], r["accept"], r["residual"]))
    return (f"<p>The draft's token is kept with probability Σ min(p, q) = "
            f"<b>{r['acceptance']:.2f}</b> overall.</p><ul>{rows}</ul>")
