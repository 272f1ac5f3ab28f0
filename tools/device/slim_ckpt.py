"""Device-run fallback: a run's checkpoint without its AdamW moments and with its parameters in
bfloat16 (about the size of the shipped weights), for a drafter whose export failed on the
machine; README.md says how to ship it from here with `train --resume`.

    python3 slim_ckpt.py CKPT.safetensors OUT.safetensors
"""
import sys

import torch
from safetensors.torch import load_file, save_file

src, dst = sys.argv[1:3]
save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v
           for k, v in load_file(src).items() if k.startswith("param/")}, dst)
