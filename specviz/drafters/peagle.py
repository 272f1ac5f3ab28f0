"""P-EAGLE (strategy `peagle`): parallel drafting, one drafter forward proposes K tokens.
ALGORITHMS.md §3.

Boundary: the head and its drafter (training: train/heads.py). EAGLE-3 features
(hidden_states 2, L//2, L-3, each RMS-normed, fused by fc) and a deeper drafter (N decoder
layers). Entry input = fc_in(cat(emb, g)). The draft block is one forward of K entries: the
root entry (real feature, root token; cached for good) and K-1 mask entries (a learned shared
hidden state and a learned mask-token embedding) at the next positions, causal among
themselves; entry k's output predicts draft token k+1. Draft tokens never feed back, so
sampled drafts use each position's own row (lossless residuals). Under greedy decoding with
the target's cost model (auto_budget), only the prefix of the K tokens worth its verify time
goes to the target, as for the `draft` chain.
Loss: sum_k 0.8^k * soft CE.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from specviz.drafters import block_tree, feature_heads as fh
from specviz.drafters.eagle import FrozenTargetParts
from specviz.drafters.eagle3 import eagle3_taps
from specviz.drafters.layers import DecoderLayer, LayerShape
from specviz.engine.cost import budget_chain, forward_cost
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree

ID = "peagle"
LAYERS = 2        # default depth (`train --layers` builds another; the weights' config says which)


class PEagleHead(FrozenTargetParts):
    def __init__(self, target, vocab_ids: torch.Tensor, layers: int = LAYERS, ffn: int = 768):
        super().__init__(target, vocab_ids)
        self.taps = eagle3_taps(target.n_layers)
        shape = LayerShape.of(target, ffn=ffn)
        d = shape.d
        self.n_layers, self.ffn = layers, ffn
        self.tap_norms = nn.ModuleList(nn.RMSNorm(d, eps=shape.eps) for _ in self.taps)
        self.fc = nn.Linear(3 * d, d, bias=False)
        self.fc_in = nn.Linear(2 * d, d, bias=True)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=shape.eps)
        self.mask_hidden = nn.Parameter(torch.zeros(d))
        self.mask_emb = nn.Parameter(target.embed.weight.detach().float().mean(0).clone())
        with torch.no_grad():
            self.fc.weight.mul_(0.1)
            self.fc.weight[:, 2 * d:] += torch.eye(d)
            self.fc_in.weight.mul_(0.1)
            self.fc_in.weight[:, d:] += torch.eye(d)
            self.fc_in.bias.zero_()
            self.norm.weight.copy_(target.final_norm.weight)
            for layer in self.layers:
                layer.o.weight.mul_(0.1)
                layer.down.weight.mul_(0.1)

    def fuse(self, feats: dict[int, torch.Tensor]) -> torch.Tensor:
        return self.fc(torch.cat([n(feats[k]) for n, k in zip(self.tap_norms, self.taps)], -1))

    def forward(self, g, emb, positions, past=None, mask=None):
        h = self.fc_in(torch.cat([emb, g], -1))
        kvs = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, positions, None if past is None else past[i], mask)
            kvs.append(kv)
        return h, self.logits(self.norm(h)), kvs

    def mask_inputs(self, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, emb) of mask entries, broadcast to shape [..., d]."""
        return self.mask_hidden.expand(shape), self.mask_emb.expand(shape)


def load_head(target) -> PEagleHead:
    return fh.load_head(ID, target, lambda target, vocab_ids, cfg: PEagleHead(target, vocab_ids, cfg["layers"], cfg["ffn"]))


@dataclass(frozen=True)
class PEagleSettings:
    k: int = 4                  # tokens proposed by one forward
    auto_budget: bool = True    # greedy: verify only the prefix that pays for its time
    tree: int = 0               # draft a tree of this many nodes from the k positions (0 = chain)
    precision: str = "auto"     # CPU linear layers: auto (bf16 where native), fp32 or bf16

    def check(self) -> None:
        if not 1 <= self.k <= 8:
            raise ValueError("peagle k must be in 1..8 (trained for 4)")
        block_tree.check_tree(self.tree)


class PEagleDrafter(fh.HeadDrafter):
    @torch.no_grad()
    def draft(self, state, root: int, sp: SamplingParams, generator) -> DraftTree:
        t0 = time.perf_counter()
        head, K = self.head, self.settings.k
        # ONE forward: the real entries not yet cached (the last pairs with the root), then
        # K-1 mask entries at the next positions, causal among themselves and never cached
        extra = head.mask_inputs((1, K - 1, head.mask_hidden.shape[0])) if K > 1 else None
        first = fh.catch_up(head, state, root, extra)
        if first is None:
            return DraftTree.root_only(root, fallback=True, note="no target feature yet")
        if self.settings.tree:
            return block_tree.draft_tree(
                root, block_tree.per_position(torch.log_softmax(first[1].float(), -1),
                                              self.settings.tree),
                self.settings.tree, K, head.vocab_ids, state.acceptance, self.cost,
                time.perf_counter() - t0, sp.greedy, f"P-EAGLE tree over {K} positions")
        rows = list(first[1])
        picks = [fh.pick(head, lg, sp, generator) for lg in rows]
        toks, qs, qrows, confs = (list(x) for x in zip(*picks))
        greedy = sp.greedy
        tree = DraftTree.chain(root, toks, q=None if greedy else qs,
                               q_rows=None if greedy else qrows, confidence=confs,
                               note=f"P-EAGLE: {K} tokens from one forward")
        return budget_chain(tree, state.acceptance, self.cost, time.perf_counter() - t0, greedy)


def build(target, settings: PEagleSettings) -> PEagleDrafter:
    return PEagleDrafter(load_head(target), settings,
                         forward_cost(target) if settings.auto_budget else None)
