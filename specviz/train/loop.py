"""The one trainer every drafter uses.

Boundary: optimisation, schedule, budgets, evaluation bookkeeping, checkpoints and shipping. A
drafter plugs in with a `Trainable`:
- `module`: the nn.Module whose parameters with requires_grad are trained (and checkpointed);
- `taps`: target hidden_states indices it needs from the data file;
- `loss(batch, generator) -> (loss, stats)`: one training loss on a TrainData batch; stats maps
  names to scalars (numbers or tensors: the loop detaches and logs them);
- `evaluate(batch) -> (hits [n, D] bool)`: for n held-out start positions, whether the drafter's
  j-th draft token (drafting as at inference, tokens teacher-forced) equals the target's argmax;
- `export() -> (tensors, config)` for drafters.weights.save, and `describe() -> str` for the card;
  optionally `export_root`, the submodule whose state-dict keys `export` writes (default
  `module`), so that `--init shipped` can load them back (`init_from`).

AdamW, linear warmup then cosine decay over max(step/steps, elapsed/minutes); deterministic
batches and noise (seeded by (seed, step)), so a resumed run sees the same batches. Checkpoints
are safetensors (parameters and AdamW moments) plus a JSON of counters: nothing is unpickled.
With `ema` > 0 the loop also keeps an exponential moving average of the trained parameters, started
at the starting weights (Polyak averaging; from shipped weights, a weight average of the fine-tune
with where it began, as `train soup` makes of separate runs), and evaluates and ships the average.
The drafter's forward and loss run under bf16 autocast (`precision`, "auto" by default) on CUDA
and on a CPU that multiplies bfloat16 natively (AMX or AVX512-BF16: 1.5-2x the steps per second
of fp32 on this project's machines, with the same held-out curve per step); parameters and
AdamW stay fp32. The features come from the fp32 target either way.
"""
from __future__ import annotations

import json
import math
import platform
import re
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from specviz.drafters import weights
from specviz.models.kernels import check_precision, resolve_precision
from specviz.train import init
from specviz.train.config import TrainConfig
from specviz.train.data import FEATURE_DIR, TrainData, shipped_vocab, span_numbers, span_of


class Trainable(Protocol):
    module: torch.nn.Module
    taps: tuple[int, ...]

    def loss(self, batch: dict, generator: torch.Generator) -> tuple[torch.Tensor, dict]: ...
    def evaluate(self, batch: dict) -> torch.Tensor: ...
    def export(self) -> tuple[dict[str, torch.Tensor], dict]: ...
    def describe(self) -> str: ...


def device_of() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def lr_at(cfg: TrainConfig, step: int, elapsed: float) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    prog = max(step / cfg.steps if cfg.steps else 0.0,
               elapsed / (60 * cfg.minutes) if cfg.minutes else 0.0)
    prog = min(1.0, prog)
    floor = cfg.lr * cfg.min_lr_frac
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * prog))


def acceptance(hits: torch.Tensor) -> dict:
    """hits [n, D] bool -> per-position acceptance (given all earlier accepted), the accuracy
    of each position alone, and the simulated chain τ = 1 + E[leading hits]."""
    lead = hits.long().cumprod(-1)                      # [n, D]: 1 while every draft so far hit
    reached = torch.cat([torch.ones_like(lead[:, :1]), lead[:, :-1]], -1).sum(0).clamp(min=1)
    return {"acc_per_position": [round(float(x), 4) for x in lead.sum(0) / reached],
            "acc_unconditional": [round(float(x), 4) for x in hits.float().mean(0)],
            "tau": round(1.0 + float(lead.sum(-1).float().mean()), 4), "n": int(hits.shape[0])}


def evaluate(trainable: Trainable, data: TrainData, cfg: TrainConfig, dev: torch.device) -> dict:
    rng = np.random.default_rng([cfg.seed, 999_983])     # the same held-out batches every time
    trainable.module.eval()
    hits = []
    with torch.no_grad(), autocast(dev, cfg.precision):
        for _ in range(cfg.eval_batches):
            batch = to(data.batch(rng, cfg.batch_size, cfg.seq_len, heldout=True), dev)
            hits.append(trainable.evaluate(batch).cpu())
    trainable.module.train()
    return acceptance(torch.cat(hits))


