"""Plain-words narration of one decoding step, generated from its real events (Learn tab).

Boundary: Step -> escaped HTML paragraphs: what the drafter proposed, how verification decided
each token on the way (greedy: argmax match; sampling: min(1, p/q) against the draw), which
token the target added and what happened to the KV cache.
"""
from __future__ import annotations

import html

from specviz.events import RunStarted, ScheduleDecided
from specviz.viz.steps import Step
from specviz.viz.tokens import visible


def _t(piece: str) -> str:
    return f"<code>{html.escape(visible(piece))}</code>"


def _decision(step: Step, i: int, greedy: bool) -> str:
    d, v = step.draft, step.verified
    tok, p, q = d.pieces[i], v.p[i], d.q[i]
    kept = i in step.accepted.path
    verdict = "<b>kept</b>" if kept else "<b>rejected</b>"
    if greedy:
        return (f"the target's most likely next token is {_t(v.argmax_pieces[i])} "
                f"(it gave {_t(tok)} p = {p:.2f}), so {_t(tok)} is {verdict}")
    draw = v.draw[i]
    if q is None:
        rule = f"the draft picked {_t(tok)} deterministically, so it is kept with probability p = {p:.2f}"
    else:
        rule = (f"the target gave {_t(tok)} p = {p:.2f} where the draft gave q = {q:.2f}, so it is "
                f"kept with probability min(1, p/q) = {min(1.0, p / q) if q else 1.0:.2f}")
    drawn = f"; the draw was {draw:.2f}" if draw is not None else ""
    return f"{rule}{drawn}: {verdict}"


def _schedule(s: ScheduleDecided) -> str:
    """The confidence prefix in words: c_k, their running product a_j, the threshold, the cut."""
    n, cut = len(s.confidence), s.verify_len
    shown = range(min(n, cut + 1))       # every kept position and the first one cut
    cs = ", ".join(f"c<sub>{k + 1}</sub> = {s.confidence[k]:.2f}" for k in shown)
    avs = ", ".join(f"a<sub>{k + 1}</sub> = {s.survival[k]:.2f}" for k in shown)
    text = (f"<b>Schedule.</b> Before the target sees anything, the confidence head estimates "
            f"c<sub>k</sub>, the chance that draft k is accepted if every draft before it was: "
            f"{cs}. Their running product is the prefix survival a<sub>j</sub> = "
            f"c<sub>1</sub> × … × c<sub>j</sub>, the chance that the first j drafts all "
            f"survive: {avs}. ")
    if s.threshold is None:
        return text + (f"The schedule sends {cut} draft(s) to the target "
                       f"({html.escape(s.reason)}).")
    if cut < n:
        return text + (f"a<sub>{cut + 1}</sub> = {s.survival[cut]:.2f} is below the threshold "
                       f"{s.threshold:g}, so the draft is truncated: only the first {cut} "
                       f"draft(s) go to the target and the remaining {n - cut} are never sent.")
    return text + (f"Every a<sub>j</sub> stays at or above the threshold {s.threshold:g}, so all "
                   f"{n} drafts go to the target.")


def narrate(step: Step, start: RunStarted | None) -> str:
    greedy = not start or float(start.settings.get("temperature", 0.0)) == 0.0
    d = step.draft
    paras = []
    if step.n_nodes <= 1:
        why = f" ({html.escape(d.note)})" if d.note else ""
        paras.append(f"<b>Draft.</b> No draft this step{why}: the target runs one plain step.")
    else:
        depth = max(d.depths)
        shape = "a chain" if len(set(d.depths)) == len(d.depths) else "a tree"
        paras.append(f"<b>Draft.</b> From the last committed token {_t(d.pieces[0])} the drafter "
                     f"proposes {shape} of {step.n_nodes - 1} tokens, {depth} deep, in "
                     f"{1000 * d.draft_s:.1f} ms. " + (html.escape(d.note) if d.note else ""))
    if step.schedule:
        paras.append(_schedule(step.schedule))
    if step.verified and step.accepted:
        v = step.verified
        paras.append(f"<b>Verify.</b> One target forward over {v.input_tokens} token(s) "
                     f"({1000 * v.verify_s:.0f} ms) scores every drafted token at once.")
        path = step.accepted.path
        lines = []
        for depth_i, node in enumerate(path):
            kids = [c for c in range(1, step.n_verified) if d.parents[c] == node]
            for c in kids:
                lines.append(f"<li>position {depth_i + 1}: {_decision(step, c, greedy)}</li>")
                if c in path:
                    break
        if lines:
            paras.append("<ul>" + "".join(lines) + "</ul>")
        a = step.accepted
        kind = step.extra_kind()
        what = {"bonus": "every drafted token on the path was kept, so the target adds a free "
                         "<b>bonus</b> token",
                "corrected": "after the rejection the target adds its own <b>corrected</b> token "
                             + ("(its argmax)" if greedy else "(sampled from the residual "
                                                             "max(0, p − q), renormalized)"),
                "target": "the target adds its own token"}[kind]
        paras.append(f"<b>Accept.</b> {a.n_accepted} drafted token(s) accepted; {what}: "
                     f"{_t(a.piece)}. This step commits {len(a.new_tokens)} token(s) for one "
                     f"target forward.")
    if step.kv:
        kv = step.kv
        drop = (f"The {len(kv.dropped)} rejected position(s) are dropped (rollback"
                + (", with the accepted branch compacted into place" if kv.kept and
                   kv.kept != list(range(kv.kept[0], kv.kept[0] + len(kv.kept))) else "")
                + ")." if kv.dropped else "Nothing to roll back.")
        paras.append(f"<b>KV cache.</b> The verify forward grew the target cache to "
                     f"{kv.target_before} positions; it now holds {kv.target_after}. {drop}")
    return "".join(f"<p>{p}</p>" if not p.startswith("<ul>") else p for p in paras)
