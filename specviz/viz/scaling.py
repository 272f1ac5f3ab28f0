"""τ against training data: the shipped drafters' measured points from earlier training rounds.

Boundary: points as assets/scaling.json stores them (plain dicts; that file's note says what each
field means and how a new round appends) -> a Plotly figure and its Markdown caption. A point is
one set of trained weights: `drafter`, `round`, `response_tokens` (summed over the rounds that led
to the weights, so data seen twice counts twice), optionally `distinct_response_tokens` (each
sequence once; absent when no round repeated data), and any of `heldout_tau`
(simulated chain τ scored on response tokens), `heldout_all_positions_tau` (the older score that
counted prompt positions too) and `engine_tau` (`python -m specviz bench`, greedy), each with its
`*source` (commit:path:line of the model card that wrote the number down).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.viz import legend

TITLE = "τ by training data: measured in earlier training rounds on this CPU"
PUBLISHED = ("The published drafters train on GPUs on 10⁵-10⁶ samples (the model cards' "
             "\"published recipes\"; one source article cites 10⁵ target-generated "
             "prompt-response pairs).")


def tokens(p: dict) -> int:
    """A point's x: the distinct response tokens its weights were trained on."""
    return p.get("distinct_response_tokens") or p["response_tokens"]


def drafters(points: list[dict]) -> list[str]:
    """The drafters in the order they first appear."""
    return list(dict.fromkeys(p["drafter"] for p in points))


def rankings(points: list[dict]) -> dict[int, list[str]]:
    """Per training-data size (distinct response tokens, `tokens`) with two or more
    response-scored held-out τ: the drafters, best held-out τ first."""
    by_size: dict[int, list[dict]] = {}
    for p in points:
        if p.get("heldout_tau") is not None:
            by_size.setdefault(tokens(p), []).append(p)
    return {n: [p["drafter"] for p in sorted(ps, key=lambda p: -p["heldout_tau"])]
            for n, ps in sorted(by_size.items()) if len(ps) > 1}


def cite(source: str) -> str:
    """commit:path:line with the commit shortened to 10 hex digits (what `git show` takes)."""
    commit, rest = source.split(":", 1)
    return f"{commit[:10]}:{rest}"


def _hover(p: dict, key: str, what: str) -> str:
    seen = f"{tokens(p):,} distinct response tokens"
    if tokens(p) != p["response_tokens"]:
        seen += f" ({p['response_tokens']:,} summed over rounds: some data was seen twice)"
    tau = f"{what}: {p[key]:.2f}"
    if key == "engine_tau":
        tau += f" ({p['engine_strategy']}, measured in round {p['engine_round']})"
    data = f"{p['sequences']:,} sequences, {p['total_tokens']:,} tokens with prompts" + (
        ", summed over rounds" if p["round"] > 1 else "")
    lines = [seen, data, tau, f"card: {cite(p[key.replace('_tau', '_source')])}"]
    if key == "engine_tau":
        lines.append(p["engine_command"])
    lines.append(f"training data: {cite(p['source'])}")
    return "<br>".join([f"<b>{html.escape(p['drafter'])}</b>, round {p['round']} weights"]
                       + [html.escape(x, quote=False) for x in lines])


def _trace(pts: list[dict], key: str, what: str, name: str, colour: str, first: bool,
           hollow: bool = False) -> go.Scatter:
    pts = sorted((p for p in pts if p.get(key) is not None), key=tokens)
    return go.Scatter(
        x=[tokens(p) for p in pts], y=[p[key] for p in pts], name=name,
        mode="markers" if hollow else "lines+markers", legendgroup=name, showlegend=first,
        line=dict(color=colour, width=2),
        marker=dict(color=colour, size=9, symbol="circle-open" if hollow else "circle",
                    line=dict(color=colour, width=2)),
        hovertext=[_hover(p, key, what) for p in pts], hoverinfo="text")


def scaling_figure(points: list[dict]) -> go.Figure:
    """Left: held-out simulated chain τ (filled: scored on response tokens; hollow: the older
    score that counted prompt positions too, higher than it should be). Right: τ the engine
    measured. One colour per drafter, x = distinct training response tokens on a log axis; a
    drafter with one point shows as a marker."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("held-out simulated chain τ (hollow: prompt counted too)",
                                        "engine τ (greedy, 16 dev prompts)"))
    for i, name in enumerate(drafters(points)):
        pts = [p for p in points if p["drafter"] == name]
        colour = legend.DRAFTERS[i % len(legend.DRAFTERS)]
        fig.add_trace(_trace(pts, "heldout_tau", "held-out τ (response tokens)", name, colour,
                             True), 1, 1)
        fig.add_trace(_trace(pts, "heldout_all_positions_tau",
                             "held-out τ (all positions, inflated)", name, colour, False,
                             hollow=True), 1, 1)
        fig.add_trace(_trace(pts, "engine_tau", "engine τ", name, colour, False), 1, 2)
    fig.update_xaxes(type="log", title="training data (distinct response tokens)", showgrid=True,
                     gridcolor="#e9ecef", matches="x")
    fig.update_yaxes(showgrid=True, gridcolor="#e9ecef")
    fig.update_yaxes(title="τ (tokens per target forward)", row=1, col=1)
    fig.update_layout(title=TITLE, height=420, margin=dict(l=55, r=10, t=70, b=40),
                      legend=dict(orientation="h", y=-0.2), plot_bgcolor="white",
                      hovermode="closest")
    return fig


def caption(points: list[dict]) -> str:
    """What the chart shows, how far it is from the published scale, and the held-out ranking at
    each data size (the point of the chart: scale changes it)."""
    most = max(points, key=tokens)
    ranks = "\n".join(f"- {n:,} distinct response tokens: " + " > ".join(f"`{d}`" for d in names)
                      for n, names in rankings(points).items())
    return (
        "**Measured in earlier training rounds on this CPU** (one thread per training run; "
        "numbers copied from the model cards' history, each point's card line in its hover, "
        "all of them in `assets/scaling.json`). Between rounds both the data and the training "
        "time grew, so a step to the right mixes the two; x counts each training sequence once, "
        "even when a later round trained on it again. Hollow markers: held-out scores that "
        "also counted the fixed system prompt (higher than they should be). The engine τ "
        "counts what the target actually accepted, with each strategy's own draft length and "
        "verify budget, so it usually sits below the simulated full chain.\n\n"
        f"{PUBLISHED} The largest point here was trained on {tokens(most):,} distinct "
        "response tokens: these are CPU-scale runs.\n\n"
        f"Ranking by held-out τ (response tokens) at each data size:\n{ranks}")