def bf16_autocast(precision: str, dev: torch.device) -> bool:
    """Whether a run of this `precision` trains under bf16 autocast on `dev`: on a CPU as
    kernels.resolve_precision says (auto: where bfloat16 is native); on a GPU unless fp32."""
    if dev.type == "cpu":
        return resolve_precision(precision, dev) == "bf16"
    check_precision(precision)
    return precision != "fp32"


def autocast(dev: torch.device, precision: str):
    return torch.autocast(dev.type, dtype=torch.bfloat16,
                          enabled=bf16_autocast(precision, dev))


def to(batch: dict, dev: torch.device) -> dict:
    return {k: v.to(dev, non_blocking=True) for k, v in batch.items()}


# --- starting from shipped weights, checkpoints ----------------------------------------------
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def grown_layers(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Decoder layers of `module` past the last one the shipped tensors hold (a deeper drafter
    built from shallower weights, `--layers` above theirs), as their name prefixes."""
    def index(name: str) -> tuple[str, int] | None:
        m = LAYER.search(name)
        return (name[:m.start(1)], int(m.group(1))) if m else None

    have = {index(k) for k in tensors} - {None}
    deepest = {pre: max(i for p, i in have if p == pre) for pre, _ in have}
    mine = {index(k) for k, _ in module.named_parameters()} - {None}
    return sorted(f"{pre}{i}." for pre, i in mine if pre in deepest and i > deepest[pre])


def init_from(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Start from shipped weights (fine-tuning): every shipped tensor must fit the module, and
    every trained parameter must come from them, except those of decoder layers appended past
    the shipped ones (`grown_layers`): these keep their fresh start with their residual-writing
    projections (o, down) zeroed, so each starts as the identity and the deeper drafter first
    drafts what the shipped one did. An integer buffer (a draft vocabulary, its lookup) must
    already equal the shipped one: the module was then built for their vocabulary, whose rows
    its frozen LM head slice and its tables are indexed by."""
    own = module.state_dict()
    clash = [k for k, v in tensors.items()
             if k in own and not v.is_floating_point() and not torch.equal(v, own[k])]
    if clash:
        raise ValueError(f"the shipped weights do not fit this drafter (built for another "
                         f"vocabulary: {clash[:4]})")
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    grown = tuple(grown_layers(module, tensors))
    for prefix in grown:
        init.as_identity(module.get_submodule(prefix.rstrip(".")))
    trained = {k for k, p in module.named_parameters()
               if p.requires_grad and not k.startswith(grown)}
    if unexpected or trained & set(missing):
        raise ValueError(f"the shipped weights do not fit this drafter (unexpected "
                         f"{sorted(unexpected)[:4]}, missing {sorted(trained & set(missing))[:4]})")


def save_checkpoint(cfg: TrainConfig, params: dict[str, torch.nn.Parameter],
                    opt: torch.optim.AdamW, state: dict,
                    average: dict[str, torch.Tensor] | None = None) -> None:
    cfg.ckpt_dir.mkdir(parents=True, exist_ok=True)
    tensors = {f"param/{k}": p.detach().cpu().contiguous() for k, p in params.items()}
    tensors |= {f"ema/{k}": v.cpu().contiguous() for k, v in (average or {}).items()}
    for k, p in params.items():
        s = opt.state.get(p, {})
        for name in ("exp_avg", "exp_avg_sq"):
            if name in s:
                tensors[f"{name}/{k}"] = s[name].detach().cpu().contiguous()
        if "step" in s:
            state.setdefault("adam_step", {})[k] = float(s["step"])
    save_file(tensors, str(cfg.ckpt_dir / "ckpt.safetensors"))
    (cfg.ckpt_dir / "ckpt.json").write_text(json.dumps(state, indent=1))


def load_checkpoint(cfg: TrainConfig, params: dict[str, torch.nn.Parameter],
                    opt: torch.optim.AdamW,
                    average: dict[str, torch.Tensor] | None = None) -> dict | None:
    """Restore parameters, AdamW moments and (when given and saved) the weight average."""
    path = cfg.ckpt_dir / "ckpt.safetensors"
    if not path.exists():
        return None
    tensors = load_file(str(path))
    state = json.loads((cfg.ckpt_dir / "ckpt.json").read_text())
    for k, p in params.items():
        with torch.no_grad():
            p.copy_(tensors[f"param/{k}"].to(p))
            if average is not None and f"ema/{k}" in tensors:
                average[k].copy_(tensors[f"ema/{k}"])
        if f"exp_avg/{k}" in tensors:
            opt.state[p] = {"step": torch.tensor(state["adam_step"][k]),
                            "exp_avg": tensors[f"exp_avg/{k}"].to(p),
                            "exp_avg_sq": tensors[f"exp_avg_sq/{k}"].to(p)}
    return state


@contextmanager
def averaged(params: dict[str, torch.nn.Parameter], average: dict[str, torch.Tensor] | None):
    """The trained parameters hold their moving average for the block (to evaluate or ship
    it), and their own values again after it; a no-op without an average."""
    if not average:
        yield
        return
    own = {k: p.detach().clone() for k, p in params.items()}
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(average[k])
    try:
        yield
    finally:
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(own[k])


# --- the loop -------------------------------------------------------------------------------
def train(trainable: Trainable, data: TrainData, cfg: TrainConfig, target=None) -> dict:
    """Train until the step or time budget is spent; returns the final state dict."""
    if not cfg.steps and not cfg.minutes:
        raise ValueError("give a step budget, a time budget, or both")
    dev = device_of()
    torch.manual_seed(cfg.seed)
    trainable.module.to(dev).train()
    params = {k: p for k, p in trainable.module.named_parameters() if p.requires_grad}
    decay = [p for k, p in params.items() if p.ndim >= 2]
    no_decay = [p for k, p in params.items() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(0.9, 0.95))
    if not 0 <= cfg.ema < 1:
        raise ValueError("the weight average's decay must be in [0, 1) (0 = off)")
    average = {k: p.detach().clone() for k, p in params.items()} if cfg.ema else None
    state = (load_checkpoint(cfg, params, opt, average) if cfg.resume else None) or {
        "step": 0, "elapsed_s": 0.0, "tokens": 0, "evals": [], "config": asdict(cfg)}

    def scored() -> dict:
        with averaged(params, average):
            return evaluate(trainable, data, cfg, dev)

    log = (cfg.ckpt_dir / "log.jsonl")
    cfg.ckpt_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter() - state["elapsed_s"]
    budget_s = 60 * cfg.minutes if cfg.minutes else float("inf")
    bar = tqdm(total=cfg.steps or None, initial=state["step"], desc=cfg.drafter_id, unit="step")

    def done() -> bool:
        return (cfg.steps and state["step"] >= cfg.steps) or \
            time.perf_counter() - t_start >= budget_s

    if cfg.init == "shipped" and state["step"] == 0:    # the starting weights, on the same split
        seen = shards_seen(card_before(cfg)) or set()
        again = seen & span_numbers(data.meta.get("shards", ""))
        if again:
            tqdm.write(f"[{cfg.drafter_id}] the shipped weights were already trained on response "
                       f"shards {span_of(again)} of this data (their card's shards seen over "
                       "rounds)")
        state["start_eval"] = scored()
        tqdm.write(f"[{cfg.drafter_id}] step 0 (shipped weights): {state['start_eval']}")
    stats = {"loss": state.get("final_loss")}     # a resumed run may have no step left
    while not done():
        step = state["step"]
        lr = lr_at(cfg, step, time.perf_counter() - t_start)
        for g in opt.param_groups:
            g["lr"] = lr
        rng = np.random.default_rng([cfg.seed, step])
        gen = torch.Generator(device=dev).manual_seed(cfg.seed * 1_000_003 + step)
        batch = to(data.batch(rng, cfg.batch_size, cfg.seq_len), dev)
        with autocast(dev, cfg.precision):
            loss, stats = trainable.loss(batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), cfg.grad_clip)
        opt.step()
        if average:
            with torch.no_grad():
                for k, p in params.items():
                    average[k].lerp_(p.detach(), 1 - cfg.ema)
        state["step"] = step + 1
        state["tokens"] += int(batch["valid"].sum())
        state["elapsed_s"] = time.perf_counter() - t_start
        stats = {"loss": round(loss.item(), 4), "lr": lr} | {
            k: round(float(torch.as_tensor(v).detach()), 4) for k, v in stats.items()}
        bar.update(1)
        bar.set_postfix(loss=stats["loss"])
        with log.open("a") as f:
            f.write(json.dumps({"step": state["step"], **stats}) + "\n")
        if state["step"] % cfg.eval_every == 0:
            state["evals"].append({"step": state["step"], **scored()})
            tqdm.write(f"[{cfg.drafter_id}] step {state['step']}: {state['evals'][-1]}")
            save_checkpoint(cfg, params, opt, state, average)
    bar.close()
    state["final_eval"] = scored()
    state["final_loss"] = stats["loss"]
    save_checkpoint(cfg, params, opt, state, average)
    if cfg.ship and target is not None:
        with averaged(params, average):
            ship(trainable, data, cfg, state, target)
    return {k: state[k] for k in ("step", "elapsed_s", "tokens", "final_eval")}


