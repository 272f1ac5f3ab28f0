"""The draft-tree view: NetworkX lays the step's tree out by depth, Plotly draws it.

Boundary: one Step -> one figure. One scatter trace per status (so the legend is the app's
legend), node size grows with q, the accepted path is a thick edge trace named "accepted path",
and the target's own token hangs after the path end as an extra node.
"""
from __future__ import annotations

import html
import textwrap
from collections import Counter

import networkx as nx
import plotly.graph_objects as go

from specviz.viz.legend import ROOT, color, label
from specviz.viz.steps import Step
from specviz.viz.tokens import node_hover, visible

EXTRA = "extra"   # graph id of the target's own token
PATH_TRACE = "accepted path"
NOTE_WIDTH = 80    # characters of the step note per title line, for a half-page panel
LABEL_DEPTH = 8    # deeper trees label only the nodes the target looked at (labels would collide)
HEIGHT = 360
WIDE = 5           # a level of more nodes than this stacks them with labels beside, not above
ROW_PX = 30        # and grows the figure by this much per node of its widest level


def graph(step: Step) -> nx.DiGraph:
    """The step's tree (node ids as in the event) plus the target's token as node EXTRA."""
    g = nx.DiGraph()
    d = step.draft
    status = step.node_status()
    for i, (par, depth) in enumerate(zip(d.parents, d.depths)):
        g.add_node(i, layer=depth, status=status[i])
        if par >= 0:
            g.add_edge(par, i)
    if step.accepted:
        end = step.accepted.path[-1]
        g.add_node(EXTRA, layer=d.depths[end] + 1, status=step.extra_kind())
        g.add_edge(end, EXTRA)
    return g


def _size(q: float | None) -> float:
    return 12 + 22 * (1.0 if q is None else q)


def tree_figure(step: Step | None, title: str = "", note_width: int = NOTE_WIDTH) -> go.Figure:
    """The step's draft tree; `note_width` wraps the step's note (characters per line) to the
    panel the figure is shown in (plotly does not wrap titles)."""
    fig = go.Figure()
    fig.update_layout(title=title or "Draft tree", height=HEIGHT,
                      margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False),
                      legend=dict(orientation="h", y=-0.05), plot_bgcolor="white")
    if step is None or step.draft is None:
        return fig
    g = graph(step)
    widest = max(Counter(layer for _, layer in g.nodes(data="layer")).values())
    fig.update_layout(height=max(HEIGHT, 120 + ROW_PX * widest))   # a block tree's wide levels
    pos = nx.multipartite_layout(g, subset_key="layer", align="vertical")
    ys = [y for _, y in pos.values()]
    span = (max(ys) - min(ys)) or 1.0   # room above the top node for its label
    fig.update_yaxes(range=[min(ys) - 0.15 * span, max(ys) + 0.3 * span])
    ex, ey = [], []
    for a, b in g.edges:
        ex += [pos[a][0], pos[b][0], None]
        ey += [pos[a][1], pos[b][1], None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#ced4da", width=1.5),
                             hoverinfo="skip", showlegend=False, name="edges"))
    if step.accepted:
        path = step.accepted.path + [EXTRA]
        fig.add_trace(go.Scatter(x=[pos[n][0] for n in path], y=[pos[n][1] for n in path],
                                 mode="lines", line=dict(color=color("accepted"), width=5),
                                 hoverinfo="skip", name=PATH_TRACE))
    d = step.draft
    crowded = max(d.depths) > LABEL_DEPTH
    groups: dict[str, list] = {}
    for n, attrs in g.nodes(data=True):
        groups.setdefault(attrs["status"], []).append(n)
    for status, nodes in groups.items():
        pieces, hovers, sizes = [], [], []
        for n in nodes:
            if n == EXTRA:
                a = step.accepted
                pieces.append(a.piece)
                hovers.append(f"{label(status)}: {visible(a.piece)!r} ({a.source})")
                sizes.append(_size(None))
            else:
                pieces.append(d.pieces[n])
                hovers.append(("root (committed): " if n == 0 else "") + node_hover(step, n))
                sizes.append(_size(d.q[n]))
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers+text",
            name="root" if status == "root" else label(status),
            marker=dict(size=sizes, color=ROOT if status == "root" else color(status),
                        line=dict(color="white", width=1)),
            text=["" if crowded and status == "pending" else html.escape(visible(p))
                  for p in pieces],
            textposition="middle right" if widest > WIDE else "top center",
            hovertext=[html.escape(h) for h in hovers], hoverinfo="text",
            customdata=[str(n) for n in nodes]))
    note = d.note + (" (fallback: plain target step)" if d.fallback else "")
    if note:
        lines = textwrap.wrap(note, note_width)
        fig.update_layout(title=dict(text=f"{fig.layout.title.text}<br><sup>"
                                          + "<br>".join(map(html.escape, lines)) + "</sup>",
                                     yref="container", y=1, yanchor="top", pad=dict(t=56)),
                          margin=dict(t=84 + 18 * len(lines)))   # (56 px: below the panel's label)
    return fig
