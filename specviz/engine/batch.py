"""The batched engine: R concurrent requests, one target forward per step, continuous batching.

Boundary: the batch's shared target cache and the step loop over its members. Each member keeps
the single-request loop's own state (`decode.Request`: tokens, drafter state, RNG); drafting and
verification are per request, with the same rules as `decode.step`; only the target forward is
shared. Which drafts are verified is the scheduler's call (engine/scheduler.py). Under greedy
decoding a drafter with a `cursor` (DSpark's sequential Markov head) drafts lazily: the
scheduler asks for a_j only while it may still verify x_j, so drafting stops where it would.

Layout: ragged and packed, with no padding. The cache is ONE row shared by all requests; every
slot has an owner (a request id, or -1 once rolled back or left). A step runs every member's
root and chosen drafts back to back in one forward, each token at its own request's logical
position, under a float additive mask: a token sees its owner's slots and the earlier tokens of
its own chain. So the forward's cost depends on the batch's total tokens only, which is exactly
the x axis of the SPS curve the scheduler optimises. Rejected drafts and leavers' slots are
masked forever; the tail is cropped after each step, and the row is compacted (index_select)
when dead slots exceed half of it. A joining request is prefilled alone and its keys/values
appended to the row.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from specviz import events as ev
from specviz import serving_metrics
from specviz.engine.decode import GenSettings, Request, check_prompt, target_probs
from specviz.engine.drafter import Drafter
from specviz.engine.sampling import probs
from specviz.engine.scheduler import Policy, Scheduler
from specviz.engine.tree import DraftTree
from specviz.engine.verify import verify
from specviz.models.target import Target

COMPACT_MIN = 64          # dead slots tolerated before a compaction is considered
COMPACT_FRACTION = 0.5    # compact when dead slots exceed this share of the row


def survival(tree: DraftTree) -> list[float]:
    """a_j for each drafted token of a chain, each known before token j was drawn (ALGORITHMS.md
    §0): DSpark's calibrated prefix survival where the drafter gives one, else prefix products
    of the draft's per-position confidence, uncalibrated: the top probability of the
    distribution token j was sampled from, or under greedy decoding the drafted (argmax)
    token's own probability, which is that top. No confidence counts as 1."""
    n = len(tree) - 1
    if tree.schedule is not None:
        return list(tree.schedule.survival[:n])
    out, a = [], 1.0
    for row, conf in zip(tree.q_rows[1:], tree.confidence[1:]):
        c = float(row.max()) if row is not None else conf
        a *= 1.0 if c is None else c
        out.append(a)
    return out


@dataclass
class Member:
    """A request in the batch: the decode loop's per-request state and its place in the row."""
    id: int
    req: Request
    length: int = 0           # slots it owns = its committed tokens in the cache (root excluded)
    joined_t: float = 0.0
    # the single-run step events of its last step (DraftProposed .. KVUpdated, times from its
    # join), for a caller that draws it with the single-run views; None: not asked for
    views: list[ev.Event] | None = None


@dataclass
class Incoming:
    """A request waiting to join: its prompt, settings and arrival (seconds after the start)."""
    id: int
    prompt_ids: list[int]
    settings: GenSettings
    arrival: float = 0.0


