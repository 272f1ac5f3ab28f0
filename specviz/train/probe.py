"""`python -m specviz train probe`: score drafter weights on a fixed probe set, teacher-forced.

The probe set (data/probe.jsonl, 96 hand-written prompts in the dev categories, other topics and
wordings than both the dev prompts and the instruction stream, never trained on) is answered
greedily by the target once; those answers are featurised like the training data and cached in
artifacts/train/probe/ (rebuilt when the target, the prompt file or the answer length changes).
A drafter's simulated chain τ is then measured on every response position of every answer, one
sequence at a time, so the score is deterministic and has ~10k positions behind it, where the
held-out split of the training data shares its templates with the training sequences (it cannot
rank changes, card notes of 2026-12-03) and the 16 dev prompts give ~1.5k. Several weight sets
(assets folders) are scored on the same positions, with a 95% interval over prompts from a
bootstrap, and paired against the first one.

`--engine VARIANT` adds what the teacher-forced chain cannot see (the tree, the engine's own
drafting): each weight set's engine τ (new tokens per target forward, timing-free with
auto_budget=false) over the same prompts, greedy, paired by prompt with a bootstrap interval,
and how many runs reproduce the target's cached answer (tie-aware, as `bench` judges against `ar`).
A weight set's engine runs are kept in the probe folder (engine/; `probe_engine`), so scoring a
new candidate against the same shipped weights runs the engine for the candidate only (a run
costs up to 15 minutes of one core).

`--card LABEL` also writes the reports into the model card of the last weight set (the candidate),
as a section headed by LABEL ("round 13", say) above the card's earlier sections.

Boundary: scores, that one card section and the engine runs' cache; nothing timed, no weights
written.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import torch

from specviz.drafters import weights
from specviz.train import data as D
from specviz.train import probe_engine
from specviz.train.loop import LAYER, acceptance, autocast, init_from

PROBE_FILE = Path("data/probe.jsonl")
PROBE_DIR = D.DATA_DIR / "probe"
BATCH = 16          # prompts per generate call
RESAMPLES = 2000    # bootstrap resamples of the prompts


def features(target, prompts_file: Path = PROBE_FILE, folder: Path = PROBE_DIR,
             max_new_tokens: int = 128, log=print) -> Path:
    """The probe's feature folder for `target`: built unless a current one is there."""
    from specviz.bench import read_prompts
    prompts = read_prompts(prompts_file)
    taps = D.taps_for(target.n_layers)
    want = {"format": D.FORMAT, "fingerprint": target.fingerprint, "taps": json.dumps(list(taps)),
            "topk": str(D.TOPK), "source": prompts_file.name,
            "source_sha256": D.file_digest(prompts_file), "max_new_tokens": str(max_new_tokens)}
    path = Path(folder) / "probe.safetensors"
    if D.training_files(Path(folder)):
        raise D.FeatureError(f"{folder} holds training features; the probe's answers must never "
                             "join the training data: give the probe a folder of its own")
    if path.exists() and all(D.metadata(path).get(k) == v for k, v in want.items()):
        return Path(folder)
    log(f"answering the {len(prompts)} probe prompts greedily ({max_new_tokens} new tokens at "
        "most) and featurising the answers, once")
    ids = [target.encode(p.prompt) for p in prompts]
    answers = []
    for i in range(0, len(ids), BATCH):
        answers += D.generate_batch(target, ids[i:i + BATCH], max_new_tokens)
    rows = [{"prompt_ids": p, "response_ids": r, "category": c.category}
            for p, r, c in zip(ids, answers, prompts)]
    Path(folder).mkdir(parents=True, exist_ok=True)
    D.write_features(target, rows, path, taps, want)
    return Path(folder)


def trainable_for(target, drafter_id: str, assets: Path):
    """The drafter's training module holding the weights of `assets` (as shipped there)."""
    from specviz.train import cli
    tensors, _ = weights.load(drafter_id, target.fingerprint, assets=Path(assets))
    argv = ["--drafter", drafter_id]
    if drafter_id in cli.DEEPENABLE:     # as deep as the weights are
        deepest = max(int(m.group(1)) for k in tensors if (m := LAYER.search(k)))
        argv += ["--layers", str(deepest + 1)]
    args = cli.parser().parse_args(argv)
    args.shipped_vocab = D.shipped_vocab(tensors)
    module, fn = cli.TRAINERS[drafter_id].split(":")
    trainable = getattr(importlib.import_module(module), fn)(target, args)
    init_from(getattr(trainable, "export_root", trainable.module), tensors)
    trainable.module.eval()
    return trainable