DATA_ROW = re.compile(r"^\| training data (?:summed over rounds )?\| (\d+) sequences, (\d+) tokens "
                      r"\((\d+) response tokens\)", re.M)


def summed_data_row(previous_card: str, meta: dict) -> str:
    """A fine-tuned drafter's card row: this run's data added to what the previous weights were
    trained on (the previous card's summed row when it has one, else its 'training data' row);
    empty when the previous card states neither. A sequence seen in two rounds counts twice."""
    rows = DATA_ROW.findall(previous_card)
    if not rows:
        return ""
    before = [int(x) for x in rows[-1]]          # the summed row follows the training data row
    now = [int(meta["sequences"]), int(meta["tokens"]), int(meta["response_tokens"])]
    total = [a + b for a, b in zip(before, now)]
    return (f"| training data summed over rounds | {total[0]} sequences, {total[1]} tokens "
            f"({total[2]} response tokens): the previous weights' {before[2]} response tokens, "
            f"then this run's {now[2]} |\n")


SEEN_ROW = re.compile(r"^\| response shards seen over rounds \| ([\d, -]*) \|", re.M)


def shards_seen(card: str) -> set[int] | None:
    """The response shards a card's weights were trained on over all their rounds; None when the
    card does not say (a card written before the row existed)."""
    row = SEEN_ROW.search(card)
    return span_numbers(row[1]) if row else None


