"""Triton kernels on the CPU under TRITON_INTERPRET=1 (a small subset of the GPU matrix).

The flag must be set before Triton decorates the kernels, and other tests may import the kernels
in compiled mode, so the checks run in one subprocess (tests/kernel_interpret_checks.py) and each
check is reported as its own test here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

CHECKS_FILE = Path(__file__).with_name("kernel_interpret_checks.py")
NAMES = [
    "decode_mha_fp32",
    "decode_gqa_fp32_padding_seq",
    "decode_fp16_hd128_big_block",
    "kv_store_padding_and_strided",
    "prefill_prefix_hits_and_chunks",
    "prefill_split_context",
    "backend_mixed_batch",
    "backend_matches_torch_backend",
    "backend_prepared_once_for_every_layer",
    "fused_rms_norm_and_rotary_fp16",
    "add_rms_norm",
    "silu_and_mul",
    "rotary_q_and_k_in_one_launch",
    "fused_model_equals_unfused",
]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(CHECKS_FILE)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_check_is_listed(results: dict[str, str]) -> None:
    assert sorted(results) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_interpreted(results: dict[str, str], name: str) -> None:
    assert results.get(name) == "ok", results.get(name)
