"""Command line: generate, bench, replay, export, selfcheck, train (DESIGN.md §5 contracts).

Boundary: argument parsing, output formatting and turning every user error into one
`specviz: error: ...` line with exit status 2 (no traceback).
"""
from __future__ import annotations

import argparse
import json
import sys

from specviz.drafters.base import DrafterUnavailable
from specviz.engine.decode import BadRequest, GenSettings
from specviz.events import TraceError
from specviz.models.loading import EMBEDDED, ModelLoadError
from specviz.strategies import UnknownStrategy

USER_ERRORS = (BadRequest, TraceError, ModelLoadError, UnknownStrategy, DrafterUnavailable, ValueError)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=EMBEDDED, help="target: 'embedded' (default), a hub id or a folder")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--temperature", type=_float, default=0.0)
    p.add_argument("--top-p", type=_float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specviz", description="See and measure speculative decoding.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="decode one prompt with one strategy")
    g.add_argument("--strategy", default="ar")
    g.add_argument("--prompt", required=True)
    chat = g.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default for instruct models)")
    chat.add_argument("--no-chat", dest="chat", action="store_false")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--trace", help="write the event trace (JSONL) here")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a strategy setting, e.g. --set max_draft=6")
    _common(g)

    b = sub.add_parser("bench", help="all strategies on all prompts, interleaved, in one process")
    b.add_argument("--strategies", required=True, help="comma-separated strategy ids; a variant "
                   "ID:KEY=VALUE[:KEY=VALUE] runs a strategy with settings (e.g. "
                   "dspark:markov=false), reported under that name")
    b.add_argument("--prompts", required=True, help="JSONL prompt file")
    b.add_argument("--max-new-tokens", type=int, default=None)
    b.add_argument("--peers", action="store_true", help="add HF generate baselines")
    b.add_argument("--repeats", type=int, default=1,
                   help="run every strategy on every prompt N times (interleaved passes) and keep "
                        "each prompt's median run: steadier per-prompt ratios on a noisy machine")
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--lockstep", dest="lockstep", action="store_true", default=True,
                      help="(the default) on each prompt, the strategies and peers take turns of "
                           "decoding steps (six target steps of this machine, at least 0.15 s "
                           "each turn), and a run's time is the sum of "
                           "its own steps: a busy or drifting machine slows them all alike, so "
                           "ratios are paired turn by turn")
    mode.add_argument("--serial", dest="lockstep", action="store_false",
                      help="on each prompt, run the strategies and peers one after another")
    _common(b)

    v = sub.add_parser("serve-bench", help="R requests through the batched engine, once per "
                       "verify-length policy, in one process")
    v.add_argument("--strategy", required=True, help="a chain strategy id, or ID:KEY=VALUE[:..]")
    v.add_argument("--prompts", required=True, help="JSONL prompt file (taken in order, cycling)")
    v.add_argument("--requests", type=int, required=True, help="R: requests to serve")
    v.add_argument("--policies", required=True,
                   help="comma-separated: fixed:G, threshold:T, dspark, dspark-prod")
    v.add_argument("--arrival", default="all", help="all (at once) or poisson:RATE (requests/s)")
    v.add_argument("--max-new-tokens", type=int, default=None)
    v.add_argument("--trace", help="write each policy's serving trace to TRACE.<policy>.jsonl")
    _common(v)

    r = sub.add_parser("replay", help="validate a trace and print its metrics")
    r.add_argument("trace")
    r.add_argument("--json", action="store_true")

    x = sub.add_parser("export", help="write a shipped drafter in the published layout vLLM / "
                       "SGLang load")
    x.add_argument("drafter", help="eagle3, eagle1, dflash-b8, dflash-b16 or dspark")
    x.add_argument("--out", required=True, help="folder to write")
    x.add_argument("--format", default="auto", choices=["auto", "eagle3", "eagle1", "dflash", "dspark"])
    x.add_argument("--model", default=EMBEDDED, help="the target the drafter was trained for")
    x.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    x.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    x.add_argument("--json", action="store_true", help="print one JSON object")

    c = sub.add_parser("selfcheck", help="every strategy, greedy, on two short prompts against "
                       "ar: works / mismatch / unavailable (exit 1 on a mismatch)")
    c.add_argument("--model", default=EMBEDDED, help="target: 'embedded' (default), a hub id or a folder")
    c.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    c.add_argument("--set", action="append", default=[], metavar="STRATEGY:KEY=VALUE",
                   help="a strategy setting, e.g. --set eagle3:path=DIR (repeatable)")
    c.add_argument("--strategies", default="", help="comma-separated ids (default: all)")
    c.add_argument("--max-new-tokens", type=int, default=32)
    c.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    c.add_argument("--json", action="store_true", help="print one JSON object")

    sub.add_parser("train", help="train drafters (see: python -m specviz train --help)", add_help=False)
    return ap


