"""Step charts: accept/reject by draft position, the confidence prefix, the KV cache over steps.

Boundary: folded steps -> Plotly figures. Colours from `legend`; text through html.escape.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from specviz.viz.legend import color
from specviz.viz.steps import RunView, Step

REASON_CHARS = 40   # a schedule reason longer than this is shortened on the chart


def _base(title: str, height: int = 300) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=height, margin=dict(l=50, r=10, t=40, b=40),
                      legend=dict(orientation="h", y=-0.25), plot_bgcolor="white",
                      hovermode="closest")
    return fig


def offered_depth(step: Step) -> int:
    """Deepest draft position that went through the target this step."""
    if not step.verified:
        return 0
    return max(step.draft.depths[:step.n_verified], default=0)


def acceptance_figure(view: RunView, upto: int | None = None) -> go.Figure:
    """This step's positions (accepted / rejected bars) and the cumulative rate per position."""
    steps = [s for s in view.complete_steps if upto is None or s.step <= upto]
    fig = _base("Accept / reject by draft position")
    fig.update_xaxes(title="draft position", dtick=1)
    fig.update_yaxes(title="acceptance", range=[0, 1.05])
    if not steps:
        return fig
    depth = max(offered_depth(s) for s in steps)
    offered = [0] * depth
    hit = [0] * depth
    for s in steps:
        for j in range(offered_depth(s)):
            offered[j] += 1
            hit[j] += j < s.accepted.n_accepted
    last = steps[-1]
    n = offered_depth(last)
    xs = list(range(1, n + 1))
    ok = [j < last.accepted.n_accepted for j in range(n)]
    fig.add_trace(go.Bar(x=xs, y=[1] * n, name=f"step {last.step}",
                         marker_color=[color("accepted" if k else "rejected") for k in ok],
                         opacity=0.55, hovertext=["accepted" if k else "rejected" for k in ok],
                         hoverinfo="x+text"))
    fig.add_trace(go.Scatter(x=list(range(1, depth + 1)),
                             y=[h / o if o else 0 for h, o in zip(hit, offered)],
                             mode="lines+markers", name="cumulative rate",
                             line=dict(color="#212529", width=2),
                             hovertext=[f"{h}/{o} accepted" for h, o in zip(hit, offered)],
                             hoverinfo="x+y+text"))
    return fig


def confidence_figure(step: Step | None) -> go.Figure:
    """c_k and survival a_j of the step's draft, the threshold and the truncation point."""
    fig = _base("Confidence prefix")
    fig.update_xaxes(title="draft position", dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    sch = step.schedule if step else None
    if sch is None:
        conf = [] if step is None or step.draft is None else [
            (d, c) for d, c in zip(step.draft.depths, step.draft.confidence) if c is not None]
        if not conf:
            fig.add_annotation(text="this strategy reports no confidence", showarrow=False,
                               xref="paper", yref="paper", x=0.5, y=0.5)
            return fig
        fig.add_trace(go.Scatter(x=[d for d, _ in conf], y=[c for _, c in conf], mode="markers",
                                 name="node confidence", marker=dict(color="#7048e8")))
        return fig
    k = list(range(1, len(sch.confidence) + 1))
    fig.add_trace(go.Bar(x=k, y=sch.confidence, name="confidence c_k", marker_color=[
        color("pending" if j > sch.verify_len else "accepted") for j in k], opacity=0.7))
    fig.add_trace(go.Scatter(x=list(range(1, len(sch.survival) + 1)), y=sch.survival,
                             mode="lines+markers", name="survival a_j",
                             line=dict(color="#7048e8", width=2)))
    if sch.threshold is not None:
        fig.add_hline(y=sch.threshold, line=dict(color=color("rejected"), dash="dash"),
                      annotation_text=f"threshold {sch.threshold:g}", name="threshold")
    # a short reason rides on the line; of a long one (the hardware scheduler's) only its head
    # before ":", the whole is the hover text. The label sits on the side with more room.
    short = sch.reason if len(sch.reason) <= REASON_CHARS else sch.reason.split(":")[0]
    text = f"verify {sch.verify_len}" + (f" ({short})" if len(short) <= REASON_CHARS else "")
    right = sch.verify_len + 0.5 <= (len(k) + 1) / 2
    fig.add_vline(x=sch.verify_len + 0.5, line=dict(color="#212529", dash="dot"),
                  annotation=dict(text=html.escape(text), hovertext=html.escape(sch.reason)),
                  annotation_position="top right" if right else "top left")
    return fig


def _ranges(xs: list[int]) -> str:
    """[3,4,5,9] -> '3-5, 9' (kept / dropped cache positions for hover)."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out) or "none"


def kv_figure(view: RunView, upto: int | None = None) -> go.Figure:
    """Target cache length: up by the verified tree, down by rollback / tree compaction."""
    steps = [s for s in view.complete_steps if upto is None or s.step <= upto]
    fig = _base("KV cache over steps")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="cached positions")
    if not steps:
        return fig
    xs, ys, hover = [], [], []
    drops_x, drops_y, drops_h = [], [], []
    for s in steps:
        kv = s.kv
        xs += [s.step - 0.5, s.step]
        ys += [kv.target_before, kv.target_after]
        hover += [f"step {s.step}: verify forward -> {kv.target_before}",
                  f"step {s.step}: kept {_ranges(kv.kept)}; dropped {_ranges(kv.dropped)}"]
        if kv.dropped:
            drops_x.append(s.step)
            drops_y.append(kv.target_after)
            drops_h.append(f"step {s.step}: dropped {len(kv.dropped)} "
                           f"({_ranges(kv.dropped)}), kept {_ranges(kv.kept)}")
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="target cache",
                             line=dict(color="#495057"), hovertext=hover, hoverinfo="text"))
    fig.add_trace(go.Scatter(x=drops_x, y=drops_y, mode="markers", name="rollback / compaction",
                             marker=dict(color=color("rejected"), size=9, symbol="triangle-down"),
                             hovertext=drops_h, hoverinfo="text"))
    if any(s.kv.drafter_after is not None for s in steps):
        fig.add_trace(go.Scatter(x=[s.step for s in steps], y=[s.kv.drafter_after for s in steps],
                                 mode="lines", name="drafter cache",
                                 line=dict(color="#7048e8", dash="dot")))
    return fig


def verify_cost_figure(widths: list[int], seconds: list[float], device: str) -> go.Figure:
    """The target's measured forward time by the number of tokens it takes at once: what a
    verify of k drafted tokens costs next to a plain 1-token step."""
    fig = _base(f"What verifying costs here ({device}): one target forward, by width")
    fig.update_xaxes(title="tokens in one forward (1 = a plain step; 1 + drafts = a verify)",
                     type="log", tickvals=widths)
    fig.update_yaxes(title="ms", rangemode="tozero")
    base = seconds[0]
    fig.add_trace(go.Scatter(
        x=widths, y=[1000 * s for s in seconds], mode="lines+markers", name="forward time",
        line=dict(color=color("accepted"), width=2),
        hovertext=[f"{w} tokens: {1000 * s:.0f} ms = {s / base:.2f}x one token"
                   for w, s in zip(widths, seconds)], hoverinfo="text"))
    fig.add_hline(y=1000 * base, line=dict(color="#868e96", dash="dot"),
                  annotation_text="a plain step", name="a plain step")
    return fig
