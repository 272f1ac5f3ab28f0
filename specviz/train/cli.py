"""`python -m specviz train`: write the response shards, build the shared feature folder, or
train one drafter.

Boundary: argument parsing and wiring only. Each drafter family has a factory
`(target, args) -> Trainable` in specviz/train/; TRAINERS maps drafter ids to them
(module:function strings, so importing the CLI loads no drafter). Training writes checkpoints to
artifacts/train/<id>/ and the final weights + model card to assets/.

  python -m specviz train data --target-tokens 3000000 --threads 1 --batch 48 [--self-instruct N]
  python -m specviz train --build-data [--max-seqs N] [--stdlib-chunks 60] [--threads 1]
  python -m specviz train --drafter eagle3 --minutes 12 [--steps N] [--resume] [--init shipped]
  python -m specviz train calibrate [--per-source 8] [--max-new-tokens 128] [--threads 1]
  python -m specviz train calibrate --report-on PROMPTS.jsonl   (score only, per position)
  python -m specviz train probe --drafter eagle3 [--assets DIR ...] [--json] [--card LABEL]
  python -m specviz train tree [--nodes 20] [--per-source 4] [--max-new-tokens 64] [--json]
  python -m specviz train soup --drafter eagle3 --assets A --assets B [...] --out DIR
"""
from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from pathlib import Path

from specviz.models.kernels import PRECISIONS
from specviz.train import data as D
from specviz.train import shards
from specviz.train.config import DEFAULTS, TrainConfig

TRAINERS = {
    "draft": "specviz.train.draft:draft",
    "eagle1": "specviz.train.heads:eagle1",
    "eagle3": "specviz.train.heads:eagle3",
    "peagle": "specviz.train.heads:peagle",
    "mtp": "specviz.train.mtp:mtp",
    "dflash-b8": "specviz.train.blocks:dflash_b8",
    "dflash-b16": "specviz.train.blocks:dflash_b16",
    "dspark": "specviz.train.blocks:dspark",
}
ALIASES = {"eagle2": "eagle1"}   # same weights
BLOCKS = ("dflash-b8", "dflash-b16", "dspark")   # block drafters: they read --position-decay
DEEPENABLE = ("draft", "peagle", *BLOCKS)        # the ones that read --layers


def machine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")


def embedded_target(args):
    """The embedded target on --device, with --threads torch threads (0 = torch's default). It
    is float32 on every device: features, soft labels and the fingerprint are then the ones the
    CPU engine sees, also when they are computed on a GPU (whose default is bf16)."""
    import torch

    from specviz.models.target import Target
    return Target.load("embedded", device=args.device, threads=args.threads, dtype=torch.float32)


def drafter_id(p: argparse.ArgumentParser, name: str) -> str:
    """The trainer id a --drafter name stands for (eagle2: eagle1's weights); else p's error."""
    did = ALIASES.get(name, name)
    if did not in TRAINERS:
        p.error(f"unknown drafter {name!r}; choose from {', '.join([*TRAINERS, *ALIASES])}")
    return did


