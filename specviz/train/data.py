"""Training data for every drafter: target responses to the instruction pool, then ONE feature
file shared by all drafters.

Boundary: the target in, files out, and a loader. Stages:
1. responses: the target's greedy answers (chat template, batched `generate_batch`) to the
   instruction stream of sources.py and to instructions the target wrote itself
   (`self_instructions`, from `pool.meta_prompts`), kept as committed, append-only token shards
   (shards.py, data/responses/); plus a few raw standard-library source chunks
   (`stdlib_chunk_rows`, no generation);
2. `artifacts/train/data.safetensors` (git-ignored, rebuilt from the shards): per token the
   target features and soft labels:
   - `tokens` int32 [N] (sequences concatenated), `seq_starts` int64 [S+1],
     `loss_mask` uint8 [N] (1 on response tokens), `split` uint8 [S] (1 = held out, ~5%);
   - `h{i}` float16 [N, d]: target hidden_states[i] for i in TAPS;
   - `topk_ids` int32 [N, TOPK], `topk_p` float16 [N, TOPK]: the target's next-token
     distribution at T=1 at each position (row t predicts token t+1);
   - metadata: target fingerprint, taps, counts.
`TrainData` loads it (only the taps a drafter needs) and cuts random-crop batches.
"""
from __future__ import annotations

import inspect
import json
import os
import random
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from specviz.train.pool import extract_instruction, meta_prompts