class BatchEngine:
    """Members join and leave between steps; `step` runs one batched round."""

    def __init__(self, target: Target, drafter: Drafter | None, policy: Policy,
                 sps: Callable[[int], float]):
        self.target, self.drafter, self.sps = target, drafter, sps
        self.scheduler = Scheduler(policy)
        self.cache = target.new_cache()
        self.owner = torch.zeros(0, dtype=torch.long)     # per cache slot: request id or -1
        self.members: list[Member] = []
        self.steps = 0
        self.t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def join(self, rid: int, prompt_ids: list[int], settings: GenSettings,
               views: bool = False) -> ev.RequestJoined:
        """Prefill the prompt alone and append its keys/values to the shared row. views: also
        keep the request's single-run step events each step (`Member.views`)."""
        settings.check()
        check_prompt(self.target, prompt_ids, settings)
        if any(m.id == rid for m in self.members) or rid < 0:
            raise ValueError(f"request id {rid} is in use or negative")
        req = Request(list(prompt_ids), settings, root=prompt_ids[-1],
                      generator=None if settings.sampling.greedy
                      else torch.Generator().manual_seed(settings.seed))
        member = Member(rid, req, joined_t=self.clock(), views=[] if views else None)
        feats: dict[int, torch.Tensor] = {}
        if len(prompt_ids) > 1:
            own = self.target.new_cache()
            taps = self.drafter.taps if self.drafter else ()
            feats = self.target.forward(prompt_ids[:-1], own, taps=taps, logits_for="last").taps
            with torch.inference_mode():
                for mine, shared in zip(own.layers, self.cache.layers):
                    shared.update(mine.keys, mine.values)
            member.length = len(prompt_ids) - 1
            self.owner = torch.cat([self.owner, torch.full((member.length,), rid)])
        if self.drafter:
            req.drafter_state = self.drafter.start(list(prompt_ids), feats)
        self.members.append(member)
        return ev.RequestJoined(step=self.steps, request=rid, prompt_ids=list(prompt_ids),
                                max_new_tokens=settings.max_new_tokens, seed=settings.seed,
                                t=self.clock())

    def leave(self, member: Member, reason: str) -> ev.RequestFinished:
        self.members.remove(member)
        self.owner[self.owner == member.id] = -1
        self._tidy()
        req = member.req
        return ev.RequestFinished(step=self.steps, request=member.id, token_ids=list(req.output),
                                  stop_reason=reason, text=self.target.decode(req.output),
                                  joined_t=member.joined_t, t=self.clock())

    def cancel(self, rid: int) -> ev.RequestFinished | None:
        """Stop a request between steps (None if it is not in the batch)."""
        member = next((m for m in self.members if m.id == rid), None)
        return self.leave(member, "cancelled") if member else None

    def _draft(self) -> list:
        """Per member: a lazy curve (a drafter with `cursor`, greedy: the scheduler draws only
        what it may verify) or the whole drafted chain."""
        out = []
        for m in self.members:
            r = m.req
            r.step += 1
            remaining = r.settings.max_new_tokens - len(r.output)
            max_depth = max(0, min(remaining - 1, self.target.max_len - m.length - 2))
            sp = r.settings.sampling
            if self.drafter is None:
                out.append(DraftTree.root_only(r.root))
            elif sp.greedy and hasattr(self.drafter, "cursor"):
                out.append(self.drafter.cursor(r.drafter_state, r.root, sp, r.generator, max_depth))
            else:
                tree = self.drafter.draft(r.drafter_state, r.root, sp, r.generator)
                if any(p != i - 1 for i, p in enumerate(tree.parents)):
                    raise ValueError("the batched engine verifies chains; this drafter drafted a "
                                     "tree")
                out.append(tree.truncate(max_depth))
        return out

    def step(self) -> list[ev.Event]:
        """One round for every member: draft, schedule, one packed target forward, verify per
        request, update; members that finish leave. Returns the step's events."""
        if not self.members:
            return []
        self.steps += 1
        t = time.perf_counter()
        drafted = self._draft()
        d = self.scheduler.decide([x if hasattr(x, "a") else survival(x) for x in drafted],
                                  self.sps)
        draft_s = time.perf_counter() - t
        trees = [x.chain(n) if hasattr(x, "a") else x.truncate(n)
                 for x, n in zip(drafted, d.lengths)]
        out: list[ev.Event] = [ev.BatchScheduled(
            step=self.steps, requests=[m.id for m in self.members], survival=d.curves,
            verify_lens=d.lengths, reasons=d.reasons, expected_tokens=d.expected_tokens,
            batch_tokens=d.batch_tokens, sps_point=[float(d.batch_tokens), d.sps],
            draft_s=draft_s, budget=d.budget, t=self.clock())]

        # verify: the chains packed back to back, each at its own positions, in one forward
        t = time.perf_counter()
        before = Target.cache_len(self.cache)
        tokens, positions, qowner, starts = [], [], [], []
        for m, tr in zip(self.members, trees):
            starts.append(len(tokens))
            tokens += tr.tokens
            positions += range(m.length, m.length + len(tr))
            qowner += [m.id] * len(tr)
        k = len(tokens)
        qo = torch.tensor(qowner)
        chains = (qo[:, None] == qo[None]) & torch.ones(k, k, dtype=torch.bool).tril()
        allowed = torch.cat([qo[:, None] == self.owner[None], chains], 1)
        taps = self.drafter.taps if self.drafter else ()
        fwd = self.target.forward_packed(tokens, positions, allowed, self.cache, taps)
        new_owner = torch.full((k,), -1)
        stepped, finished = [], []
        verify_s = time.perf_counter() - t
        for i, (m, full, tr, s) in enumerate(zip(list(self.members), drafted, trees, starts)):
            r = m.req
            sp = r.settings.sampling
            logits = fwd.logits[s:s + len(tr)]
            p_rows = logits if sp.greedy else probs(logits, sp)
            verdict = verify(tr, p_rows, sp, r.generator)
            past, d_before = m.length, self._drafter_len(m)
            new = [tr.tokens[i] for i in verdict.path[1:]] + [verdict.token]
            new = new[:r.settings.max_new_tokens - len(r.output)]
            eos = next((i for i, tok in enumerate(new) if tok in self.target.eos_ids), None)
            if eos is not None:
                new = new[:eos + 1]
            r.output.extend(new)
            idx = torch.tensor([s + i for i in verdict.path])
            new_owner[idx] = m.id
            m.length += len(verdict.path)
            if self.drafter:
                self.drafter.commit(r.drafter_state, [tr.tokens[i] for i in verdict.path],
                                    {j: f.index_select(0, idx.to(f.device)) for j, f in fwd.taps.items()})
            r.root = new[-1]
            if m.views is not None:
                m.views = self._views(m, full, tr, logits, p_rows, verdict, new, past, d_before,
                                      d, i, draft_s / len(trees), verify_s)
            stepped.append(ev.RequestStepped(
                step=self.steps, request=m.id,
                drafted=list(full.toks) if hasattr(full, "a") else full.tokens[1:],
                verify_len=len(tr) - 1,
                n_accepted=len(verdict.path) - 1, new_tokens=new, source=verdict.source,
                t=self.clock()))
            if eos is not None:
                finished.append((m, "eos"))
            elif len(r.output) >= r.settings.max_new_tokens:
                finished.append((m, "max_new_tokens"))
            elif m.length + 1 >= self.target.max_len:
                finished.append((m, "context"))
        self.owner = torch.cat([self.owner, new_owner])
        self._tidy()
        out.append(ev.BatchVerified(step=self.steps, input_tokens=k, cache_before=before,
                                    cache_after=Target.cache_len(self.cache),
                                    verify_s=time.perf_counter() - t, t=self.clock()))
        out += stepped
        out += [self.leave(m, reason) for m, reason in finished]
        return out

    def _drafter_len(self, m: Member) -> int | None:
        return self.drafter.cache_len(m.req.drafter_state) if self.drafter else None

    def _views(self, m: Member, full, tr: DraftTree, logits: torch.Tensor, p_rows: torch.Tensor,
               verdict, new: list[int], past: int, d_before: int | None, d, i: int,
               draft_s: float, verify_s: float) -> list[ev.Event]:
        """The member's step as a single run would tell it (decode.step's events), so the
        single-run views draw a batched request too. Times are shares of the batch's step:
        drafting split evenly, the whole shared verify."""
        r, tgt = m.req, self.target
        whole = full.chain(len(full.toks)) if hasattr(full, "a") else full
        t = self.clock() - m.joined_t
        a = d.curves[i]
        argmax = logits.argmax(-1).tolist()
        par = tr.parents
        kept = [past + j for j in verdict.path]
        return [
            ev.DraftProposed(step=r.step, tokens=whole.tokens, pieces=tgt.pieces(whole.tokens),
                             parents=whole.parents, depths=whole.depths, q=whole.q,
                             confidence=whole.confidence, draft_s=draft_s,
                             fallback=whole.fallback, note=whole.note, t=t),
            ev.ScheduleDecided(step=r.step, survival=list(a),
                               confidence=[x / prev if prev else 0.0
                                           for x, prev in zip(a, [1.0, *a[:-1]])],
                               verify_len=d.lengths[i], reason=d.reasons[i],
                               sps_point=[float(d.batch_tokens), d.sps], t=t),
            ev.Verified(step=r.step,
                        p=[None] + target_probs(logits, p_rows, tr, r.settings.sampling.greedy),
                        argmax=[None] + [argmax[par[j]] for j in range(1, len(tr))],
                        argmax_pieces=[None] + [tgt.piece(argmax[par[j]])
                                                for j in range(1, len(tr))],
                        draw=verdict.draws, verify_s=verify_s, input_tokens=len(tr), t=t),
            ev.Accepted(step=r.step, path=verdict.path, n_accepted=len(verdict.path) - 1,
                        token=verdict.token, piece=tgt.piece(verdict.token), source=verdict.source,
                        new_tokens=new, t=t),
            ev.KVUpdated(step=r.step, target_before=past + len(tr), target_after=m.length,
                         kept=kept,
                         dropped=[x for x in range(past, past + len(tr)) if x not in kept],
                         drafter_before=d_before, drafter_after=self._drafter_len(m), t=t)]

    def _tidy(self) -> None:
        """Crop dead slots at the tail; compact the row when too many are dead."""
        live = (self.owner >= 0).nonzero()[:, 0]
        end = int(live[-1]) + 1 if len(live) else 0
        if end < len(self.owner):
            Target.crop(self.cache, end)
            self.owner = self.owner[:end]
        dead = end - len(live)
        if dead > max(COMPACT_MIN, COMPACT_FRACTION * end):
            Target.keep(self.cache, 0, live.tolist())
            self.owner = self.owner[live]


