"""The Models & guide tab: what is loaded, each drafter's card and measured τ, and an honest
strategy-selection guide (the seed articles' decision trees, corrected).

Boundary: target facts + the registry + assets/<id>[-*].md cards + τ from the shipped traces
-> Markdown, the target's measured verify-cost curve and the drafters' τ by training data
(assets/scaling.json) -> Plotly figures, and the "Bring your own" section (bring_your_own.py).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import gradio as gr

from specviz import strategies
from specviz.engine.cost import forward_cost
from specviz.events import TraceError, read_trace
from specviz.ui import bring_your_own
from specviz.viz import scaling
from specviz.viz.charts import verify_cost_figure

ROOT = Path(__file__).resolve().parents[2]

GUIDE = """
### Which strategy when? (honest version)

| situation | try first | why / caveat |
|---|---|---|
| the answer copies from the prompt (summaries, QA over a passage, code edits, RAG) | `ngram` | no training; near-free drafts when the text repeats. On open chat it rarely matches and falls back to plain steps. |
| general chat, you can train a small head on the target | `eagle2` / `eagle3` | feature-level drafting has the highest acceptance per drafted token; EAGLE-3's fused multi-layer features need training-time test to stay accurate deep into the draft. |
| you can only add a separate small model with the same tokenizer | `draft` | the classic; its forwards cost real time on CPU, so it only pays when the target is much larger than the draft. |
| the target was trained with MTP modules (DeepSeek-V3 style) | `mtp` | reuse them; do not bolt MTP onto a model that was not trained with it. |
| GPU serving where one wide forward costs about one narrow one | `peagle`, `dflash`, `dspark` | parallel / block drafting spends FLOPs to save sequential steps: it pays on a GPU, much less on a CPU, where a 16-token block costs about 1.5 plain steps to verify (see the measured curve). |

**Corrections to the source articles.**
- Speculative decoding with proper verification is *lossless*: greedy output is identical to
  plain decoding, and sampled output has exactly the target's distribution. It never trades
  quality for speed; a method that does is not speculative decoding.
- Speedup is not acceptance rate. It is τ (tokens per target forward) times the ratio of a
  plain step's cost to a verify step's cost plus drafting. On a CPU a wide verify is dearer
  than a 1-token step (the curve above is measured on this machine), so a high τ can still be
  slower than `ar`: measure. `eagle2`, `eagle3`, `dspark` and `ngram` read that curve to decide
  how much of a draft to verify under greedy decoding.
- "Five draft models plus an arbiter" is not MTP. Several drafters can be merged into one tree
  and verified in one pass, losslessly; there is no arbiter that picks an answer.
