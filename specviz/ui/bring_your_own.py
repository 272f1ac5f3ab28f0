"""The "Bring your own" part of the Models & guide tab: published target/drafter pairs and how to
load each, which strategies the loaded target can use (and why not), and the export / serve
commands for the shipped drafters.

Boundary: the registry's availability + the export module's serving flags -> Markdown. Nothing
is loaded or written here; the commands are for the user to run.
"""
from __future__ import annotations

import json
import shlex

from specviz import strategies
from specviz.drafters.published.export import FORMAT_OF, serving

# FORMATS.md §6: small public pairs that fit one GPU Space (the hub files were not opened from
# here: the layouts are the ones FORMATS.md names, and `selfcheck` is how a deployment checks).
PAIRS = [
    ("Qwen/Qwen3-4B", "dflash", "z-lab/Qwen3-4B-DFlash-b16", "DFlash (z-lab), 15 drafts per block"),
    ("Qwen/Qwen3-4B", "eagle3", "AngelSlim/Qwen3-4B_eagle3", "EAGLE-3 (SpecForge/vLLM layout)"),
    ("Qwen/Qwen3-1.7B", "eagle3", "AngelSlim/Qwen3-1.7B_eagle3", "EAGLE-3 (SpecForge/vLLM layout)"),
    ("meta-llama/Llama-3.1-8B-Instruct", "eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
     "EAGLE-3; fits a 24 GB GPU tightly"),
    ("Qwen/Qwen3-4B", "dspark", "deepseek-ai/dspark_qwen3_4b_block7",
     "DSpark (DeepSpec), block 7"),
]
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"   # the embedded target's own hub id
SHIPPED_BLOCK = {"dflash-b8": 8, "dflash-b16": 16, "dspark": 16}


def pairs_markdown() -> str:
    rows = ["| target | strategy | drafter | command (GPU machine with network) | Space variables |",
            "|---|---|---|---|---|"]
    for model, sid, drafter, what in PAIRS:
        cmd = (f"`python app.py --model {model} --device cuda --set {sid}:path={drafter}`")
        env = f"`SPECVIZ_MODEL={model}` `SPECVIZ_SET={sid}:path={drafter}`"
        rows.append(f"| `{model}` | `{sid}` | `{drafter}` ({what}) | {cmd} | {env} |")
    return "\n".join(rows)


def availability_markdown(target, unavailable: dict[str, str | None]) -> str:
    rows = ["| strategy | for this target | why not / where the weights come from |",
            "|---|---|---|"]
    for sid in strategies.REGISTRY:
        reason = unavailable.get(sid)
        path = strategies.DEFAULTS.get(sid, {}).get("path")
        # a drafter may say where it comes from (mtp: the checkpoint's own layers, or ours)
        origin = None if reason else getattr(
            getattr(target, "drafters", {}).get((sid, strategies.parse_settings(sid))), "origin",
            None)
        source = (f"published folder `{path}`" if path else origin if origin else
                  "no weights needed" if strategies.REGISTRY[sid].build is None or sid == "ngram"
                  else "shipped weights (assets/)")
        rows.append(f"| `{sid}` | {'no' if reason else 'yes'} | "
                    f"{(reason or source).replace('|', '/')} |")
    return "\n".join(rows)


def export_markdown() -> str:
    lines = []
    for drafter, fmt in FORMAT_OF.items():
        out = f"exports/{drafter}"
        spec_cfg, sglang = serving(fmt, out, SHIPPED_BLOCK.get(drafter, 0))
        lines.append(
            f"- **{drafter}** ({fmt} layout):\n"
            f"  `python -m specviz export {drafter} --out {out} --json`, then\n"
            f"  `vllm serve {EMBEDDED_HUB_ID} --speculative-config "
            f"{shlex.quote(json.dumps(spec_cfg))}` or\n"
            f"  `python -m sglang.launch_server --model-path {EMBEDDED_HUB_ID} "
            f"{shlex.join(sglang)}`")
    return "\n".join(lines)


def markdown(target, unavailable: dict[str, str | None]) -> str:
    return f"""### Bring your own target and drafter
Any Hugging Face causal LM loads as the target (`--model HUB_ID_OR_FOLDER`; safetensors only, no
remote code), and every strategy that takes weights accepts a drafter folder or hub id in a
published layout (EAGLE-3, EAGLE-1/2, DFlash, DSpark) as its `path` setting: in the Playground's
settings table, with `--set path=...` in `generate`, as `dflash:path=...` in `bench`, or as a
site default with `app.py --set STRATEGY:path=...`. A drafter made for another target is refused
with the reason before any decoding.

**Which strategies the loaded target (`{target.model_id}`) can use**

{availability_markdown(target, unavailable)}

**Published pairs** (FORMATS.md §6; the hub files could not be opened from the machine this was
built on, so check a deployment with `python -m specviz selfcheck --model MODEL --device cuda
--set STRATEGY:path=DRAFTER`: one line per strategy, exit 1 on any mismatch with `ar`)

{pairs_markdown()}

Native MTP: when the target's own checkpoint ships MTP layers (DeepSeek-V3 / GLM-4.x or MiMo
weight layout, loadable by transformers without remote code), `mtp` drafts with them (the table
above then says "native MTP from the checkpoint"); `mtp:path=native` insists on them. Hybrid
linear-attention targets (Qwen3.5 / Qwen3-Next) are out of scope: rollback would need their
recurrent state. MiMo-7B's own model type needs remote code, which is never run.

**Serve the shipped drafters with vLLM or SGLang** (target `{EMBEDDED_HUB_ID}`)

{export_markdown()}

The shipped drafters predate the published layouts: each export lists what a serving engine
computes differently from specviz (its `differences`, also in each model card's Export
section). Output stays lossless in any engine; acceptance may not.
"""
