"""The one colour legend of the whole app (tokens, tree nodes, bars, badges).

Boundary: names and colours of token statuses, the legend as HTML, and the categorical palettes
of series that are not statuses (requests in a batch, drafters). Nothing else in specviz spells a
colour.
"""
from __future__ import annotations

from plotly.colors import qualitative

# status -> (colour, label, meaning)
STATUS: dict[str, tuple[str, str, str]] = {
    "accepted": ("#1a9850", "accepted", "drafted and kept by the target"),
    "rejected": ("#d73027", "rejected", "drafted, verified, discarded"),
    "corrected": ("#f08c00", "resampled / corrected",
                  "the target's own token after a rejection (argmax or residual sample)"),
    "bonus": ("#4c6ef5", "bonus", "the target's extra token after a fully accepted draft"),
    "target": ("#5c6370", "plain step", "a target step with no draft (like `ar`)"),
    "pending": ("#adb5bd", "pending", "drafted, not (yet) verified"),
}
ROOT = "#343a40"          # the committed token a draft grows from
PROMPT = "#868e96"
REQUESTS = qualitative.Dark24    # one per request of a batch (R <= 16 in the app)
DRAFTERS = qualitative.Dark2     # one per drafter


def color(status: str) -> str:
    return STATUS[status][0]


def label(status: str) -> str:
    return STATUS[status][1]


def legend_html() -> str:
    items = "".join(
        f'<span class="sv-legend-item" title="{meaning}">'
        f'<span class="sv-swatch" style="background:{c}"></span>{name}</span>'
        for c, name, meaning in STATUS.values())
    return f'<div class="sv-legend">{items}</div>'