def seen_row(previous_card: str, meta: dict, init: str) -> str:
    """The card row of the response shards seen over rounds: this run's, with the previous
    weights' when fine-tuning; empty when a fine-tuned drafter's previous card does not say, or
    the run read no response shard."""
    seen = span_numbers(meta.get("shards", ""))
    if init == "shipped":
        before = shards_seen(previous_card)
        if before is None:
            return ""
        seen |= before
    return f"| response shards seen over rounds | {span_of(seen)} |\n" if seen else ""


def card_before(cfg: TrainConfig) -> str:
    """The card of the weights a fine-tuning run starts from ('' for fresh weights or none)."""
    path = weights.folder() / f"{cfg.drafter_id}.md"
    return path.read_text(encoding="utf-8") if cfg.init == "shipped" and path.exists() else ""


def earlier_sections(previous_card: str) -> str:
    """The previous card's sections (its '## ' headings to the end: engine measurements of the
    earlier weights, export notes), which a fine-tuned drafter's new card keeps below its own
    header; empty when it has none."""
    i = previous_card.find("\n## ")
    return f"\n{previous_card[i:].strip()}\n" if i >= 0 else ""


def earlier_paragraphs(previous_card: str) -> str:
    """The previous card's round paragraphs: its prose below the header table and above its first
    `## ` section, less its Reproduce paragraph (tables inside a round's prose stay). A
    fine-tuned drafter's new card keeps them below this round's note, so the card tells every
    round; empty when there are none."""
    head = previous_card.split("\n## ", 1)[0]
    lines = head.split("\n")
    table = next((i for i, x in enumerate(lines) if x.startswith("|")), len(lines))
    while table < len(lines) and lines[table].startswith("|"):
        table += 1                                      # past the header table
    rest = "\n".join(lines[table:])
    rest = re.sub(r"(?ms)^Reproduce:.*?(?=\n\s*\n|\Z)", "", rest)
    rest = re.sub(r"\n{3,}", "\n\n", rest).strip()
    return f"\n{rest}\n" if rest else ""


def start_row(state: dict) -> str:
    """A fine-tune's card row: the starting weights' held-out scores on this run's split, so the
    card's before and after are measured alike; empty for fresh weights or an older checkpoint."""
    ev = state.get("start_eval")
    return (f"| held-out simulated chain τ of the starting weights | {ev['tau']} (position-1 "
            f"acceptance {ev['acc_per_position'][0]}) |\n") if ev else ""


