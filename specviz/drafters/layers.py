"""Building blocks of the trained drafters: a Llama-style decoder layer whose attention takes an
explicit key/value prefix, RoPE, and helpers for the frozen target pieces.

Boundary: tensors in, tensors out; no caches, no drafting policy. The caller owns every key/value
it passes as `prefix` (a drafter cache of committed positions, or injected target context as in
DFlash), the position ids and the attention mask, so one layer serves autoregressive drafters
(MTP, EAGLE) and block-parallel ones (DFlash, DSpark) alike.

Shapes: x [b, n, d_in]; positions [n] (shared by the batch) or [b, n]; keys/values
[b, kv_heads, P, hd] after RoPE; mask [n, P + n] or [b, n, P + n] bool (True = may attend), or
None (every query sees every key).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specviz.models.kernels import Prepacked


@dataclass(frozen=True)
class LayerShape:
    d: int = 576               # residual width (the target's hidden size)
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    ffn: int = 1536
    rope_theta: float = 100_000.0
    d_in: int = 0              # attention input width (0: d); EAGLE-3 feeds cat(emb, h) = 2d
    eps: float = 1e-5
    qk_norm: bool = False      # Qwen3-style RMSNorm of each q / k head before RoPE
    input_norm: bool = True    # False: no input RMSNorm (EAGLE-1's layer 0)
    # scaled RoPE (llama3, yarn, linear): the inverse frequencies and cos/sin factor transformers'
    # ROPE_INIT_FUNCTIONS give for a checkpoint's rope_scaling; () = plain 1/theta^(2i/hd)
    rope_inv: tuple[float, ...] = ()
    rope_scale: float = 1.0

    @classmethod
    def of(cls, target, **kw) -> "LayerShape":
        """The target's own attention geometry (drafters run at the target's hidden size)."""
        cfg = target.model.config
        return cls(d=cfg.hidden_size, heads=cfg.num_attention_heads,
                   kv_heads=cfg.num_key_value_heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                   ffn=kw.pop("ffn", cfg.intermediate_size),
                   rope_theta=float(getattr(cfg, "rope_theta", None)
                                    or cfg.rope_parameters["rope_theta"]),
                   eps=cfg.rms_norm_eps, **kw)


def rope_tables(positions: torch.Tensor, hd: int, theta: float, inv: torch.Tensor | None = None,
                scale: float = 1.0, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of rotate-half RoPE (the Llama convention) at positions [n] -> [n, hd], or
    [b, n] -> [b, 1, n, hd]. inv [hd/2]: scaled inverse frequencies (default 1/theta^(2i/hd));
    scale multiplies cos and sin (yarn's attention factor), as transformers' rotary embeddings
    do. Computed once per forward, they serve the queries and the keys."""
    if inv is None:
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=positions.device,
                                           dtype=torch.float32) / hd)
    ang = positions.to(torch.float32)[..., None] * inv.to(positions.device)  # [(b,) n, hd/2]
    cos = (torch.cat([ang.cos(), ang.cos()], -1) * scale).to(dtype)
    sin = (torch.cat([ang.sin(), ang.sin()], -1) * scale).to(dtype)
    if positions.dim() == 2:                                           # per-row positions
        cos, sin = cos[:, None], sin[:, None]
    return cos, sin