def check_drafter_options(args) -> None:
    """The drafter options' errors that need no target, before the target is loaded."""
    did = drafter_id(parser(), args.drafter)
    if args.layers and did not in DEEPENABLE:
        parser().error(f"--layers applies to {', '.join(DEEPENABLE)}, not {args.drafter}")
    if args.greedy_mix and did != "eagle3":
        parser().error(f"--greedy-mix applies to eagle3, not {args.drafter}")
    if not 0 <= args.greedy_mix < 1:
        parser().error("--greedy-mix must be in [0, 1)")
    if args.draft_vocab and args.draft_vocab < 256:
        parser().error("--draft-vocab must be at least 256")
    if args.ttt_steps and did not in ("eagle1", "eagle3"):
        parser().error(f"--ttt-steps applies to eagle1 and eagle3, not {args.drafter}")
    if not 0 <= args.ttt_steps <= 12:
        parser().error("--ttt-steps must be in 0..12 (0 = the default)")
    if args.position_decay and did not in BLOCKS:
        parser().error(f"--position-decay applies to {', '.join(BLOCKS)}, not {args.drafter}")
    if not 0 <= args.position_decay <= 64:
        parser().error("--position-decay must be in [0, 64] (0 = the default)")
    if args.ce_weight and did != "dspark":
        parser().error(f"--ce-weight applies to dspark, not {args.drafter}")
    if not 0 <= args.ce_weight <= 1:
        parser().error("--ce-weight must be in [0, 1] (0 = the published 0.1)")
    if not 0 <= args.ema < 1:
        parser().error("--ema must be in [0, 1) (0 = off)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specviz train",
                                description="Build drafter training data or train a drafter.")
    p.add_argument("--build-data", action="store_true",
                   help="build or extend the feature folder from the response shards (see "
                        "`train data`): only missing or stale files are computed")
    p.add_argument("--shards", default=str(shards.SHARD_DIR), help="response shard folder")
    p.add_argument("--max-seqs", type=int, default=0, help="use the first N sequences (0 = all)")
    p.add_argument("--stdlib-chunks", type=int, default=0, help="raw stdlib source chunks")
    p.add_argument("--feature-batch", type=int, default=0, metavar="N",
                   help="--build-data: sequences per target pass (0 = 1 on a CPU, which is exact "
                        "and as fast, 32 on a GPU, which is launch-bound one at a time)")
    p.add_argument("--drafter", help=f"drafter id: {', '.join([*TRAINERS, *ALIASES])}")
    p.add_argument("--data", default=str(D.FEATURE_DIR), help="feature folder")
    p.add_argument("--minutes", type=float, default=DEFAULTS.minutes, help="time budget (0 = none)")
    p.add_argument("--steps", type=int, default=DEFAULTS.steps, help="step budget (0 = none)")
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    p.add_argument("--seq-len", type=int, default=DEFAULTS.seq_len,
                   help="crop length: 256 holds 96%% of the training sequences whole, prompt "
                        "included, as the drafter sees them at inference")
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--warmup", type=int, default=DEFAULTS.warmup)
    p.add_argument("--eval-every", type=int, default=DEFAULTS.eval_every)
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--init", choices=("fresh", "shipped"), default="fresh",
                   help="fresh weights, or fine-tune the shipped ones in assets/ (their draft "
                        "vocabulary is kept)")
    p.add_argument("--no-ship", action="store_true", help="do not write assets/")
    p.add_argument("--out-dir", default=DEFAULTS.out_dir,
                   help="checkpoint folder: a run keeps <out-dir>/<drafter>/ (an experiment "
                        "beside the shipped drafter's run takes its own)")
    p.add_argument("--note", default="", help="a paragraph for the model card")
    p.add_argument("--layers", type=int, default=0,
                   help=f"drafter decoder layers: {', '.join(DEEPENABLE)} (0 = their default, 2); "
                        "with --init shipped, layers past the shipped ones start as the identity")
    p.add_argument("--greedy-mix", type=float, default=0.0, metavar="LAMBDA",
                   help="eagle3: train on (1 - LAMBDA) * the target's distribution + LAMBDA * its "
                        "greedy token (0 = pure soft labels)")
    p.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="select the draft vocabulary anew: the N tokens with the most target "
                        "probability mass in --data (0 = the shipped one with --init shipped, "
                        "else the drafter's default size); with --init shipped the shipped "
                        "weights are fitted to it")
    p.add_argument("--ttt-steps", type=int, default=0, metavar="N",
                   help="eagle3: unrolled steps of the training-time test (0 = its default, 4; "
                        "the engine drafts up to depth 7); eagle1: unrolled steps of its "
                        "feature loss, each fed the head's own features (HASS; 0 = the "
                        "published 1)")
    p.add_argument("--position-decay", type=float, default=0.0, metavar="G",
                   help="block drafters (dflash-*, dspark): loss weight exp(-(k-1)/G) of draft "
                        "position k (0 = the published default: 7 for B = 16, 4 for B = 8); a "
                        "smaller G puts the loss on the first drafts, which decide τ when few "
                        "are accepted")
    p.add_argument("--ce-weight", type=float, default=0.0, metavar="W",
                   help="dspark: loss W * CE + (1 - W) * L1 against the target's distribution, "
                        "plus the confidence BCE (0 = the published 0.1); an experiment: 0.5 "
                        "did no better than 0.1 here (the dspark card)")
    p.add_argument("--ema", type=float, default=DEFAULTS.ema, metavar="DECAY",
                   help="evaluate and ship the exponential moving average of the weights with "
                        "this decay per step, started at the starting weights (0 = off: the "
                        "last weights); with --init shipped, a weight average of the fine-tune "
                        "with the shipped weights, as `train soup` makes of separate runs")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="bf16 autocast for the drafter's forward and loss: auto = on CUDA and on "
                        "a CPU with native bfloat16 (AMX, AVX512-BF16), 1.5-2x the steps per "
                        "second there; weights and AdamW stay fp32")
    machine_args(p)
    return p