def _settings(a: argparse.Namespace, max_new_tokens: int) -> GenSettings:
    s = GenSettings(max_new_tokens=max_new_tokens, temperature=a.temperature, top_p=a.top_p,
                    top_k=a.top_k, seed=a.seed)
    s.check()
    return s


def _load(a: argparse.Namespace):
    from specviz.models.target import Target
    return Target.load(a.model, a.device, threads=a.threads)


def cmd_generate(a: argparse.Namespace) -> None:
    from specviz import events, metrics, runner, strategies
    settings = _settings(a, a.max_new_tokens)
    overrides = strategies.parse_pairs(a.set)
    strategies.parse_settings(a.strategy, overrides)  # unknown strategy / bad setting: fail before loading
    if not a.prompt.strip():
        raise BadRequest("the prompt is empty")
    target = _load(a)
    ids = runner.encode(target, a.prompt, a.chat)
    res = runner.generate(target, strategy=a.strategy, prompt_ids=ids, gen=settings,
                          overrides=overrides)
    if a.trace:
        events.write_trace(res.events, a.trace)
    m = metrics.from_finished(res.finished)
    if a.json:
        print(json.dumps({"strategy": a.strategy, "token_ids": res.token_ids, "text": res.text,
                          "metrics": m}, ensure_ascii=False))
    else:
        print(res.text)
        print(f"\n[{a.strategy}] {m['new_tokens']} tokens in {m['wall_s']:.2f} s "
              f"({m['tokens_per_s']:.1f} tok/s), {m['target_forwards']} target forwards, "
              f"tau {m['mean_accepted_length']:.2f}, draft {m['draft_s']:.2f} s, "
              f"verify {m['verify_s']:.2f} s, stop: {m['stop_reason']}", file=sys.stderr)


def cmd_bench(a: argparse.Namespace) -> None:
    from specviz import bench, strategies
    ids = [s.strip() for s in a.strategies.split(",") if s.strip()]
    if not ids:
        raise BadRequest("--strategies is empty")
    for sid in ids:
        strategies.parse_variant(sid)   # unknown strategy / bad setting: fail before loading
    if a.max_new_tokens is not None:
        _settings(a, a.max_new_tokens)
    settings = _settings(a, a.max_new_tokens or 1)
    bench.check_repeats(a.repeats)
    prompts = bench.read_prompts(a.prompts)
    target = _load(a)
    log = (lambda s: None) if a.json else (lambda s: print(s, file=sys.stderr))
    report = bench.bench(target, strategy_ids=ids, prompts=prompts,
                         max_new_tokens=a.max_new_tokens, settings=settings, peers=a.peers,
                         log=log, repeats=a.repeats, lockstep=a.lockstep)
    print(json.dumps(report, ensure_ascii=False, allow_nan=False) if a.json else bench.table(report))


