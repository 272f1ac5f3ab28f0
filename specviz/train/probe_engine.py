"""The engine runs behind `train probe --engine`, and their cache.

A weight set's greedy engine runs over the probe prompts are kept in the probe folder (engine/),
under a key of what they depend on besides the weights: the variant, the answer length, the
probe's answers, the target and the source the engine runs (specviz outside train/, ui/ and viz/,
which it never imports, and this module; not probe.py, whose statistics and card text read the
runs but do not make them), with the digest of each weight file the runs read. They are reused
for any folder whose files of those names match, so new weights of one drafter leave the
others' runs valid.

Boundary: making, keying and keeping engine runs; no statistics (probe.py), no weights written.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

import numpy as np

from specviz.drafters import weights
from specviz.train import data as D


def engine_runs(target, variant: str, refs: list[tuple[list[int], list[int]]], assets: Path,
                max_new_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(new tokens, target forwards, greedy match) per prompt of the engine's greedy runs of
    `variant` (a bench variant, "ID[:KEY=VALUE...]") with the weights in `assets`, on the
    prompts of `refs` (prompt ids, the target's own greedy answer). A run matches when it
    reproduces that answer, tie-aware as `bench` judges it against `ar`."""
    from specviz import runner, strategies
    from specviz.bench import greedy_match
    from specviz.engine.decode import GenSettings
    sid, overrides = strategies.parse_variant(variant)
    tokens, forwards, matches = [], [], []
    with weights.use(assets):
        strategies.forget(target)     # drafters are built anew from this folder
        try:
            for prompt_ids, answer in refs:
                run = runner.generate(target, strategy=sid, prompt_ids=prompt_ids,
                                      gen=GenSettings(max_new_tokens=max_new_tokens),
                                      overrides=overrides)
                tokens.append(len(run.token_ids))
                forwards.append(run.finished.target_forwards)
                matches.append(greedy_match(target, prompt_ids, answer, run.token_ids))
        finally:
            strategies.forget(target)
    return (np.array(tokens, dtype=float), np.array(forwards, dtype=float),
            np.array(matches, dtype=bool))


def engine_key(target, variant: str, refs: list[tuple[list[int], list[int]]],
               max_new_tokens: int) -> str:
    """What `engine_runs` returns depends on, besides the weights it reads: the variant, the
    answer length, the prompts and answers, the target and `engine_sources`."""
    import specviz
    root = Path(specviz.__file__).parent
    h = hashlib.sha256(json.dumps([variant, max_new_tokens, target.fingerprint, refs]).encode())
    for p in engine_sources():
        h.update(f"{p.relative_to(root)}\0{D.file_digest(p)}\0".encode())
    return h.hexdigest()[:24]


def engine_sources() -> list[Path]:
    """The source files the engine runs read: specviz outside the train, ui and viz packages
    (which it never imports), and this module."""
    import specviz
    root = Path(specviz.__file__).parent
    return [p for p in sorted(root.rglob("*.py"))
            if p.relative_to(root).parts[0] not in ("train", "ui", "viz")] + [Path(__file__)]


def digests(assets: Path, names) -> dict[str, str | None]:
    """{file name: its digest in `assets`, None when it is not there}."""
    return {n: D.file_digest(Path(assets) / n) if (Path(assets) / n).exists() else None
            for n in names}


def cached_engine_runs(target, variant: str, refs: list[tuple[list[int], list[int]]],
                       assets: Path, max_new_tokens: int, cache: Path | None,
                       log=print) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`engine_runs`, read from `cache` when runs were made before under the same key with weight
    files equal to those of `assets`, else made and kept there (no cache: always made)."""
    path = Path(cache) / f"{engine_key(target, variant, refs, max_new_tokens)}.json" \
        if cache is not None else None
    kept = read_kept(path, variant)
    now = digests(assets, {n for entry in kept["runs"] for n in entry["weights"]})
    for entry in kept["runs"]:
        if {n: now[n] for n in entry["weights"]} == entry["weights"]:
            log(f"engine: {variant} with {assets}: the runs made before with these weights "
                f"({path.name}, made with {entry['assets']})")
            return (np.array(entry["tokens"], dtype=float),
                    np.array(entry["forwards"], dtype=float),
                    np.array(entry["matches"], dtype=bool))
    log(f"engine: {variant} with {assets}, {len(refs)} prompts")
    with weights.recording() as read:
        runs = engine_runs(target, variant, refs, assets, max_new_tokens)
    if path is not None:
        keep(path, variant, {"weights": digests(assets, sorted({p.name for p in read})),
                             "assets": str(assets), "tokens": runs[0].tolist(),
                             "forwards": runs[1].tolist(), "matches": runs[2].tolist()})
    return runs


def read_kept(path: Path | None, variant: str) -> dict:
    """The cache file `path` ({variant, runs}); empty when there is none."""
    return json.loads(path.read_text(encoding="utf-8")) if path and path.exists() else \
        {"variant": variant, "runs": []}


def keep(path: Path, variant: str, entry: dict) -> None:
    """Append `entry` to the cache file `path`, read again under an exclusive lock: probes of
    other weight sets run in parallel processes, and each keeps the runs the others wrote while
    it ran."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = read_kept(path, variant)
        kept["runs"].append(entry)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(kept), encoding="utf-8")
        tmp.replace(path)
