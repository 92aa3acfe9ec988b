"""A server says how long each stage of its start took: build_engine times its stages in order."""

from __future__ import annotations

from runtime.executor.setup import build_engine
from tests.model_helpers import make_tiny


def test_build_engine_reports_each_stage_in_order(tmp_path):
    tiny = make_tiny("llama", tmp_path / "m")
    for opts in ({"num_blocks": 64}, {"kv_cache_gb": 0.01}):  # a fixed pool and one sized from a budget
        parts = build_engine(loaded=tiny.loaded, device="cpu", **opts)
        assert list(parts.stages) == ["model", "runner"]
        line = parts.describe_build()
        assert line == (f"engine built in {sum(parts.stages.values()):.1f} s (model {parts.stages['model']:.1f} s, "
                        f"runner {parts.stages['runner']:.1f} s)")
