"""The benchmark: every strategy (and HF peers) on every prompt, interleaved in one process.

Boundary: prompt files, running and timing the runners (ours and the HF peers, one after
another or taking turns of a few steps), counting the peers' target forwards, the tie-aware
greedy comparison with `ar`, and the JSON shape of DESIGN.md §5. Ratios are taken within one
run so they hold on a noisy machine.
"""
from __future__ import annotations

import contextlib
import json
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterator

import greenlet
import torch

from specviz import events as ev
from specviz import runner, strategies, turns
from specviz.engine.cost import forward_cost
from specviz.engine.decode import BadRequest, GenSettings
from specviz.models.target import Target

PEERS = ("hf-generate", "hf-assisted", "hf-prompt-lookup")
TIE_GAP = 1e-4


@dataclass
class Prompt:
    id: str
    category: str
    prompt: str | list[dict]
    max_new_tokens: int | None


def read_prompts(path: str | Path) -> list[Prompt]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadRequest(f"cannot read prompt file {path}: {exc.strerror}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"{path} line {n}: not valid JSON ({exc.msg})") from None
        if not isinstance(d, dict) or not ("prompt" in d or "messages" in d):
            raise BadRequest(f"{path} line {n}: needs an object with 'prompt' or 'messages'")
        mnt = d.get("max_new_tokens")
        if mnt is not None and (not isinstance(mnt, int) or mnt < 1):
            raise BadRequest(f"{path} line {n}: max_new_tokens must be a positive integer")
        out.append(Prompt(str(d.get("id", f"line-{n}")), str(d.get("category", "")),
                          d.get("messages") or d["prompt"], mnt))
    if not out:
        raise BadRequest(f"{path} holds no prompts")
    return out


def greedy_match(target: Target, prompt_ids: list[int], ref: list[int], got: list[int]) -> bool:
    """Tokens equal `ar`'s, tie-aware: a divergence only counts where the target's top-2 logit
    gap at that position exceeds 1e-4 (fp reorderings may flip exact ties)."""
    i = next((k for k, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    if i == len(ref) == len(got):
        return True
    if i == min(len(ref), len(got)):
        return False  # one stopped early with equal tokens before: not a tie flip
    cache = target.new_cache()
    logits = target.forward(prompt_ids + ref[:i], cache, logits_for="last").logits[-1]
    top2 = logits.topk(2).values
    return bool(top2[0] - top2[1] <= TIE_GAP)


# A runner's run on one prompt: a generator that yields the seconds of each of its turns (one
# turn in all, or one per decoding step when `stepped`) and returns (tokens, target forwards,
# Split).
Split = tuple[float, float] | None   # (draft s, verify s) of one run; None for the HF peers
Turns = Generator[float, None, tuple[list[int], int | None, Split]]
Runner = Callable[[list[int], GenSettings, bool], Turns]
Pause = Callable[[], None]


def _ours(target: Target, sid: str, overrides: dict[str, str]) -> Runner:
    def decode(pids: list[int], s: GenSettings, pause: Pause | None
               ) -> tuple[list[int], int, Split]:
        events = []
        for e in runner.stream(target, strategy=sid, prompt_ids=pids, gen=s, overrides=overrides):
            events.append(e)
            if pause and isinstance(e, ev.KVUpdated):
                pause()
        res = runner.Result.of(sid, events)
        done = res.finished
        return res.token_ids, done.target_forwards, (done.draft_s, done.verify_s)

    def go(pids: list[int], s: GenSettings, stepped: bool) -> Turns:
        return (yield from _turns(lambda pause: decode(pids, s, pause), stepped))

    return go


def _turns(work: Callable[[Pause | None], Any], stepped: bool) -> Turns:
    """One run as turns: `work(pause)` in a greenlet of this thread, one turn per step
    (turns.in_turns; every runner alike, each with torch's global RNG state of its own:
    `_private_rng`), or `work(None)` in one turn."""
    if stepped:
        return (yield from turns.in_turns(lambda pause: work(_private_rng(pause))))
    t = time.perf_counter()
    out = work(None)
    yield time.perf_counter() - t
    return out


def _private_rng(pause: Pause) -> Pause:
    """A pause that keeps torch's global RNG states (CPU and CUDA) to the paused runner: HF
    `generate` samples from them, so without this, sampled peers taking turns would draw from
    one shared stream and their tokens would differ from a serial run's with the same seed."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()

    def private() -> None:
        cpu, gpu = torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None
        pause()
        torch.set_rng_state(cpu)
        if cuda:
            torch.cuda.set_rng_state_all(gpu)

    return private


def _hf_runner(target: Target, name: str) -> Runner:
    extra: dict[str, Any] = {}
    if name == "hf-prompt-lookup":
        extra["prompt_lookup_num_tokens"] = 10
    elif name == "hf-assisted":
        from specviz.drafters.draft import load_draft_lm  # the `draft` strategy's LM,
        with strategies.built_in_precision(target, strategies.parse_settings("draft")):
            extra["assistant_model"] = load_draft_lm(target)     # in its default precision

    def generate(ids: list[int], s: GenSettings, pause: Pause | None
                 ) -> tuple[list[int], int, Split]:
        x = torch.tensor([ids], device=target.device)
        kw: dict[str, Any] = dict(max_new_tokens=s.max_new_tokens, pad_token_id=target.tokenizer.eos_token_id)
        if s.temperature > 0:
            kw |= dict(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
            torch.manual_seed(s.seed)
        else:
            kw |= dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        # (per thread: a stepped run enters inference mode in its worker)
        with torch.inference_mode(), forward_count(target.model) as forwards:
            out = target.model.generate(x, attention_mask=torch.ones_like(x),
                                        streamer=turns.Streamer(pause) if pause else None,
                                        **kw, **extra)
        return out[0, len(ids):].tolist(), forwards[0], None

    def go(ids: list[int], s: GenSettings, stepped: bool) -> Turns:
        return (yield from _turns(lambda pause: generate(ids, s, pause), stepped))

    return go


@contextlib.contextmanager
def forward_count(model: torch.nn.Module) -> Iterator[list[int]]:
    """Count the calls of `model` (the target's CausalLM, which HF `generate` calls once per
    target forward, its prefill included; the engine calls the inner model and an assistant is
    another module) made by this runner (its greenlet, turns.py), into the yielded one-item
    list."""
    me, count = greenlet.getcurrent(), [0]

    def hook(module, args):
        if greenlet.getcurrent() is me:
            count[0] += 1

    handle = model.register_forward_pre_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


# A lockstep turn lasts a few decoding steps, not one: every switch to another runner costs the
# next one time (its caches cold), and switching at every step of 11 runners cost the learned
# strategies more than `ar` (eagle3 1.70x hf-generate, 1.83x run serially, 1.85x in 0.15 s turns
# on the same 8 dev prompts, where a target step took about 40 ms). A turn is TURN_STEPS target
# steps long by the machine's own cost model, and at least TURN_S: on a machine whose step took
# 85 ms, 0.15 s turns of 14 runners left the trees' drafting cold at nearly every step (`eagle2`
# τ 1.78 against 2.35 with 5 runners, its cost model trimming the tree). Drifts of the machine's
# speed last seconds.
TURN_S = 0.15
TURN_STEPS = 6


def turn_seconds(target: Target) -> float:
    """How long a lockstep turn lasts on this machine: TURN_STEPS single-token target forwards
    by its cost model, and at least TURN_S."""
    return max(TURN_S, TURN_STEPS * forward_cost(target)(1))


def _run(runs: dict[str, Turns], turn_order: random.Random | None, turn_s: float | None = TURN_S
         ) -> dict[str, tuple[list[int], float, int | None, Split]]:
    """Drive each runner's run to its end: one after another in the dict's order, or, given
    `turn_order` (a seeded RNG: lockstep), in rounds of one turn each, in a fresh random order
    every round (no runner always follows the same one); a turn takes a runner's steps until
    they add up to `turn_s` seconds. Returns name -> (tokens, wall seconds, target forwards,
    (draft s, verify s) or None), the wall time being the sum of the runner's own steps.

    The runners share this thread (greenlets, turns.py), so its autograd state too: they all
    run inside one inference mode, so that a runner's own `no_grad` / `inference_mode` blocks,
    which stay open across its pauses and close in any order, save and restore the same state
    and never leave another runner with grad mode on."""
    wall = dict.fromkeys(runs, 0.0)
    done: dict[str, tuple[list[int], int | None, Split]] = {}
    with torch.inference_mode():
        while len(done) < len(runs):
            names = [n for n in runs if n not in done]
            for name in turn_order.sample(names, len(names)) if turn_order else names:
                turn = 0.0
                while name not in done and not (turn_order and turn >= turn_s):
                    try:
                        step = next(runs[name])
                        wall[name] += step
                        turn += step
                    except StopIteration as stop:
                        done[name] = stop.value
    return {name: (toks, wall[name], fw, split) for name, (toks, fw, split) in done.items()}


MAX_REPEATS = 20


def check_repeats(repeats: int) -> None:
    if not 1 <= repeats <= MAX_REPEATS:
        raise BadRequest(f"--repeats must be in 1..{MAX_REPEATS}, got {repeats}")


def bench(target: Target, *, strategy_ids: list[str], prompts: list[Prompt],
          max_new_tokens: int | None, settings: GenSettings, peers: bool = False,
          log: Callable[[str], None] = lambda s: None, repeats: int = 1,
          lockstep: bool = True) -> dict:
    """Every runner on every prompt; the order of the runners rotates from prompt to prompt.

    With repeats > 1 the whole interleaved pass runs that many times, each starting from a
    fresh process's cross-request state (`strategies.forget`: the n-gram store learns the same
    way in every pass), and each prompt's row for a strategy is its run of median wall time
    (its `wall_s_runs` lists every pass). With lockstep (the default) the runners on a prompt
    take turns of `turn_seconds` of decoding steps each, in a seeded random order each round
    (HF generate pauses at each step in a greenlet, turns.py), and a run's wall time is the sum
    of its own steps: a drift in the machine's speed then falls on every runner alike.
    Without it (serial), the runners on a prompt run one after another. Both repeats and
    lockstep steady single-prompt ratios on a noisy machine."""
    check_repeats(repeats)
    ids = ["ar"] + [s for s in strategy_ids if s != "ar"]
    runners: dict[str, Runner] = {}
    for name in ids:
        sid, overrides = strategies.parse_variant(name)
        # load weights (or fail) before any timing
        runner.prepare(target, strategy=sid, prompt_ids=[], gen=settings, overrides=overrides)
        runners[name] = _ours(target, sid, overrides)
    skipped: dict[str, str] = {}
    if peers:
        for name in PEERS:
            try:
                runners[name] = _hf_runner(target, name)
            except Exception as exc:  # e.g. no trained `draft` model for hf-assisted
                skipped[name] = str(exc)
    warm = GenSettings(max_new_tokens=4, temperature=settings.temperature, seed=settings.seed)
    runs: dict[str, list[list[dict]]] = {k: [[] for _ in prompts] for k in runners}
    turn_order = random.Random(settings.seed) if lockstep else None
    turn_s = turn_seconds(target) if lockstep else None
    for r in range(repeats):
        if r:
            strategies.forget(target)
        _run({k: go(target.encode("Hello"), warm, lockstep) for k, go in runners.items()},
             turn_order, turn_s)
        for n, pr in enumerate(prompts):
            pids = runner.encode(target, pr.prompt)
            s = GenSettings(max_new_tokens=max_new_tokens or pr.max_new_tokens or 128,
                            temperature=settings.temperature, top_p=settings.top_p,
                            top_k=settings.top_k, seed=settings.seed)
            order = list(runners)   # rotated from prompt to prompt: no fixed position bias
            k = (n + r) % len(order)
            results = _run({name: runners[name](pids, s, lockstep)
                            for name in order[k:] + order[:k]}, turn_order, turn_s)
            for name, (toks, wall, _, _) in results.items():
                log(f"{pr.id} {name}: {len(toks)} tokens in {wall:.2f} s")
            ref = results["ar"][0]
            for name, (toks, wall, forwards, split) in results.items():
                match = greedy_match(target, pids, ref, toks) if settings.temperature == 0 else None
                runs[name][n].append({
                    "id": pr.id, "category": pr.category, "new_tokens": len(toks), "wall_s": wall,
                    "tokens_per_s": len(toks) / wall if wall > 0 else 0.0,
                    "target_forwards": forwards,
                    "draft_s": split and split[0], "verify_s": split and split[1],
                    "mean_accepted_length": (len(toks) / forwards
                                             if forwards and name not in PEERS else None),
                    "greedy_match": match})
    rows = {name: [_median_run(rs) for rs in per_prompt] for name, per_prompt in runs.items()}
    return _report(rows, target, settings, max_new_tokens, skipped, repeats, turn_s)


def _median_run(rows: list[dict]) -> dict:
    """The run of median wall time (the lower middle one for an even count), with every run's
    wall time."""
    mid = sorted(rows, key=lambda x: x["wall_s"])[(len(rows) - 1) // 2]
    return mid | {"wall_s_runs": [x["wall_s"] for x in rows]}


def _report(rows: dict[str, list[dict]], target: Target, s: GenSettings, max_new_tokens: int | None,
            skipped: dict[str, str], repeats: int, turn_s: float | None) -> dict:
    def agg(name: str) -> dict:
        r = rows[name]
        tok = sum(x["new_tokens"] for x in r)
        wall = sum(x["wall_s"] for x in r)
        fw = sum(x["target_forwards"] or 0 for x in r)
        matches = [x["greedy_match"] for x in r]
        ours = fw and name not in PEERS

        def per_step(key: str) -> float | None:    # ms of drafting / verifying per target forward
            return 1000 * sum(x[key] for x in r) / fw if ours else None

        return {"tokens_per_s": tok / wall if wall else 0.0,   # peers: τ null (DESIGN.md §5)
                "mean_accepted_length": tok / fw if ours else None,
                "new_tokens": tok, "wall_s": wall, "target_forwards": fw or None,
                "draft_ms_per_step": per_step("draft_s"),
                "verify_ms_per_step": per_step("verify_s"),
                "greedy_match_rate": None if s.temperature > 0 else sum(matches) / len(matches)}

    aggs = {k: agg(k) for k in rows}
    ar_tps = aggs["ar"]["tokens_per_s"]
    hf_tps = aggs["hf-generate"]["tokens_per_s"] if "hf-generate" in aggs else None
    out: dict[str, Any] = {"settings": {
        "model": target.model_id, "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""), "max_new_tokens": max_new_tokens,
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": s.seed,
        "repeats": repeats, "lockstep": turn_s is not None,
        "turn_s": turn_s and round(turn_s, 3),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "platform": platform.platform(), "skipped_peers": skipped}, "strategies": {}}
    for name, a in aggs.items():
        a["speedup_vs_ar"] = a["tokens_per_s"] / ar_tps if ar_tps else None
        a["speedup_vs_hf_generate"] = a["tokens_per_s"] / hf_tps if hf_tps else None
        for r in rows[name]:
            ar_row = next(x for x in rows["ar"] if x["id"] == r["id"])
            r["speedup_vs_ar"] = r["tokens_per_s"] / ar_row["tokens_per_s"] if ar_row["tokens_per_s"] else None
        out["strategies"][name] = {"aggregate": a, "prompts": rows[name]}
    return out


def table(report: dict) -> str:
    """The report for a terminal: one line per strategy (aggregates), then one line per prompt
    with each strategy's speedup over `ar` on it ("x" marks a greedy mismatch)."""
    f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    head = (f"{'strategy':<18}{'tok/s':>8}{'tau':>7}{'fwd':>6}{'draft ms':>9}{'verify ms':>10}"
            f"{'vs ar':>8}{'vs hf':>8}{'greedy':>8}")
    lines = [head, "-" * len(head)]
    for name, d in report["strategies"].items():
        a = d["aggregate"]
        lines.append(f"{name:<18}{f(a['tokens_per_s']):>8}{f(a['mean_accepted_length']):>7}"
                     f"{a['target_forwards'] or '-':>6}{f(a.get('draft_ms_per_step'), 1):>9}"
                     f"{f(a.get('verify_ms_per_step'), 1):>10}{f(a['speedup_vs_ar']):>8}"
                     f"{f(a['speedup_vs_hf_generate']):>8}{f(a['greedy_match_rate']):>8}")
    names = [n for n in report["strategies"] if n != "ar"]
    if not names:
        return "\n".join(lines)
    width = {n: max(7, len(n) + 2) for n in names}
    head = f"{'prompt':<18}{'tokens':>7}{'ar tok/s':>9}" + "".join(f"{n:>{width[n]}}" for n in names)
    lines += ["", "speedup over ar, per prompt", head, "-" * len(head)]
    rows = {n: d["prompts"] for n, d in report["strategies"].items()}
    for i, ar in enumerate(rows["ar"]):
        cells = "".join(f"{f(r['speedup_vs_ar']) + ('x' if r['greedy_match'] is False else ''):>{width[n]}}"
                        for n in names for r in [rows[n][i]])
        lines.append(f"{ar['id'][:17]:<18}{ar['new_tokens']:>7}{f(ar['tokens_per_s'], 1):>9}{cells}")
    return "\n".join(lines)
