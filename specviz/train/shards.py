"""Append-only shards of the target's answers: the token data every drafter trains on, committed
in git (data/responses/) so that later sessions extend it instead of regenerating it.

Boundary: the shard format, reading it, and `extend` (the resumable generator behind
`python -m specviz train data`). Features are not stored: data.build_features recomputes them
with a teacher-forced target pass.

A shard, data/responses/shard-NNNNN.safetensors, is written once (tmp file + rename) and never
rewritten, so killing the generator loses at most the shard in progress. Tensors:
- `tokens` uint16 [N]: each sequence's prompt (chat template applied) then its response (greedy,
  ending with end-of-sequence unless max_new_tokens cut it), concatenated;
- `offsets` int64 [S + 1]: sequence starts in `tokens`; `prompt_len` int32 [S];
- `index` int64 [S]: the instruction's index in its stream; `source` uint8 [S]: an index into the
  metadata's `sources` list.
Metadata: format, stream (`pool`: sources.stream(seed), with stream_version; `self`: the
self-instructions in data/responses/self-instructions.jsonl), seed, first and count (the shard
answers indices [first, first + count) of its stream, all of them), sources, target fingerprint
and model id, max_new_tokens, response_tokens.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from safetensors import safe_open

from specviz.train import sources

SHARD_DIR = Path(__file__).resolve().parents[2] / "data" / "responses"   # the committed shards
FORMAT = "specviz-responses-1"
SELF_FILE = "self-instructions.jsonl"


def shard_paths(folder: Path = SHARD_DIR) -> list[Path]:
    return sorted(Path(folder).glob("shard-*.safetensors"))


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.safetensors"


def shard_number(name: str) -> int | None:
    """The number in a shard's file name `shard-NNNNN.safetensors` (None for another name)."""
    stem = Path(name).name.removesuffix(".safetensors")
    head, _, num = stem.partition("-")
    return int(num) if head == "shard" and num.isdigit() else None


def meta(path: Path) -> dict:
    with safe_open(str(path), framework="numpy") as f:
        m = dict(f.metadata())
    for k in ("seed", "first", "count", "max_new_tokens", "response_tokens"):
        m[k] = int(m[k])
    m["sources"] = json.loads(m["sources"])
    return m


def read(folder: Path = SHARD_DIR, fingerprint: str | None = None) -> list[dict]:
    """Every sequence of every shard, in shard order, less repeated prompts (streams of other
    seeds or versions may overlap): {prompt_ids, response_ids, category, stream, index, shard}.
    With `fingerprint`, shards written for another target are an error."""
    out, seen = [], set()
    for path in shard_paths(folder):
        m, t = meta(path), load_file(str(path))
        if fingerprint is not None and m["fingerprint"] != fingerprint:
            raise ValueError(f"{path} was written by another target ({m['target']})")
        tokens, off, plen = t["tokens"].astype(np.int64), t["offsets"], t["prompt_len"]
        for s in range(len(plen)):
            seq = tokens[off[s]:off[s + 1]].tolist()
            if tuple(seq[:plen[s]]) in seen:
                continue
            seen.add(tuple(seq[:plen[s]]))
            out.append({"prompt_ids": seq[:plen[s]], "response_ids": seq[plen[s]:],
                        "category": m["sources"][t["source"][s]], "stream": m["stream"],
                        "index": int(t["index"][s]), "shard": path.name})
    return out


def write(folder: Path, number: int, rows: list[dict], metadata: dict) -> Path:
    """Write shard `number` from rows {prompt_ids, response_ids, source, index} (atomically)."""
    names = sorted({r["source"] for r in rows})
    seqs = [r["prompt_ids"] + r["response_ids"] for r in rows]
    tokens = np.array([t for s in seqs for t in s], dtype=np.int64)
    if tokens.size and (tokens.max() > np.iinfo(np.uint16).max or tokens.min() < 0):
        raise ValueError("token ids do not fit uint16")
    tensors = {"tokens": tokens.astype(np.uint16),
               "offsets": np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64),
               "prompt_len": np.array([len(r["prompt_ids"]) for r in rows], dtype=np.int32),
               "index": np.array([r["index"] for r in rows], dtype=np.int64),
               "source": np.array([names.index(r["source"]) for r in rows], dtype=np.uint8)}
    md = {k: str(v) for k, v in metadata.items()} | {
        "format": FORMAT, "sources": json.dumps(names),
        "response_tokens": str(sum(len(r["response_ids"]) for r in rows))}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / shard_name(number)
    if path.exists():
        raise FileExistsError(f"{path} exists: shards are never rewritten")
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=md)
    os.replace(tmp, path)
    return path


