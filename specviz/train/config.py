"""The settings of one training run, and their defaults.

Boundary: a plain dataclass with no torch or drafter imports, so that the `train` CLI takes its
option defaults from here (one place) without loading a drafter; loop.py runs a `TrainConfig`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path("artifacts/train")   # feature folders, and each run's <out_dir>/<drafter id>/


@dataclass
class TrainConfig:
    drafter_id: str
    minutes: float = 0.0
    steps: int = 0
    batch_size: int = 4
    seq_len: int = 256          # whole sequences, prompt included, for 96% of the data
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_batches: int = 4
    seed: int = 0
    init: str = "fresh"        # or "shipped": fine-tuned from the weights in assets/
    resume: bool = False
    ship: bool = True
    out_dir: str = str(DATA_DIR)
    note: str = ""                # free text for the model card (e.g. the scale reached)
    precision: str = "auto"       # bf16 autocast: auto (CUDA, native-bf16 CPU), fp32 or bf16
    ema: float = 0.0              # decay of the weights' moving average that is evaluated and
                                  # shipped (0 = off: the last weights)
    flags: str = ""               # the drafter's own CLI options, for the card's Reproduce line

    @property
    def ckpt_dir(self) -> Path:
        return Path(self.out_dir) / self.drafter_id


DEFAULTS = TrainConfig(drafter_id="")
