"""Record the demo traces the Learn and Replay tabs ship with.

Usage: python -m demos.record [--strategies ar,ngram,...] [--device cpu]
Writes demos/traces/<strategy>-<prompt id>[-sampled].jsonl: every prompt of demos/prompts.jsonl
greedy, and the first prompt also sampled (temperature 0.7, seed 0) so walkthroughs can narrate
the rejection-sampling rule. Strategies whose drafter is unavailable are skipped with the reason.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specviz import strategies
from specviz.drafters.base import DrafterUnavailable
from specviz.engine.decode import GenSettings, run
from specviz.events import write_trace
from specviz.models.target import Target

HERE = Path(__file__).resolve().parent
MAX_NEW_TOKENS = 64


def record(target: Target, strategy: str, prompt: dict, settings: GenSettings, path: Path) -> None:
    drafter = strategies.drafter_for(target, strategy)
    events = list(run(target, target.encode(prompt["prompt"]), settings, drafter,
                      strategy=strategy,
                      strategy_settings=strategies.settings_dict(strategies.parse_settings(strategy)),
                      drafter_id=strategy if drafter else None))
    write_trace(events, path)
    fin = events[-1]
    print(f"{path.name}: {fin.new_tokens} tokens, τ {fin.mean_accepted_length:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategies", default=",".join(strategies.REGISTRY))
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = Target.load("embedded", device=args.device)
    prompts = [json.loads(line) for line in open(HERE / "prompts.jsonl", encoding="utf-8")]
    out = HERE / "traces"
    out.mkdir(exist_ok=True)
    for sid in args.strategies.split(","):
        try:
            strategies.drafter_for(target, sid)
        except DrafterUnavailable as exc:
            print(f"skip {sid}: {exc}")
            continue
        for i, p in enumerate(prompts):
            n = min(MAX_NEW_TOKENS, p.get("max_new_tokens", MAX_NEW_TOKENS))
            record(target, sid, p, GenSettings(max_new_tokens=n), out / f"{sid}-{p['id']}.jsonl")
            if i == 0:
                record(target, sid, p, GenSettings(max_new_tokens=n, temperature=0.7, seed=0),
                       out / f"{sid}-{p['id']}-sampled.jsonl")


if __name__ == "__main__":
    main()