def drafter_flags(args) -> str:
    """The options of a training run that shape the drafter or its loss, as typed (for the
    model card's Reproduce line); those left at their default are omitted."""
    given = [("--layers", args.layers), ("--draft-vocab", args.draft_vocab),
             ("--ttt-steps", args.ttt_steps), ("--greedy-mix", args.greedy_mix),
             ("--position-decay", args.position_decay), ("--ce-weight", args.ce_weight)]
    flags = "".join(f" {name} {value:g}" for name, value in given if value)
    return flags + (f" --precision {args.precision}" if args.precision != "auto" else "")


def data_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specviz train data",
        description="Append response shards (the target's greedy answers) until they hold "
                    "--target-tokens response tokens. Resumable: kill it at any time (the shard "
                    "in progress is lost), run it again to go on.")
    p.add_argument("--target-tokens", type=int, default=3_000_000)
    p.add_argument("--out", default=str(shards.SHARD_DIR), help="shard folder")
    p.add_argument("--batch", type=int, default=48, help="sequences per generate call")
    p.add_argument("--shard-seqs", type=int, default=240, help="sequences per shard")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--self-instruct", type=int, default=0,
                   help="first answer N instructions the target writes itself")
    p.add_argument("--seed", type=int, default=0, help="instruction stream seed")
    p.add_argument("--max-shards", type=int, default=0, help="stop after N new shards (0 = none)")
    machine_args(p)
    return p


def main_data(argv: list[str]) -> int:
    args = data_parser().parse_args(argv)
    target = embedded_target(args)
    done = shards.extend(target, Path(args.out), args.target_tokens, batch=args.batch,
                         max_new_tokens=args.max_new_tokens, shard_seqs=args.shard_seqs,
                         seed=args.seed, self_instruct=args.self_instruct,
                         max_shards=args.max_shards,
                         log=lambda s: print(s, flush=True))
    print(f"{args.out}: {done['shards']} shards, {done['sequences']} sequences, "
          f"{done['response_tokens']} response tokens")
    return 0


def calibrate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specviz train calibrate",
        description="Refit the shipped dspark drafter's confidence calibration on engine runs "
                    "over held-out instructions, and write them into assets/ (weights and card).")
    p.add_argument("--per-source", type=int, default=8, help="instructions per source")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--no-ship", action="store_true", help="report only; do not write assets/")
    p.add_argument("--runs", default="",
                   help="keep the engine runs in this file and reuse them on a later call while "
                        "the drafter's weights (calibration aside) and these settings are the same")
    p.add_argument("--fit-on", default="", metavar="PROMPTS",
                   help="fit on engine runs of this prompt file's prompts (bench's jsonl, e.g. "
                        "data/probe.jsonl) instead of held-out instructions (--per-source)")
    p.add_argument("--report-on", default="", metavar="PROMPTS",
                   help="fit nothing: score the shipped calibration on engine runs of this prompt "
                        "file's prompts (bench's jsonl format), per position")
    machine_args(p)
    return p


def print_positions(scored: dict, positions: int) -> None:
    for row in scored["by_position"]:
        print(f"a_{row['position']}: mean {row['mean_a']:.3f}, realized {row['realized']:.3f}, "
              f"gap {row['gap']:+.3f}, ECE {row['ece']:.3f}")
    print(f"positions 1-{positions}: ECE {scored['ece']:.3f}, AUC {scored['auc']:.3f}")


