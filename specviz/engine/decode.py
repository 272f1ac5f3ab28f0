"""The decode loop: plain AR and every speculative strategy, as a generator of events.

Boundary: one request's state (tokens, target cache, drafter state, RNG) and the four named
phases of a step: draft -> verify -> accept -> update. `ar` is the same loop with no drafter
(a root-only tree), so every strategy is measured by the same clock.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch

from specviz import events as ev
from specviz import metrics
from specviz.engine.drafter import Drafter
from specviz.engine.sampling import SamplingParams, probs
from specviz.engine.tree import DraftTree, after_chain
from specviz.engine.verify import verify
from specviz.models.target import Target

MAX_NEW_TOKENS = 4096


class BadRequest(ValueError):
    """A request the engine refuses; the message is one clear line for the user."""


@dataclass(frozen=True)
class GenSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k)

    def check(self) -> None:
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise BadRequest(f"max-new-tokens must be an integer in 1..{MAX_NEW_TOKENS}, "
                             f"got {self.max_new_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise BadRequest(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature > 100:
            raise BadRequest(f"temperature must be at most 100, got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise BadRequest(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise BadRequest(f"top-k must be >= 0 (0 = off), got {self.top_k}")


@dataclass
class Request:
    """Per-request state, kept apart from the model calls."""
    prompt_ids: list[int]
    settings: GenSettings
    cache: Any = None
    drafter_state: Any = None
    root: int = 0
    output: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    step: int = 0
    prefix: list[int] = field(default_factory=list)   # prompt tokens the first verify carries


def check_prompt(target: Target, prompt_ids: list[int], settings: GenSettings) -> None:
    if not prompt_ids:
        raise BadRequest("the prompt is empty")
    room = target.max_len - len(prompt_ids)
    if room < 1:
        raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; the model's context is "
                         f"{target.max_len} tokens")


def run_started(target: Target, prompt_ids: list[int], settings: GenSettings, strategy: str,
                strategy_settings: dict | None, drafter_id: str | None) -> ev.RunStarted:
    """A run's first event (also for a request served in a batch, batcher.py)."""
    return ev.RunStarted(
        strategy=strategy, settings=asdict(settings) | (strategy_settings or {}),
        target_id=target.model_id, drafter_id=drafter_id, device=str(target.device),
        dtype=str(target.dtype).replace("torch.", ""), prompt_ids=list(prompt_ids),
        prompt_pieces=target.pieces(prompt_ids), seed=settings.seed)


def run(target: Target, prompt_ids: list[int], settings: GenSettings, drafter: Drafter | None = None,
        strategy: str = "ar", strategy_settings: dict | None = None, drafter_id: str | None = None,
        cancel: threading.Event | None = None) -> Iterator[ev.Event]:
    """Decode one request, yielding RunStarted, then per step DraftProposed [ScheduleDecided]
    Verified Accepted KVUpdated, then RunFinished."""
    settings.check()
    check_prompt(target, prompt_ids, settings)
    sp = settings.sampling
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    emitted: list[ev.Event] = []

    def emit(e: ev.Event) -> ev.Event:
        emitted.append(e)
        return e

    yield emit(run_started(target, prompt_ids, settings, strategy, strategy_settings, drafter_id))

    req = Request(list(prompt_ids), settings, cache=target.new_cache(), root=prompt_ids[-1],
                  generator=None if sp.greedy else torch.Generator().manual_seed(settings.seed))
    taps = drafter.taps if drafter else ()
    feats: dict[int, torch.Tensor] = {}
    if len(prompt_ids) > 1 and taps:   # the drafter needs the prompt's features to draft
        feats = target.forward(prompt_ids[:-1], req.cache, taps=taps, logits_for="last").taps
    elif len(prompt_ids) > 1:          # else the prompt rides along with the first verify
        req.prefix = list(prompt_ids[:-1])
    if drafter:
        req.drafter_state = drafter.start(list(prompt_ids), feats)

    stop = ""
    while not stop:
        if cancel is not None and cancel.is_set():
            stop = "cancelled"
            break
        req.step += 1
        for e in step(target, drafter, req, sp, clock):
            yield emit(e)
        new = emitted[-2].new_tokens  # the step's Accepted event
        if any(t in target.eos_ids for t in new):
            stop = "eos"
        elif len(req.output) >= settings.max_new_tokens:
            stop = "max_new_tokens"
        elif Target.cache_len(req.cache) + 1 >= target.max_len:
            stop = "context"
    text = target.decode(req.output)
    yield emit(metrics.finish(emitted, stop, text, clock()))


