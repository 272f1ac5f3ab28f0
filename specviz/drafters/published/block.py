"""DFlash (z-lab layout) and DSpark (DeepSpec layout) drafters built from a published folder, on
the shipped block machinery (dflash.BlockBackbone / ContextCache, dspark.DSparkModel /
DSparkDrafter): the same drafting code, the published weights and conventions.

Boundary: config keys, the derived tensors (vocabulary, mask embedding, Markov tables) and the
checks against the target; forward code stays in dflash.py / dspark.py / layers.py.

DFlash (FORMATS.md §3): ctx = hidden_norm(fc(cat(hidden_states[i + 1] for the output ids i in
target_layer_ids))); every layer attends, non-causally, from the block [anchor, mask x (b-1)]
(embedded with the target's embeddings; mask = the target's embedding of mask_token_id) over
[W_k ctx ; W_k block] (q/k RMS-normed per head for Qwen3-style layers, then RoPE at the true
positions); final norm, the target's LM head; block rows 1..b-1 are the b-1 drafts.
DSpark (§4): the same backbone; all b rows draft (the anchor row predicts too), row k's logits
+ markov_w2(markov_w1[x_k]) with x_0 the anchor and x_k the previous draft; confidence
c_k = σ(proj([h_k ; markov_w1[x_k]])).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specviz.drafters.dflash import BlockBackbone, DFlashDrafter
from specviz.drafters.dspark import DSparkDrafter, DSparkModel
from specviz.drafters.layers import vocab_lookup
from specviz.drafters.published.folder import Folder
from specviz.drafters.published.names import backbone_names, dspark_names, layer_shape, load_mapped
from specviz.engine.cost import forward_cost


def target_taps(folder: Folder, ids, target, n_taps: int) -> tuple[int, ...]:
    """Output layer ids -> hidden_states indices (i + 1); when a config has none, n_taps ids
    spread evenly from 1 to N - 3 (z-lab's default)."""
    N = target.n_layers
    if not ids:
        ids = [1] if n_taps == 1 else [round(1 + i * (N - 4) / (n_taps - 1)) for i in range(n_taps)]
    if max(ids) >= N or min(ids) < -1:
        raise folder.fail(f"it reads target layers {list(ids)} (output ids), but the target has "
                          f"{N} layers")
    return tuple(i + 1 for i in ids)


def _backbone(folder: Folder, target, vocab: torch.Tensor, ids, mask_token_id) -> tuple[BlockBackbone, dict[str, torch.Tensor]]:
    """A BlockBackbone shaped by the folder, and the tensors the loader derives itself."""
    cfg, sv = folder.config, folder.specviz
    shape = layer_shape(folder, target, prefix="layers.0")
    fc = folder.tensors.get("fc.weight")
    if fc is None:
        raise folder.fail("missing tensors fc.weight")
    taps = target_taps(folder, ids, target, fc.shape[-1] // shape.d)
    n_layers = cfg.get("num_hidden_layers") or 1
    bb = BlockBackbone(shape, vocab, target.vocab, n_layers, taps)
    if not sv.get("tap_norms"):
        bb.tap_norms = nn.ModuleList(nn.Identity() for _ in taps)
    if sv.get("mask_embed"):
        mask = folder.extras.get("specviz.mask_embed")
        if mask is None or mask.shape != (shape.d,):
            raise folder.fail("its config.json asks for specviz.mask_embed, which is missing")
    else:
        if mask_token_id is None or not 0 <= int(mask_token_id) < target.vocab:
            raise folder.fail(f"mask_token_id {mask_token_id} is not a token of the target")
        mask = target.embed.weight.detach()[int(mask_token_id)].float()
    if float(cfg.get("input_embedding_scale", (cfg.get("dflash_config") or {}).get(
            "input_embedding_scale", 1.0))) != 1.0:
        raise folder.fail("input_embedding_scale != 1 is not supported")
    return bb, {"mask_embed": mask, "vocab": vocab.long()}


def _vocab(folder: Folder, target) -> torch.Tensor:
    """The draft vocabulary (target ids): a specviz export's, else the whole vocabulary."""
    v = folder.extras.get("specviz.draft_vocab")
    vocab = v.long() if v is not None else torch.arange(target.vocab)
    if vocab.min() < 0 or vocab.max() >= target.vocab:
        raise folder.fail("its draft vocabulary has ids outside the target's vocabulary")
    return vocab


def _check_family(folder: Folder, target) -> None:
    cfg = folder.config
    folder.match("vocabulary size", cfg.get("vocab_size", target.vocab), target.vocab)
    n = cfg.get("num_target_layers")
    if n is not None:
        folder.match("layer count", n, target.n_layers)


def load_dflash(folder: Folder, target) -> tuple[BlockBackbone, int]:
    """(loaded backbone, block size b: b - 1 drafts per forward)."""
    cfg = folder.config
    _check_family(folder, target)
    dc = cfg.get("dflash_config") or {}
    block = int(dc.get("block_size") or cfg.get("block_size") or 16)
    if block < 2:
        raise folder.fail(f"block_size {block}: DFlash needs at least 2 (b - 1 drafts)")
    bb, given = _backbone(folder, target, _vocab(folder, target), dc.get("target_layer_ids"),
                          dc.get("mask_token_id", cfg.get("mask_token_id")))
    return load_mapped(folder, bb, backbone_names(bb), target, given, target.dtype), block


def load_dspark(folder: Folder, target) -> DSparkModel:
    cfg = folder.config
    _check_family(folder, target)
    kind = str(cfg.get("markov_head_type", "vanilla")).lower()
    if kind != "vanilla" or not cfg.get("markov_rank"):
        raise folder.fail(f"markov_head_type {kind!r} with rank {cfg.get('markov_rank')} is not "
                          "supported (only the vanilla Markov head)")
    if not (cfg.get("enable_confidence_head") and cfg.get("confidence_head_with_markov")):
        raise folder.fail("it needs enable_confidence_head and confidence_head_with_markov")
    block = int(cfg.get("block_size") or 0)
    if block < 1:
        raise folder.fail("config.json has no block_size")
    vocab, r = _vocab(folder, target), int(cfg["markov_rank"])
    bb, given = _backbone(folder, target, vocab, cfg.get("target_layer_ids"),
                          cfg.get("mask_token_id"))
    model = DSparkModel(bb.shape, vocab, target.vocab, block=block, n_layers=len(bb.layers),
                        rank=r, taps=bb.taps)
    model.backbone = bb
    folder.require({"markov_head.markov_w1.weight": (target.vocab, r),
                    "markov_head.markov_w2.weight": (target.vocab, r)})
    w1, w2 = folder.tensors["markov_head.markov_w1.weight"], folder.tensors["markov_head.markov_w2.weight"]
    other = vocab_lookup(vocab, target.vocab) == len(vocab)       # ids outside the draft vocabulary
    other_row = w1[other.nonzero()[0, 0]] if other.any() else torch.zeros(r)
    given = {f"backbone.{k}": v for k, v in given.items()} | {
        "w1.weight": torch.cat([w1[vocab], other_row[None]]), "w2.weight": w2[vocab],
        "temperature": folder.extras.get("specviz.temperature", torch.ones(block)),
        "calibration_bias": folder.extras.get("specviz.calibration_bias", torch.zeros(block))}
    for key in ("temperature", "calibration_bias"):
        if given[key].shape != (block,):
            raise folder.fail(f"specviz.{key} has shape {list(given[key].shape)}, "
                              f"expected [{block}]")
    return load_mapped(folder, model, dspark_names(model), target, given, target.dtype)


def dflash_drafter(folder: Folder, target, settings) -> DFlashDrafter:
    """The checkpoint's block size is used (settings.block_size picks a shipped model only)."""
    bb, block = load_dflash(folder, target)
    return DFlashDrafter(target, bb, block, settings.window,
                         forward_cost(target) if settings.auto_budget else None, settings.tree)


def dspark_drafter(folder: Folder, target, settings) -> DSparkDrafter:
    """At most the checkpoint's block of drafts per forward."""
    model = load_dspark(folder, target)
    settings = dataclasses.replace(settings, block_size=min(settings.block_size, model.block))
    cost = forward_cost(target) if settings.scheduler == "hardware" else None
    return DSparkDrafter(target, model, settings, cost)