def main_calibrate(argv: list[str]) -> int:
    args = calibrate_parser().parse_args(argv)
    if args.fit_on and args.report_on:
        calibrate_parser().error("give --fit-on or --report-on, not both")
    if not 1 <= args.per_source <= 200:
        calibrate_parser().error("--per-source must be in 1..200")
    if args.max_new_tokens < 1:
        calibrate_parser().error("--max-new-tokens must be at least 1")
    from specviz.bench import read_prompts
    from specviz.engine.decode import BadRequest
    from specviz.train import recalibrate
    if args.report_on or args.fit_on:
        try:
            prompts = [p.prompt for p in read_prompts(args.report_on or args.fit_on)]
        except BadRequest as exc:
            calibrate_parser().error(str(exc))
    if args.report_on:
        scored = recalibrate.report_on(embedded_target(args), prompts, args.max_new_tokens)
        print(f"{args.report_on}: {scored['prompts']} prompts, {scored['blocks']} blocks, the "
              "full block verified, greedy; the shipped calibration")
        print_positions(scored, recalibrate.POSITIONS)
        return 0
    if args.fit_on and len(prompts) < 2:
        calibrate_parser().error("--fit-on needs two prompts at least (half fit, half report)")
    target = embedded_target(args)
    report = recalibrate.run(target, args.per_source, args.max_new_tokens, ship=not args.no_ship,
                             cmd="python -m specviz train calibrate " + " ".join(argv),
                             runs=Path(args.runs) if args.runs else None,
                             prompt_file=Path(args.fit_on) if args.fit_on else None)
    print_positions(report["after"], recalibrate.POSITIONS)
    print(f"(before: ECE {report['before']['ece']:.3f})"
          + ("" if args.no_ship else "; written to assets/"))
    return 0


def probe_parser() -> argparse.ArgumentParser:
    from specviz.drafters.weights import ASSETS
    from specviz.train import probe
    p = argparse.ArgumentParser(
        prog="python -m specviz train probe",
        description="Score drafter weights on the fixed probe prompts (data/probe.jsonl, never "
                    "trained on): simulated chain τ, teacher-forced on the target's greedy "
                    "answers, with a 95%% interval over prompts; weight sets after the first "
                    "are paired against it.")
    p.add_argument("--drafter", required=True, help=f"drafter id: {', '.join([*TRAINERS, *ALIASES])}")
    p.add_argument("--assets", action="append", default=[], metavar="DIR",
                   help=f"an assets folder holding the weights (repeat to compare; default "
                        f"{ASSETS})")
    p.add_argument("--prompts", default=str(probe.PROBE_FILE), help="prompt file (bench's jsonl)")
    p.add_argument("--data", default=str(probe.PROBE_DIR), help="the answers' feature folder")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    p.add_argument("--engine", action="append", default=[], metavar="VARIANT",
                   help="also run the engine (greedy) on the probe prompts with each weight set "
                        "and pair its τ by prompt: a bench variant such as "
                        "eagle3:auto_budget=false (timing-free without auto_budget); repeat to "
                        "compare variants too (each with each weight set, every run paired with "
                        "the first variant's first weight set); a weight set's runs are kept in "
                        "the --data folder and reused while nothing they depend on changes")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.add_argument("--card", default="", metavar="LABEL",
                   help="also write the reports into the model card of the last --assets folder "
                        "(the candidate) as the section 'Measured on the probe prompts (LABEL)'")
    machine_args(p)
    return p