def target_probs(logits: torch.Tensor, p_rows: torch.Tensor, tree: DraftTree,
                 greedy: bool) -> list[float]:
    """p(node token | its parent's row) for the drafted nodes, as the UI shows them. Greedy
    verification never needed the softmax: normalise only the parent rows, never [k, V]."""
    if len(tree) == 1:
        return []
    par = torch.tensor(tree.parents[1:], device=logits.device)
    tok = torch.tensor(tree.tokens[1:], device=logits.device)
    if not greedy:
        return p_rows[par, tok].tolist()
    rows, where = torch.unique(par, return_inverse=True)
    lse = torch.logsumexp(logits[rows], -1)
    return (logits[par, tok] - lse[where]).exp().tolist()


def step(target: Target, drafter: Drafter | None, req: Request, sp: SamplingParams,
         clock) -> Iterator[ev.Event]:
    """One round: draft -> verify -> accept -> update."""
    past = Target.cache_len(req.cache) + len(req.prefix)
    remaining = req.settings.max_new_tokens - len(req.output)
    max_depth = max(0, min(remaining - 1, target.max_len - past - 2))

    # draft
    t = time.perf_counter()
    if drafter is None:
        tree = DraftTree.root_only(req.root)
    else:
        tree = drafter.draft(req.drafter_state, req.root, sp, req.generator)
    draft_s = time.perf_counter() - t
    yield ev.DraftProposed(step=req.step, tokens=tree.tokens, pieces=target.pieces(tree.tokens),
                           parents=tree.parents, depths=tree.depths, q=tree.q,
                           confidence=tree.confidence, draft_s=draft_s, fallback=tree.fallback,
                           note=tree.note, t=clock())
    if tree.schedule is not None:
        s = tree.schedule
        yield ev.ScheduleDecided(step=req.step, confidence=s.confidence, survival=s.survival,
                                 verify_len=s.verify_len, reason=s.reason, threshold=s.threshold,
                                 t=clock())
        tree = tree.truncate(s.verify_len)
    tree = tree.truncate(max_depth)

    # verify: one target forward over the whole tree
    t = time.perf_counter()
    chain = all(p == i - 1 for i, p in enumerate(tree.parents))
    prefix, req.prefix = req.prefix, []   # a tree after a whole prompt: the prompt as its stem
    out = target.forward(prefix + tree.tokens, req.cache,
                         parents=None if chain else after_chain(len(prefix), tree.parents),
                         taps=drafter.taps if drafter else (), logits_for=len(tree))
    p_rows = out.logits if sp.greedy else probs(out.logits, sp)  # greedy needs argmax only
    verdict = verify(tree, p_rows, sp, req.generator)
    verify_s = time.perf_counter() - t
    argmax = out.logits.argmax(-1).tolist()
    par = tree.parents
    yield ev.Verified(
        step=req.step, p=[None] + target_probs(out.logits, p_rows, tree, sp.greedy),
        argmax=[None] + [argmax[par[i]] for i in range(1, len(tree))],
        argmax_pieces=[None] + [target.piece(argmax[par[i]]) for i in range(1, len(tree))],
        draw=verdict.draws, verify_s=verify_s, input_tokens=len(tree), t=clock())

    # accept
    new = [tree.tokens[i] for i in verdict.path[1:]] + [verdict.token]
    new = new[:remaining]
    eos = next((i for i, tok in enumerate(new) if tok in target.eos_ids), None)
    if eos is not None:
        new = new[:eos + 1]
    req.output.extend(new)
    yield ev.Accepted(step=req.step, path=verdict.path, n_accepted=len(verdict.path) - 1,
                      token=verdict.token, piece=target.piece(verdict.token), source=verdict.source,
                      new_tokens=new, t=clock())

    # update: keep root + accepted path in the target cache; the last new token is the next root
    before = Target.cache_len(req.cache)
    Target.keep(req.cache, past, verdict.path)
    kept = [past + i for i in verdict.path]
    dropped = sorted(set(range(past, before)) - set(kept))
    d_before = drafter.cache_len(req.drafter_state) if drafter else None
    if drafter:
        idx = torch.tensor(verdict.path, device=target.device)
        drafter.commit(req.drafter_state, [tree.tokens[i] for i in verdict.path],
                       {k: v.index_select(0, idx) for k, v in out.taps.items()})
    req.root = new[-1]
    yield ev.KVUpdated(step=req.step, target_before=before, target_after=Target.cache_len(req.cache),
                       kept=kept, dropped=dropped, drafter_before=d_before,
                       drafter_after=drafter.cache_len(req.drafter_state) if drafter else None,
                       t=clock())
