"""DFlash: a block-parallel drafter conditioned on fused target features (ALGORITHMS.md §5).

Boundary: the backbone and the drafter built on it. The backbone fuses target hidden states
(outputs of layers 1, 14, 27 for the 30-layer target: hidden_states 2, 15, 28) into context
features H = RMSNorm(fc(cat(RMSNorm_i(h_i)))) (the per-tap norms start as the target's own
input norms of the next layer: raw residual streams carry "massive" dimensions in the hundreds
to tens of thousands that would otherwise swamp fc), injects them as keys/values into every drafter layer
([W_k H ; W_k x], RoPE at the context positions then the block positions) and runs ONE
non-causal forward over the block [anchor, MASK x (B-1)], embedded with the target's frozen
embedding; the target's frozen LM head turns block rows into drafts. The per-request cache holds
projected keys/values of committed context only (block keys/values are never kept), optionally
only the last `window` positions. DSpark (dspark.py) reuses the backbone and the context cache.
Under greedy decoding with the target's cost model (auto_budget), only the prefix of the block's
drafts worth its verify time goes to the target, as for the `peagle` block: on a GPU a 16-wide
verify costs about what a 1-wide one does and the whole block is kept; on a 2-core CPU it does not.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from specviz.drafters import block_tree, weights
from specviz.drafters.layers import DecoderLayer, DraftHead, LayerShape, vocab_lookup
from specviz.engine.cost import Acceptance, ForwardCost, budget_chain, forward_cost
from specviz.engine.sampling import SamplingParams, pick
from specviz.engine.tree import DraftTree
from specviz.models.kernels import pack_linears

TAPS = (2, 15, 28)   # round(1 + i (L-4)/2) for L = 30: outputs of decoder layers 1, 14, 27
BLOCK_SIZES = (8, 16)  # shipped models: assets/dflash-b8, assets/dflash-b16


@dataclass(frozen=True)
class DFlashSettings:
    block_size: int = 16       # picks the model: B - 1 drafts per forward
    window: int = 0            # attend to only the last W context positions (0 = all)
    auto_budget: bool = True   # greedy: verify only the prefix of the block that pays for its time
    tree: int = 0              # draft a tree of this many nodes from the block (0 = the chain)
    path: str = ""             # a published drafter folder or hub id; its own block size is used
    precision: str = "auto"     # CPU linear layers: auto (bf16 where native), fp32 or bf16

    def check(self) -> None:
        if not self.path and self.block_size not in BLOCK_SIZES:
            raise ValueError(f"dflash block_size must be one of {BLOCK_SIZES}")
        if self.window < 0:
            raise ValueError("window must be >= 0 (0 = the whole context)")
        block_tree.check_tree(self.tree)


class BlockBackbone(nn.Module):
    """Fused-context KV injection + non-causal block attention. Frozen target parts (embedding,
    LM head) are passed in by the caller and never stored here; `vocab` [Vd] holds the target ids
    of the draft vocabulary (the LM head rows used)."""

    def __init__(self, shape: LayerShape, vocab: torch.Tensor, n_target_vocab: int,
                 n_layers: int = 1, taps: tuple[int, ...] = TAPS):
        super().__init__()
        self.shape, self.taps = shape, tuple(taps)
        self.register_buffer("vocab", vocab.long())
        self.register_buffer("lookup", vocab_lookup(vocab, n_target_vocab), persistent=False)
        self.tap_norms = nn.ModuleList(nn.RMSNorm(shape.d, eps=shape.eps) for _ in taps)
        self.fc = nn.Linear(len(taps) * shape.d, shape.d, bias=False)
        self.ctx_norm = nn.RMSNorm(shape.d, eps=shape.eps)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(n_layers))
        self.mask_embed = nn.Parameter(torch.zeros(shape.d))
        self.norm = nn.RMSNorm(shape.d, eps=shape.eps)

    def fuse(self, feats: dict[int, torch.Tensor]) -> torch.Tensor:
        """Target features {tap: [..., n, d]} -> the raw fc input [..., n, len(taps) d]."""
        return torch.cat([feats[t] for t in self.taps], -1)

    def context_kv(self, fused: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """fused [b, n, len(taps) d] -> per layer (k, v) [b, kv_heads, n, hd] at `positions`."""
        parts = fused.to(self.fc.weight.dtype).chunk(len(self.taps), -1)
        ctx = self.ctx_norm(self.fc(torch.cat([n(p) for n, p in zip(self.tap_norms, parts)], -1)))
        return [layer.project_kv(ctx, positions) for layer in self.layers]

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                prefix: list[tuple[torch.Tensor, torch.Tensor]] | None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Block embeddings x [b, m, d] -> final normed hidden [b, m, d]; every layer sees its
        injected context keys/values `prefix[i]` first."""
        for i, layer in enumerate(self.layers):
            x, _ = layer(x, positions, prefix[i] if prefix else None, mask)
        return self.norm(x)

    def block_input(self, embed: nn.Module, anchors: torch.Tensor, size: int) -> torch.Tensor:
        """[anchor, MASK x (size-1)] embeddings: anchors [b] -> [b, size, d]."""
        a = embed(anchors)[:, None].to(self.mask_embed.dtype)
        return torch.cat([a, self.mask_embed.expand(a.shape[0], size - 1, -1)], 1)


