"""A weight average ("model soup") of fine-tunes of one drafter (`python -m specviz train soup`).

Fine-tunes that start from the same weights stay in one basin of the loss, so the average of
their weights is itself a working drafter, and often a better one on data none of them was
tuned on: the uniform soup of Wortsman et al. (2022, "Model soups"), and WiSE-FT's average of
the starting and the fine-tuned weights (Wortsman et al., "Robust fine-tuning of zero-shot
models"). Here the probe prompts play that part: a fine-tune on the templated instruction
stream gains on its own held-out split and loses a little on the hand-written probe, and the
average of the shipped weights with such fine-tunes gained there a little (about +0.01 in τ
for eagle1, eagle3 and mtp in 2026-12: their model cards). `train --ema` (train/loop.py) makes
the same kind of average within one run.

Boundary: reading the ingredients (one drafter's weights in several assets folders), checking
that they can be averaged (the same target, configuration, tensor names and shapes, integer
tensors such as the draft vocabulary equal), the average and writing it with a card section
that names the ingredients. Which ingredients to average, and whether the soup ships, is the
probe's call (`train probe`), as for any fine-tune.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from specviz.drafters import weights
from specviz.drafters.base import DrafterUnavailable
from specviz.train import data as D


class SoupError(ValueError):
    """The ingredients cannot be averaged; the message says which and why."""


def _fingerprint(drafter_id: str, assets: Path) -> str:
    """The target fingerprint the folder's weights of the drafter were trained for."""
    paths = weights.files(drafter_id, assets)
    if not paths:
        raise SoupError(f"no {drafter_id} weights in {assets}")
    with safe_open(str(paths[0]), framework="pt") as f:
        return (f.metadata() or {}).get("fingerprint", "")


def digest(drafter_id: str, assets: Path) -> str:
    """A folder's weight files of the drafter, by content (`data.file_digest`, as the probe's
    engine cache names them): names an ingredient."""
    return ", ".join(D.file_digest(path) for path in weights.files(drafter_id, assets))


def average(drafter_id: str, folders: list[Path]) -> tuple[dict[str, torch.Tensor], dict, str]:
    """(the uniform average of the folders' weights, their configuration, their target's
    fingerprint). Floating tensors are averaged in float32; integer ones must be equal."""
    if len(folders) < 2:
        raise SoupError("a soup needs at least two assets folders")
    fingerprint = _fingerprint(drafter_id, folders[0])
    try:       # load checks each folder's target against the first's
        sets = [weights.load(drafter_id, fingerprint, folder) for folder in folders]
    except DrafterUnavailable as exc:
        raise SoupError(f"{exc} (the first ingredient, {folders[0]}, sets the target)") from None
    (first, config), rest = sets[0], sets[1:]
    for folder, (tensors, cfg) in zip(folders[1:], rest):
        if cfg != config:
            raise SoupError(f"{folder}: another {drafter_id} configuration than {folders[0]}'s "
                            f"({cfg} vs {config})")
        if set(tensors) != set(first):
            raise SoupError(f"{folder}: other tensors than {folders[0]}'s "
                            f"({sorted(set(tensors) ^ set(first))[:4]})")
        for k, v in tensors.items():
            if v.shape != first[k].shape:
                raise SoupError(f"{folder}: {k} is {tuple(v.shape)}, not {tuple(first[k].shape)}")
            if not v.is_floating_point() and not torch.equal(v, first[k]):
                raise SoupError(f"{folder}: {k} differs from {folders[0]}'s (another draft "
                                "vocabulary?): only fine-tunes of the same weights average")
    out = {k: torch.stack([t[k] for t, _ in sets]).mean(0) if v.is_floating_point() else v
           for k, v in first.items()}
    return out, config, fingerprint


def card_section(drafter_id: str, folders: list[Path], command: str, note: str) -> str:
    rows = "\n".join(f"| `{f}` | `{digest(drafter_id, f)}` |" for f in folders)
    return (f"## Weight average of {len(folders)} weight sets\n\n"
            f"`{command}`: the uniform average of these folders' `{drafter_id}` weights (every "
            "floating tensor; the draft vocabulary is theirs, the same in all):\n\n"
            f"| ingredient | sha256 of its weight files (first 16 hex digits) |\n|---|---|\n{rows}\n"
            + (f"\n{note}\n" if note else ""))


def make(drafter_id: str, folders: list[Path], out: Path, command: str, note: str = ""
         ) -> list[Path]:
    """Average the folders' weights into `out` (an assets folder) and put the section into its
    card (the first folder's card when `out` has none)."""
    tensors, config, fingerprint = average(drafter_id, folders)
    section = card_section(drafter_id, folders, command, note)
    card = out / f"{drafter_id}.md"
    old = (card if card.exists() else folders[0] / f"{drafter_id}.md")
    text = old.read_text(encoding="utf-8") if old.exists() else f"# `{drafter_id}`\n"
    paths = weights.save(drafter_id, tensors, config, fingerprint, out)
    weights.write_card(drafter_id, weights.with_section(text, section), out)
    return paths
