"""Training data for every drafter: target responses to the instruction pool, then ONE feature
folder shared by all drafters.

Boundary: the target in, files out, and a loader. Stages:
1. responses: the target's greedy answers (chat template, batched `generate_batch`) to the
   instruction stream of sources.py and to instructions the target wrote itself
   (`self_instructions`, from `pool.meta_prompts`), kept as committed, append-only token shards
   (shards.py, data/responses/); plus a few raw standard-library source chunks
   (`stdlib_chunk_rows`, no generation);
2. `artifacts/train/features/` (git-ignored, rebuilt from the shards by `build_features`, which
   computes only missing or stale files): one feature file per response shard,
   `shard-NNNNN.safetensors` (its sequences after `shards.read` drops repeated prompts), and
   `stdlib.safetensors` for the source chunks. Per token the target features and soft labels:
   - `tokens` int32 [N] (the file's sequences concatenated), `seq_starts` int64 [S+1],
     `loss_mask` uint8 [N] (1 on response tokens), `split` uint8 [S] (1 = held out, ~5%,
     `is_heldout`);
   - `h{i}` float16 [N, d]: target hidden_states[i] for i in TAPS;
   - `topk_ids` int32 [N, TOPK], `topk_p` float16 [N, TOPK]: the target's next-token
     distribution at T=1 at each position (row t predicts token t+1);
   - metadata: format, target fingerprint, taps, topk, the source (shard name and sha256), a
     digest of the file's sequences (a file whose digest, target or taps differ is stale and
     rebuilt), counts.
`TrainData` opens the folder lazily (only the rows of the taps a drafter needs are read) and
cuts random-crop batches.
"""
from __future__ import annotations

import bisect
import hashlib
import inspect
import itertools
import json
import os
import random
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from specviz.train import shards
from specviz.train.config import DATA_DIR
from specviz.train.pool import extract_instruction, meta_prompts

TAPS = (2, 15, 27, 28, 30)   # EAGLE-3: 2,15,27; DFlash/DSpark: 2,15,28; EAGLE-1/MTP/P-EAGLE: 30
TOPK = 64
FEATURE_DIR = DATA_DIR / "features"
FORMAT = "specviz-features-1"
STDLIB = "stdlib"            # the feature file of the raw source chunks


