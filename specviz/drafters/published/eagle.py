"""EAGLE-3 (SpecForge / vLLM layout) and EAGLE-1/2 (yuhuili layout) heads built from a published
folder, as feature heads the shipped drafters (eagle3.Eagle3Drafter, eagle.EagleDrafter) draft
with: the same EAGLE-2 dynamic tree, static tree and chain code.

Boundary: tensor names, shapes and the two heads' flags; drafting lives in feature_heads.

EAGLE-3, per entry i (FORMATS.md §1): g_i = fc(cat(h_a, h_b, h_c)) on the target's hidden
states (input ids: hidden_states[i]) for real positions, the drafter's own pre-norm output on
draft steps; x = cat(input_layernorm(emb(t_{i+1})), hidden_norm(g_i)) (2H) -> attention with
residual g_i -> post-norm MLP -> out; logits = lm_head(norm(out)) over the draft vocabulary, draft
id j meaning target id j + d2t[j].
EAGLE-1 (§2): out = layer(fc(cat(emb(t_{i+1}), f_i))) with no input norm on layer 0, f the
target's final normed state; logits = the target's LM head on out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specviz.drafters.eagle import Eagle1Head
from specviz.drafters.eagle3 import Eagle3Head, eagle3_taps
from specviz.drafters.layers import DecoderLayer, LayerShape
from specviz.drafters.published.folder import Folder
from specviz.drafters.published.names import eagle1_names, eagle3_names, layer_shape, load_mapped
from specviz.models.kernels import Prepacked


class FolderHead(nn.Module):
    """The frozen pieces a feature head reads: the target's embedding (or the folder's own
    embed_tokens), LM-head rows `head_w` for the draft ids `vocab_ids` (sorted target ids)."""

    def init_frozen(self, target, vocab_ids: torch.Tensor, head_w: torch.Tensor,
                    emb_w: torch.Tensor | None = None) -> None:
        self.vocab = target.vocab
        order = vocab_ids.argsort()                    # draft ids in target-id order (chain's search)
        self.register_buffer("vocab_ids", vocab_ids[order].long(), persistent=False)
        self.register_buffer("head_w", head_w[order].float(), persistent=False)
        emb = target.embed.weight if emb_w is None else emb_w
        self.register_buffer("emb_w", emb.detach().float(), persistent=False)
        self.head_mm = Prepacked()

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.emb_w)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head_mm(h, self.head_w)


class Eagle3Layout(FolderHead, Eagle3Head):
    """Eagle3Head's fuse/forward over published weights; tap norms and the concat norm only
    where a specviz export carries them."""

    def __init__(self, target, shape: LayerShape, taps: tuple[int, ...], tap_norms: bool,
                 vocab_ids: torch.Tensor, head_w: torch.Tensor, emb_w: torch.Tensor | None,
                 d_target: int):
        nn.Module.__init__(self)
        self.init_frozen(target, vocab_ids, head_w, emb_w)
        self.taps = taps
        d = shape.d
        self.tap_norms = nn.ModuleList((nn.RMSNorm(d_target, eps=shape.eps) if tap_norms
                                        else nn.Identity()) for _ in taps)
        self.fc = nn.Linear(len(taps) * d_target, d, bias=False)
        self.emb_norm = nn.RMSNorm(d, eps=shape.eps)
        self.h_norm = nn.RMSNorm(d, eps=shape.eps)
        self.layer = DecoderLayer(shape)
        self.norm = nn.RMSNorm(d, eps=shape.eps)


class Eagle1Layout(FolderHead, Eagle1Head):
    """Eagle1Head's fuse/forward over published weights: no input norm on the layer unless a
    specviz export carries one; the target's LM head (rows of a specviz draft vocabulary)."""

    def __init__(self, target, shape: LayerShape, vocab_ids: torch.Tensor):
        nn.Module.__init__(self)
        self.init_frozen(target, vocab_ids, target.lm_head.weight.detach()[vocab_ids])
        self.taps = (target.n_layers,)
        self.fc = nn.Linear(2 * shape.d, shape.d, bias=True)
        self.layer = DecoderLayer(shape)


def eagle3_taps_of(folder: Folder, target) -> tuple[int, ...]:
    """hidden_states indices: the specviz block's, else eagle_aux_hidden_state_layer_ids read as
    vLLM reads them (input ids, hidden_states[i]), else the EAGLE-3 default (2, N//2, N-3)."""
    sv = folder.specviz.get("taps_hidden_states")
    if sv:
        return tuple(sv)
    ids = folder.config.get("eagle_aux_hidden_state_layer_ids") or \
        (folder.config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    taps = tuple(ids) if ids else eagle3_taps(target.n_layers)
    if max(taps) > target.n_layers:
        raise folder.fail(f"it reads target layers {list(taps)}, but the target has "
                          f"{target.n_layers}")
    return taps


def load_eagle3(folder: Folder, target) -> Eagle3Layout:
    cfg, t = folder.config, folder.tensors
    folder.match("vocabulary size", cfg.get("vocab_size", target.vocab), target.vocab)
    if "layers.0.self_attn.q_proj.weight" in t and "midlayer.self_attn.q_proj.weight" not in t:
        folder.tensors = t = {k.replace("layers.0.", "midlayer.", 1): v for k, v in t.items()}
    d_target = cfg.get("target_hidden_size") or target.hidden
    folder.match("hidden size", d_target, target.hidden)
    shape = layer_shape(folder, target, d_in=2 * cfg.get("hidden_size", 0),
                   input_norm=bool(folder.specviz.get("concat_norm")), prefix="midlayer")
    vd = cfg.get("draft_vocab_size") or target.vocab
    folder.require({"lm_head.weight": (vd, shape.d)})
    if "d2t" in t:
        folder.require({"d2t": (vd,)})
        vocab_ids = torch.arange(vd) + t["d2t"].long()
        if vocab_ids.min() < 0 or vocab_ids.max() >= target.vocab or len(set(vocab_ids.tolist())) < vd:
            raise folder.fail("d2t maps draft ids outside the target vocabulary or twice")
    elif vd == target.vocab:
        vocab_ids = torch.arange(vd)
    else:
        raise folder.fail(f"draft_vocab_size {vd} < the target's {target.vocab} but no d2t tensor")
    emb_w = t.get("embed_tokens.weight")
    if emb_w is not None:
        folder.require({"embed_tokens.weight": (target.vocab, shape.d)})
    taps = eagle3_taps_of(folder, target)
    folder.match("feature width", t["fc.weight"].shape[-1] if "fc.weight" in t else None,
                 len(taps) * d_target)
    head = Eagle3Layout(target, shape, taps, bool(folder.specviz.get("tap_norms")), vocab_ids,
                        t["lm_head.weight"], emb_w, d_target)
    return load_mapped(folder, head, eagle3_names(head), target)


def load_eagle1(folder: Folder, target) -> Eagle1Layout:
    cfg, t = folder.config, folder.tensors
    folder.match("vocabulary size", cfg.get("vocab_size", target.vocab), target.vocab)
    shape = layer_shape(folder, target, input_norm=bool(folder.specviz.get("input_norm")),
                   prefix="layers.0")
    if "fc.bias" not in t and not cfg.get("bias", True):   # bias-free fc: a zero bias
        t["fc.bias"] = torch.zeros(shape.d)
    vocab = folder.extras.get("specviz.draft_vocab")
    head = Eagle1Layout(target, shape, vocab.long() if vocab is not None else torch.arange(target.vocab))
    return load_mapped(folder, head, eagle1_names(head), target)