def self_items(folder: Path, start: int, n: int) -> list[dict]:
    """Self-instructions [start, start + n) from folder/SELF_FILE as stream items."""
    path = folder / SELF_FILE
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [{"index": i, "source": rows[i]["category"], "prompt": rows[i]["prompt"]}
            for i in range(start, min(start + n, len(rows)))]


def extend(target, folder: Path = SHARD_DIR, target_tokens: int = 3_000_000, batch: int = 48,
           max_new_tokens: int = 160, shard_seqs: int = 240, seed: int = 0,
           self_instruct: int = 0, max_shards: int = 0, log=print) -> dict:
    """Append shards until they hold `target_tokens` response tokens (or `max_shards` more were
    written, when > 0): first answers to `self_instruct` instructions the target writes itself
    (data.self_instructions, cached in folder/SELF_FILE), then to sources.stream(seed). Resumes
    after the last shard of each stream; pool shards of another seed or stream version are other
    streams (kept, counted, never extended here; `read` drops repeated prompts).
    Returns {shards, sequences (of the streams extended here), response_tokens}."""
    from specviz.train.data import generate_batch, self_instructions
    folder = Path(folder)
    done = [meta(p) for p in shard_paths(folder)]
    for m in done:
        if m["fingerprint"] != target.fingerprint:
            raise ValueError(f"{folder} holds shards of another target ({m['target']}); "
                             "use another folder")
    mine = {"self": [m for m in done if m["stream"] == "self"],
            "pool": [m for m in done if m["stream"] == "pool" and m["seed"] == seed
                     and m["stream_version"] == sources.VERSION]}
    nxt = {s: max((m["first"] + m["count"] for m in ms), default=0) for s, ms in mine.items()}
    total = sum(m["response_tokens"] for m in done)
    number = max((shard_number(p.name) for p in shard_paths(folder)), default=0) + 1
    if self_instruct > nxt["self"]:
        folder.mkdir(parents=True, exist_ok=True)
        self_instructions(target, self_instruct, folder / SELF_FILE, batch=min(batch, 16),
                          seed=seed)
    stop = number + max_shards if max_shards else None
    while total < target_tokens and number != stop:
        stream = "self" if nxt["self"] < self_instruct else "pool"
        n = shard_seqs if stream == "pool" else min(shard_seqs, self_instruct - nxt["self"])
        items = (sources.take(n, nxt["pool"], seed) if stream == "pool"
                 else self_items(folder, nxt["self"], n))
        if not items:
            log(f"the {stream} stream ran dry at index {nxt[stream]}")
            break
        t0 = time.perf_counter()
        prompts = [target.encode(it["prompt"]) for it in items]
        order = sorted(range(len(items)), key=lambda i: len(prompts[i]))   # less padding
        answers: list[list[int]] = [[] for _ in items]
        for b in range(0, len(order), batch):
            idx = order[b:b + batch]
            for i, resp in zip(idx, generate_batch(target, [prompts[i] for i in idx],
                                                   max_new_tokens)):
                answers[i] = resp
        rows = [{"prompt_ids": p, "response_ids": a, "source": it["source"], "index": it["index"]}
                for it, p, a in zip(items, prompts, answers)]
        md = {"stream": stream, "seed": seed, "first": items[0]["index"], "count": len(items),
              "fingerprint": target.fingerprint, "target": target.model_id,
              "max_new_tokens": max_new_tokens}
        if stream == "pool":
            md["stream_version"] = sources.VERSION
        path = write(folder, number, rows, md)
        made = sum(len(a) for a in answers)
        total += made
        nxt[stream] += len(items)
        number += 1
        log(f"{path.name}: {len(items)} {stream} answers, {made} response tokens in "
            f"{time.perf_counter() - t0:.0f} s ({made / (time.perf_counter() - t0):.1f} tok/s); "
            f"total {total} of {target_tokens}")
    return {"shards": number - 1, "sequences": sum(nxt.values()), "response_tokens": total}
