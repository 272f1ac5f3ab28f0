"""Where training starts: drafter weights initialised from the target's own weights.

Boundary: in-place initialisation of freshly built drafter modules (drafters/draft.py,
dflash.py, mtp.py) from a target, and the depth (`--layers`) a drafter is built with; nothing
here runs at inference (shipped weights replace it).
"""
from __future__ import annotations

import torch
from torch import nn

from specviz.drafters.dflash import BlockBackbone
from specviz.drafters.draft import DraftModel
from specviz.drafters.layers import DecoderLayer
from specviz.drafters.mtp import MtpModule
from specviz.train.data import is_vocab_key, shipped_vocab

TARGET_NAMES = {"input_norm": "input_layernorm", "post_norm": "post_attention_layernorm",
                "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                "down": "mlp.down_proj"}


@torch.no_grad()
def copy_target_layer(layer: DecoderLayer, src: nn.Module) -> None:
    """Initialise a drafter layer from a target (HF Llama) decoder layer of the same geometry."""
    for mine, theirs in TARGET_NAMES.items():
        getattr(layer, mine).weight.copy_(src.get_submodule(theirs).weight)


@torch.no_grad()
def as_identity(layer: nn.Module) -> None:
    """Zero a decoder layer's residual-writing projections (attention o, MLP down; ours or an HF
    Llama layer's, the draft model's): it then adds nothing to its input, while its other weights
    keep their start."""
    ours = isinstance(layer, DecoderLayer)
    for name in ("o", "down"):
        layer.get_submodule(name if ours else TARGET_NAMES[name]).weight.zero_()


@torch.no_grad()
def revocab(module: nn.Module, tensors: dict[str, torch.Tensor], old: torch.Tensor
            ) -> dict[str, torch.Tensor]:
    """Shipped tensors fitted to `module`, built for another draft vocabulary than theirs (`old`,
    target ids; `--draft-vocab` with `--init shipped`): the vocabulary lists are the module's,
    and the weights whose rows follow the vocabulary (a module's VOCAB_ROWS) keep each row of a
    token in both; a new token's row starts as VOCAB_ROWS says ("other": the last, shared row,
    "zero"). Every other weight is vocabulary-free (frozen LM-head rows do the rest)."""
    rows = getattr(module, "VOCAB_ROWS", {})
    new = shipped_vocab(dict(module.state_dict())) if rows else None
    return {k: _rows(v, old.long(), new.long(), rows[k]) if k in rows else v
            for k, v in tensors.items() if not is_vocab_key(k)}   # the module's own list stays


def _rows(w: torch.Tensor, old: torch.Tensor, new: torch.Tensor, start: str) -> torch.Tensor:
    """w's rows (one per token of `old`, maybe plus trailing shared rows) re-indexed by `new`."""
    where = torch.full((int(max(old.max(), new.max())) + 1,), -1, dtype=torch.long)
    where[old] = torch.arange(len(old))
    src = where[new]
    extra = w[len(old):]                               # rows past the vocabulary ("other")
    fill = extra[-1] if start == "other" else torch.zeros_like(w[0])
    body = torch.where((src >= 0)[:, None], w[src.clamp(min=0)], fill)
    return torch.cat([body, extra])


def depth(args, default: int) -> int:
    """The decoder layers a drafter is built with: `--layers`, else its `default`."""
    layers = getattr(args, "layers", 0) or default
    if not 1 <= layers <= 8:
        raise ValueError("--layers must be in 1..8")
    return layers


def layers_from(n_layers: int, k: int) -> list[int]:
    """The target layers a k-layer draft model starts from: evenly spaced from the first to the
    last (for 2 layers, those two)."""
    return [round(i * (n_layers - 1) / max(k - 1, 1)) for i in range(k)]


def draft_model(model: DraftModel, target) -> DraftModel:
    """Copy target layers `layers_from` (recorded as model.source_layers) and the final norm."""
    src = target.model.model
    model.source_layers = layers_from(src.config.num_hidden_layers, len(model.lm.model.layers))
    with torch.no_grad():
        for mine, i in zip(model.lm.model.layers, model.source_layers):
            mine.load_state_dict(src.layers[i].state_dict())
        model.lm.model.norm.weight.copy_(src.norm.weight)
    return model


def block_backbone(bb: BlockBackbone, target) -> BlockBackbone:
    """Start from the target's last decoder layer (output projections zeroed: each layer starts
    as the identity), a damped copy of its final norm (small first logits rather than
    confident wrong ones), and a MASK embedding at the mean token embedding. The context norm
    starts as that layer's input norm: its copied k/v projections expect inputs at that
    scale (a unit-weight norm made context attention logits ~10x too large, a saturated
    softmax that never learned to read the context)."""
    for layer in bb.layers:
        copy_target_layer(layer, target.model.model.layers[-1])
    layers = target.model.model.layers
    with torch.no_grad():
        for tap, norm in zip(bb.taps, bb.tap_norms):
            src = layers[tap].input_layernorm if tap < len(layers) else target.final_norm
            norm.weight.copy_(src.weight)
        bb.ctx_norm.weight.copy_(layers[-1].input_layernorm.weight)
        for layer in bb.layers:
            as_identity(layer)
        bb.norm.weight.copy_(0.2 * target.final_norm.weight)
        bb.mask_embed.copy_(target.embed.weight.mean(0))
    return bb


def mtp_module(m: MtpModule, target) -> MtpModule:
    """Start near the identity: M = [0.1 I | I] passes h through, and the block (the target's
    last decoder layer) has zeroed output projections, so the first drafts are the target's
    own next-token guess; training shifts them one token ahead."""
    copy_target_layer(m.block, target.model.model.layers[-1])
    with torch.no_grad():
        as_identity(m.block)
        m.norm.weight.copy_(target.final_norm.weight)
        d = m.shape.d
        m.proj.weight.zero_()
        m.proj.weight[:, d:] = torch.eye(d)
        m.proj.weight[:, :d] = 0.1 * torch.eye(d)
    return m