def ship(trainable: Trainable, data: TrainData, cfg: TrainConfig, state: dict, target) -> None:
    """Write the drafter's weights to assets/ and its model card."""
    tensors, config = trainable.export()
    vocab = shipped_vocab(dict(tensors))
    vocab_row = "" if vocab is None else (
        f"| draft vocabulary | {len(vocab)} tokens, covering {100 * data.coverage(vocab):.1f}% of "
        "the held-out response tokens (the drafter can propose no other token) |\n")
    paths = weights.save(cfg.drafter_id, tensors, config, target.fingerprint)
    n_params = sum(v.numel() for k, v in tensors.items() if v.is_floating_point())
    dev = device_of()
    hw = torch.cuda.get_device_name() if dev.type == "cuda" else \
        f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} thread(s)"
    ev = state["final_eval"]
    meta = data.meta
    chunks = int(meta.get("stdlib_chunks", 0))
    selfi = int(meta.get("self_instruct", 0))
    also = f" and to {selfi} instructions the target wrote itself (self-instruct)" if selfi else ""
    start = ("fine-tuned from the weights previously shipped in assets/ (their card's data and "
             "steps come before these)" if cfg.init == "shipped" else "fresh weights")
    before = card_before(cfg)
    summed = summed_data_row(before, meta) + seen_row(before, meta, cfg.init)
    # this round's note, then the earlier rounds' paragraphs: one blank line either side, or none
    note = (f"\n{cfg.note}\n" if cfg.note else "") + earlier_paragraphs(before)
    span = f", response shards {meta['shards']}" if meta.get("shards") else ""
    if Path(data.folder).resolve() == FEATURE_DIR.resolve():
        build = (f"`python -m specviz train --build-data \\\n--max-seqs "
                 f"{int(meta['sequences']) - chunks} --stdlib-chunks {chunks}`")
        use = ""
    else:           # a feature folder of some shards only
        build = (f"`python -m specviz train --build-data --shards S --data {data.folder}` with "
                 f"S a folder of (links to) the response shards {meta['shards']}")
        use = f" --data {data.folder}"
    card = f"""# `{cfg.drafter_id}` drafter for {target.model_id}

{trainable.describe()}

| | |
|---|---|
| shipped parameters | {n_params:,} ({', '.join(f'{p.name} {p.stat().st_size / 2**20:.1f} MiB' for p in paths)}) |
| target fingerprint | `{target.fingerprint}` |
| training data | {meta['sequences']} sequences, {meta['tokens']} tokens ({meta['response_tokens']} response tokens) of target-generated answers to the offline instruction stream (`specviz/train/sources.py`){span}{also}; {len(data.heldout_ids)} sequences held out |
{summed}| start | {start} |
| optimisation | AdamW lr {cfg.lr}, warmup {cfg.warmup}, cosine; batch {cfg.batch_size} x {cfg.seq_len} tokens; seed {cfg.seed}{f"; ships the moving average of the weights (decay {cfg.ema:g}, from the starting weights)" if cfg.ema else ""} |
| steps | {state['step']} ({state['tokens']:,} tokens seen) |
| hardware | {hw} |
| wall time | {state['elapsed_s'] / 60:.1f} min |
| held-out acceptance by position (simulated, greedy) | {ev['acc_per_position']} |
| held-out accuracy by position (each alone) | {ev['acc_unconditional']} |
| held-out simulated chain τ | {ev['tau']} (n = {ev['n']} start positions) |
{vocab_row}{start_row(state)}{note}
Reproduce: with the response shards in data/responses/ (`python -m specviz train data` writes and
extends them{f", --self-instruct {selfi}" if selfi else ""}), {build}, then
`python -m specviz train --drafter {cfg.drafter_id} --minutes {cfg.minutes} --steps {cfg.steps} \\
--batch-size {cfg.batch_size} --seq-len {cfg.seq_len} --lr {cfg.lr} --warmup {cfg.warmup}\
{" --init shipped" if cfg.init == "shipped" else ""}{f" --ema {cfg.ema:g}" if cfg.ema else ""}{use}{cfg.flags}`.
{earlier_sections(before)}"""
    weights.write_card(cfg.drafter_id, card)
