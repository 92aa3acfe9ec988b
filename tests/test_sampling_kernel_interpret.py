"""The sorting-free sampling kernel on the CPU under TRITON_INTERPRET=1: the torch sampler's
tokens for the same uniforms, every probability to within 1/N on a grid of N uniforms, non-finite
rows flagged, batch independence, the inverse CDF's edges (tests/sampling_interpret_checks.py, in
a subprocess: the flag must be set before Triton decorates the kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECKS_FILE = Path(__file__).with_name("sampling_interpret_checks.py")
NAMES = ["same_tokens_as_torch", "stratified_distribution", "non_finite_rows", "alone_equals_in_batch", "edges"]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(CHECKS_FILE)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_check_is_listed(results: dict[str, str]) -> None:
    assert sorted(results) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sampling_kernel_interpreted(results: dict[str, str], name: str) -> None:
    assert results.get(name) == "ok", results.get(name)
