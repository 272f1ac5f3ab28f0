"""Calibrating DSpark's confidences on engine runs (ALGORITHMS.md §6; per-position temperature
and bias, train/calibrate.py), on held-out instructions that no training shard answers.

Boundary: runs the engine on the shipped `dspark` drafter, collects per step the uncalibrated
confidence logits and which drafts were accepted, fits the calibration (calibrate.py), and
writes them into the shipped weights and a section of the model card. Called by
`python -m specviz train calibrate` (`--report-on FILE` scores the shipped calibration on a prompt
file's engine runs instead).

The prompts can also come from a prompt file (`--fit-on`), e.g. the hand-written probe prompts
(data/probe.jsonl), which no shard answers and which are worded like the prompts the app
serves rather than like the instruction stream's templates.

Why engine runs and not the training file's held-out sequences: the prefix survival a_j is read
as a probability by the confidence-prefix view and by the schedulers, so it has to be one on the
prompts the app serves. Fitting on held-out crops of the training data left a_1 at 0.44 against
0.31 realized on fresh instructions (the crops are easier than fresh answers). Here each block is
drafted and verified in full (`scheduler=threshold`, threshold 0), greedy, with every temperature
at 1 and bias at 0, so c_k = σ(z_k) and the label of position k is "drafts 1..k were all
accepted". The instructions are stratified over the instruction sources (sources.py) in the
mix of the evaluation categories (MIX), from a stream range no shard covers; half the prompts
fit, the other half report, and the shipped calibration is the fit half's (what is reported
is what ships). The engine runs (z, s, prompt) can be kept in a file (`--runs`) and refitted
without rerunning the engine while the drafter's weights other than its calibration are
unchanged.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specviz import events as ev
from specviz import runner
from specviz.drafters import weights
from specviz.drafters.dspark import load_weights
from specviz.engine.decode import GenSettings
from specviz.train import calibrate, shards, sources

ID = "dspark"
FIRST_INDEX = 30_000      # calibration instructions come from stream indices [FIRST, FIRST + SPAN)
SPAN = 10_000
STREAM_VERSION = "1"      # of sources.stream: not "2", whose templates the drafters train on:
                          # its answers are easier for them than fresh prompts' (a_1 realized
                          # 0.443 on 256 version-2 instructions, 0.401 on 252 of version 1, 0.388
                          # on the dev prompts), and a fit there left the dev prompts' a_1 gap no
                          # smaller (+0.057 vs +0.054)
SECTION = "## Calibration on engine runs"


# instructions per source, in units of `per_source`: the evaluation categories the app is
# judged on (chat, code, math, summarization, QA, writing, JSON, rewriting) mapped onto the
# instruction sources. Passages serve summarization, QA and rewriting; no source writes JSON;
# `lists` matches no category (and its answers are far easier: a_1 0.59 realized vs 0.24-0.35).
MIX = {"chat": 1, "code": 1, "math": 1, "writing": 1, "passage": 3}


def instructions(per_source: int, seed: int = 0) -> list[dict]:
    """MIX[source] x `per_source` instructions of each source, in stream order."""
    by = defaultdict(list)
    for it in sources.take(SPAN, FIRST_INDEX, seed, STREAM_VERSION):
        if len(by[it["source"]]) < MIX.get(it["source"], 0) * per_source:
            by[it["source"]].append(it)
    missing = [k for k, n in MIX.items() if len(by[k]) < n * per_source]
    if missing:
        raise RuntimeError(f"the calibration range has too few {', '.join(missing)} instructions")
    return sorted((it for items in by.values() for it in items), key=lambda it: it["index"])


def check_unused(folder=shards.SHARD_DIR, seed: int = 0) -> None:
    """Fail when a response shard of the same stream answers an index of the calibration range."""
    for path in shards.shard_paths(folder):
        m = shards.meta(path)
        if m["stream"] == "pool" and m["seed"] == seed and \
                m["stream_version"] == STREAM_VERSION and \
                m["first"] < FIRST_INDEX + SPAN and m["first"] + m["count"] > FIRST_INDEX:
            raise RuntimeError(f"{path.name} answers stream indices {m['first']}.."
                               f"{m['first'] + m['count'] - 1}, inside the calibration range "
                               f"{FIRST_INDEX}..{FIRST_INDEX + SPAN - 1}: move FIRST_INDEX")


def collect(target, prompts: list[str], max_new_tokens: int, log=print
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Engine runs of `dspark` at uncalibrated confidences: (z [N, γ], s [N, γ], prompt [N])
    over all steps of all prompts, z_k the uncalibrated logit of c_k, s_k = 1 when drafts 1..k
    were accepted, and the index of the prompt each block belongs to."""
    zs, ss, rows = [], [], []
    for i, prompt in enumerate(prompts):
        spec = runner.prepare(target, strategy=ID, prompt_ids=runner.encode(target, prompt),
                              gen=GenSettings(max_new_tokens=max_new_tokens),
                              overrides={"scheduler": "threshold", "threshold": 0.0})
        spec.drafter.model.temperature.fill_(1.0)
        spec.drafter.model.calibration_bias.zero_()
        conf = None
        for e in runner.events(target, spec):
            if isinstance(e, ev.ScheduleDecided):
                conf = e.confidence
            elif isinstance(e, ev.Accepted) and conf is not None:
                c = torch.tensor(conf, dtype=torch.double).clamp(1e-12, 1 - 1e-12)
                zs.append(torch.log(c) - torch.log1p(-c))
                ss.append((torch.arange(len(conf)) < e.n_accepted).double())
                rows.append(i)
                conf = None
        log(f"calibration prompt {i + 1}/{len(prompts)}: {len(zs)} blocks so far")
    return torch.stack(zs), torch.stack(ss), torch.tensor(rows)


