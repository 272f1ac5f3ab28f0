"""SPS profiling: the target's verify steps per second against the batch's total tokens, measured
on the actual device once per (model, device, dtype, CPU threads) and cached as JSON.

Boundary: the curve the batch scheduler optimises (ALGORITHMS.md §6: SPS(B)) and its cache
file. The timing itself is `cost.ForwardCost.measure` (a forward of B new tokens after a
cached context), over batch sizes up to 64 tokens and a context as long as a batch of requests
holds; between measured points the forward's time is interpolated linearly. The batched engine
packs all requests' tokens into one forward without padding (engine/batch.py), so its cost
depends on the batch tokens B, as this curve assumes.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from specviz.engine.cost import ForwardCost
from specviz.models.loading import cache_root

BATCH_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
CONTEXT = 512        # cached positions behind the measured forward: a few requests' worth
REPS = 3


class SpsCurve:
    """Verify steps per second at B batch tokens: 1 / the interpolated forward time."""

    def __init__(self, cost: ForwardCost):
        self.cost = cost

    def __call__(self, batch_tokens: int) -> float:
        return 1.0 / self.cost(batch_tokens)

    def points(self) -> list[list[float]]:
        """[[batch tokens, steps/s], ...] at the measured batch sizes (JSON-able)."""
        return [[float(w), 1.0 / s] for w, s in zip(self.cost.widths, self.cost.seconds)]

    @classmethod
    def from_points(cls, points: list[list[float]]) -> "SpsCurve":
        return cls(ForwardCost([int(b) for b, _ in points], [1.0 / sps for _, sps in points]))


def cache_file(target) -> Path:
    """One file per model id and fingerprint, device, dtype and CPU thread count."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", target.model_id)[-60:]
    dtype = str(target.dtype).replace("torch.", "")
    threads = f"-t{torch.get_num_threads()}" if target.device.type == "cpu" else ""
    return (cache_root() / "sps" /
            f"{name}-{target.fingerprint}-{target.device.type}-{dtype}{threads}.json")


def measure(target, reps: int = REPS) -> SpsCurve:
    return SpsCurve(ForwardCost.measure(target, reps=reps, widths=BATCH_TOKENS, context=CONTEXT))


def profile(target, refresh: bool = False) -> SpsCurve:
    """The target's SPS curve: from its cache file, else measured now and cached."""
    path = cache_file(target)
    if not refresh and path.is_file():
        try:
            return SpsCurve.from_points(json.loads(path.read_text())["points"])
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            pass                      # a damaged cache file: measure again
    curve = measure(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model_id": target.model_id, "device": str(target.device),
                                "dtype": str(target.dtype), "points": curve.points()}))
    return curve
