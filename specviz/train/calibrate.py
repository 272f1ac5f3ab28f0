"""Calibration of prefix-survival confidences: ECE, AUC and sequential temperature scaling
(DSpark, ALGORITHMS.md §6).

Boundary: pure tensor maths on held-out scores, no model. Inputs are per block position k
(k = 0..γ-1) confidence logits z[:, k] and binary outcomes acc[:, k] (draft k+1 accepted). The
prefix survival is a_k = Π_{i<=k} σ(z_i / T_i) and its label s_k = Π_{i<=k} acc_i. Sequential
temperature scaling fixes T_0, then T_1 given T_0, and so on, each by grid search minimizing
the ECE of a_k against s_k. (The exact σ(z/T) form is ALGORITHMS.md's [unconfirmed] reading.)
"""
from __future__ import annotations

import torch

GRID = torch.exp(torch.linspace(-2.5, 2.5, 101))     # temperatures 0.08 .. 12


def ece(scores: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """Expected calibration error with equal-width bins: Σ_b |bin| / N · |mean score - mean label|."""
    scores, labels = scores.flatten().double(), labels.flatten().double()
    if scores.numel() == 0:
        return 0.0
    idx = (scores * bins).long().clamp(0, bins - 1)
    n = torch.bincount(idx, minlength=bins).double()
    gap = (torch.bincount(idx, scores, bins) - torch.bincount(idx, labels, bins)).abs()
    return float(gap.sum() / n.sum())


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC by the rank-sum statistic (ties count half); nan when one class is absent."""
    scores, labels = scores.flatten().double(), labels.flatten().bool()
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.double)
    for v in scores.unique():                          # average ranks over ties
        tie = scores == v
        if int(tie.sum()) > 1:
            ranks[tie] = ranks[tie].mean()
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def survival(z: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """[N, γ] logits, [γ] temperatures -> [N, γ] prefix survival a_k."""
    return torch.sigmoid(z / temps).cumprod(-1)


def sequential_temperatures(z: torch.Tensor, acc: torch.Tensor, grid: torch.Tensor = GRID,
                            min_positive: int = 30) -> torch.Tensor:
    """Fit T_k in order of k, each minimizing ECE(a_k, s_k) with T_{<k} fixed: [γ]. A position
    with fewer than `min_positive` surviving blocks (s_k = 1) keeps T_{k-1}: the ECE of a few
    dozen near-zero scores is noise, and its grid minimum lands anywhere from 0.08 to 12."""
    z, s = z.double(), acc.double().cumprod(-1)
    temps = torch.ones(z.shape[1], dtype=torch.double)
    prefix = torch.ones(z.shape[0], dtype=torch.double)    # a_{k-1} under the fitted T_{<k}
    for k in range(z.shape[1]):
        if s[:, k].sum() < min_positive:
            temps[k] = temps[k - 1] if k else 1.0
        else:
            cand = prefix[:, None] * torch.sigmoid(z[:, k:k + 1] / grid[None].double())   # [N, G]
            errs = [ece(cand[:, g], s[:, k]) for g in range(len(grid))]
            temps[k] = grid[int(torch.tensor(errs).argmin())]
        prefix = prefix * torch.sigmoid(z[:, k] / temps[k])
    return temps.float()


def report(z: torch.Tensor, acc: torch.Tensor, temps: torch.Tensor) -> dict[str, float]:
    """ECE of a_j (all positions pooled) before (T = 1) and after calibration, and AUC."""
    s = acc.double().cumprod(-1)
    before, after = survival(z, torch.ones_like(temps)), survival(z, temps)
    return {"ece_before": ece(before, s), "ece_after": ece(after, s), "auc": auc(after, s),
            "n_blocks": int(z.shape[0]), "mean_prefix_len": float(s.sum(-1).mean())}
