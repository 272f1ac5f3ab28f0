"""EAGLE-3 (strategy `eagle3`): three fused target layers, direct token prediction, trained with
training-time test; EAGLE-2 dynamic tree or chain drafting. ALGORITHMS.md §2.

Boundary: the head and its drafter (training: train/heads.py). For real positions
g_i = fc(cat(norm(h_low), norm(h_mid), norm(h_high))) (hidden_states 2, L//2, L-3 = 2, 15, 27 on
the 30-layer target; each tap RMS-normed because target layers carry outlier dims of ~3e4);
draft steps feed the head's own output instead. The decoder layer attends over cat(norm(emb(t_{i+1})), norm(g_i))
(2d wide) with residual g_i; its own RMSNorm and the LM head over a reduced draft vocabulary
(d2t as the sorted id list `vocab_ids`) give the logits. The head rows start as (and here stay)
the target's rows: shipping them would double the file for a small gain at CPU scale.
Loss: sum_j 0.8^j * soft CE at unroll step j (the target distribution on the draft vocab).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specviz.drafters import feature_heads as fh
from specviz.drafters.eagle import FrozenTargetParts
from specviz.drafters.layers import DecoderLayer, LayerShape
from specviz.engine.cost import forward_cost
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree

ID = "eagle3"


def eagle3_taps(n_layers: int) -> tuple[int, int, int]:
    return (2, n_layers // 2, n_layers - 3)


class Eagle3Head(FrozenTargetParts):
    def __init__(self, target, vocab_ids: torch.Tensor):
        super().__init__(target, vocab_ids)
        self.taps = eagle3_taps(target.n_layers)
        shape = LayerShape.of(target, d_in=2 * target.hidden)
        d = shape.d
        self.tap_norms = nn.ModuleList(nn.RMSNorm(d, eps=shape.eps) for _ in self.taps)
        self.fc = nn.Linear(3 * d, d, bias=False)
        self.emb_norm = nn.RMSNorm(d, eps=shape.eps)
        self.h_norm = nn.RMSNorm(d, eps=shape.eps)
        self.layer = DecoderLayer(shape)
        self.norm = nn.RMSNorm(d, eps=shape.eps)
        with torch.no_grad():   # start near "the normed high tap is the feature"
            self.fc.weight.mul_(0.1)
            self.fc.weight[:, 2 * d:] += torch.eye(d)
            self.norm.weight.copy_(target.final_norm.weight)
            self.layer.o.weight.mul_(0.1)
            self.layer.down.weight.mul_(0.1)

    def fuse(self, feats: dict[int, torch.Tensor]) -> torch.Tensor:
        # each tap RMS-normed first: mid/high target layers carry outlier dims of ~3e4
        return self.fc(torch.cat([n(feats[k]) for n, k in zip(self.tap_norms, self.taps)], -1))

    def forward(self, g, emb, positions, past=None, mask=None):
        x = torch.cat([self.emb_norm(emb), self.h_norm(g)], -1)
        out, kv = self.layer(x, positions, None if past is None else past[0], mask, residual=g)
        return out, self.logits(self.norm(out)), [kv]


def load_head(target) -> Eagle3Head:
    return fh.load_head(ID, target, lambda target, vocab_ids, cfg: Eagle3Head(target, vocab_ids))


@dataclass(frozen=True)
class Eagle3Settings:
    mode: str = "tree"          # "tree" (EAGLE-2 dynamic tree) or "chain"
    top_k: int = 6
    depth: int = 10             # the most levels; chosen on the probe prompts (assets/eagle3.md)
    total_tokens: int = 24
    gamma: int = 5              # chain length
    auto_budget: bool = True    # greedy tree mode: verify only nodes that pay for their time
    path: str = ""            # a published drafter folder or hub id (drafters/published)
    precision: str = "auto"     # CPU linear layers: auto (bf16 where native), fp32 or bf16

    def check(self) -> None:
        if self.mode not in ("tree", "chain"):
            raise ValueError("eagle3 mode must be tree or chain")
        if not (1 <= self.top_k <= 16 and 1 <= self.depth <= 12 and 2 <= self.total_tokens <= 128
                and 1 <= self.gamma <= 16):
            raise ValueError("eagle3 needs top_k 1..16, depth 1..12, total_tokens 2..128, "
                             "gamma 1..16")


class Eagle3Drafter(fh.HeadDrafter):
    def draft(self, state, root: int, sp: SamplingParams, generator) -> DraftTree:
        s = self.settings
        if s.mode == "chain":
            return fh.chain(self.head, state, root, s.gamma, sp, generator)
        return fh.dynamic_tree(self.head, state, root, s.top_k, s.depth, s.total_tokens,
                               self.cost if sp.greedy else None)


def build(target, settings: Eagle3Settings) -> Eagle3Drafter:
    cost = forward_cost(target) if settings.mode == "tree" and settings.auto_budget else None
    return Eagle3Drafter(load_head(target), settings, cost)
