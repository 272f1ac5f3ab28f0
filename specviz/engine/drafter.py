"""The Drafter protocol: how the decode loop talks to a drafter.

Boundary: the interface only; drafter families live in specviz/drafters/. A drafter object
holds weights shared by all requests; everything per request lives in the state object `start`
returns, so one drafter serves many concurrent requests.

The loop's contract, for committed tokens x_0..x_{n-1}:
- the target cache holds x_0..x_{n-2}; the root x_{n-1} is known but not yet run through the
  target (EAGLE's convention: the feature of position i and the token i+1 predict token i+2);
- `start` sees the prompt and the target features (hidden_states indices in `taps`) of
  prompt[:-1];
- `draft` proposes a DraftTree rooted at x_{n-1} (candidates never depend on target outputs of
  this step: a condition for losslessness);
- `commit` receives the tokens that entered the target cache this step (root + accepted nodes)
  with their target features. It must be cheap: drafters catch up lazily in the next `draft`.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree


class Drafter(Protocol):
    taps: tuple[int, ...]

    def start(self, prompt_ids: list[int], feats: dict[int, torch.Tensor]) -> Any: ...

    def draft(self, state: Any, root: int, sp: SamplingParams,
              generator: torch.Generator | None) -> DraftTree: ...

    def commit(self, state: Any, tokens: list[int], feats: dict[int, torch.Tensor]) -> None: ...

    def cache_len(self, state: Any) -> int | None: ...
