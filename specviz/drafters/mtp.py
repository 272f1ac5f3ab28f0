"""MTP: a DeepSeek-V3-style multi-token-prediction module on the frozen target's last hidden
state, reused autoregressively as a drafter (ALGORITHMS.md §4).

Boundary: the module and the drafter. At position i the module combines the embedding of token
t_{i+1} with a hidden state h_i (EMBEDDING FIRST, as implementations do):
    h'_i = M · cat(RMSNorm(Emb(t_{i+1})), RMSNorm(h_i)),   M ∈ R^{d x 2d}
then one transformer block (causal, over this module's own cache), then its own RMSNorm and the
target's frozen, shared LM head (its rows for the draft vocabulary), predicting t_{i+2}. Drafting step 1 uses the target's
hidden_states[30] (final normed state); step k > 1 feeds the module's own previous output and the
previous draft token (vLLM's reuse of one module). The drafter cache holds block keys/values of
committed positions only; draft-step entries are dropped after every round. Under greedy
decoding with the target's cost model (auto_budget), only the prefix of the gamma drafts worth
its verify time goes to the target, as for the `draft` and `peagle` chains (off by default).

Unlike DeepSeek-V3, whose MTP modules are trained jointly with the model, this module was
post-trained on a frozen target: expect lower acceptance than native MTP.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from specviz.drafters import weights
from specviz.drafters.layers import DecoderLayer, DraftHead, LayerShape, causal_mask
from specviz.engine.cost import Acceptance, ForwardCost, budget_chain, forward_cost
from specviz.engine.sampling import SamplingParams, pick
from specviz.engine.tree import DraftTree
from specviz.models.kernels import pack_linears


class MtpModule(nn.Module):
    """`vocab` [Vd]: target ids of the draft vocabulary (the shared LM head's rows it uses)."""

    def __init__(self, shape: LayerShape, vocab: torch.Tensor, tap: int = 30):
        super().__init__()
        self.shape, self.tap = shape, tap
        self.register_buffer("vocab", vocab.long())
        self.emb_norm = nn.RMSNorm(shape.d, eps=shape.eps)
        self.h_norm = nn.RMSNorm(shape.d, eps=shape.eps)
        self.proj = nn.Linear(2 * shape.d, shape.d, bias=False)             # M
        self.block = DecoderLayer(shape)
        self.norm = nn.RMSNorm(shape.d, eps=shape.eps)

    def forward(self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor,
                prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None):
        """emb, h [b, n, d] -> (output hidden h' [b, n, d] (fed to the next step), normed
        hidden for the LM head [b, n, d], (k, v) of the new positions)."""
        x = self.proj(torch.cat([self.emb_norm(emb), self.h_norm(h)], -1))
        out, kv = self.block(x, positions, prefix, mask)
        return out, self.norm(out), kv


ID = "mtp"


@dataclass(frozen=True)
class MtpSettings:
    gamma: int = 3             # autoregressive reuses of the one module per step
    # greedy: verify only the prefix that pays for its time. Off by default: at gamma = 3 on
    # the 2-core CPU it measured no faster (20.15 vs 20.10 tok/s, 16 dev prompts, one bench),
    # and the τ of MTP is quoted at a fixed gamma
    auto_budget: bool = False
    # "" (default): the target checkpoint's own MTP layers where it ships them (DeepSeek-V3 /
    # GLM-4.x or MiMo layout: published/native_mtp.py), else the module trained here for the
    # embedded target; "native": the checkpoint's own layers or a reason why not
    path: str = ""
    precision: str = "auto"     # CPU linear layers: auto (bf16 where native), fp32 or bf16

    def check(self) -> None:
        if not 1 <= self.gamma <= 8:
            raise ValueError("mtp needs gamma in 1..8")
        if self.path not in ("", "native"):
            raise ValueError("mtp takes path=native (the target checkpoint's own MTP layers); "
                             "there is no published MTP drafter folder layout")


@dataclass
class MtpState:
    tokens: list[int]                                     # committed tokens except the root
    feats: list[torch.Tensor] = field(default_factory=list)   # h_i not yet in the cache
    kv: tuple[torch.Tensor, torch.Tensor] | None = None
    length: int = 0                                        # positions in the module cache
    acceptance: Acceptance = field(default_factory=Acceptance)   # learnt from verified drafts


class MtpDrafter:
    """`module`: an MtpModule, or a checkpoint's native MTP layer with the same interface
    (published/native_mtp.py, with its `head` and `origin`)."""

    def __init__(self, target, module: MtpModule, gamma: int = 3, cost: ForwardCost | None = None,
                 head: DraftHead | None = None, origin: str = "post-trained on a frozen target"):
        self.target, self.module, self.gamma, self.cost = target, module, gamma, cost
        self.taps = (module.tap,)
        self.head = head or DraftHead(target, module.vocab)
        self.origin = origin

    def start(self, prompt_ids: list[int], feats: dict[int, torch.Tensor]) -> MtpState:
        state = MtpState(list(prompt_ids[:-1]))
        if feats:
            state.feats.append(feats[self.module.tap])
        return state

    def commit(self, state: MtpState, tokens: list[int], feats: dict[int, torch.Tensor]) -> None:
        state.acceptance.settle(tokens)
        state.tokens.extend(tokens)
        state.feats.append(feats[self.module.tap])

    def cache_len(self, state: MtpState) -> int:
        return state.length

    def _step(self, state: MtpState, tokens: list[int], h: torch.Tensor):
        """Run positions length.. with next tokens `tokens` and hidden states h [n, d]."""
        m, n = self.module, h.shape[0]
        dev = h.device
        emb = self.target.embed(torch.tensor([tokens], device=dev)).to(h.dtype)
        pos = torch.arange(state.length, state.length + n, device=dev)
        out, normed, (k, v) = m(emb, h[None].to(emb.dtype), pos, state.kv,
                                causal_mask(n, state.length, dev))
        kv = (k, v) if state.kv is None else (torch.cat([state.kv[0], k], 2),
                                              torch.cat([state.kv[1], v], 2))
        state.kv, state.length = kv, state.length + n
        return out[0, -1], normed[0, -1]

    @torch.inference_mode()
    def draft(self, state: MtpState, root: int, sp: SamplingParams,
              generator: torch.Generator | None) -> DraftTree:
        t0 = time.perf_counter()
        if not state.feats and state.length == 0:
            return DraftTree.root_only(root, fallback=True, note="no target hidden state yet")
        committed = len(state.tokens)                  # positions 0..committed-1 have h_i
        nxt = (state.tokens + [root])[state.length + 1:committed + 1]
        h_out, normed = self._step(state, nxt, torch.cat(state.feats, 0))
        state.feats.clear()
        toks, qs, rows, confs = [], [], [], []
        for k in range(self.gamma):
            tok, q, q_row, conf = pick(self.head.full(self.head.logits(normed)), sp, generator)
            toks.append(tok), qs.append(q), rows.append(q_row), confs.append(conf)
            if k + 1 < self.gamma:
                h_out, normed = self._step(state, [tok], h_out[None])
        # drop the draft steps' keys/values: the cache keeps committed positions only
        state.kv = (state.kv[0][:, :, :committed], state.kv[1][:, :, :committed])
        state.length = committed
        tree = DraftTree.chain(root, toks, q=qs, q_rows=rows, confidence=confs,
                               note=f"MTP module reused {self.gamma}x ({self.origin})")
        return budget_chain(tree, state.acceptance, self.cost, time.perf_counter() - t0, sp.greedy)


def build_mtp(target, settings: MtpSettings) -> MtpDrafter:
    from specviz.drafters.published import native_mtp
    if settings.path == "native" or native_mtp.ships_mtp(target):
        return native_mtp.build(target, settings)
    tensors, cfg = weights.load(ID, target.fingerprint)
    module = MtpModule(LayerShape.of(target, ffn=cfg["ffn"]), tensors["vocab"], tap=cfg["tap"])
    module.load_state_dict(tensors)
    return MtpDrafter(target, pack_linears(module.to(target.device, target.dtype).eval()),
                      settings.gamma, forward_cost(target) if settings.auto_budget else None)
