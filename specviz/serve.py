"""Batched serving glue: the `serve-bench` command (DESIGN.md §5) and the drafter set-up the
batched engine needs.

Boundary: strategy id -> a drafter that drafts its whole chain (the policy makes the cut), R
requests from a prompt file with arrival times, one serving run per policy in one process, and
the report (JSON shape of §5, plus the SPS curve). The engine work is engine/batch.py; the
numbers come from the events (serving_metrics.py).
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable

import torch

from specviz import events as ev
from specviz import runner, serving_metrics, strategies
from specviz.bench import Prompt, greedy_match
from specviz.engine.batch import Incoming, serve
from specviz.engine.decode import BadRequest, GenSettings
from specviz.engine.drafter import Drafter
from specviz.engine.scheduler import parse_policy
from specviz.engine.sps import SpsCurve, profile
from specviz.models.target import Target

# settings that make each chain drafter draft its whole chain: the batch policy cuts it
FULL_CHAIN: dict[str, dict[str, Any]] = {
    "ar": {},
    "dspark": {"scheduler": "threshold", "threshold": 0.0, "tree": 0},
    "dflash": {"auto_budget": False, "tree": 0},
    "mtp": {"auto_budget": False},
    "draft": {"auto_budget": False, "min_confidence": 0.0},
    "peagle": {"auto_budget": False, "tree": 0},
    "eagle3": {"mode": "chain"},
}


def batch_drafter(target: Target, strategy: str, overrides: dict[str, str] | None = None
                  ) -> tuple[Drafter | None, str, dict[str, Any]]:
    """(drafter, confidence kind, settings dict) for batched serving: the strategy's drafter set
    to draft its whole chain. Confidence kind: "calibrated" (DSpark's head), "uncalibrated"
    (per-position draft probabilities) or "none" (`ar`)."""
    if strategy not in FULL_CHAIN:
        strategies.spec(strategy)          # an unknown id: the registry's message
        raise BadRequest(f"the batched engine verifies chains; {strategy!r} drafts trees. "
                         f"Choose from: {', '.join(FULL_CHAIN)}")
    spec = runner.prepare(target, strategy=strategy, prompt_ids=[], gen=GenSettings(),
                          overrides={**(overrides or {}), **FULL_CHAIN[strategy]})
    kind = "none" if spec.drafter is None else "uncalibrated"
    if strategy == "dspark" and getattr(spec.settings, "markov", True):
        kind = "calibrated"
    return spec.drafter, kind, spec.settings_dict


def arrivals(pattern: str, n: int, seed: int) -> list[float]:
    """Arrival times (seconds): `all` at 0, or `poisson:RATE` (RATE requests per second,
    exponential gaps drawn with the seed; the first request arrives at 0)."""
    if pattern == "all":
        return [0.0] * n
    kind, _, rate = pattern.partition(":")
    try:
        r = float(rate)
    except ValueError:
        r = 0.0
    if kind != "poisson" or not r > 0:
        raise BadRequest(f"--arrival takes all or poisson:RATE with RATE > 0, got {pattern!r}")
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        out.append(t)
        t += rng.expovariate(r)
    return out


def requests_of(target: Target, prompts: list[Prompt], n: int, max_new_tokens: int | None,
                gen: GenSettings, pattern: str) -> tuple[list[Incoming], list[str]]:
    """R requests, prompts in order and cycling; request i is seeded seed + i. Returns the
    requests and their report ids (the prompt id, with #2, #3.. on later cycles)."""
    times = arrivals(pattern, n, gen.seed)
    out, names = [], []
    for i in range(n):
        pr = prompts[i % len(prompts)]
        s = dataclasses.replace(gen, max_new_tokens=max_new_tokens or pr.max_new_tokens or 128,
                                seed=gen.seed + i)
        s.check()
        out.append(Incoming(i, runner.encode(target, pr.prompt), s, times[i]))
        names.append(pr.id if i < len(prompts) else f"{pr.id}#{i // len(prompts) + 1}")
    return out, names


def ar_reference(target: Target, requests: list[Incoming]) -> dict[int, list[int]]:
    """Each request's own single-request `ar` tokens (greedy), run once and reused."""
    refs: dict[tuple, list[int]] = {}
    out = {}
    for x in requests:
        key = (tuple(x.prompt_ids), x.settings.max_new_tokens)
        if key not in refs:
            refs[key] = runner.generate(target, strategy="ar", prompt_ids=x.prompt_ids,
                                        gen=x.settings).token_ids
        out[x.id] = refs[key]
    return out


def serve_bench(target: Target, *, strategy: str, prompts: list[Prompt], requests: int,
                policies: list[str], arrival: str = "all", max_new_tokens: int | None = None,
                gen: GenSettings = GenSettings(), sps: SpsCurve | None = None,
                trace: str | None = None, log: Callable[[str], None] = lambda s: None) -> dict:
    """Serve the same R requests once per policy; the report of DESIGN.md §5."""
    if requests < 1:
        raise BadRequest(f"--requests must be at least 1, got {requests}")
    parsed = [parse_policy(p) for p in policies]
    if not parsed:
        raise BadRequest("--policies is empty")
    sid, overrides = strategies.parse_variant(strategy)
    drafter, kind, sdict = batch_drafter(target, sid, overrides)
    incoming, names = requests_of(target, prompts, requests, max_new_tokens, gen, arrival)
    sps = sps or profile(target)
    greedy = gen.sampling.greedy
    refs = ar_reference(target, incoming) if greedy else {}
    report: dict[str, Any] = {"settings": {
        "strategy": strategy, "requests": requests, "policies": [p.id for p in parsed],
        "arrival": arrival, "max_new_tokens": max_new_tokens, "temperature": gen.temperature,
        "top_p": gen.top_p, "top_k": gen.top_k, "seed": gen.seed, "model": target.model_id,
        "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(), "confidence": kind,
        "strategy_settings": sdict, "sps_curve": sps.points()},
        "sps_curve": sps.points(), "policies": {}}
    # a short warm-up serve, so that the first policy does not pay for lazy initialisation
    warm = [dataclasses.replace(x, settings=dataclasses.replace(x.settings, max_new_tokens=4))
            for x in incoming[:2]]
    for _ in serve(target, drafter, warm, parsed[0], sps, strategy=sid):
        pass
    for policy in parsed:
        events = list(serve(target, drafter, incoming, policy,
                            sps, strategy=strategy, strategy_settings=sdict, confidence=kind,
                            sps_curve=sps.points(), seed=gen.seed))
        if trace:
            ev.write_trace(events, f"{trace}.{policy.id.replace(':', '-')}.jsonl")
        m = serving_metrics.report(events)
        rows = []
        for r in m["request_rows"]:
            match = greedy_match(target, incoming[r["id"]].prompt_ids, refs[r["id"]],
                                 r["token_ids"]) if greedy else None
            rows.append({"id": names[r["id"]], "request": r["id"], "new_tokens": r["new_tokens"],
                         "tokens_per_s": r["tokens_per_s"],
                         "mean_accepted_length": r["mean_accepted_length"],
                         "greedy_match": match, "stop_reason": r["stop_reason"]})
        matches = [r["greedy_match"] for r in rows]
        report["policies"][policy.id] = {
            "throughput_tokens_per_s": m["throughput_tokens_per_s"],
            "mean_per_request_tokens_per_s": m["mean_per_request_tokens_per_s"],
            "mean_accepted_length": m["mean_accepted_length"],
            "mean_batch_tokens": m["mean_batch_tokens"],
            "greedy_match_rate": sum(matches) / len(matches) if greedy else None,
            "new_tokens": m["new_tokens"], "wall_s": m["wall_s"], "steps": m["steps"],
            "draft_s": m["draft_s"], "verify_s": m["verify_s"],
            "mean_expected_tokens": m["mean_expected_tokens"], "requests": rows}
        log(f"{policy.id}: {m['new_tokens']} tokens in {m['wall_s']:.2f} s "
            f"({m['throughput_tokens_per_s']:.1f} tok/s)")
    return report


def table(report: dict) -> str:
    """The report for a terminal: the SPS curve, then one line per policy."""
    curve = "  ".join(f"{int(b)}:{s:.1f}" for b, s in report["sps_curve"])
    lines = [f"SPS curve (batch tokens: verify steps/s): {curve}", ""]
    head = (f"{'policy':<16}{'tok/s':>8}{'per-req':>9}{'tau':>7}{'batch':>7}{'steps':>7}"
            f"{'greedy':>8}")
    lines += [head, "-" * len(head)]
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for pid, p in report["policies"].items():
        lines.append(f"{pid:<16}{p['throughput_tokens_per_s']:>8.1f}"
                     f"{p['mean_per_request_tokens_per_s']:>9.1f}{p['mean_accepted_length']:>7.2f}"
                     f"{p['mean_batch_tokens']:>7.1f}{p['steps']:>7}{f(p['greedy_match_rate']):>8}")
    return "\n".join(lines)