@dataclass
class ContextState:
    """One request's drafter cache: projected keys/values of committed context positions."""
    pending: list[torch.Tensor] = field(default_factory=list)   # fused features not yet projected
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    length: int = 0        # committed context positions seen (target cache length)
    kept: int = 0          # positions held in kv (<= window when windowed)
    acceptance: Acceptance = field(default_factory=Acceptance)   # learnt from verified drafts


class ContextCache:
    """Lazy catch-up of the committed context for block drafters (commit is O(1))."""

    def __init__(self, backbone: BlockBackbone, window: int = 0):
        self.backbone, self.window = backbone, window
        self.taps = backbone.taps

    def start(self, prompt_ids: list[int], feats: dict[int, torch.Tensor]) -> ContextState:
        state = ContextState()
        if feats:
            state.pending.append(self.backbone.fuse(feats))
        return state

    def commit(self, state: ContextState, tokens: list[int], feats: dict[int, torch.Tensor]) -> None:
        state.acceptance.settle(tokens)
        state.pending.append(self.backbone.fuse(feats))

    def cache_len(self, state: ContextState) -> int:
        return state.kept

    @torch.inference_mode()
    def catch_up(self, state: ContextState) -> None:
        if not state.pending:
            return
        fused = torch.cat(state.pending, 0)[None]
        n = fused.shape[1]
        pos = torch.arange(state.length, state.length + n, device=fused.device)
        new = self.backbone.context_kv(fused, pos)
        state.kv = new if state.kv is None else [
            (torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(state.kv, new)]
        if self.window:
            state.kv = [(k[:, :, -self.window:], v[:, :, -self.window:]) for k, v in state.kv]
        state.pending.clear()
        state.length += n
        state.kept = state.kv[0][0].shape[2]

    @torch.inference_mode()
    def block_hidden(self, state: ContextState, embed: nn.Module, root: int, size: int) -> torch.Tensor:
        """Catch up, then one forward over [root, MASK x (size-1)] at positions length..:
        [size, d]. Block keys/values are not kept."""
        self.catch_up(state)
        dev = self.backbone.mask_embed.device
        x = self.backbone.block_input(embed, torch.tensor([root], device=dev), size)
        pos = torch.arange(state.length, state.length + size, device=dev)
        return self.backbone(x, pos, state.kv)[0]


class DFlashDrafter(ContextCache):
    """Block size B: row k of the block (k = 1..B-1) drafts the token k after the anchor."""

    def __init__(self, target, backbone: BlockBackbone, block: int, window: int = 0,
                 cost: ForwardCost | None = None, tree: int = 0):
        super().__init__(backbone, window)
        self.target, self.block, self.cost, self.tree = target, block, cost, tree
        self.head = DraftHead(target, backbone.vocab)

    def draft(self, state: ContextState, root: int, sp: SamplingParams,
              generator: torch.Generator | None) -> DraftTree:
        t0 = time.perf_counter()
        h = self.block_hidden(state, self.target.embed, root, self.block)
        ctx = f"last {state.kept} of {state.length}" if self.window else f"{state.length}"
        if self.tree:
            with torch.inference_mode():
                logq = torch.log_softmax(self.head.logits(h[1:]).float(), -1)   # [B-1, Vd]
            return block_tree.draft_tree(
                root, block_tree.per_position(logq, self.tree), self.tree, self.block - 1,
                self.head.vocab, state.acceptance, self.cost, time.perf_counter() - t0,
                sp.greedy, f"one block forward, context {ctx} positions; a tree over its "
                           f"{self.block - 1} positions")
        with torch.inference_mode():
            logits = self.head.logits(h[1:])                                   # [B-1, Vd]
            if sp.greedy:   # no widened rows; conf: the draft's probability of its argmax
                toks, rows = self.head.argmax(logits).tolist(), None
                confs = torch.softmax(logits.float(), -1).amax(-1).tolist()
                qs = [1.0] * len(toks)
            else:
                toks, qs, rows, confs = [], [], [], []
                for row in self.head.full(logits):   # conf: the draft's own probability of its
                    tok, q, q_row, conf = pick(row, sp, generator)   # token (temperature 1)
                    toks.append(tok), qs.append(q), rows.append(q_row), confs.append(conf)
        tree = DraftTree.chain(root, toks, q=qs, q_rows=rows, confidence=confs,
                               note=f"one block forward: {len(toks)} drafts, context {ctx} positions")
        return budget_chain(tree, state.acceptance, self.cost, time.perf_counter() - t0, sp.greedy)


def build_dflash(target, settings: DFlashSettings) -> DFlashDrafter:
    tensors, cfg = weights.load(f"dflash-b{settings.block_size}", target.fingerprint)
    bb = BlockBackbone(LayerShape.of(target, ffn=cfg["ffn"]), tensors["vocab"], target.vocab,
                       cfg["layers"], tuple(cfg["taps"]))
    bb.load_state_dict(tensors)
    return DFlashDrafter(target, pack_linears(bb.to(target.device, target.dtype).eval()),
                         settings.block_size, settings.window,
                         forward_cost(target) if settings.auto_budget else None, settings.tree)
