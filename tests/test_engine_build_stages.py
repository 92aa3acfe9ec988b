"""A server says how long each stage of its start took: build_engine times its stages in order."""

from __future__ import annotations

from runtime.executor.setup import build_engine
from tests.model_helpers import make_tiny


def test_build_engine_reports_each_stage_in_order(tmp_path):
    tiny = make_tiny("llama", tmp_path / "m")
    for opts in ({"num_blocks": 64}, {"kv_cache_gb": 0.01}):  # a fixed pool and one sized from a budget
        parts = build_engine(loaded=tiny.loaded, device="cpu", **opts)
        assert list(parts.stages) == ["model", "KV pool", "runner"]
        assert all(s >= 0 for s in parts.stages.values())
        line = parts.describe_build()
        assert line.startswith(f"engine built in {sum(parts.stages.values()):.1f} s (model ")
        assert "KV pool" in line and "runner" in line
