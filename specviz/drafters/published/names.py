"""Our module keys -> published tensor names, per layout: the one place they meet. The importer
loads through these maps and export.py writes through them, so an export -> import round trip is
exact by construction. Names under `specviz.` are what specviz's shipped drafters add to the
published architectures; they live in specviz_extras.safetensors, which serving engines never
read (folder.py).

Boundary: names and the checked, strict load of a module from a Folder; no forward code.
"""
from __future__ import annotations

import torch
from torch import nn

from specviz.drafters.base import DrafterUnavailable
from specviz.drafters.layers import DecoderLayer, LayerShape
from specviz.drafters.published.folder import EXTRAS, Folder, attention
from specviz.models.kernels import pack_linears

LAYER = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
         "o": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
         "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
         "post_norm": "post_attention_layernorm", "input_norm": "input_layernorm"}


def layer_names(ours: str, theirs: str, layer: DecoderLayer, input_norm: str = "") -> dict[str, str]:
    """Our DecoderLayer keys -> published keys; `input_norm`: where its input norm goes (default
    the layer's own input_layernorm)."""
    out = {}
    for key in layer.state_dict():
        mod, param = key.rsplit(".", 1)
        pub = input_norm if (mod == "input_norm" and input_norm) else f"{theirs}.{LAYER[mod]}"
        out[f"{ours}.{key}"] = f"{pub}.{param}"
    return out


def _tap_norms(prefix: str, norms: nn.ModuleList) -> dict[str, str]:
    return {f"{prefix}tap_norms.{i}.weight": f"specviz.tap_norms.{i}.weight"
            for i, n in enumerate(norms) if isinstance(n, nn.RMSNorm)}


def eagle3_names(head) -> dict[str, str]:
    """Eagle3Head: the shipped head's extra RMSNorm over the 2H concat is its layer's input norm."""
    names = {"fc.weight": "fc.weight", "emb_norm.weight": "midlayer.input_layernorm.weight",
             "h_norm.weight": "midlayer.hidden_norm.weight", "norm.weight": "norm.weight"}
    return (names | _tap_norms("", head.tap_norms)
            | layer_names("layer", "midlayer", head.layer, "specviz.midlayer.concat_norm"))


def eagle1_names(head) -> dict[str, str]:
    """Eagle1Head: the published layer 0 has no input norm; the shipped one has."""
    return ({"fc.weight": "fc.weight", "fc.bias": "fc.bias"}
            | layer_names("layer", "layers.0", head.layer, "specviz.layers.0.input_layernorm"))


def backbone_names(bb, prefix: str = "") -> dict[str, str]:
    """BlockBackbone (DFlash; DSpark's `backbone.`). `vocab` and `mask_embed` are not here:
    the loader derives them (a specviz draft vocabulary or the full one; a specviz mask
    embedding or the target's embedding of mask_token_id)."""
    names = {f"{prefix}fc.weight": "fc.weight", f"{prefix}ctx_norm.weight": "hidden_norm.weight",
             f"{prefix}norm.weight": "norm.weight"}
    for i, layer in enumerate(bb.layers):
        names |= layer_names(f"{prefix}layers.{i}", f"layers.{i}", layer)
    return names | _tap_norms(prefix, bb.tap_norms)


def dspark_names(model) -> dict[str, str]:
    """DSparkModel without its Markov tables (draft-vocabulary rows, rebuilt by the loader)."""
    return backbone_names(model.backbone, "backbone.") | {
        "conf.weight": "confidence_head.proj.weight", "conf.bias": "confidence_head.proj.bias"}


def load_mapped(folder: Folder, module: nn.Module, names: dict[str, str], target,
                given: dict[str, torch.Tensor] | None = None, dtype=None) -> nn.Module:
    """Check every mapped tensor (presence, shape), then load them with the `given` ones
    (strict: every key of the module is set); on the target's device, eval, linears packed."""
    given = given or {}
    state = {k: v for k, v in module.state_dict().items() if k not in given}
    pub = {names[k]: tuple(v.shape) for k, v in state.items() if not names[k].startswith("specviz.")}
    folder.require(pub)
    ext = [k for k, v in state.items() if names[k].startswith("specviz.")
           and tuple(folder.extras.get(names[k], torch.empty(0)).shape) != tuple(v.shape)]
    if ext:
        raise folder.fail(f"its config.json asks for specviz extras, but {EXTRAS} lacks or "
                          f"misshapes {', '.join(names[k] for k in ext[:3])}")
    module.load_state_dict({k: (folder.extras if names[k].startswith("specviz.") else
                                folder.tensors)[names[k]] for k in state} | given)
    module = module.to(target.device) if dtype is None else module.to(target.device, dtype)
    return pack_linears(module.eval())


def layer_shape(folder: Folder, target, d_in: int = 0, input_norm: bool = True, prefix: str = "") -> LayerShape:
    """The drafter layers' geometry from its config.json (Qwen3 q/k norms where the folder has
    them, at `prefix`; scaled RoPE from its rope_scaling); its hidden size must be the target's."""
    cfg = folder.config
    d = cfg.get("hidden_size")
    folder.match("hidden size", d, target.hidden)
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise folder.fail("attention / MLP biases are not supported")
    if any(t != "full_attention" for t in cfg.get("layer_types") or []) and \
            len(cfg.get("layer_types") or []) <= (cfg.get("num_hidden_layers") or 1):
        raise folder.fail(f"its layer_types {cfg['layer_types']} include sliding-window layers, "
                          "which are not supported")
    qk = f"{prefix}.self_attn.q_norm.weight" in folder.tensors
    try:
        kw = attention(cfg, d)
    except DrafterUnavailable as exc:
        raise folder.fail(str(exc).removeprefix("drafter ")) from None
    if not kw["ffn"]:
        gate = folder.tensors.get(f"{prefix}.mlp.gate_proj.weight")
        kw["ffn"] = gate.shape[0] if gate is not None else 4 * d
    return LayerShape(**kw, d_in=d_in, qk_norm=qk, input_norm=input_norm)
