"""Where the executor keeps what it builds once per machine (converted GGUF folders, compiled CPU
kernels): ``$MINIVLLM_CACHE`` or ``~/.cache/minivllm``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("MINIVLLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "minivllm")
    return Path(root)
