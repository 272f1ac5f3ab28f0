"""Files the app hands to the browser: run traces and exported figures.

Boundary: one temporary folder per process, removed at exit, holding the newest KEEP files, one
subfolder each (older ones are deleted as new ones arrive). Gradio copies a returned file into
its own cache (cleaned by `delete_cache` on the Blocks), so a long-running Space never fills its
disk with downloads.
"""
from __future__ import annotations

import atexit
import itertools
import shutil
import tempfile
import threading
from pathlib import Path

KEEP = 64
_lock = threading.Lock()
_serial = itertools.count()
_folder: Path | None = None


def new_path(name: str) -> Path:
    """A fresh path for a download called `name` (e.g. "trace.jsonl"); prunes old files."""
    global _folder
    with _lock:
        if _folder is None:
            _folder = Path(tempfile.mkdtemp(prefix="specviz-downloads-"))
            atexit.register(shutil.rmtree, _folder, True)
        old = sorted(_folder.iterdir())             # serial-numbered folders: oldest first
        for p in old[:max(0, len(old) - KEEP + 1)]:
            shutil.rmtree(p, ignore_errors=True)
        folder = _folder / f"{next(_serial):08d}"   # keeps `name` as the downloaded file name
        folder.mkdir()
        return folder / name
