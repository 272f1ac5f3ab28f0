"""Export the shipped drafters in the published layouts serving engines load (DESIGN.md §5:
`python -m specviz export DRAFTER --out DIR`): eagle3 -> EAGLE-3, eagle1 -> EAGLE-1,
dflash-b8 / dflash-b16 -> DFlash, dspark -> DSpark.

Boundary: shipped weights (weights.load) in, a folder out: config.json, model.safetensors (the
published tensors, through names.py), model.safetensors.index.json (naming model.safetensors
only, so vLLM and SGLang skip the rest) and specviz_extras.safetensors (what the published
architectures cannot express; our importer applies it, so `--set path=` reproduces the shipped
drafter exactly). The report lists, per item, what a serving engine computes differently: the
shipped architectures predate this export, and their weights cannot be converted exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specviz.drafters import weights
from specviz.drafters.dflash import BlockBackbone
from specviz.drafters.dspark import DSparkModel
from specviz.drafters.eagle import Eagle1Head
from specviz.drafters.eagle3 import Eagle3Head
from specviz.drafters.layers import LayerShape, vocab_lookup
from specviz.drafters.published.folder import EXTRAS, INDEX
from specviz.drafters.published.names import backbone_names, dspark_names, eagle1_names, eagle3_names

FORMAT_OF = {"eagle3": "eagle3", "eagle1": "eagle1", "dflash-b8": "dflash", "dflash-b16": "dflash",
             "dspark": "dspark"}
ARCH = {"eagle3": "LlamaForCausalLMEagle3", "eagle1": "LlamaForCausalLM",
        "dflash": "DFlashDraftModel", "dspark": "Qwen3DSparkModel"}

TAP_NORMS = ("tap norms: specviz RMS-normalizes each target hidden state it reads ({taps}) with "
             "its own learned weight before fc (specviz.tap_norms.* in specviz_extras); a serving "
             "engine feeds the raw hidden states to fc. Consequence: fc sees inputs on another "
             "scale (this target's residual streams carry outlier dimensions in the thousands), "
             "so the fused feature and every draft differ: output stays lossless, acceptance "
             "collapses toward zero.")
DRAFT_VOCAB = ("draft vocabulary: specviz drafts only the {n} tokens of its draft vocabulary "
               "(specviz.draft_vocab); a serving engine scores the whole {v}-token LM head. "
               "Consequence: where the engine's best token lies outside that set, it drafts a "
               "token specviz would not; a small change in acceptance.")


def _split(tensors: dict, names: dict) -> tuple[dict, dict]:
    """(published tensors, specviz extras) by name; every shipped tensor must have a name."""
    unnamed = sorted(set(tensors) - set(names))
    if unnamed:
        raise RuntimeError(f"export: no published name for {', '.join(unnamed)}")
    pub = {names[k]: v for k, v in tensors.items() if k in names and not names[k].startswith("specviz.")}
    ext = {names[k]: v for k, v in tensors.items() if k in names and names[k].startswith("specviz.")}
    return pub, ext


def _base_config(target, shape: LayerShape, layers: int) -> dict:
    cfg = target.model.config
    return {"model_type": cfg.model_type, "hidden_size": shape.d, "intermediate_size": shape.ffn,
            "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim, "num_hidden_layers": layers, "rms_norm_eps": shape.eps,
            "rope_theta": shape.rope_theta, "hidden_act": "silu", "vocab_size": target.vocab,
            "max_position_embeddings": target.max_len, "tie_word_embeddings": False,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
            "torch_dtype": "float32"}


def _eagle3(target, raw: dict) -> tuple[dict, dict, dict, list[str], dict]:
    vocab = raw.pop("vocab_ids").long()
    head = Eagle3Head(target, vocab)
    pub, ext = _split(raw, eagle3_names(head))
    pub["lm_head.weight"] = target.lm_head.weight.detach().float()[vocab]
    pub["d2t"] = vocab - torch.arange(len(vocab))
    t2d = torch.zeros(target.vocab, dtype=torch.bool)
    t2d[vocab] = True
    pub["t2d"] = t2d
    shape = head.layer.s
    config = _base_config(target, shape, 1) | {
        "architectures": [ARCH["eagle3"]], "model_type": "llama", "draft_vocab_size": len(vocab),
        "target_hidden_size": target.hidden}
    spec = {"taps_hidden_states": list(head.taps), "tap_norms": True, "concat_norm": True}
    diffs = [TAP_NORMS.format(taps=f"hidden_states {list(head.taps)}, the EAGLE-3 default "
                              "(2, N//2, N-3) that vLLM and SGLang also use when config.json "
                              "names no layers"),
             "concat norm: specviz applies one more RMSNorm (learned weight, width 2H) over "
             "cat(input_layernorm(emb), hidden_norm(h)) before q/k/v "
             "(specviz.midlayer.concat_norm.weight); the engines' EAGLE-3 layer feeds the concat "
             "to q/k/v directly. Consequence: the attention inputs differ in scale at every "
             "position, so attention and drafts differ."]
    return config, pub, ext, diffs, spec


def _eagle1(target, raw: dict):
    vocab = raw.pop("vocab_ids").long()
    head = Eagle1Head(target, vocab)
    pub, ext = _split(raw, eagle1_names(head))
    ext["specviz.draft_vocab"] = vocab
    config = _base_config(target, head.layer.s, 1) | {"architectures": [ARCH["eagle1"]],
                                                      "bias": True}
    diffs = ["layer-0 input norm: specviz's decoder layer RMS-normalizes its input fc(cat(emb, "
             "f)) (specviz.layers.0.input_layernorm.weight); yuhuili's EAGLE-1 and vLLM's "
             "llama_eagle skip layer 0's input norm. Consequence: attention sees other inputs, "
             "so the predicted features and the drafts differ.",
             DRAFT_VOCAB.format(n=len(vocab), v=target.vocab)]
    return config, pub, ext, diffs, {"input_norm": True}


def _mask_token(target, mask: torch.Tensor) -> tuple[int, str]:
    emb = target.embed.weight.detach().float()
    dist = (emb - mask.float()).norm(dim=-1)
    i = int(dist.argmin())
    return i, (f"mask embedding: specviz fills the block's mask positions with a learned "
               f"embedding (specviz.mask_embed); the published layout embeds mask_token_id. The "
               f"exported mask_token_id {i} ({target.piece(i)!r}) is the target token nearest to "
               f"it (L2 distance {float(dist[i]):.3g}, the embedding's norm "
               f"{float(mask.float().norm()):.3g}). Consequence: every mask row of the block "
               f"starts from another input, so the drafts differ.")


QK_NORM = ("q/k norms: the published DFlash/DSpark layers (Qwen3-style; vLLM and SGLang) "
           "RMS-normalize each q and k head before RoPE; specviz's layers do not, and the folder "
           "has no q_norm/k_norm tensors (an engine leaves them at unit weight and still "
           "normalizes). Consequence: attention logits change scale; drafts differ.")


def _block_parts(target, raw: dict, cfg: dict, prefix: str):
    bb = BlockBackbone(LayerShape.of(target, ffn=cfg["ffn"]), raw[f"{prefix}vocab"], target.vocab,
                       cfg["layers"], tuple(cfg["taps"]))
    vocab = raw.pop(f"{prefix}vocab").long()
    mask = raw.pop(f"{prefix}mask_embed")
    mask_id, mask_diff = _mask_token(target, mask)
    ext = {"specviz.mask_embed": mask, "specviz.draft_vocab": vocab}
    diffs = [TAP_NORMS.format(taps=f"hidden_states {list(bb.taps)}"), mask_diff, QK_NORM,
             DRAFT_VOCAB.format(n=len(vocab), v=target.vocab)]
    return bb, vocab, mask_id, ext, diffs


def _dflash(target, raw: dict, cfg: dict, block: int):
    bb, vocab, mask_id, ext, diffs = _block_parts(target, raw, cfg, "")
    pub, ext2 = _split(raw, backbone_names(bb))
    ids = [t - 1 for t in bb.taps]
    config = _base_config(target, bb.shape, cfg["layers"]) | {
        "architectures": [ARCH["dflash"]], "num_target_layers": target.n_layers,
        "block_size": block, "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": ids,
                                               "block_size": block}}
    spec = {"tap_norms": True, "mask_embed": True, "qk_norm": False}
    return config, pub, ext | ext2, diffs, spec


def _dspark(target, raw: dict, cfg: dict):
    model = DSparkModel(LayerShape.of(target, ffn=cfg["ffn"]), raw["backbone.vocab"], target.vocab,
                        block=cfg["block"], n_layers=cfg["layers"], rank=cfg["rank"],
                        taps=tuple(cfg["taps"]))
    _, vocab, mask_id, ext, diffs = _block_parts(target, raw, cfg, "backbone.")
    w1, w2, temperature = raw.pop("w1.weight"), raw.pop("w2.weight"), raw.pop("temperature")
    bias = raw.pop("calibration_bias")
    pub, ext2 = _split(raw, dspark_names(model))
    pub["markov_head.markov_w1.weight"] = w1[vocab_lookup(vocab, target.vocab)]
    full_w2 = torch.zeros(target.vocab, w2.shape[1])
    full_w2[vocab] = w2
    pub["markov_head.markov_w2.weight"] = full_w2
    pub["embed_tokens.weight"] = target.embed.weight.detach().float()
    pub["lm_head.weight"] = target.lm_head.weight.detach().float().clone()   # tied in some targets
    ext["specviz.temperature"], ext["specviz.calibration_bias"] = temperature, bias
    config = target.model.config.to_dict() | _base_config(target, model.backbone.shape, cfg["layers"]) | {
        "architectures": [ARCH["dspark"]], "block_size": cfg["block"], "mask_token_id": mask_id,
        "target_layer_ids": [t - 1 for t in model.backbone.taps], "num_target_layers": target.n_layers,
        "markov_rank": cfg["rank"], "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True}
    diffs.append("confidence calibration: specviz divides each block position's confidence logit "
                 "by a calibration temperature (specviz.temperature) and adds a calibration bias "
                 "(specviz.calibration_bias) before the sigmoid; an "
                 "engine uses σ(proj([h ; markov_w1[prev]])) as it is. Consequence: other "
                 "confidences, so other truncation points (throughput only). Whether vLLM's "
                 "dspark method runs confidence-scheduled verification at all is unconfirmed.")
    spec = {"tap_norms": True, "mask_embed": True, "qk_norm": False, "temperature": True,
            "calibration_bias": True}
    return config, pub, ext | ext2, diffs, spec


def serving(fmt: str, path: str, block: int = 0) -> tuple[dict, list[str]]:
    """(vLLM --speculative-config object, SGLang launch flags) for a folder of this format; the
    tree shapes are the shipped strategies' defaults."""
    head = ["--speculative-draft-model-path", path]
    if fmt == "eagle3":
        return ({"method": "eagle3", "model": path, "num_speculative_tokens": 5},
                ["--speculative-algorithm", "EAGLE3", *head, "--speculative-num-steps", "7",
                 "--speculative-eagle-topk", "6", "--speculative-num-draft-tokens", "24"])
    if fmt == "eagle1":
        return ({"method": "eagle", "model": path, "num_speculative_tokens": 5},
                ["--speculative-algorithm", "EAGLE", *head, "--speculative-num-steps", "6",
                 "--speculative-eagle-topk", "6", "--speculative-num-draft-tokens", "24"])
    if fmt == "dflash":
        return ({"method": "dflash", "model": path, "num_speculative_tokens": block - 1},
                ["--speculative-algorithm", "DFLASH", *head])
    return ({"method": "dspark", "model": path, "num_speculative_tokens": block},
            ["--speculative-algorithm", "DSPARK", *head, "--speculative-dspark-block-size", str(block)])


