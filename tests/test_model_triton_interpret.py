"""The engine with the Triton attention backend, interpreted on the CPU (TRITON_INTERPRET=1), equals
HF greedy on a tiny Qwen3: checks that the runner's metadata is what the kernels expect, without a
GPU. Runs in a subprocess because the flag must be set before Triton decorates the kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCENARIOS = ["mixed_batch", "chunked_prefill", "prefix_hits", "decode_graph_buffers"]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    script = Path(__file__).with_name("engine_interpret_check.py")
    proc = subprocess.run([sys.executable, str(script)], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_triton_backend_engine_equals_hf(results, scenario):
    assert results.get(scenario) == "ok", results.get(scenario)