def serve(target: Target, drafter: Drafter | None, incoming: list[Incoming], policy: Policy,
          sps: Callable[[int], float], *, strategy: str, strategy_settings: dict | None = None,
          confidence: str = "none", sps_curve: list[list[float]] | None = None,
          seed: int = 0) -> Iterator[ev.Event]:
    """Serve `incoming` requests through one BatchEngine (each joins at the first step boundary
    after its arrival time), yielding ServeStarted, the step events, ServeFinished."""
    engine = BatchEngine(target, drafter, policy, sps)
    emitted: list[ev.Event] = []

    def emit(e: ev.Event) -> ev.Event:
        emitted.append(e)
        return e

    yield emit(ev.ServeStarted(
        strategy=strategy, policy=policy.id, settings=strategy_settings or {},
        target_id=target.model_id, drafter_id=strategy if drafter else None,
        device=str(target.device), dtype=str(target.dtype).replace("torch.", ""),
        confidence=confidence, sps_curve=sps_curve or [], seed=seed, t=engine.clock()))
    pending = sorted(incoming, key=lambda x: x.arrival)
    while pending or engine.members:
        while pending and pending[0].arrival <= engine.clock():
            x = pending.pop(0)
            yield emit(engine.join(x.id, x.prompt_ids, x.settings))
        if not engine.members:
            time.sleep(max(0.0, pending[0].arrival - engine.clock()))
            continue
        for e in engine.step():
            yield emit(e)
    yield emit(serving_metrics.finish(emitted, engine.clock()))
