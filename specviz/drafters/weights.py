"""Shipped drafter weights: safetensors files in assets/ with the target fingerprint and config,
and a model card per drafter.

Boundary: files only. The folder is `SPECVIZ_ASSETS` (default assets/), or the one `use(dir)` sets
for the code inside it (a context variable: another thread keeps its own), so that one process can
run the engine on two weight sets in turn (`train probe --engine`); `recording()` lists the
files `load` reads inside it (what a cached engine run depends on). `save` writes
`<id>.safetensors` (or `<id>-00001-of-0000N...` shards, each at most MAX_FILE_BYTES) in bf16 for
floating tensors; `load` checks the fingerprint and returns (tensors, config), raising
DrafterUnavailable with a how-to-fix message when the files are missing or were trained for
another target.
"""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specviz.drafters.base import DrafterUnavailable

ASSETS = Path(os.environ.get("SPECVIZ_ASSETS", Path(__file__).resolve().parents[2] / "assets"))
MAX_FILE_BYTES = 16 * 1024 * 1024 - 64 * 1024   # under 16 MiB with room for the header
_folder: ContextVar[Path] = ContextVar("assets", default=ASSETS)
_read: ContextVar[list[Path] | None] = ContextVar("read", default=None)


def folder() -> Path:
    """The assets folder weights are read from and written to here and now."""
    return _folder.get()


@contextmanager
def use(assets: Path):
    """Read and write weights in `assets` inside the block (drafters built there keep theirs)."""
    token = _folder.set(Path(assets))
    try:
        yield
    finally:
        _folder.reset(token)


@contextmanager
def recording():
    """Yields a list that collects every weight file `load` reads inside the block."""
    read: list[Path] = []
    token = _read.set(read)
    try:
        yield read
    finally:
        _read.reset(token)


def files(drafter_id: str, assets: Path | None = None) -> list[Path]:
    assets = assets or folder()
    single = assets / f"{drafter_id}.safetensors"
    if single.exists():
        return [single]
    return sorted(assets.glob(f"{drafter_id}-*-of-*.safetensors"))


def save(drafter_id: str, tensors: dict[str, torch.Tensor], config: dict, fingerprint: str,
         assets: Path | None = None, dtype: torch.dtype = torch.bfloat16) -> list[Path]:
    """Write the weights (floating tensors cast to dtype), sharded under MAX_FILE_BYTES."""
    assets = assets or folder()
    assets.mkdir(parents=True, exist_ok=True)
    for old in files(drafter_id, assets):
        old.unlink()
    ready = {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous()
             for k, v in tensors.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(ready):
        n = ready[k].numel() * ready[k].element_size()
        if n > MAX_FILE_BYTES:
            raise ValueError(f"tensor {k} alone is {n} bytes, over the per-file limit")
        if size + n > MAX_FILE_BYTES:
            shards.append({})
            size = 0
        shards[-1][k] = ready[k]
        size += n
    meta = {"drafter": drafter_id, "fingerprint": fingerprint, "config": json.dumps(config)}
    paths = [assets / f"{drafter_id}.safetensors"] if len(shards) == 1 else [
        assets / f"{drafter_id}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        for i in range(len(shards))]
    for path, shard in zip(paths, shards):
        save_file(shard, str(path), metadata=meta)
    return paths


def load(drafter_id: str, fingerprint: str, assets: Path | None = None,
         train_hint: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors in float32 / their integer type, config) for the drafter, checked against the
    target's fingerprint."""
    assets = assets or folder()
    hint = train_hint or drafter_id
    paths = files(drafter_id, assets)
    if not paths:
        raise DrafterUnavailable(f"{drafter_id} weights not found in {assets}; train them with: "
                                 f"python -m specviz train --drafter {hint}")
    if (read := _read.get()) is not None:
        read.extend(paths)
    tensors: dict[str, torch.Tensor] = {}
    config: dict = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("fingerprint") != fingerprint:
                raise DrafterUnavailable(
                    f"{path.name} was trained for another target (fingerprint "
                    f"{meta.get('fingerprint')}, this target is {fingerprint}); retrain with: "
                    f"python -m specviz train --drafter {hint}")
            config = json.loads(meta.get("config", "{}"))
            for k in f.keys():
                t = f.get_tensor(k)
                tensors[k] = t.float() if t.is_floating_point() else t
    return tensors, config


def write_card(drafter_id: str, text: str, assets: Path | None = None) -> Path:
    path = (assets or folder()) / f"{drafter_id}.md"
    path.write_text(text)
    return path


def with_section(card: str, section: str) -> str:
    """The card with `section` (markdown that starts with its `## ` heading line) in place of the
    card's section of the same heading, else inserted before the card's first `## ` heading: the
    newest measurements come first, below the header."""
    heading = section.split("\n", 1)[0]
    card = re.sub(rf"\n{re.escape(heading)}\n.*?(?=\n## |\Z)", "", card, flags=re.S)
    head, sep, rest = card.partition("\n## ")
    return head.rstrip() + "\n\n" + section.rstrip() + "\n" + (sep + rest if sep else "")
