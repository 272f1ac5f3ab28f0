"""The tokens view: the text so far, coloured by status, as escaped HTML.

Boundary: model text is always escaped here (a `<script>` prompt shows literally). Hover (the
title attribute) gives p, q and the acceptance draw of each drafted token.
"""
from __future__ import annotations

import html

from specviz.viz.legend import color, legend_html
from specviz.viz.steps import RunView, Step


def visible(piece: str) -> str:
    """A piece as shown inside a node label or a table cell (whitespace made visible)."""
    return piece.replace("\n", "⏎").replace("\t", "⇥") or "∅"


def _num(x: float | None) -> str:
    return "one-hot" if x is None else f"{x:.3f}"


def node_hover(step: Step, i: int) -> str:
    """Plain-text facts about draft node i of a step (callers escape)."""
    d, v = step.draft, step.verified
    parts = [f"token {d.tokens[i]} {visible(d.pieces[i])!r}", f"q = {_num(d.q[i])}"]
    if v and i < len(v.p) and v.p[i] is not None:
        parts.append(f"p = {v.p[i]:.3f}")
        if v.draw[i] is not None:
            parts.append(f"draw = {v.draw[i]:.3f}")
        if v.argmax_pieces[i] is not None:
            parts.append(f"target argmax {visible(v.argmax_pieces[i])!r}")
    if d.confidence[i] is not None:
        parts.append(f"confidence = {d.confidence[i]:.3f}")
    return ", ".join(parts)


def _span(piece: str, status: str, title: str, extra: str = "") -> str:
    return (f'<span class="sv-tok sv-{status}{extra}" style="--c:{color(status)}" '
            f'title="{html.escape(title)}">{html.escape(piece)}</span>')


def tokens_html(view: RunView, upto: int | None = None, prompt: bool = True) -> str:
    """Text of steps 1..upto; the last shown step also lists its rejected and pending drafts."""
    steps = [s for s in view.steps if upto is None or s.step <= upto]
    out = [legend_html(), '<div class="sv-tokens">']
    if prompt and view.start:
        out.append(f'<span class="sv-prompt">{html.escape("".join(view.start.prompt_pieces))}'
                   f'</span>')
    for s in steps:
        for piece, status, node in s.committed():
            title = (node_hover(s, node) if node is not None else
                     f"step {s.step}: the target's own token ({status}, {s.accepted.source})")
            out.append(_span(piece, status, f"step {s.step}: {title}"))
    if steps:
        last = steps[-1]
        status = last.node_status()
        shown = [i for i, st in enumerate(status) if st in ("rejected", "pending")]
        if shown:
            out.append('<span class="sv-aside">')
            out.extend(_span(visible(last.draft.pieces[i]), status[i], node_hover(last, i))
                       for i in shown)
            out.append('</span>')
    out.append("</div>")
    return "".join(out)
