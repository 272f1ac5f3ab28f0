"""Calibration of prefix-survival confidences: ECE, AUC and sequential Platt scaling
(DSpark, ALGORITHMS.md §6).

Boundary: pure tensor maths on held-out scores, no model. Inputs are per block position k
(k = 0..γ-1) confidence logits z[:, k] and binary outcomes acc[:, k] (draft k+1 accepted). The
prefix survival is a_k = Π_{i<=k} σ(z_i / T_i + b_i) and its label s_k = Π_{i<=k} acc_i.
Sequential fitting fixes (T_0, b_0), then (T_1, b_1) given them, and so on, each by maximum
likelihood of s_k under a_k.

Why not ALGORITHMS.md's temperature alone, grid-searched for the lowest ECE of a_k: a
temperature cannot move a position's mean confidence much, and the ECE grid overfits the fit
half. On the engine runs of `train calibrate` (84 held-out instructions, 5,091 blocks, round-8
weights) it left a_1 at 0.472 against 0.417 realized on the report half (ECE 0.081; positions
1-4 pooled 0.043), with temperatures jumping between 0.37 and 7.0 from one position to the
next; temperature and bias by likelihood gave gaps of at most 0.016 at positions 1-4 and a
pooled ECE of 0.020 (0.015 with the halves swapped). With b = 0 this is the paper's σ(z/T).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


def survival(z: torch.Tensor, temps: torch.Tensor, biases: torch.Tensor | None = None
             ) -> torch.Tensor:
    """[N, γ] logits, [γ] temperatures and biases (default 0) -> [N, γ] prefix survival a_k."""
    u = z / temps if biases is None else z / temps + biases
    return torch.sigmoid(u).cumprod(-1)


def _fit_position(prefix: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> tuple[float, float]:
    """(T, b) maximizing the likelihood of labels s under prefix * σ(z / T + b) (all double)."""
    inv_t = torch.zeros(1, dtype=torch.double, requires_grad=True)      # log(1 / T)
    b = torch.zeros(1, dtype=torch.double, requires_grad=True)
    opt = torch.optim.LBFGS([inv_t, b], max_iter=200, line_search_fn="strong_wolfe")

    def nll():
        opt.zero_grad()
        u = z * inv_t.exp() + b
        log_p = prefix.clamp(min=1e-300).log() + F.logsigmoid(u)
        log_q = torch.log1p(-(prefix * torch.sigmoid(u)).clamp(max=1 - 1e-12))
        loss = -(s * log_p + (1 - s) * log_q).mean()
        loss.backward()
        return loss

    opt.step(nll)
    return float((-inv_t).detach().exp()), float(b.detach())


def sequential_fit(z: torch.Tensor, acc: torch.Tensor, min_positive: int = 30
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit (T_k, b_k) in order of k, each by maximum likelihood of s_k under a_k with the
    earlier positions fixed: ([γ] temperatures, [γ] biases). A position with fewer than
    `min_positive` surviving blocks (s_k = 1), or fewer than that many that reach it and fail
    there (s_{k-1} = 1, s_k = 0), keeps position k-1's pair: a few dozen of either cannot pin a
    slope and an offset, and with almost no failures the likelihood runs off to T -> infinity,
    b -> +infinity (an export once fitted T = 30165 at positions 7-16)."""
    z, s = z.double(), acc.double().cumprod(-1)
    temps = torch.ones(z.shape[1], dtype=torch.double)
    biases = torch.zeros(z.shape[1], dtype=torch.double)
    prefix = torch.ones(z.shape[0], dtype=torch.double)    # a_{k-1} under the fitted pairs
    for k in range(z.shape[1]):
        reached = s[:, k - 1] if k else torch.ones_like(s[:, 0])
        if min(s[:, k].sum(), (reached - s[:, k]).sum()) < min_positive:
            if k:
                temps[k], biases[k] = temps[k - 1], biases[k - 1]
        else:
            temps[k], biases[k] = _fit_position(prefix, z[:, k], s[:, k])
        prefix = prefix * torch.sigmoid(z[:, k] / temps[k] + biases[k])
    return temps.float(), biases.float()


def report(z: torch.Tensor, acc: torch.Tensor, temps: torch.Tensor, biases: torch.Tensor
           ) -> dict[str, float]:
    """ECE of a_j (all positions pooled) before (T = 1, b = 0) and after calibration, and AUC."""
    s = acc.double().cumprod(-1)
    before, after = survival(z, torch.ones_like(temps)), survival(z, temps, biases)
    return {"ece_before": ece(before, s), "ece_after": ece(after, s), "auc": auc(after, s),
            "n_blocks": int(z.shape[0]), "mean_prefix_len": float(s.sum(-1).mean())}
