"""The embedded model's dequantized cache (models/loading.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_embedded_cache_survives_two_processes_building_it_at_once(tmp_path):
    """Two processes that find no cache both build it; each finishes with the complete folder,
    and no partial build is left behind (before, the second removed the first's work folder)."""
    env = os.environ | {"SPECVIZ_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    code = "from specviz.models.loading import embedded_folder; print(embedded_folder())"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    folders = {Path(out.strip().splitlines()[-1]) for out, _ in outs}
    assert len(folders) == 1
    folder = folders.pop()
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
