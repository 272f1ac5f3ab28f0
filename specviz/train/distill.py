"""Distillation against the target's stored top-k distribution (data.py's topk_ids / topk_p).

Boundary: loss maths on logits and label rows; no model, no data loading. The target's
distribution at a row is its top-k renormalised (the rest of the vocabulary gets 0): at k = 64
this holds nearly all of the mass of a 135M model's next-token distribution. Drafters with a
reduced draft vocabulary first map the labels with `to_draft`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def head_logits(hn: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Frozen LM head on normed hidden states [..., d] -> float32 logits [..., V]; gradients
    reach hn only. The matmul runs in bf16 under the run's bf16 autocast (train/loop.py: on CUDA
    and on a CPU where bfloat16 is native), else in fp32: a bf16 cast on a CPU without native
    bfloat16 made this dominant cost about 60x slower ([800, 8192] x [8192, 576]: 6.3 s against
    0.1 s): an `mtp` training step took 25 s instead of 1.5-2, `dflash` and `dspark` 7.7 s
    instead of 0.8-0.9 (1 thread, AVX2-only CPU)."""
    return F.linear(hn, weight.to(hn.dtype)).float()


def to_draft(topk_ids: torch.Tensor, topk_p: torch.Tensor, lookup: torch.Tensor, n_draft: int):
    """Target-id labels -> draft-vocabulary labels (lookup: target id -> draft index, n_draft for
    ids outside it); those outside get probability 0 (target_probs renormalises the rest)."""
    d = lookup[topk_ids]
    outside = d == n_draft
    return d.masked_fill(outside, 0), topk_p.masked_fill(outside, 0.0)


def target_probs(topk_p: torch.Tensor) -> torch.Tensor:
    return topk_p / topk_p.sum(-1, keepdim=True).clamp(min=1e-6)


def with_greedy(topk_p: torch.Tensor, mix: float) -> torch.Tensor:
    """Labels (1 - mix) * p_target + mix * onehot(the target's greedy token, topk column 0),
    for greedy acceptance, which only the argmax decides; rows whose greedy token lies outside
    the draft vocabulary (probability 0 there) keep p_target."""
    if not mix:
        return topk_p
    hit = (topk_p[..., :1] > 0).float()
    p = target_probs(topk_p) * (1 - mix * hit)
    p[..., :1] += mix * hit
    return p


def soft_ce(logits: torch.Tensor, topk_ids: torch.Tensor, topk_p: torch.Tensor) -> torch.Tensor:
    """Per row -Σ_v p_target(v) log q(v): logits [..., V], topk [..., K] -> [...]."""
    logq = torch.log_softmax(logits, -1).gather(-1, topk_ids)
    return -(target_probs(topk_p) * logq).sum(-1)


def l1_to_target(q: torch.Tensor, topk_ids: torch.Tensor, topk_p: torch.Tensor) -> torch.Tensor:
    """‖q - p_target‖₁ per row, with p_target zero outside its top-k:
    Σ_top |q - p| + (1 - Σ_top q). Then 1 - ½‖q - p‖₁ is the acceptance rate at T = 1."""
    q_top = q.gather(-1, topk_ids)
    return (q_top - target_probs(topk_p)).abs().sum(-1) + (1 - q_top.sum(-1)).clamp(min=0)


def weighted_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Mean of per-position values x under weights w (0 where nothing is weighed)."""
    return (x * w).sum() / w.sum().clamp(min=1e-6)