def hits_by_prompt(trainable, folder: Path, precision: str = "auto") -> list[torch.Tensor]:
    """Per probe sequence (file order), the [n, D] hits of the drafter's teacher-forced chain."""
    data = D.TrainData(folder, trainable.taps)
    dev = torch.device("cpu")
    out = []
    with torch.no_grad(), autocast(dev, precision):
        for s, n in enumerate(data.lengths):
            batch = {k: v[None] for k, v in data.crop(s, 0, n).items()}
            out.append(trainable.evaluate(batch).cpu())
    return out


def lead(hits: torch.Tensor) -> torch.Tensor:
    """Accepted drafts per start position (leading hits) of an [n, D] hits tensor."""
    return hits.long().cumprod(-1).sum(-1) if len(hits) else torch.zeros(0, dtype=torch.long)


def resampled(num: np.ndarray, den: np.ndarray, seed: int = 0) -> np.ndarray:
    """Σ num / Σ den over RESAMPLES bootstrap resamples of the prompts (positions within one
    answer are not independent); arrays of one length and seed share their resamples, so two
    weight sets' figures pair."""
    pick = np.random.default_rng(seed).integers(len(num), size=(RESAMPLES, len(num)))
    return num[pick].sum(1) / np.maximum(den[pick].sum(1), 1)