def rope(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [b, h, n, hd] rotated by `rope_tables` (cos, sin)."""
    cos, sin = tables
    hd = x.shape[-1]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP. `forward` returns the output and the new tokens' keys /
    values (so a caller can cache them); `project_kv` projects external states (e.g. fused target
    features) into this layer's key/value space."""

    def __init__(self, s: LayerShape):
        super().__init__()
        self.s = s
        d_in = s.d_in or s.d
        self.input_norm = nn.RMSNorm(d_in, eps=s.eps) if s.input_norm else nn.Identity()
        if s.qk_norm:   # only then: shipped state dicts keep their keys
            self.q_norm = nn.RMSNorm(s.head_dim, eps=s.eps)
            self.k_norm = nn.RMSNorm(s.head_dim, eps=s.eps)
        self.q = nn.Linear(d_in, s.heads * s.head_dim, bias=False)
        self.k = nn.Linear(d_in, s.kv_heads * s.head_dim, bias=False)
        self.v = nn.Linear(d_in, s.kv_heads * s.head_dim, bias=False)
        self.o = nn.Linear(s.heads * s.head_dim, s.d, bias=False)
        self.post_norm = nn.RMSNorm(s.d, eps=s.eps)
        self.gate = nn.Linear(s.d, s.ffn, bias=False)
        self.up = nn.Linear(s.d, s.ffn, bias=False)
        self.down = nn.Linear(s.ffn, s.d, bias=False)
        # float32 and outside the state dict, so .to(dtype) leaves it and shipped weights load
        self.rope_inv = torch.tensor(s.rope_inv, dtype=torch.float32) if s.rope_inv else None

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope_inv is not None and self.rope_inv.device != positions.device:
            self.rope_inv = self.rope_inv.to(positions.device)
        return rope_tables(positions, self.s.head_dim, self.s.rope_theta, self.rope_inv,
                           self.s.rope_scale, dtype)

    def _heads(self, t: torch.Tensor, n_heads: int, norm: str = "") -> torch.Tensor:
        b, n, _ = t.shape
        t = t.view(b, n, n_heads, self.s.head_dim)
        if norm and self.s.qk_norm:
            t = getattr(self, norm)(t)
        return t.transpose(1, 2)

    def _kv(self, h: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]
            ) -> tuple[torch.Tensor, torch.Tensor]:
        k = rope(self._heads(self.k(h), self.s.kv_heads, "k_norm"), tables)
        return k, self._heads(self.v(h), self.s.kv_heads)

    def project_kv(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of states h [b, n, d_in] used as they are (no input norm), RoPE'd at
        `positions`."""
        return self._kv(h, self._tables(positions.to(h.device), h.dtype))

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [b, n, d_in] -> ([b, n, d], (k, v) of x). residual: the stream added to the
        attention output (default x; EAGLE-3 passes h because its input is 2d wide)."""
        s = self.s
        xn = self.input_norm(x)
        tables = self._tables(positions.to(x.device), x.dtype)
        q = rope(self._heads(self.q(xn), s.heads, "q_norm"), tables)
        k, v = self._kv(xn, tables)
        keys, values = (k, v) if prefix is None else (torch.cat([prefix[0], k], 2),
                                                      torch.cat([prefix[1], v], 2))
        # grouped keys/values stay grouped (no per-query-head copies): the same arithmetic
        attn = F.scaled_dot_product_attention(
            q, keys, values, enable_gqa=s.heads != s.kv_heads,
            attn_mask=None if mask is None else (mask if mask.dim() == 2 else mask[:, None]).to(q.device))
        b, _, n, _ = attn.shape
        h = (x if residual is None else residual) + self.o(attn.transpose(1, 2).reshape(b, n, -1))
        hn = self.post_norm(h)
        return h + self.down(F.silu(self.gate(hn)) * self.up(hn)), (k, v)


def causal_mask(n: int, past: int, device=None) -> torch.Tensor:
    """[n, past + n] bool: every query sees the whole prefix and the new tokens up to itself."""
    m = torch.ones(n, past + n, dtype=torch.bool, device=device)
    m[:, past:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return m



class DraftHead:
    """The target's frozen LM head restricted to a draft vocabulary (EAGLE-3's reduced vocab, as
    target ids): drafts only ever propose these tokens, and the head costs Vd/V of the full one.
    `full` widens draft logits back to the target vocabulary (-inf elsewhere), so a sampled
    draft's q row is a true distribution over the target's tokens. `weight` [Vd, d]: another
    head's rows for `vocab` (a native MTP layer's own head) instead of the target's."""

    def __init__(self, target, vocab: torch.Tensor, weight: torch.Tensor | None = None):
        self.vocab = vocab.long().to(target.device)
        self.weight = (target.lm_head.weight[self.vocab] if weight is None else weight).detach()
        self.size = target.vocab
        self.mm = Prepacked()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.mm(h.to(self.weight.dtype), self.weight).float()

    def full(self, logits: torch.Tensor) -> torch.Tensor:
        return widen(logits, self.vocab, self.size)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Target ids of the argmax of [..., Vd] draft logits: the argmax of their `full` rows,
        ties included (the draft ids are sorted), without building those rows."""
        return self.vocab[logits.argmax(-1)]


def widen(logits: torch.Tensor, vocab: torch.Tensor, size: int) -> torch.Tensor:
    """[..., Vd] draft-vocabulary logits -> [..., size] target-vocabulary logits, -inf outside
    the draft vocabulary `vocab` (target ids)."""
    out = logits.new_full((*logits.shape[:-1], size), float("-inf"))
    return out.index_copy(-1, vocab.long(), logits)


def vocab_lookup(vocab: torch.Tensor, size: int) -> torch.Tensor:
    """[size] target id -> draft index; ids outside the draft vocabulary map to len(vocab)
    (so a draft argmax never equals them)."""
    lookup = torch.full((size,), len(vocab), dtype=torch.long, device=vocab.device)
    lookup[vocab.long()] = torch.arange(len(vocab), device=vocab.device)
    return lookup