def export(drafter_id: str, out: str | Path, target, fmt: str = "auto") -> dict:
    """Write the folder; return the report (DESIGN.md §5 keys plus `differences`)."""
    if drafter_id not in FORMAT_OF:
        raise ValueError(f"cannot export {drafter_id!r}; exportable drafters: {', '.join(FORMAT_OF)}")
    own = FORMAT_OF[drafter_id]
    if fmt not in ("auto", own):
        raise ValueError(f"{drafter_id} exports in the {own} layout only (--format auto or {own})")
    raw, cfg = weights.load(drafter_id, target.fingerprint)
    block = 0
    if own == "eagle3":
        config, pub, ext, diffs, spec = _eagle3(target, raw)
    elif own == "eagle1":
        config, pub, ext, diffs, spec = _eagle1(target, raw)
    elif own == "dflash":
        block = int(drafter_id.rsplit("-b", 1)[1])
        config, pub, ext, diffs, spec = _dflash(target, raw, cfg, block)
    else:
        block = cfg["block"]
        config, pub, ext, diffs, spec = _dspark(target, raw, cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config["specviz"] = spec | {"drafter": drafter_id, "target": target.model_id,
                                "fingerprint": target.fingerprint, "extras": EXTRAS,
                                "differences": diffs}
    ready = lambda d: {k: v.detach().cpu().contiguous() for k, v in d.items()}   # noqa: E731
    save_file(ready(pub), str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(ready(ext), str(out / EXTRAS), metadata={"format": "pt"})
    (out / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {
        k: "model.safetensors" for k in sorted(pub)}}, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    files = ["config.json", "model.safetensors", INDEX, EXTRAS]
    spec_cfg, sglang = serving(own, str(out), block)
    return {"path": str(out), "format": own, "drafter": drafter_id, "files": files,
            "speculative_config": spec_cfg, "sglang_args": sglang, "differences": diffs}