def print_report(r: dict, detail: str) -> None:
    """One weight set's probe report: τ, its interval, `detail`, the pairing, by category."""
    lo, hi = r["ci95"]
    line = f"{r['assets']}: τ {r['tau']:.3f} [{lo:.3f}, {hi:.3f}], {detail}"
    if "vs_first" in r:
        d = r["vs_first"]
        line += f"; vs the first: {d['delta']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
    print(line)
    print("   by category: " + ", ".join(f"{c} {t:.2f}" for c, t in r["tau_by_category"].items()))


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main_probe(argv: list[str]) -> int:
    from specviz.bench import read_prompts
    from specviz.drafters.base import DrafterUnavailable
    from specviz.drafters.weights import ASSETS
    from specviz.engine.decode import BadRequest
    from specviz.train import probe
    p = probe_parser()
    args = p.parse_args(argv)
    did = drafter_id(p, args.drafter)
    if not 1 <= args.max_new_tokens <= 1024:
        p.error("--max-new-tokens must be in 1..1024")
    if args.card and len(args.engine) > 1:
        p.error("--card takes one --engine variant (its table pairs weight sets)")
    from specviz.strategies import parse_variant
    for variant in args.engine:
        try:
            parse_variant(variant)
        except ValueError as exc:      # an unknown strategy or setting
            p.error(f"--engine: {exc}")
    try:
        rows = read_prompts(args.prompts)
    except BadRequest as exc:
        p.error(str(exc))
    categories = [x.category or "-" for x in rows]
    target = embedded_target(args)
    try:
        folder = probe.features(target, Path(args.prompts), Path(args.data), args.max_new_tokens,
                                log=progress)      # stdout is the report (--json: JSON only)
    except D.FeatureError as exc:
        p.error(str(exc))
    folders = [Path(a) for a in args.assets or [ASSETS]]
    engine = []
    try:
        reports = probe.score(target, did, folders, folder, categories, args.precision)
        if args.engine:
            engine = probe.engine_score(target, args.engine, folders, probe.answers(folder),
                                        categories, args.max_new_tokens, log=progress,
                                        cache=folder / "engine")
    except DrafterUnavailable as exc:
        p.error(str(exc))
    if args.card:
        from specviz.drafters import weights
        card = folders[-1] / f"{did}.md"
        old = card.read_text(encoding="utf-8") if card.exists() else f"# `{did}`\n"
        command = shlex.join(["python", "-m", "specviz", "train", "probe", *argv])
        section = probe.card_section(args.card, command, f"{len(categories)} prompts of "
                                     f"{args.prompts}", reports, engine)
        weights.write_card(did, weights.with_section(old, section), folders[-1])
        print(f"written to {card}", file=sys.stderr)
    if args.json:
        print(json.dumps({"teacher_forced": reports, "engine": engine}, indent=1))
        return 0
    print(f"{did} on {args.prompts} ({len(categories)} prompts, the target's greedy answers, "
          "teacher-forced)")
    for r in reports:
        print_report(r, f"n {r['n']}, acceptance by position {r['acc_per_position']}")
    if engine:
        print(f"the engine, greedy, {args.max_new_tokens} new tokens at most "
              "(τ = new tokens / target forwards)")
    for r in engine:
        print_report(r, f"{r['variant']}, {r['tokens']} tokens in {r['target_forwards']} target "
                        f"forwards, greedy match {r['greedy_match_rate']:.2f} (against the "
                        "target's answers)")
    return 0


def tree_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specviz train tree",
        description="Measure which static tree of rank paths suits the shipped eagle1 head: "
                    "greedy engine runs with a wide tree on held-out instructions, then the "
                    "NODES paths accepted most often (drafters/eagle.py keeps the chosen tree)")
    p.add_argument("--nodes", type=int, default=20, help="draft nodes of the chosen tree")
    p.add_argument("--per-source", type=int, default=4,
                   help="held-out instructions per source (train calibrate's mix)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--json", action="store_true")
    machine_args(p)
    return p


def main_tree(argv: list[str]) -> int:
    p = tree_parser()
    args = p.parse_args(argv)
    if not 1 <= args.nodes <= 64:
        p.error("--nodes must be in 1..64")
    if not 1 <= args.per_source <= 200 or args.max_new_tokens < 1:
        p.error("--per-source must be in 1..200 and --max-new-tokens at least 1")
    from specviz import runner
    from specviz.train import recalibrate, treeshape
    target = embedded_target(args)
    prompts = [runner.encode(target, it["prompt"])
               for it in recalibrate.instructions(args.per_source)]
    r = treeshape.measure(target, prompts, args.max_new_tokens, args.nodes, log=progress)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{r['prompts']} prompts drafting a {r['wide_nodes']}-node tree: {r['fit_steps']} steps "
          f"of the even-numbered ones choose, {r['held_out_steps']} of the odd-numbered score "
          f"(the wide tree: tau {r['tau_wide']:.3f} on them)")
    print(f"held out: the chosen {args.nodes}-node tree tau {r['tau_chosen']:.3f}, the shipped "
          f"STATIC_TREE {r['tau_shipped']:.3f}")
    print(json.dumps([tuple(p) for p in r["tree"]]))
    return 0


def main_soup(argv: list[str]) -> int:
    from specviz.train import soup
    p = argparse.ArgumentParser(
        prog="python -m specviz train soup",
        description="Average one drafter's weights over several assets folders (fine-tunes of "
                    "the same weights: a model soup) into --out, with a card section naming "
                    "the ingredients. Judge the result with `train probe`, as any fine-tune.")
    p.add_argument("--drafter", required=True, help=f"drafter id: {', '.join([*TRAINERS, *ALIASES])}")
    p.add_argument("--assets", action="append", default=[], metavar="DIR", required=True,
                   help="an assets folder holding an ingredient (repeat: two or more)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the assets folder to write the average and its card into (assets/ "
                        "ships it)")
    p.add_argument("--note", default="", help="a paragraph for the card section")
    args = p.parse_args(argv)
    did = drafter_id(p, args.drafter)
    command = shlex.join(["python", "-m", "specviz", "train", "soup", *argv])
    try:
        paths = soup.make(did, [Path(a) for a in args.assets], Path(args.out), command, args.note)
    except soup.SoupError as exc:
        p.error(str(exc))
    print(f"wrote {', '.join(str(x) for x in paths)} and {Path(args.out) / (did + '.md')} "
          f"(the average of {len(args.assets)} weight sets)")
    return 0