def ci95(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return round(float(lo), 4), round(float(hi), 4)


def sums(per_prompt: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: (sum of the values, their count)."""
    return (np.array([float(x.sum()) for x in per_prompt]),
            np.array([len(x) for x in per_prompt], dtype=float))


def paired(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
           seed: int = 0) -> dict:
    """Ratio Σnum/Σden of b minus that of a, per-prompt (num, den) arrays of the same prompts,
    with a 95% bootstrap interval over prompts."""
    delta = b[0].sum() / max(b[1].sum(), 1) - a[0].sum() / max(a[1].sum(), 1)
    return {"delta": round(float(delta), 4),
            "ci95": ci95(resampled(*b, seed) - resampled(*a, seed))}


def by_category(categories: list[str], num: np.ndarray, den: np.ndarray) -> dict[str, float]:
    """Σ num / Σ den over each category's prompts (per-prompt arrays), categories with den > 0."""
    cats = np.array(categories)
    return {c: float(num[cats == c].sum() / den[cats == c].sum())
            for c in dict.fromkeys(categories) if den[cats == c].sum() > 0}


def paired_with_first(reports: list[dict], per_prompt: list[tuple[np.ndarray, np.ndarray]]
                      ) -> list[dict]:
    """Each report after the first gains `vs_first`: its (num, den) per prompt paired with the
    first folder's."""
    for r, x in zip(reports[1:], per_prompt[1:]):
        r["vs_first"] = paired(per_prompt[0], x)
    return reports


def score(target, drafter_id: str, assets_dirs: list[Path], folder: Path,
          categories: list[str], precision: str = "auto") -> list[dict]:
    """One report per assets folder: τ with its interval, acceptance by position, τ by
    category, and (after the first) the paired difference to the first."""
    reports, per_prompt = [], []
    for assets in assets_dirs:
        per = hits_by_prompt(trainable_for(target, drafter_id, assets), folder, precision)
        leads = sums([lead(h) for h in per])
        lo, hi = ci95(resampled(*leads))
        r = acceptance(torch.cat(per)) | {"assets": str(assets), "ci95": (round(1 + lo, 4), round(1 + hi, 4))}
        r["tau_by_category"] = {c: round(1 + t, 3) for c, t in by_category(categories, *leads).items()}
        reports.append(r)
        per_prompt.append(leads)
    return paired_with_first(reports, per_prompt)


def answers(folder: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy answer) per probe prompt, in prompt-file order, as the
    probe's feature folder holds them."""
    data = D.TrainData(folder)
    out = []
    for s, n in enumerate(data.lengths):
        ids = data.crop(s, 0, n)["tokens"].tolist()
        out.append((ids[:data.response_start[s]], ids[data.response_start[s]:]))
    return out


def engine_score(target, variants: list[str], assets_dirs: list[Path],
                 refs: list[tuple[list[int], list[int]]], categories: list[str],
                 max_new_tokens: int, log=print, cache: Path | None = None) -> list[dict]:
    """One report per variant and assets folder (variants outer): the engine τ of the variant
    over the prompts of `refs` (see `engine_runs`, kept in `cache` when given) with its interval,
    the greedy match rate against the target's answers, τ by category, and (after the first)
    the paired difference to the first report: another weight set, or another variant of the
    same weights (a tree shape, a budget)."""
    reports, per_prompt = [], []
    for variant, assets in ((v, a) for v in variants for a in assets_dirs):
        *runs, matches = probe_engine.cached_engine_runs(target, variant, refs, assets,
                                                         max_new_tokens, cache, log)
        reports.append({"assets": str(assets), "variant": variant,
                        "tau": round(float(runs[0].sum() / runs[1].sum()), 4),
                        "ci95": ci95(resampled(*runs)), "tokens": int(runs[0].sum()),
                        "target_forwards": int(runs[1].sum()),
                        "greedy_match_rate": round(float(matches.mean()), 4),
                        "tau_by_category": {c: round(t, 3) for c, t in
                                            by_category(categories, *runs).items()}})
        per_prompt.append(runs)
    return paired_with_first(reports, per_prompt)


def interval(r: dict) -> str:
    lo, hi = r["ci95"]
    return f"{r['tau']:.3f} [{lo:.3f}, {hi:.3f}]"


def signed(x: float) -> str:
    """x with its sign and 3 decimals, or 4 where 3 would hide which side of 0 it lies."""
    return f"{x:+.3f}" if x == 0 or abs(x) >= 5e-4 else f"{x:+.4f}"


def difference(r: dict) -> str:
    if "vs_first" not in r:
        return "–"
    d = r["vs_first"]
    return f"**{signed(d['delta'])}** [{signed(d['ci95'][0])}, {signed(d['ci95'][1])}]"


def card_section(label: str, command: str, prompts: str, reports: list[dict],
                 engine: list[dict]) -> str:
    """A model-card section of a probe: per weight set (a row each, named by its folder), the
    teacher-forced τ and, when the engine ran, the engine τ and its greedy match rate, each with
    its interval and its paired difference to the first set; then τ by category."""
    cols = "| weights | teacher-forced chain τ | vs the first |"
    rule = "|---|---|---|"
    if engine:
        cols += f" engine τ (`{engine[0]['variant']}`) | vs the first | greedy match |"
        rule += "---|---|---|"
    rows = []
    for i, r in enumerate(reports):
        row = f"| `{r['assets']}` | {interval(r)} | {difference(r)} |"
        if engine:
            e = engine[i]
            row += f" {interval(e)} | {difference(e)} | {e['greedy_match_rate']:.2f} |"
        rows.append(row)
    n = len(reports)
    cats = "\n".join(
        f"| {c} | " + " | ".join(
            f"{r['tau_by_category'][c]:.2f}" + (f" / {e['tau_by_category'][c]:.2f}" if e else "")
            for r, e in zip(reports, engine or [None] * n)) + " |"
        for c in reports[0]["tau_by_category"])
    return (f"## Measured on the probe prompts ({label})\n\n"
            f"`{command}`: {prompts} (hand-written, in the dev categories; no training shard "
            "answers them). Teacher-forced on the target's greedy answers; the engine runs "
            "greedy and is matched against those answers. 95% bootstrap intervals over "
            f"prompts; each weight set after the first is paired with the first by prompt "
            f"({reports[0]['n']} teacher-forced start positions"
            + (f"; the engine: {', '.join(str(e['target_forwards']) for e in engine)} target "
               "forwards" if engine else "") + ").\n\n"
            f"{cols}\n{rule}\n" + "\n".join(rows) + "\n\n"
            "τ by category, teacher-forced" + (" / engine" if engine else "") + ":\n\n"
            "| category | " + " | ".join(f"`{r['assets']}`" for r in reports) + " |\n"
            "|---|" + "---|" * n + "\n" + cats + "\n")