- A confidence head (DSpark, EAGLE-2's dynamic tree) does not change *what* is accepted; it only
  decides how much to send to the target, trading wasted verify work against missed tokens.
- A block drafter's one forward gives a distribution for every position. P-EAGLE, DFlash and
  DSpark verify the chain of each position's top token; the same forward can fill a tree
  instead (Medusa's idea, selected by cumulative draft probability as in EAGLE-2): the `tree`
  setting. Where a position's top token is wrong its second is often right, and a chain never
  tries it. On the 16 dev prompts (greedy, full budget) `tree=16` took `dflash` from τ 1.67 to
  2.17 with one more verified token (17 against 16), `peagle` from 1.81 to 2.32 and `dspark`
  from 1.75 to 2.18.
- Overlapping drafting with verification (two CUDA streams) and CUDA graphs are engine
  features that help any strategy on a GPU; they are not drafting methods.
"""


def at_defaults(strategy: str, settings: dict) -> bool:
    """Whether a trace's recorded settings are its strategy's defaults (a setting the trace
    predates counts as the default)."""
    try:
        defaults = strategies.settings_dict(strategies.parse_settings(strategy))
    except ValueError:                  # an unknown strategy (UnknownStrategy) or bad defaults
        return False
    return all(settings.get(k, v) == v for k, v in defaults.items())


def measured_tau() -> dict[str, list[float]]:
    """τ of every shipped greedy trace at its strategy's default settings, per strategy (the
    demos' own measurements; a walkthrough recorded with other settings, such as DSpark's
    threshold rule or a block drafter's tree, is not the strategy's default)."""
    out: dict[str, list[float]] = {}
    for path in sorted((ROOT / "demos" / "traces").glob("*.jsonl")):
        try:
            events = read_trace(path)
        except TraceError:
            continue
        first = events[0]
        if (float(first.settings.get("temperature", 0.0)) == 0.0
                and at_defaults(first.strategy, first.settings)):
            out.setdefault(first.strategy, []).append(events[-1].mean_accepted_length)
    return out


def cards(strategy: str) -> dict[str, str]:
    """The strategy's model cards by name: assets/<id>.md, or one per shipped model
    (assets/<id>-*.md, e.g. dflash-b8 and dflash-b16); headings demoted to sit under the
    strategy's own heading."""
    assets = ROOT / "assets"
    paths = sorted({*assets.glob(f"{strategy}.md"), *assets.glob(f"{strategy}-*.md")})
    return {p.stem: re.sub(r"^(#{1,3}) ", lambda m: "#" * (len(m.group(1)) + 4) + " ",
                           p.read_text(encoding="utf-8"), flags=re.M) for p in paths}


def card_tau(text: str) -> float | None:
    """The held-out simulated τ a model card reports (the row specviz.train writes), if any."""
    m = re.search(r"^\|\s*held-out simulated[^|]*τ\s*\|\s*([0-9.]+)", text, flags=re.M)
    return float(m.group(1)) if m else None


def scaling_points() -> list[dict]:
    """The drafters' (training data, τ) points measured in earlier training rounds, with the card
    line each number comes from (assets/scaling.json; its note says how a new round appends)."""
    return json.loads((ROOT / "assets" / "scaling.json").read_text(encoding="utf-8"))["points"]


def overview(target, unavailable: dict[str, str | None]) -> str:
    taus = measured_tau()
    lines = [f"### Loaded target\n- model: `{target.model_id}`\n- device: `{target.device}`, "
             f"dtype: `{str(target.dtype).replace('torch.', '')}`\n- context: {target.max_len} "
             f"tokens, vocabulary {target.vocab}\n\n### Strategies"]
    for sp in strategies.REGISTRY.values():
        tau = taus.get(sp.id)
        tau_s = (f"τ {min(tau):.2f}–{max(tau):.2f} on the shipped greedy demo traces at default "
                 "settings" if tau
                 else "no shipped demo trace yet")
        state = (f"unavailable: {unavailable[sp.id]}" if unavailable.get(sp.id) else "available")
        found = cards(sp.id)
        for name, text in found.items():
            if card_tau(text) is not None:
                tau_s += (f"\n- τ {card_tau(text):.2f} held-out (simulated chain), model card"
                          + (f" {name}" if len(found) > 1 else ""))
        lines.append(f"#### {sp.id} — {sp.label}\n{sp.summary}\n\n- {state}\n- {tau_s}"
                     + (f"\n- caveat: {sp.caveat}" if sp.caveat else ""))
        lines += [f"<details><summary>model card ({name})</summary>\n\n{text}\n\n</details>"
                  for name, text in found.items()]
    return "\n\n".join(lines)


def build(target, unavailable: dict[str, str | None]) -> None:
    cost = forward_cost(target)
    with gr.Row():
        gr.Markdown(overview(target, unavailable), elem_id="guide-models")
        with gr.Column():
            gr.Plot(verify_cost_figure(cost.widths, cost.seconds, str(target.device)),
                    elem_id="guide-cost")
            gr.Markdown(GUIDE, elem_id="guide-strategies")
    points = scaling_points()
    gr.Plot(scaling.scaling_figure(points), elem_id="guide-scaling")
    gr.Markdown(scaling.caption(points), elem_id="guide-scaling-caption")
    gr.Markdown(bring_your_own.markdown(target, unavailable), elem_id="guide-byo")
