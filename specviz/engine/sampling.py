"""Sampling transforms as free functions with shape contracts.

Boundary: logits in, probabilities / token ids out; randomness only through an explicit
torch.Generator. Temperature 0 means argmax (a one-hot distribution).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature, top-k and top-p.

    Greedy gives the one-hot of argmax. Draft and target go through the same transform, so
    p and q in the acceptance rules are comparable (ALGORITHMS.md notation).
    """
    logits = logits.float()
    if sp.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sp.temperature
    if sp.top_k and sp.top_k < logits.shape[-1]:
        kth = logits.topk(sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    out = torch.softmax(logits, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, idx = out.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= sp.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        out = torch.zeros_like(out).scatter(-1, idx, sorted_p)
        out = out / out.sum(-1, keepdim=True)
    return out


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a [V] distribution."""
    return int(torch.multinomial(p, 1, generator=generator))


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator))


def draw(logits: torch.Tensor, sp: SamplingParams,
         generator: torch.Generator | None) -> tuple[int, float, torch.Tensor | None]:
    """A drafter's choice from [V] logits: (token, q(token), q row or None when deterministic).

    Greedy drafts take argmax (q one-hot, row None); sampled drafts return the row they were
    drawn from, which verification needs for the residual.
    """
    q = probs(logits, sp)
    if sp.greedy:
        tok = int(q.argmax())
        return tok, 1.0, None
    tok = sample(q, generator)
    return tok, float(q[tok]), q


def pick(logits: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None
         ) -> tuple[int, float, torch.Tensor | None, float]:
    """`draw` from [V] logits, plus the token's confidence: its probability at temperature 1
    with no truncation (what the UI shows as the drafter's own belief)."""
    tok, q, row = draw(logits, sp, generator)
    return tok, q, row, float(torch.softmax(logits.float(), -1)[tok])
