"""Published drafter folders: resolve a local folder or a hub id, read config.json and the
safetensors weights, and decide the layout (../shared/FORMATS.md).

Boundary: files and names only; no modules. Everything that can go wrong with a folder
(missing, offline, unknown architecture, missing or misshapen tensors, a target it was not made
for) becomes one DrafterUnavailable line. Weights load from safetensors only (never pickle), and
no remote code is ever run.

A folder exported by specviz carries what the published layouts cannot express in
`specviz_extras.safetensors` (tensors named `specviz.*`) and a `specviz` block in config.json;
`model.safetensors.index.json` lists model.safetensors only, so vLLM and SGLang (which keep the
files named by the index) never read the extras.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from specviz.drafters.base import DrafterUnavailable

EXTRAS = "specviz_extras.safetensors"
INDEX = "model.safetensors.index.json"

# layout -> architectures that name it (SpecForge / vLLM / AngelSlim / z-lab / DeepSpec / yuhuili)
ARCHITECTURES = {
    "eagle3": ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM"),
    "dflash": ("DFlashDraftModel",),
    "dspark": ("Qwen3DSparkModel",),
    "eagle1": ("EagleLlamaForCausalLM", "LlamaForCausalLM"),
}
LAYOUT_NAMES = {"eagle3": "EAGLE-3", "eagle1": "EAGLE-1/2", "dflash": "DFlash", "dspark": "DSpark"}


@dataclass
class Folder:
    path: Path
    source: str                              # what the user gave (folder or hub id)
    config: dict
    layout: str                              # a key of LAYOUT_NAMES
    tensors: dict[str, torch.Tensor]         # published tensors (floating ones as float32)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)   # specviz.* tensors

    @property
    def specviz(self) -> dict:
        """The specviz block of an exported folder ({} for anyone else's)."""
        return self.config.get("specviz", {})

    def fail(self, why: str) -> DrafterUnavailable:
        return DrafterUnavailable(f"{LAYOUT_NAMES[self.layout]} drafter {self.source}: {why}")

    def require(self, expected: dict[str, tuple[int, ...]]) -> None:
        """Every expected tensor present with its shape; one line naming what is not."""
        missing = [k for k in expected if k not in self.tensors]
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise self.fail(f"missing tensors {', '.join(missing[:3])}{more}")
        for k, shape in expected.items():
            if tuple(self.tensors[k].shape) != tuple(shape):
                raise self.fail(f"tensor {k} has shape {list(self.tensors[k].shape)}, "
                                f"expected {list(shape)} from config.json and the target")

    def match(self, what: str, theirs, ours) -> None:
        if theirs != ours:
            raise self.fail(f"it was made for a target with {what} {theirs}, this target has "
                            f"{ours}")


def resolve(source: str) -> tuple[Path, str]:
    """(local folder, source) for a folder path or a hub id (config and safetensors files only)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path, source
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise DrafterUnavailable(f"drafter folder {source} not found (give a folder or a hub id "
                                 "owner/name)")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(source, allow_patterns=["*.json", "*.safetensors"])), source
    except Exception as exc:   # offline, unknown repo, gated repo: one line either way
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DrafterUnavailable(f"cannot fetch drafter {source} from the Hugging Face hub "
                                 f"(offline or not a public repo?): {first}") from None


def detect(config: dict, names: set[str]) -> str | None:
    """The layout of a config.json (and its tensor names, for the plain-Llama EAGLE-1 case)."""
    archs = set(config.get("architectures") or [])
    if archs & set(ARCHITECTURES["dspark"]) or "markov_rank" in config:
        return "dspark"
    if archs & set(ARCHITECTURES["dflash"]) or "dflash_config" in config:
        return "dflash"
    if archs & set(ARCHITECTURES["eagle3"]) or "draft_vocab_size" in config:
        return "eagle3"
    if (archs & set(ARCHITECTURES["eagle1"]) and config.get("num_hidden_layers") == 1
            and "fc.weight" in names and "lm_head.weight" not in names):
        return "eagle1"
    return None


def _read(files: list[Path]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                out[k] = t.float() if t.is_floating_point() else t
    return out


def weight_files(path: Path) -> list[Path]:
    """The model's safetensors files: those the index names, else all but the extras."""
    if (path / INDEX).is_file():
        names = set(json.loads((path / INDEX).read_text())["weight_map"].values())
        return [path / n for n in sorted(names)]
    return sorted(p for p in path.glob("*.safetensors") if p.name != EXTRAS)


def open_folder(source: str) -> Folder:
    path, source = resolve(source)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise DrafterUnavailable(f"drafter folder {source} has no config.json")
    try:
        config = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DrafterUnavailable(f"drafter folder {source}: config.json is not JSON ({exc})") from None
    files = weight_files(path)
    if not files:
        pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        note = f" ({', '.join(pickles[:2])} not loaded: pickle files can run code)" if pickles else ""
        raise DrafterUnavailable(f"drafter folder {source} has no .safetensors weights{note}")
    try:
        tensors = _read(files)
        extras = _read([path / EXTRAS]) if (path / EXTRAS).is_file() else {}
    except Exception as exc:   # a truncated or corrupt file
        raise DrafterUnavailable(f"drafter folder {source}: cannot read its safetensors "
                                 f"({type(exc).__name__}: {exc})") from None
    layout = detect(config, set(tensors))
    if layout is None:
        raise DrafterUnavailable(
            f"drafter folder {source}: unknown architecture {config.get('architectures')} "
            f"(supported: EAGLE-3 {ARCHITECTURES['eagle3'][0]}, EAGLE-1 LlamaForCausalLM with "
            "one layer and fc, DFlash DFlashDraftModel, DSpark Qwen3DSparkModel)")
    return Folder(path, source, config, layout, tensors, extras)


def attention(config: dict, d: int) -> dict:
    """LayerShape keywords of a drafter config's attention geometry (Llama / Qwen3 keys)."""
    heads = config.get("num_attention_heads")
    if not heads:
        raise DrafterUnavailable("drafter config.json has no num_attention_heads")
    rope = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta") \
        or (config.get("rope_scaling") or {}).get("rope_theta") or 10_000.0
    head_dim = config.get("head_dim") or d // heads
    inv, scale = rope_frequencies(config, float(rope), head_dim)
    return dict(d=d, heads=heads, kv_heads=config.get("num_key_value_heads") or heads,
                head_dim=head_dim, ffn=config.get("intermediate_size"), rope_theta=float(rope),
                eps=config.get("rms_norm_eps", 1e-6), rope_inv=inv, rope_scale=scale)


STATIC_ROPE = ("linear", "llama3", "yarn")   # scalings that do not change with the length


def rope_frequencies(config: dict, theta: float, head_dim: int) -> tuple[tuple[float, ...], float]:
    """((), 1.0) for plain RoPE; for a static rope_scaling (Llama-3.1's llama3, Qwen's yarn,
    linear) the inverse frequencies and cos/sin factor of transformers' own ROPE_INIT_FUNCTIONS,
    computed on the drafter's config as transformers would."""
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return (), 1.0
    if kind not in STATIC_ROPE:
        raise DrafterUnavailable(f"drafter rope_scaling {kind} is not supported (plain, "
                                 f"{', '.join(STATIC_ROPE)} only)")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    geometry = {k: config[k] for k in ("hidden_size", "num_attention_heads",
                                       "max_position_embeddings") if config.get(k)}
    cfg = LlamaConfig(**geometry, head_dim=head_dim,
                      rope_parameters={**params, "rope_type": kind, "rope_theta": theta})
    inv, scale = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    return tuple(inv.float().tolist()), float(scale)
