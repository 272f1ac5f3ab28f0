"""`python -m specviz.appbench --url URL`: N `/speculate` clients at once against the same N
requests sent one after another, on a running app (its shared batch, batcher.py).

Boundary: a gradio_client load generator and its report (JSON on stdout): total new tokens over
wall time both ways, their ratio, and whether every concurrent answer equals its sequential
one (greedy). The two passes alternate `--rounds` times so that a drift in the machine's speed
falls on both.
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

from gradio_client import Client

from specviz.bench import read_prompts


def one(client: Client, prompt: str, strategy: str, n: int) -> tuple[str, dict]:
    return client.predict(prompt, strategy, n, 0.0, 0, api_name="/speculate")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--prompts", default="demos/prompts.jsonl")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--strategy", default="dspark")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    prompts = [p.prompt for p in read_prompts(a.prompts)]
    work = [prompts[i % len(prompts)] for i in range(a.clients)]
    clients = [Client(a.url, verbose=False) for _ in range(a.clients)]
    one(clients[0], work[0], a.strategy, 4)                      # warm the engine and drafter
    rounds = []
    for _ in range(a.rounds):
        t = time.perf_counter()
        alone = [one(clients[0], p, a.strategy, a.max_new_tokens) for p in work]
        seq_s = time.perf_counter() - t
        t = time.perf_counter()
        with ThreadPoolExecutor(a.clients) as pool:
            together = list(pool.map(lambda cp: one(cp[0], cp[1], a.strategy, a.max_new_tokens),
                                     zip(clients, work)))
        conc_s = time.perf_counter() - t
        seq_tps = sum(m["new_tokens"] for _, m in alone) / seq_s
        conc_tps = sum(m["new_tokens"] for _, m in together) / conc_s
        rounds.append({"sequential_s": seq_s, "concurrent_s": conc_s,
                       "sequential_tokens_per_s": seq_tps, "concurrent_tokens_per_s": conc_tps,
                       "ratio": conc_tps / seq_tps,
                       "same_text": [x[0] == y[0] for x, y in zip(alone, together)],
                       "batched": all(m.get("batched") for _, m in together)})
    print(json.dumps({"clients": a.clients, "strategy": a.strategy,
                      "max_new_tokens": a.max_new_tokens, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