POSITIONS = 4     # the goal is judged on a_1..a_4, per position and pooled over them


def by_position(a: torch.Tensor, s: torch.Tensor) -> list[dict]:
    """Per position j = 1..POSITIONS: mean a_j, realized survival, their gap and the ECE."""
    return [{"position": j + 1, "mean_a": float(a[:, j].mean()), "realized": float(s[:, j].mean()),
             "gap": float(a[:, j].mean() - s[:, j].mean()), "ece": calibrate.ece(a[:, j], s[:, j])}
            for j in range(min(POSITIONS, a.shape[1]))]


def score(z: torch.Tensor, s: torch.Tensor, temps: torch.Tensor, biases: torch.Tensor) -> dict:
    """a_j under (`temps`, `biases`) against the survival labels: per position (by_position),
    and the ECE and AUC pooled over positions 1..POSITIONS."""
    a, p = calibrate.survival(z.float(), temps, biases), POSITIONS
    return {"by_position": by_position(a, s), "ece": calibrate.ece(a[:, :p], s[:, :p]),
            "auc": calibrate.auc(a[:, :p], s[:, :p])}


def fit(z: torch.Tensor, s: torch.Tensor, fit_rows: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Temperatures and biases fitted on the rows `fit_rows` (bool [N]), rounded as shipped
    (bf16), and their score on the other rows."""
    temps, biases = (t.to(torch.bfloat16).float()
                     for t in calibrate.sequential_fit(z[fit_rows], s[fit_rows]))
    return temps, biases, {"after": score(z[~fit_rows], s[~fit_rows], temps, biases),
                           "blocks_fit": int(fit_rows.sum()),
                           "blocks_report": int((~fit_rows).sum())}


def report_on(target, prompts: list, max_new_tokens: int, log=print) -> dict:
    """The shipped calibration scored on engine runs of any prompts (a prompt file of the kind
    the app is judged on, say); nothing is fitted or written. Per position (by_position) and
    pooled over positions 1..POSITIONS, as `score`."""
    tensors, _ = load_weights(target)
    z, s, _ = collect(target, prompts, max_new_tokens, log)
    return score(z, s, tensors["temperature"], tensors["calibration_bias"]) | {
        "blocks": int(z.shape[0]), "prompts": len(prompts)}


def card_section(report: dict, cmd: str) -> str:
    before, after = report["before"], report["after"]
    rows = "\n".join(
        f"| {b['position']} | {b['mean_a']:.3f} | {a['mean_a']:.3f} | {a['realized']:.3f} | "
        f"{a['gap']:+.3f} | {b['ece']:.3f} | {a['ece']:.3f} |"
        for b, a in zip(before["by_position"], after["by_position"]))
    what = (f"{report['prompts']} prompts of {report['prompt_file']}, which no training shard "
            "answers" if "prompt_file" in report else
            f"{report['prompts']} held-out instructions: {report['per_source']} x {MIX} by "
            f"instruction source, the evaluation categories' mix; stream indices "
            f"{FIRST_INDEX}..{FIRST_INDEX + SPAN - 1}")
    return (f"{SECTION}\n\n"
            f"`{cmd}` ({what}; greedy, {report['max_new_tokens']} new "
            f"tokens, the full block verified). Fit on half the prompts ({report['blocks_fit']} "
            f"blocks), reported on the other half ({report['blocks_report']} blocks). "
            f"c_k = σ(z_k / T_k + b_k) with temperatures T_k: "
            f"{[round(t, 3) for t in report['temperatures']]} and biases b_k: "
            f"{[round(b, 3) for b in report['biases']]}. \"Before\" is the calibration the shipped "
            f"weights carried when this ran.\n\n"
            "| position j | mean a_j before | mean a_j after | realized survival | gap after | "
            "ECE before | ECE after |\n|---|---|---|---|---|---|---|\n"
            f"{rows}\n\nPositions 1-{POSITIONS} pooled: ECE {before['ece']:.3f} before, "
            f"{after['ece']:.3f} after; AUC {after['auc']:.3f}.\n")


def weights_digest(target) -> str:
    """sha256 of the shipped drafter's tensors other than its calibration (which `train
    calibrate` rewrites and collect() resets): saved runs are valid while it is unchanged."""
    tensors, _ = weights.load(ID, target.fingerprint)
    h = hashlib.sha256()
    for k in sorted(tensors):
        if k not in ("temperature", "calibration_bias"):
            h.update(k.encode() + tensors[k].contiguous().numpy().tobytes())
    return h.hexdigest()


def save_runs(path: Path, z: torch.Tensor, s: torch.Tensor, prompt: torch.Tensor,
              key: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"z": z.contiguous(), "s": s.contiguous(), "prompt": prompt.contiguous()}, str(path),
              metadata={k: str(v) for k, v in key.items()})


def saved_runs(path: Path, about: dict) -> tuple[torch.Tensor, ...] | None:
    """(z, s, prompt) from a runs file written for the same weights and settings, else None."""
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if any(meta.get(k) != str(v) for k, v in about.items()):
        return None
    t = load_file(str(path))
    return t["z"], t["s"], t["prompt"]


def run(target, per_source: int = 8, max_new_tokens: int = 128, ship: bool = True,
        cmd: str = "python -m specviz train calibrate", runs: Path | None = None,
        prompt_file: Path | None = None, log=print) -> dict:
    """Collect on fresh calibration instructions, or on the prompts of `prompt_file` (bench's
    jsonl; hand-written ones such as data/probe.jsonl are worded like the prompts the app
    serves), or reuse `runs` when it holds this drafter's runs at these settings (a new
    collection is saved there); fit, and (with `ship`) write the result."""
    if prompt_file is not None:
        from specviz.bench import read_prompts
        from specviz.train.data import file_digest
        prompts = [p.prompt for p in read_prompts(prompt_file)]
        about = {"prompts": len(prompts), "prompt_file": Path(prompt_file).name,
                 "prompt_sha256": file_digest(Path(prompt_file)), "max_new_tokens": max_new_tokens}
    else:
        check_unused()
        prompts = [it["prompt"] for it in instructions(per_source)]
        about = {"prompts": len(prompts), "per_source": per_source,
                 "max_new_tokens": max_new_tokens}
    key = about | {"weights": weights_digest(target)}
    kept = saved_runs(Path(runs), key) if runs else None
    if kept is not None:
        log(f"reusing the engine runs in {runs}")
        z, s, prompt = kept
    else:
        z, s, prompt = collect(target, prompts, max_new_tokens, log)
        if runs:
            save_runs(Path(runs), z, s, prompt, key)
    return fit_and_ship(target, z, s, prompt, ship=ship, cmd=cmd, about=about)


def fit_and_ship(target, z: torch.Tensor, s: torch.Tensor, prompt: torch.Tensor, *, ship: bool,
                 cmd: str, about: dict) -> dict:
    """Fit on the even prompts, report on the odd ones against the calibration in use, and
    (with `ship`) write the fitted one into the shipped weights and the card section."""
    tensors, cfg = load_weights(target)
    fit_rows = prompt % 2 == 0
    temps, biases, report = fit(z, s, fit_rows)
    report |= about | {"temperatures": temps.tolist(), "biases": biases.tolist(),
                       "before": score(z[~fit_rows], s[~fit_rows], tensors["temperature"],
                                       tensors["calibration_bias"])}
    if ship:
        tensors["temperature"], tensors["calibration_bias"] = temps, biases
        cfg.setdefault("calibration", {})["engine"] = {
            k: report[k] for k in ("after", "blocks_fit", "blocks_report")}
        weights.save(ID, tensors, cfg, target.fingerprint)
        card = weights.folder() / f"{ID}.md"
        weights.write_card(ID, weights.with_section(card.read_text(), card_section(report, cmd)))
    return report
