"""Record the demo traces the Learn and Replay tabs ship with.

Usage: python -m demos.record [--strategies ar,ngram,...] [--sampled ngram=0.7,eagle2=1]
                              [--set dspark:threshold=0.2] [--device cpu]
Writes demos/traces/<strategy>-<prompt id>.jsonl for every prompt of demos/prompts.jsonl, greedy,
at most 48 new tokens; and for the strategies named in --sampled, the first prompt also sampled
at that temperature (seed 0), as <strategy>-<prompt id>-sampled.jsonl, so walkthroughs can
narrate the rejection-sampling rule. With --set, the strategies are recorded with those
settings instead, and the file names end in -<setting><value> (e.g. -threshold0.2).
Strategies whose drafter is unavailable are skipped with the reason.

The shipped traces (2026-12-07: eagle2 on the round-15 eagle1 weights, `--strategies eagle2`,
and eagle3 round 16, `--strategies eagle2,eagle3` earlier that day, both at tree depth 10 and
recorded on an idle bf16 machine, since the
auto_budget tree sizes follow the measured forward cost (on an fp32-only CPU eagle2 verified 1-5
drafts a step, here 6-15); also 2026-12-07: eagle1 on the round-15 weights (its static tree has no
cost model, so its steps do not depend on the machine); 2026-12-08: mtp round 14 (a fixed chain,
timing-free); eagle3 round 17 was not re-recorded: on that faster machine the cost model sized
smaller trees, so the round-16 weights too fell from τ 2.25/2.18 to 1.89/2.00 on copy-list and
explain, and the traces would have shown the machine, not the weights; 2026-12-06: dflash
(B = 16) round 13, draft round 11; 2026-12-05: peagle round 10, and dspark round 11's three default
traces (`--strategies dspark`); also
2026-12-04: dspark round 9's threshold traces, which the DSpark walkthrough names,
with the calibration refitted on the 96 probe prompts; 2026-12-01 for the others) come from
`python -m demos.record` and `python -m demos.record --strategies dspark
--set dspark:scheduler=threshold --set dspark:threshold=0.2 --sampled dspark=1` (the DSpark
walkthrough narrates the threshold rule, which greedy runs use only when asked), and
`python -m demos.record --strategies dflash --set dflash:tree=16 --set dflash:auto_budget=false`
(2026-12-06, round 13: the same block forward verified as a 16-node tree, for the Replay tab;
the guide's τ counts only traces at default settings). A walkthrough
names its trace and the steps it shows: re-recording changes the steps, so pick them again.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specviz import runner, strategies
from specviz.drafters.base import DrafterUnavailable
from specviz.engine.decode import GenSettings
from specviz.events import write_trace
from specviz.models.target import Target

HERE = Path(__file__).resolve().parent
MAX_NEW_TOKENS = 48
SAMPLED = "ar=0.7,ngram=0.7,eagle2=1.0"
MAX_TRACE_KB = 150          # keep the shipped traces small


def record(target: Target, strategy: str, overrides: dict[str, str], prompt: dict,
           settings: GenSettings, path: Path) -> None:
    events = runner.generate(target, strategy=strategy, prompt_ids=target.encode(prompt["prompt"]),
                             gen=settings, overrides=overrides).events
    write_trace(events, path)
    fin = events[-1]
    kb = path.stat().st_size / 1024
    print(f"{path.name}: {fin.new_tokens} tokens, τ {fin.mean_accepted_length:.2f}, {kb:.0f} KB"
          + (f"  (over {MAX_TRACE_KB} KB)" if kb > MAX_TRACE_KB else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategies", default=",".join(strategies.REGISTRY))
    ap.add_argument("--sampled", default=SAMPLED,
                    help="strategy=temperature pairs that also get a sampled trace")
    ap.add_argument("--set", action="append", default=[], metavar="STRATEGY:KEY=VALUE",
                    help="record STRATEGY with this setting (repeatable)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    sampled = {sid: float(t) for sid, t in (kv.split("=") for kv in args.sampled.split(",") if kv)}
    overrides = strategies.parse_sets(args.set)
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
        knobs = overrides.get(sid, {})
        suffix = "".join(f"-{k}{v}" for k, v in knobs.items())
        for i, p in enumerate(prompts):
            n = min(MAX_NEW_TOKENS, p.get("max_new_tokens", MAX_NEW_TOKENS))
            record(target, sid, knobs, p, GenSettings(max_new_tokens=n),
                   out / f"{sid}-{p['id']}{suffix}.jsonl")
            if i == 0 and sid in sampled:
                record(target, sid, knobs, p,
                       GenSettings(max_new_tokens=n, temperature=sampled[sid], seed=0),
                       out / f"{sid}-{p['id']}-sampled{suffix}.jsonl")


if __name__ == "__main__":
    main()
