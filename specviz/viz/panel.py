"""The live metrics panel: tokens/s, speedup vs `ar`, τ, target forwards, time split.

Boundary: contract metrics (from `specviz.metrics`) -> escaped HTML. Speedup is shown only when
an `ar` run of the same prompt and settings was measured; it is never guessed.
"""
from __future__ import annotations

import html
from typing import Any

from specviz import metrics
from specviz.events import Event, RunFinished


def run_metrics(events: list[Event]) -> dict[str, Any]:
    """Contract metrics of a finished run, or live ones of a run in progress."""
    if events and isinstance(events[-1], RunFinished):
        fin = events[-1]
        return metrics.summarize(events) | metrics.from_finished(fin)
    return metrics.summarize(events)


def _card(name: str, value: str, hint: str) -> str:
    return (f'<div class="sv-card" title="{html.escape(hint)}"><div class="sv-card-v">'
            f'{html.escape(value)}</div><div class="sv-card-k">{html.escape(name)}</div></div>')


def metrics_html(m: dict[str, Any], ar_tokens_per_s: float | None = None,
                 status: str = "") -> str:
    speed = (f"{m['tokens_per_s'] / ar_tokens_per_s:.2f}×" if ar_tokens_per_s and m["tokens_per_s"]
             else "run ar")
    forwards = m["target_forwards"]
    cards = [
        _card("tokens/s", f"{m['tokens_per_s']:.1f}", "new tokens / wall time"),
        _card("speedup vs ar", speed, "tokens/s over ar's tokens/s on the same prompt and "
              "settings (run ar once, or use Compare, to measure it)"),
        _card("τ (tokens / verify)", f"{m['mean_accepted_length']:.2f}",
              "mean tokens committed per target verify forward (the 'compression')"),
        _card("target forwards", f"{forwards} for {m['new_tokens']} tokens",
              "target verify forwards, prefill not counted"),
    ]
    wall = m["wall_s"] or 1.0
    split = [("draft", m["draft_s"], "#7048e8"), ("verify", m["verify_s"], "#1c7ed6"),
             ("other", max(0.0, m["wall_s"] - m["draft_s"] - m["verify_s"]), "#adb5bd")]
    bar = "".join(f'<span style="width:{100 * v / wall:.1f}%;background:{c}" '
                  f'title="{k}: {v:.3f} s"></span>' for k, v, c in split)
    keys = " · ".join(f"{k} {v:.2f} s" for k, v, _ in split)
    note = f'<div class="sv-status">{html.escape(status)}</div>' if status else ""
    return (f'<div class="sv-metrics">{note}<div class="sv-cards">{"".join(cards)}</div>'
            f'<div class="sv-split">{bar}</div><div class="sv-split-k">time: {keys} '
            f'(wall {m["wall_s"]:.2f} s)</div></div>')


def message_html(text: str, kind: str = "error") -> str:
    """A clear in-page message (errors, notices); the text is escaped."""
    return f'<div class="sv-msg sv-msg-{kind}">{html.escape(text)}</div>'