def taps_for(n_layers: int) -> tuple[int, ...]:
    """The taps TAPS generalised to any depth (low, mid, L-3, L-2, final)."""
    return tuple(sorted({2, n_layers // 2, n_layers - 3, n_layers - 2, n_layers}))


HELDOUT_EVERY = 20           # ~5% of sequences are held out


def is_heldout(row: dict) -> bool:
    """Whether the sequence {prompt_ids, response_ids} is held out: by its content (a crc32 of
    its prompt, of its response when it has none), so appending shards, deduplication or
    `--max-seqs` never move a sequence between the splits."""
    key = np.asarray(row["prompt_ids"] or row["response_ids"], dtype=np.int64)
    return zlib.crc32(key.tobytes()) % HELDOUT_EVERY == 7


# --- stage 1: responses (shards.py stores them) -----------------------------------------
def self_instructions(target, n: int, path: Path, batch: int = 16, seed: int = 0) -> list[dict]:
    """n distinct instructions written by the target (sampled at T = 0.8, top-p 0.95, seeded per
    batch) from `pool.meta_prompts`, taken in turn; cached (append-only, resumable) in the
    JSON-lines file `path` (shards.SELF_FILE, next to the shards that answer them)."""
    out = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    seen = {d["prompt"] for d in out}
    metas = meta_prompts()
    b = max((d["batch"] for d in out), default=-1) + 1     # a resumed run goes on from here
    limit = b + 10 * (n // batch + 1)
    with path.open("a") as f, tqdm(total=n, initial=len(out), desc="self-instruct") as bar:
        while len(out) < n:
            if b >= limit:
                raise RuntimeError(f"self-instruct: the target wrote only {len(out)} usable "
                                   f"instructions of {n} in {b} batches")
            picks = [metas[(b * batch + j) % len(metas)] for j in range(batch)]
            prompts = [target.encode(m) for _, m in picks]
            rows = generate_batch(target, prompts, 48, sample_seed=seed * 1_000_003 + b)
            for (cat, _), row in zip(picks, rows):
                text = extract_instruction(target.tokenizer.decode(row, skip_special_tokens=True))
                if text and text not in seen and len(out) < n:
                    seen.add(text)
                    out.append({"id": f"self-{len(out):05d}", "category": f"self-{cat}",
                                "prompt": text, "batch": b})
                    f.write(json.dumps(out[-1]) + "\n")
                    bar.update(1)
            f.flush()
            b += 1
    return out[:n]


def generate_batch(target, prompts: list[list[int]], max_new_tokens: int,
              sample_seed: int | None = None) -> list[list[int]]:
    """One left-padded batched `generate` (greedy, or sampled with a seed); each row cut after
    its first end-of-sequence token."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(target.eos_ids)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=target.device)
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                       device=target.device)
    kw: dict = dict(do_sample=False)
    if sample_seed is not None:
        torch.manual_seed(sample_seed)
        kw = dict(do_sample=True, temperature=0.8, top_p=0.95, top_k=0)
    with torch.inference_mode():
        gen = target.model.generate(input_ids=ids, attention_mask=att,
                                    max_new_tokens=max_new_tokens, pad_token_id=pad, **kw)
    out = []
    for row in gen[:, width:].tolist():
        cut = next((i for i, t in enumerate(row) if t in target.eos_ids), len(row) - 1)
        out.append(row[:cut + 1])
    return out


def stdlib_chunk_rows(tok, n: int, seed: int = 0, length: int = 192) -> list[dict]:
    """n training rows of `length` tokens of raw standard-library source code (no prompt)."""
    import difflib, json as js, textwrap, string, statistics, heapq  # noqa: E401 - stable sources
    rng = random.Random(seed)
    text = "\n".join(inspect.getsource(m) for m in (difflib, js.decoder, textwrap, string,
                                                     statistics, heapq))
    ids = tok.encode(text)
    starts = sorted(rng.sample(range(0, len(ids) - length), n)) if n else []
    return [{"prompt_ids": [], "response_ids": ids[s:s + length], "category": "stdlib-source"}
            for s in starts]


# --- stage 2: features ----------------------------------------------------------------------
class FeatureError(ValueError):
    """A feature folder that cannot be trained on as it stands: missing, of another target,
    stale."""


def rows_digest(rows: list[dict]) -> str:
    """A digest of exactly the sequences a feature file is computed from."""
    h = hashlib.sha256()
    for r in rows:
        h.update(np.asarray([len(r["prompt_ids"]), len(r["response_ids"]), *r["prompt_ids"],
                             *r["response_ids"]], dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def feature_plan(target, shard_dir: Path, max_seqs: int = 0, stdlib_chunks: int = 0,
                 seed: int = 0) -> dict[str, tuple[list[dict], dict]]:
    """What the feature folder must hold: file stem -> (its sequences, the metadata naming their
    source). One file per response shard (`shards.read`'s order and deduplication, cut after the
    first `max_seqs` sequences; a shard left with none has no file), then `stdlib_chunks` raw
    source chunks in a file of their own."""
    rows = shards.read(shard_dir, target.fingerprint)[:max_seqs or None]
    plan: dict[str, tuple[list[dict], dict]] = {}
    for r in rows:
        plan.setdefault(Path(r["shard"]).stem, ([], {"source": r["shard"]}))[0].append(r)
    for _, source in plan.values():
        source["source_sha256"] = file_digest(Path(shard_dir) / source["source"])
    if stdlib_chunks:
        plan[STDLIB] = (stdlib_chunk_rows(target.tokenizer, stdlib_chunks, seed),
                        {"source": STDLIB})
    for rs, source in plan.values():
        source["digest"] = rows_digest(rs)
    return plan


def build_features(target, shard_dir: Path = shards.SHARD_DIR, folder: Path = FEATURE_DIR,
                   max_seqs: int = 0, stdlib_chunks: int = 0, seed: int = 0,
                   taps: tuple[int, ...] | None = None, log=print, batch: int = 1) -> dict:
    """Bring the feature folder up to date with the response shards (`feature_plan`): compute
    each missing or stale file (another target, taps, format, or other sequences), skip the
    current ones, delete those no longer planned. Memory: one shard's features at a time.
    Returns {built, skipped, removed (file names), tokens (in the folder), built_tokens,
    seconds (of the feature passes)}."""
    taps = taps or taps_for(target.n_layers)
    folder = Path(folder)
    if folder.is_file():
        raise FeatureError(f"{folder} is a file; the features are a folder of per-shard files")
    plan = feature_plan(target, shard_dir, max_seqs, stdlib_chunks, seed)
    common = {"format": FORMAT, "fingerprint": target.fingerprint, "taps": json.dumps(list(taps)),
              "topk": str(TOPK)}
    done = {"built": [], "skipped": [], "removed": [], "tokens": 0, "built_tokens": 0,
            "seconds": 0.0}
    folder.mkdir(parents=True, exist_ok=True)
    for stem, (rows, source) in plan.items():
        path, want = folder / f"{stem}.safetensors", common | source
        have = metadata(path) if path.exists() else {}
        if all(have.get(k) == v for k, v in want.items()):
            done["skipped"].append(path.name)
            done["tokens"] += int(have["tokens"])
            continue
        t0 = time.perf_counter()
        n = write_features(target, rows, path, taps, want, batch)
        dt = time.perf_counter() - t0
        log(f"{path.name}: {len(rows)} sequences, {n} tokens in {dt:.0f} s "
            f"({n / max(dt, 1e-9):.0f} tok/s)")
        done["built"].append(path.name)
        done["tokens"] += n
        done["built_tokens"] += n
        done["seconds"] += dt
    for path in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.tmp")):
        if path.stem not in plan or path.suffix == ".tmp":
            path.unlink()
            done["removed"].append(path.name)
    return done


def write_features(target, rows: list[dict], path: Path, taps: tuple[int, ...],
                   meta: dict, batch: int = 1) -> int:
    """Run the target over the sequences {prompt_ids, response_ids, category} and write their
    features to `path` (atomically, with `meta` plus counts). Returns the token count.

    `batch` sequences of similar length go through the target together, right-padded and
    masked (a GPU is launch-bound one short sequence at a time); 1 runs each alone, which is
    exact and no slower on a CPU."""
    seqs = [r["prompt_ids"] + r["response_ids"] for r in rows]
    starts = [0, *itertools.accumulate(len(q) for q in seqs)]
    n = starts[-1]
    hs = {i: torch.empty(n, target.hidden, dtype=torch.float16) for i in taps}
    top_ids = torch.empty(n, TOPK, dtype=torch.int32)
    top_p = torch.empty(n, TOPK, dtype=torch.float16)
    by_length = sorted(range(len(seqs)), key=lambda j: len(seqs[j]))
    groups = [by_length[g:g + batch] for g in range(0, len(seqs), batch)]
    with torch.inference_mode():
        for group in tqdm(groups, desc=path.stem, unit="batch", leave=False):
            width = max(len(seqs[j]) for j in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros(len(group), width, dtype=torch.long)
            for row, j in enumerate(group):
                ids[row, :len(seqs[j])] = torch.tensor(seqs[j])
                mask[row, :len(seqs[j])] = 1
            o = target.model.model(input_ids=ids.to(target.device),
                                   attention_mask=mask.to(target.device) if batch > 1 else None,
                                   output_hidden_states=True)
            for row, j in enumerate(group):
                a, b = starts[j], starts[j + 1]
                for i in taps:
                    h = o.last_hidden_state if i == target.n_layers else o.hidden_states[i]
                    hs[i][a:b] = h[row, :b - a].to(torch.float16).cpu()
                logits = target.lm_head(o.last_hidden_state[row, :b - a])
                v, ix = torch.softmax(logits.float(), -1).topk(TOPK, -1)
                top_ids[a:b], top_p[a:b] = ix.to(torch.int32).cpu(), v.to(torch.float16).cpu()
    tokens = [t for q in seqs for t in q]
    loss = [m for r in rows for m in [0] * len(r["prompt_ids"]) + [1] * len(r["response_ids"])]
    split = [int(is_heldout(r)) for r in rows]
    tensors = {"tokens": torch.tensor(tokens, dtype=torch.int32),
               "seq_starts": torch.tensor(starts, dtype=torch.int64),
               "loss_mask": torch.tensor(loss, dtype=torch.uint8),
               "split": torch.tensor(split, dtype=torch.uint8),
               "topk_ids": top_ids, "topk_p": top_p} | {f"h{i}": h for i, h in hs.items()}
    counts = {"target": target.model_id, "sequences": len(rows), "tokens": n,
              "response_tokens": sum(loss), "heldout_sequences": sum(split),
              "stdlib_chunks": sum(r["category"] == "stdlib-source" for r in rows),
              "self_instruct": sum(r["category"].startswith("self-") for r in rows)}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta | {k: str(v) for k, v in counts.items()})
    os.replace(tmp, path)
    return n


def metadata(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def stale_files(folder: Path, shard_dir: Path) -> list[str]:
    """The feature files in `folder` whose response shard in `shard_dir` is gone or changed."""
    out = []
    for path in sorted(Path(folder).glob("shard-*.safetensors")):
        m = metadata(path)
        shard = Path(shard_dir) / m.get("source", path.name)
        if not shard.exists() or file_digest(shard) != m.get("source_sha256"):
            out.append(path.name)
    return out


def first_ones(mask: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Per sequence [starts[i], starts[i+1]) of `mask`, the offset of its first nonzero entry
    (the sequence's length when it has none)."""
    ones = mask.nonzero().flatten()
    at = torch.searchsorted(ones, starts[:-1])
    first = torch.cat([ones, starts[-1:]])[at]
    return torch.minimum(first, starts[1:]) - starts[:-1]


def shard_span(names) -> str:
    """'1-9, 34-41' for the response shards shard-00001 ... named in `names` (others ignored)."""
    return span_of(n for n in map(shards.shard_number, names) if n is not None)


def span_of(numbers) -> str:
    """'1-9, 34-41' for a collection of shard numbers (the inverse of `span_numbers`)."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def span_numbers(span: str) -> set[int]:
    """The shard numbers of a span such as '1-9, 34-41' (the inverse of `span_of`)."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in span.split(","))):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


# --- loading --------------------------------------------------------------------------------
COUNTS = ("sequences", "tokens", "response_tokens", "heldout_sequences", "stdlib_chunks",
          "self_instruct")


def is_training_file(path: Path) -> bool:
    """Whether a feature file is training data: one per response shard, or the stdlib chunks."""
    return path.stem.startswith("shard-") or path.stem == STDLIB


def training_files(folder: Path) -> list[Path]:
    """The training feature files of a folder."""
    return sorted(filter(is_training_file, Path(folder).glob("*.safetensors")))


class TrainData:
    """The feature folder, read lazily: every file is opened once (memory-mapped) and a crop
    reads only its rows of the taps a drafter asks for, so memory stays small whatever the data
    size. Sequences are numbered across the files in name order (shards, then stdlib).

    A batch is a dict of [B, T(, ...)] tensors cut from random crops of random sequences:
    tokens (long), loss_mask (float), topk_ids (long), topk_p (float), h{i} (float32), and
    `valid` (float, 0 on padding after a short sequence's end).
    """

    def __init__(self, folder: Path | str = FEATURE_DIR, taps: tuple[int, ...] = ()):
        folder = Path(folder)
        build = "python -m specviz train --build-data"
        if folder.is_file():
            raise FeatureError(f"{folder} is a single feature file of an older specviz; the "
                               f"features are now a folder of per-shard files: {build}")
        paths = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        if not paths:
            raise FeatureError(f"no feature files in {folder}; build them with: {build}")
        others = [p.name for p in paths if not is_training_file(p)]
        if others and len(others) < len(paths):
            raise FeatureError(f"{folder} mixes training features with {', '.join(others)} (the "
                               "probe's answers, say), which must not be trained on: move them out")
        self.files = [safe_open(str(p), framework="pt") for p in paths]
        metas = [f.metadata() or {} for f in self.files]
        first = metas[0]
        for p, m in zip(paths, metas):
            if m.get("format") != FORMAT or (m["taps"], m["topk"]) != (first["taps"],
                                                                          first["topk"]):
                raise FeatureError(f"{p} is stale (another format, taps or top-k than "
                                   f"{paths[0].name}); rebuild with: {build}")
            if m["fingerprint"] != first["fingerprint"]:
                raise FeatureError(f"{p} was built for another target ({m['target']}) than "
                                   f"{paths[0].name} ({first['target']}); rebuild with: {build}")
        self.taps = tuple(dict.fromkeys(taps))
        missing = set(self.taps) - set(json.loads(first["taps"]))
        if missing:
            raise FeatureError(f"{folder} has no features of layer(s) {sorted(missing)}")
        self.folder = folder
        self.meta = {k: first[k] for k in ("fingerprint", "target", "taps", "topk")} | {
            k: str(sum(int(m[k]) for m in metas)) for k in COUNTS} | {
            "files": str(len(paths)), "shards": shard_span(m.get("source", "") for m in metas)}
        self.fingerprint = first["fingerprint"]
        self.seq_starts = [f.get_tensor("seq_starts") for f in self.files]
        self.first = [0] + list(itertools.accumulate(len(s) - 1 for s in self.seq_starts))
        split = torch.cat([f.get_tensor("split") for f in self.files]).tolist()
        self.lengths = torch.cat([s.diff() for s in self.seq_starts]).tolist()
        self.response_start = [int(x) for f, st in zip(self.files, self.seq_starts)
                               for x in first_ones(f.get_tensor("loss_mask"), st)]
        self.train_ids = [s for s, n in enumerate(self.lengths) if not split[s] and n > 2]
        self.heldout_ids = [s for s, n in enumerate(self.lengths) if split[s] and n > 2]

    @property
    def n_tokens(self) -> int:
        return int(self.meta["tokens"])

    def sequences(self, heldout: bool = False) -> list[int]:
        return self.heldout_ids if heldout else self.train_ids

    def _span(self, s: int, start: int, length: int):
        """(feature file, first row, end row) of sequence s's tokens [start, start + length)."""
        k = bisect.bisect_right(self.first, s) - 1
        starts = self.seq_starts[k]
        a = int(starts[s - self.first[k]]) + start
        return self.files[k], a, min(a + length, int(starts[s - self.first[k] + 1]))

    def crop(self, s: int, start: int, length: int) -> dict[str, torch.Tensor]:
        f, a, b = self._span(s, start, length)

        def rows(name: str) -> torch.Tensor:
            return f.get_slice(name)[a:b]

        out = {"tokens": rows("tokens").long(), "loss_mask": rows("loss_mask").float(),
               "topk_ids": rows("topk_ids").long(), "topk_p": rows("topk_p").float(),
               "valid": torch.ones(b - a)}
        out |= {f"h{i}": rows(f"h{i}").float() for i in self.taps}
        return out

    def batch(self, rng: np.random.Generator, batch_size: int, seq_len: int,
              heldout: bool = False) -> dict[str, torch.Tensor]:
        """batch_size random crops of at most seq_len tokens, right-padded (valid = 0). A
        sequence that fits is taken whole, prompt included, as the drafter sees it at inference
        (copying from the prompt is much of what it learns). A longer one is cropped to start at
        most seq_len // 4 tokens before its response, so that a long prompt does not fill the
        crop with tokens that carry no loss."""
        ids = self.sequences(heldout)
        crops = []
        for _ in range(batch_size):
            s = ids[int(rng.integers(len(ids)))]
            hi = max(0, self.lengths[s] - seq_len)
            lo = min(hi, max(0, self.response_start[s] - seq_len // 4))
            crops.append(self.crop(s, int(rng.integers(lo, hi + 1)), seq_len))
        return collate(crops)

    def coverage(self, vocab_ids: torch.Tensor) -> float:
        """The share of the held-out sequences' response tokens that lie in a draft vocabulary
        (target ids, on any device): a drafter can never propose the others."""
        inside = hits = 0
        vocab_ids = vocab_ids.long().cpu()           # the feature files are read on the CPU
        for s in self.heldout_ids:
            f, a, b = self._span(s, 0, self.lengths[s])
            resp = f.get_slice("tokens")[a:b].long()[f.get_slice("loss_mask")[a:b] > 0]
            inside += int(torch.isin(resp, vocab_ids).sum())
            hits += len(resp)
        return inside / max(hits, 1)

    def vocab_by_mass(self, n: int, vocab: int) -> torch.Tensor:
        """The n token ids (of a vocab-size target) with the most target probability mass plus
        occurrences over the data, sorted by id: a reduced draft vocabulary (EAGLE-3's d2t in
        id form). Reads one file at a time."""
        mass = torch.zeros(vocab)
        for f in self.files:
            mass.index_add_(0, f.get_tensor("topk_ids").long().flatten(),
                            f.get_tensor("topk_p").float().flatten())
            tokens = f.get_tensor("tokens").long()
            mass.index_add_(0, tokens, torch.ones(len(tokens)))
        return mass.topk(n).indices.sort().values


# the default draft vocabulary size (every drafter: its LM-head rows, DSpark's Markov tables).
# Over the version-2 data, the 4096 tokens of most mass cover 95.4% of fresh response tokens and
# the 8192 98.4% (16384: 99.7%); the CPU cost of 8192 bf16 LM-head rows per draft step is small.
DRAFT_VOCAB = 8192


def draft_vocab(path: str | Path, n: int, vocab: int) -> torch.Tensor:
    """A drafter's reduced vocabulary from the feature folder at `path` (`vocab_by_mass`)."""
    return TrainData(path).vocab_by_mass(n, vocab)


def is_vocab_key(key: str) -> bool:
    """Whether a shipped tensor's name is a draft-vocabulary list (`vocab_ids`, `*.vocab`)."""
    return key == "vocab_ids" or key.rsplit(".", 1)[-1] == "vocab"


def shipped_vocab(tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The reduced draft vocabulary in shipped weights, under whichever key the drafter keeps it:
    `vocab_ids` (outside the module: popped) or a `vocab` buffer (`vocab`, `backbone.vocab`);
    None when they have none."""
    if "vocab_ids" in tensors:
        return tensors.pop("vocab_ids")
    return next((v for k, v in tensors.items() if is_vocab_key(k)), None)


def drafter_vocab(args, vocab: int, n: int = DRAFT_VOCAB) -> torch.Tensor:
    """The reduced vocabulary of a drafter about to be trained: the shipped weights' own when
    fine-tuning them (`--init shipped` sets args.shipped_vocab), else the feature folder's, of
    `--draft-vocab` tokens when given (else n)."""
    shipped = getattr(args, "shipped_vocab", None)
    if shipped is not None:
        return shipped.long()
    return draft_vocab(args.data, getattr(args, "draft_vocab", 0) or n, vocab)


def collate(crops: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    T = max(len(c["tokens"]) for c in crops)
    out = {}
    for k in crops[0]:
        rows = []
        for c in crops:
            x = c[k]
            pad = torch.zeros((T - len(x),) + tuple(x.shape[1:]), dtype=x.dtype)
            rows.append(torch.cat([x, pad]))
        out[k] = torch.stack(rows)
    return out