SUBCOMMANDS = {"data": main_data, "calibrate": main_calibrate, "probe": main_probe,
               "tree": main_tree, "soup": main_soup}


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    args = parser().parse_args(argv)
    if not args.build_data and not args.drafter:
        parser().error("give --build-data or --drafter ID")
    if args.drafter:
        check_drafter_options(args)
    if not 0 <= args.feature_batch <= 1024:
        parser().error("--feature-batch must be in 0..1024 (0 = by device)")
    target = embedded_target(args)
    if args.build_data:
        if not shards.shard_paths(Path(args.shards)):
            parser().error(f"no response shards in {args.shards}; write them with: "
                           "python -m specviz train data")
        batch = args.feature_batch or (32 if target.device.type == "cuda" else 1)
        try:
            done = D.build_features(target, Path(args.shards), Path(args.data), args.max_seqs,
                                    args.stdlib_chunks, args.seed,
                                    log=lambda s: print(s, flush=True), batch=batch)
        except D.FeatureError as exc:
            parser().error(str(exc))
        speed = done["built_tokens"] / max(done["seconds"], 1e-9)
        removed = f" ({', '.join(done['removed'])})" if done["removed"] else ""
        print(f"{args.data}: built {len(done['built'])} files ({done['built_tokens']} tokens in "
              f"{done['seconds']:.0f} s, {speed:.0f} tok/s), skipped {len(done['skipped'])} "
              f"current, removed {len(done['removed'])}{removed}; {done['tokens']} tokens in all")
    if args.drafter:
        from specviz.drafters import weights
        from specviz.drafters.base import DrafterUnavailable
        from specviz.train.init import revocab
        from specviz.train.loop import init_from, train
        did = ALIASES.get(args.drafter, args.drafter)
        if args.draft_vocab and not 256 <= args.draft_vocab <= target.vocab:
            parser().error(f"--draft-vocab must be in 256..{target.vocab} (the target's vocabulary)")
        module, fn = TRAINERS[did].split(":")
        factory = getattr(importlib.import_module(module), fn)
        shipped = None
        if args.init == "shipped":   # (a resumed run's checkpoint then replaces the weights)
            try:
                shipped, _ = weights.load(did, target.fingerprint)
            except DrafterUnavailable as exc:
                parser().error(str(exc))
            old_vocab = D.shipped_vocab(shipped)
            args.shipped_vocab = None if args.draft_vocab else old_vocab
        try:
            data = D.TrainData(args.data)
            stale = D.stale_files(Path(args.data), Path(args.shards))
            if data.fingerprint != target.fingerprint:
                parser().error(f"{args.data} was built for another target ({data.meta['target']})"
                               "; rebuild it with --build-data")
            if stale:
                parser().error(f"{args.data}: {', '.join(stale)} no longer match(es) the "
                               f"response shards in {args.shards}; rebuild with --build-data")
            trainable = factory(target, args)
            data = D.TrainData(args.data, trainable.taps)
        except (D.FeatureError, ValueError) as exc:     # ValueError: a setting out of range
            parser().error(str(exc))
        if shipped is not None:
            root = getattr(trainable, "export_root", trainable.module)
            if args.draft_vocab:
                shipped = revocab(root, shipped, old_vocab)
            init_from(root, shipped)
        cfg = TrainConfig(drafter_id=did, minutes=args.minutes, steps=args.steps,
                          batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                          warmup=args.warmup, eval_every=args.eval_every, seed=args.seed,
                          resume=args.resume, ship=not args.no_ship, note=args.note,
                          init=args.init, out_dir=args.out_dir, precision=args.precision,
                          ema=args.ema, flags=drafter_flags(args))
        result = train(trainable, data, cfg, target)
        print(result)
    return 0
