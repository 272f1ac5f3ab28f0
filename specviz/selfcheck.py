"""`python -m specviz selfcheck`: every strategy, greedy, on two short prompts, against `ar`.

Boundary: a deployment smoke test (what the owner of a GPU Space runs after deploying): per
strategy one line, "works" (τ, tokens/s), "MISMATCH" (where its tokens leave `ar`'s, tie-aware
as in the bench) or "unavailable" (why). Any mismatch makes the command exit non-zero.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specviz import runner, strategies
from specviz.bench import greedy_match
from specviz.drafters.base import DrafterUnavailable
from specviz.engine.decode import GenSettings
from specviz.models.target import Target

PROMPTS = ("Name three primary colors and say what mixing two of them gives.",
           "Write a Python function that returns the squares of a list of numbers.")


@dataclass
class Line:
    strategy: str
    status: str                      # "reference", "works", "mismatch" or "unavailable"
    tau: float | None = None
    tokens_per_s: float | None = None
    detail: str = ""
    settings: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        head = f"{self.strategy:<8} {self.status.upper() if self.status == 'mismatch' else self.status:<11}"
        if self.status in ("works", "reference"):
            return f"{head} τ {self.tau:.2f}  {self.tokens_per_s:6.1f} tok/s" + (
                f"  ({self.detail})" if self.detail else "")
        return f"{head} {self.detail}"


def selfcheck(target: Target, sets: dict[str, dict[str, str]] | None = None,
              max_new_tokens: int = 32, only: list[str] | None = None) -> list[Line]:
    """`ar`, then every registered strategy (or those in `only`) against it."""
    sets = sets or {}
    gen = GenSettings(max_new_tokens=max_new_tokens)
    prompts = [runner.encode(target, p) for p in PROMPTS]

    def run(sid: str) -> tuple[list[list[int]], float, float]:
        toks, new, fwd, wall = [], 0, 0, 0.0
        for ids in prompts:
            fin = runner.generate(target, strategy=sid, prompt_ids=ids, gen=gen,
                                  overrides=sets.get(sid))
            toks.append(fin.token_ids)
            new += fin.finished.new_tokens
            fwd += fin.finished.target_forwards
            wall += fin.finished.wall_s
        return toks, new / max(1, fwd), new / wall if wall > 0 else 0.0

    ref, tau, tps = run("ar")
    lines = [Line("ar", "reference", tau, tps, f"{sum(map(len, ref))} tokens on "
                                               f"{len(prompts)} prompts")]
    for sid in only or strategies.REGISTRY:
        if sid == "ar":
            continue
        try:
            runner.prepare(target, strategy=sid, prompt_ids=[], gen=gen, overrides=sets.get(sid))
        except DrafterUnavailable as exc:
            lines.append(Line(sid, "unavailable", detail=str(exc), settings=sets.get(sid, {})))
            continue
        got, tau, tps = run(sid)
        bad = [i for i, (ids, a, b) in enumerate(zip(prompts, ref, got))
               if not greedy_match(target, ids, a, b)]
        if bad:
            i = bad[0]
            at = next((k for k, (a, b) in enumerate(zip(ref[i], got[i])) if a != b),
                      min(len(ref[i]), len(got[i])))
            lines.append(Line(sid, "mismatch", tau, tps, f"prompt {i + 1} leaves ar's tokens at "
                                                         f"new token {at + 1}",
                              settings=sets.get(sid, {})))
        else:
            lines.append(Line(sid, "works", tau, tps, settings=sets.get(sid, {})))
    return lines