TAPS = (2, 15, 27, 28, 30)   # EAGLE-3: 2,15,27; DFlash/DSpark: 2,15,28; EAGLE-1/MTP/P-EAGLE: 30
TOPK = 64
DATA_DIR = Path("artifacts/train")
DATA_FILE = DATA_DIR / "data.safetensors"
def taps_for(n_layers: int) -> tuple[int, ...]:
    """The taps TAPS generalised to any depth (low, mid, L-3, L-2, final)."""
    return tuple(sorted({2, n_layers // 2, n_layers - 3, n_layers - 2, n_layers}))


HELDOUT_EVERY = 20           # sequence s is held out when s % 20 == 7 (5%)


def is_heldout(s: int) -> bool:
    return s % HELDOUT_EVERY == 7


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
def build_features(target, rows: list[dict], out: Path = DATA_FILE,
                   taps: tuple[int, ...] | None = None) -> Path:
    """Run the target over every sequence {prompt_ids, response_ids, category} (shards.read,
    plus raw source chunks) and write the shared feature file (atomically)."""
    taps = taps or taps_for(target.n_layers)
    tokens, loss, starts, split = [], [], [0], []
    hs = {i: [] for i in taps}
    top_ids, top_p = [], []
    with torch.inference_mode():
        for s, r in enumerate(tqdm(rows, desc="features", unit="seq")):
            seq = r["prompt_ids"] + r["response_ids"]
            o = target.model.model(input_ids=torch.tensor([seq], device=target.device),
                                   output_hidden_states=True)
            for i in taps:
                h = o.last_hidden_state if i == target.n_layers else o.hidden_states[i]
                hs[i].append(h[0].to(torch.float16).cpu())
            p = torch.softmax(target.lm_head(o.last_hidden_state[0]).float(), -1)
            v, ix = p.topk(TOPK, -1)
            top_ids.append(ix.to(torch.int32).cpu())
            top_p.append(v.to(torch.float16).cpu())
            tokens += seq
            loss += [0] * len(r["prompt_ids"]) + [1] * len(r["response_ids"])
            starts.append(len(tokens))
            split.append(int(is_heldout(s)))
    tensors = {"tokens": torch.tensor(tokens, dtype=torch.int32),
               "seq_starts": torch.tensor(starts, dtype=torch.int64),
               "loss_mask": torch.tensor(loss, dtype=torch.uint8),
               "split": torch.tensor(split, dtype=torch.uint8),
               "topk_ids": torch.cat(top_ids), "topk_p": torch.cat(top_p)}
    tensors |= {f"h{i}": torch.cat(v) for i, v in hs.items()}
    meta = {"fingerprint": target.fingerprint, "target": target.model_id,
            "taps": json.dumps(list(taps)), "topk": str(TOPK), "sequences": str(len(rows)),
            "tokens": str(len(tokens)), "response_tokens": str(sum(loss)),
            "heldout_sequences": str(sum(split)),
            "stdlib_chunks": str(sum(r["category"] == "stdlib-source" for r in rows)),
            "self_instruct": str(sum(r["category"].startswith("self-") for r in rows))}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, out)
    return out


# --- loading --------------------------------------------------------------------------------
class TrainData:
    """The shared feature file, with only the taps a drafter asks for held in memory.

    A batch is a dict of [B, T(, ...)] tensors cut from random crops of random sequences:
    tokens (long), loss_mask (float), topk_ids (long), topk_p (float), h{i} (float32), and
    `valid` (float, 0 on padding after a short sequence's end).
    """

    def __init__(self, path: Path | str = DATA_FILE, taps: tuple[int, ...] = ()):
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path} not found; build it with: "
                                    f"python -m specviz train --build-data")
        with safe_open(str(path), framework="pt") as f:
            self.meta = f.metadata()
            self.tokens = f.get_tensor("tokens").long()
            self.starts = f.get_tensor("seq_starts")
            self.loss_mask = f.get_tensor("loss_mask").float()
            self.split = f.get_tensor("split")
            self.topk_ids = f.get_tensor("topk_ids").long()
            self.topk_p = f.get_tensor("topk_p")
            self.h = {i: f.get_tensor(f"h{i}") for i in taps}
        self.fingerprint = self.meta["fingerprint"]
        lens = (self.starts[1:] - self.starts[:-1]).tolist()
        self.train_ids = [s for s in range(len(lens)) if not self.split[s] and lens[s] > 2]
        self.heldout_ids = [s for s in range(len(lens)) if self.split[s] and lens[s] > 2]
        self.lengths = lens

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def sequences(self, heldout: bool = False) -> list[int]:
        return self.heldout_ids if heldout else self.train_ids

    def crop(self, s: int, start: int, length: int) -> dict[str, torch.Tensor]:
        a = int(self.starts[s]) + start
        b = min(a + length, int(self.starts[s + 1]))
        sl = slice(a, b)
        out = {"tokens": self.tokens[sl], "loss_mask": self.loss_mask[sl],
               "topk_ids": self.topk_ids[sl], "topk_p": self.topk_p[sl].float(),
               "valid": torch.ones(b - a)}
        out |= {f"h{i}": h[sl].float() for i, h in self.h.items()}
        return out

    def batch(self, rng: np.random.Generator, batch_size: int, seq_len: int,
              heldout: bool = False) -> dict[str, torch.Tensor]:
        """batch_size random crops of at most seq_len tokens, right-padded (valid = 0)."""
        ids = self.sequences(heldout)
        crops = []
        for _ in range(batch_size):
            s = ids[int(rng.integers(len(ids)))]
            start = int(rng.integers(max(1, self.lengths[s] - seq_len + 1)))
            crops.append(self.crop(s, start, seq_len))
        return collate(crops)

    def vocab_by_mass(self, n: int, vocab: int) -> torch.Tensor:
        """The n token ids (of a vocab-size target) with the most target probability mass plus
        occurrences over the data, sorted by id: a reduced draft vocabulary (EAGLE-3's d2t in
        id form)."""
        mass = torch.zeros(vocab)
        mass.index_add_(0, self.topk_ids.flatten(), self.topk_p.float().flatten())
        mass.index_add_(0, self.tokens, torch.ones(len(self.tokens)))
        return mass.topk(n).indices.sort().values


def draft_vocab(path: str | Path, n: int, vocab: int) -> torch.Tensor:
    """A drafter's reduced vocabulary from the training data file at `path` (`vocab_by_mass`)."""
    return TrainData(path).vocab_by_mass(n, vocab)


def drafter_vocab(args, n: int, vocab: int) -> torch.Tensor:
    """The reduced vocabulary of a drafter about to be trained: the shipped weights' own when
    fine-tuning them (`--init shipped` sets args.shipped_vocab), else the data file's."""
    shipped = getattr(args, "shipped_vocab", None)
    return shipped.long() if shipped is not None else draft_vocab(args.data, n, vocab)


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
