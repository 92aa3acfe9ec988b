"""A CPU KV pool larger than the memory the machine has free is refused before it is allocated, in
one line naming the flag (the kernel's out-of-memory killer would end the process without a word)."""

from __future__ import annotations

import pytest

from runtime.cli import main
from runtime.executor import kv_cache
from tests.model_helpers import make_tiny


def test_a_pool_past_the_free_memory_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys):
    tiny = make_tiny("llama", tmp_path, tokenizer=True)
    capsys.readouterr()  # (the shards' writing)
    monkeypatch.setattr(kv_cache, "available_memory", lambda: 1 << 20)  # 1 MiB free
    with pytest.raises(SystemExit):
        main(["generate", "hello", "--model", str(tiny.folder), "--device", "cpu", "--block-size", "4",
              "--num-blocks", "100000", "--max-model-len", "128"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "--num-blocks: num_blocks 100,000: a KV pool of 0.2 GiB, and this machine has 0.0 GiB " \
        "free; give fewer blocks or a smaller --kv-cache-gb" in err[0]
