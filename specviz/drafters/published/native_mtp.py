"""Native MTP (issue 20, FORMATS.md §5): the multi-token-prediction layers a target checkpoint
ships next to its own weights, run by the `mtp` strategy's drafter (mtp.MtpDrafter: the same
catch-up, chaining and rollback as the module trained here).

Boundary: finding the MTP tensors in the target's own safetensors files (transformers drops them
when it loads the target), checking them, and the module's forward; drafting lives in mtp.py.
The decoder block is the target family's own transformers decoder-layer class (so DeepSeek-V3's
MLA attention and MoE MLP come for free), with the target's rotary embedding and a key/value
prefix the drafter owns.

Equations, checked against vLLM's deepseek_mtp.py and mimo_mtp.py (model_executor/models) and
SGLang's mimo_mtp.py. At position i, with h_i the target's final *normed* hidden state (what the
target model's forward returns to the proposer) and e = Emb(t_{i+1}) zeroed where i == 0:
- DeepSeek-V3 / GLM-4.x (`model.layers.{N+k}.*`):
    x = eh_proj(cat(enorm(e), hnorm(h)));  out = block(x)  (residual stream, pre-norm)
    logits = shared_head.head(shared_head.norm(out)); the next step is fed `out`.
- MiMo (`model.mtp_layers.{k}.*`):
    x = input_proj(cat(hidden_layernorm(h), token_layernorm(e)));  out = final_layernorm(block(x))
    logits = the target's lm_head(out); the next step is fed `out` (already normed).
Later drafting steps reuse MTP layer 0 autoregressively on its own previous output, as vLLM's
proposer does (the published checkpoints ship one layer: num_nextn_predict_layers = 1).
Hybrid linear-attention targets (Qwen3-Next / Qwen3.5, `mtp.*`) are refused: rolling back a
rejected draft would need their recurrent state restored, not a key/value crop.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from specviz.drafters.base import DrafterUnavailable
from specviz.drafters.published.folder import INDEX, weight_files

HYBRID_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")
HYBRID = ("out of scope: rollback needs the recurrent state (a hybrid linear-attention target "
          "cannot drop rejected draft tokens with a key/value crop)")


@dataclass(frozen=True)
class Layout:
    name: str
    emb_norm: str
    h_norm: str
    proj: str
    norm: str
    head: str               # the layer's own LM head ("" = the target's)
    hidden_first: bool      # fc input order [hidden, embed] (MiMo) vs [embed, hidden]
    feed_normed: bool       # the next step gets the normed output (MiMo) vs the residual stream


DEEPSEEK = Layout("DeepSeek-V3", "enorm", "hnorm", "eh_proj", "shared_head.norm",
                  "shared_head.head", hidden_first=False, feed_normed=False)
MIMO = Layout("MiMo", "token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm", "",
              hidden_first=True, feed_normed=True)


def checkpoint_folder(target) -> Path | None:
    """The local folder the target was loaded from (a folder, or a hub id's cached snapshot)."""
    name = getattr(target.model, "name_or_path", "") or ""
    if name and Path(name).is_dir():
        return Path(name)
    if name.count("/") == 1:
        from huggingface_hub import try_to_load_from_cache
        cfg = try_to_load_from_cache(name, "config.json")
        if isinstance(cfg, str):
            return Path(cfg).parent
    return None


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the index or the files' headers (no data read)."""
    if (path / INDEX).is_file():
        return {k: path / f for k, f in json.loads((path / INDEX).read_text())["weight_map"].items()}
    out = {}
    for f in weight_files(path):
        with safe_open(str(f), framework="pt") as st:
            out |= {k: f for k in st.keys()}
    return out


def _is_hybrid(cfg) -> bool:
    return (cfg.model_type in HYBRID_TYPES
            or "linear_attention" in (getattr(cfg, "layer_types", None) or []))


def find(target) -> tuple[Layout, str, dict[str, Path]] | None:
    """(layout, tensor-name prefix of MTP layer 0, name -> file) when the target's checkpoint
    ships MTP layers; None when it ships none. A hybrid target that ships them raises."""
    path = checkpoint_folder(target)
    if path is None:
        return None
    files = _tensor_files(path)
    n = target.n_layers
    if any(k.startswith("mtp.") or ".mtp." in k for k in files):   # Qwen3-Next / Qwen3.5
        raise DrafterUnavailable(f"native MTP of {target.model_id}: {HYBRID}")
    for layout, prefix in ((DEEPSEEK, f"model.layers.{n}."), (MIMO, "model.mtp_layers.0.")):
        if f"{prefix}{layout.proj}.weight" in files:
            return layout, prefix, files
    return None


def ships_mtp(target) -> bool:
    """Whether the target's own checkpoint has MTP layers (a hybrid target's count: building its
    drafter then says why it cannot run)."""
    try:
        return find(target) is not None
    except DrafterUnavailable:
        return True


def _read(files: dict[str, Path], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix` (prefix stripped), opening only the files that hold them."""
    out: dict[str, torch.Tensor] = {}
    wanted = {k: f for k, f in files.items() if k.startswith(prefix)}
    for f in sorted(set(wanted.values())):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                if k in wanted:
                    out[k[len(prefix):]] = st.get_tensor(k)
    return out


class _Prefix:
    """The one cache method a transformers attention layer calls: update(k, v, layer_idx)
    returns the prefix followed by the new keys/values (dim 2), which it keeps as `new`."""

    def __init__(self, prefix: tuple[torch.Tensor, torch.Tensor] | None):
        self.prefix, self.new = prefix, None

    def update(self, k: torch.Tensor, v: torch.Tensor, *_args, **_kw):
        self.new = (k, v)
        if self.prefix is None:
            return k, v
        return torch.cat([self.prefix[0], k], 2), torch.cat([self.prefix[1], v], 2)


class NativeMtp(nn.Module):
    """An MTP layer of the target's checkpoint with MtpModule's interface (mtp.py): forward
    returns (the state fed to the next step, the normed state for the LM head, new k/v)."""

    def __init__(self, target, layout: Layout):
        super().__init__()
        cfg = copy.deepcopy(target.model.config)
        if getattr(cfg, "layer_types", None):    # MTP layers attend fully; their index is N
            cfg.layer_types = list(cfg.layer_types) + ["full_attention"]
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layout, self.tap = layout, target.n_layers
        self.register_buffer("vocab", torch.arange(target.vocab), persistent=False)
        self.emb_norm = nn.RMSNorm(d, eps=eps)
        self.h_norm = nn.RMSNorm(d, eps=eps)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.block = type(target.model.model.layers[0])(cfg, layer_idx=target.n_layers)
        self.norm = nn.RMSNorm(d, eps=eps)
        self.rotary = target.model.model.rotary_emb.forward   # a bound method: not a submodule

    def names(self) -> dict[str, str]:
        """Our state-dict keys -> checkpoint names under the layer's prefix."""
        lay = self.layout
        out = {"emb_norm.weight": f"{lay.emb_norm}.weight", "h_norm.weight": f"{lay.h_norm}.weight",
               "proj.weight": f"{lay.proj}.weight", "norm.weight": f"{lay.norm}.weight"}
        return out | {f"block.{k}": k for k in self.block.state_dict()}

    def forward(self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor,
                prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None):
        """emb, h [1, n, d]; positions [n]; mask [n, P + n] bool (True = may attend)."""
        emb = emb.masked_fill((positions == 0)[None, :, None], 0.0)
        e, hn = self.emb_norm(emb), self.h_norm(h)
        x = self.proj(torch.cat([hn, e] if self.layout.hidden_first else [e, hn], -1))
        pos = positions[None]
        past = 0 if prefix is None else prefix[0].shape[2]
        n = x.shape[1]
        allowed = mask if mask is not None else torch.ones(n, past + n, dtype=torch.bool,
                                                            device=x.device)
        add = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        add.masked_fill_(~allowed.to(x.device), torch.finfo(x.dtype).min)
        cache = _Prefix(prefix)
        out = self.block(x, attention_mask=add[None, None], position_ids=pos,
                         past_key_values=cache, use_cache=True,
                         position_embeddings=self.rotary(x, pos))
        out = out[0] if isinstance(out, tuple) else out
        normed = self.norm(out)
        return (normed if self.layout.feed_normed else out), normed, cache.new


def _fused_experts(key: str, t: dict[str, torch.Tensor], n_experts: int
                   ) -> tuple[torch.Tensor | None, str]:
    """transformers' fused expert tensor `key` from a checkpoint's per-expert ones (what its
    loader does for DeepSeek-V3 / Qwen-MoE): gate_up_proj [E, 2I, d] = cat(gate, up) per
    expert, down_proj [E, d, I]. (tensor, "") or (None, the first per-expert name missing)."""
    base, kind = key.rsplit(".", 1)
    parts = {"gate_up_proj": ("gate", "up"), "down_proj": ("down",)}.get(kind)
    if not base.endswith("experts") or parts is None or not n_experts:
        return None, key
    names = [[f"{base}.{e}.{p}_proj.weight" for p in parts] for e in range(n_experts)]
    missing = next((n for row in names for n in row if n not in t), "")
    if missing:
        return None, missing
    return torch.stack([torch.cat([t[n] for n in row], 0) for row in names]), ""


def load(target) -> tuple[NativeMtp, torch.Tensor | None]:
    """(the module on the target's device and dtype, its own LM head weight or None)."""
    cfg = target.model.config
    if _is_hybrid(cfg):
        raise DrafterUnavailable(f"native MTP of {target.model_id}: {HYBRID}")
    found = find(target)
    if found is None:
        where = checkpoint_folder(target)
        raise DrafterUnavailable(
            f"native MTP: the checkpoint of {target.model_id} has no MTP layers "
            f"({'not loaded from a folder or cached hub snapshot' if where is None else where})")
    layout, prefix, files = found

    def fail(why: str) -> DrafterUnavailable:
        return DrafterUnavailable(f"native MTP ({layout.name} layout) of {target.model_id}: {why}")

    t = _read(files, prefix)
    if any(v.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for v in t.values()) or \
            any(k.endswith("_scale_inv") for k in t):
        raise fail("its MTP weights are quantized (FP8), which is not supported")
    try:
        module = NativeMtp(target, layout)
    except Exception as exc:   # a layer class with another constructor
        raise fail(f"cannot build its decoder layer ({type(exc).__name__}: {exc})") from None
    n_experts = getattr(getattr(module.block.mlp, "experts", None), "num_experts", 0)
    state = {}
    for ours, theirs in module.names().items():
        want = module.state_dict()[ours]
        got, missing = t.get(theirs), theirs
        if got is None and ours.startswith("block."):
            got, missing = _fused_experts(theirs, t, n_experts)
        if got is None:
            raise fail(f"missing tensor {prefix}{missing}")
        if tuple(got.shape) != tuple(want.shape):
            raise fail(f"tensor {prefix}{theirs} has shape {list(got.shape)}, expected "
                       f"{list(want.shape)} from the target's config")
        state[ours] = got.to(want.dtype) if got.is_floating_point() else got
    module.load_state_dict(state)
    head = None
    if layout.head:
        head = t.get(f"{layout.head}.weight")
        if head is None:                          # vLLM: the head is shared with the target's
            head = target.lm_head.weight.detach()
        elif tuple(head.shape) != (target.vocab, target.hidden):
            raise fail(f"tensor {prefix}{layout.head}.weight has shape {list(head.shape)}, "
                       f"expected {[target.vocab, target.hidden]}")
        head = head.to(target.device, target.dtype)
    return module.to(target.device, target.dtype).eval(), head


def build(target, settings):
    """The `mtp` drafter over the target checkpoint's own MTP layer 0."""
    from specviz.drafters.layers import DraftHead
    from specviz.drafters.mtp import MtpDrafter
    from specviz.engine.cost import forward_cost
    module, head_w = load(target)
    head = DraftHead(target, module.vocab, head_w if head_w is not None
                     else target.lm_head.weight.detach())
    return MtpDrafter(target, module, settings.gamma,
                      forward_cost(target) if settings.auto_budget else None, head=head,
                      origin=f"native MTP from the checkpoint, {module.layout.name} layout")