def cmd_serve_bench(a: argparse.Namespace) -> None:
    from specviz import bench, serve, strategies
    from specviz.engine.scheduler import parse_policy
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    for p in policies:
        parse_policy(p)                        # a bad policy id: fail before loading
    strategies.parse_variant(a.strategy)
    if a.requests < 1:
        raise BadRequest(f"--requests must be at least 1, got {a.requests}")
    settings = _settings(a, a.max_new_tokens or 1)
    serve.arrivals(a.arrival, 1, a.seed)       # a bad --arrival: fail before loading
    prompts = bench.read_prompts(a.prompts)
    target = _load(a)
    log = (lambda s: None) if a.json else (lambda s: print(s, file=sys.stderr))
    report = serve.serve_bench(target, strategy=a.strategy, prompts=prompts,
                               requests=a.requests, policies=policies, arrival=a.arrival,
                               max_new_tokens=a.max_new_tokens, gen=settings, trace=a.trace,
                               log=log)
    print(json.dumps(report, ensure_ascii=False, allow_nan=False) if a.json
          else serve.table(report))


def cmd_replay(a: argparse.Namespace) -> None:
    from specviz import events, metrics, serving_metrics
    trace = events.read_trace(a.trace)
    if isinstance(trace[0], events.ServeStarted):
        m = serving_metrics.replay(trace)
        print(json.dumps(m, ensure_ascii=False) if a.json else
              f"{m['strategy']} / {m['policy']}: {m['requests']} requests, {m['new_tokens']} "
              f"tokens in {m['steps']} batched steps, {m['throughput_tokens_per_s']:.1f} tok/s, "
              f"{m['mean_per_request_tokens_per_s']:.1f} tok/s per request, "
              f"tau {m['mean_accepted_length']:.2f}, {m['mean_batch_tokens']:.1f} batch tokens")
        return
    m = metrics.replay(trace)
    if a.json:
        print(json.dumps(m, ensure_ascii=False))
    else:
        print(f"{m['strategy']}: {m['new_tokens']} tokens, {m['target_forwards']} target forwards, "
              f"tau {m['mean_accepted_length']:.2f}, {m['tokens_per_s']:.1f} tok/s, "
              f"stop: {m['stop_reason']}")
        print(m["text"])


def cmd_export(a: argparse.Namespace) -> None:
    from specviz.drafters.published.export import export
    report = export(a.drafter, a.out, _load(a), a.format)
    if a.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print(f"{a.drafter} -> {report['path']} ({report['format']} layout): "
              f"{', '.join(report['files'])}")
        print(f"vLLM:   --speculative-config '{json.dumps(report['speculative_config'])}'")
        print(f"SGLang: {' '.join(report['sglang_args'])}")
        print("What a serving engine computes differently:")
        for d in report["differences"]:
            print(f"- {d}")


def cmd_selfcheck(a: argparse.Namespace) -> int:
    from dataclasses import asdict
    from specviz import strategies
    from specviz.selfcheck import selfcheck
    sets = strategies.parse_sets(a.set)
    for sid in a.strategies.split(",") if a.strategies else []:
        strategies.spec(sid.strip())
    GenSettings(max_new_tokens=a.max_new_tokens).check()
    target = _load(a)
    only = [x.strip() for x in a.strategies.split(",") if x.strip()]
    lines = selfcheck(target, sets, a.max_new_tokens, only)
    failed = any(line.status == "mismatch" for line in lines)
    if a.json:
        print(json.dumps({"model": target.model_id, "device": str(target.device),
                          "ok": not failed, "strategies": [asdict(x) for x in lines]},
                         ensure_ascii=False))
    else:
        print(f"selfcheck: {target.model_id} on {target.device} ({target.dtype}), greedy, "
              f"{a.max_new_tokens} new tokens per prompt")
        for line in lines:
            print(line.text())
        print("FAILED: a strategy left ar's tokens" if failed else "OK: every available "
              "strategy reproduces ar")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from specviz.train.cli import main as train_main
        return train_main(argv[1:]) or 0
    ap = parser()
    a = ap.parse_args(argv)
    try:
        code = {"generate": cmd_generate, "bench": cmd_bench, "replay": cmd_replay,
                "serve-bench": cmd_serve_bench,
                "export": cmd_export, "selfcheck": cmd_selfcheck}[a.cmd](a)
    except USER_ERRORS as exc:
        print(f"specviz: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specviz: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not isinstance(exc, MemoryError) and "out of memory" not in str(exc).lower():
            raise
        print("specviz: error: out of memory; try fewer --max-new-tokens or a shorter prompt",
              file=sys.stderr)
        return 2
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
