"""scripts/launch_probe.py on the CPU at small shapes: the plumbing the H200 run uses (the real runner
behind StepLoop, a prompt arriving while requests decode) and what must hold on any device."""

from __future__ import annotations

import json

import pytest

from tests.model_helpers import one_thread

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def test_launch_probe_runs_and_the_held_back_step_outlasts_the_launch(tmp_path):
    from scripts.launch_probe import main

    out = tmp_path / "probe.json"
    assert main(["--device", "cpu", "--model-shape", "smollm2-135m", "--sizes", "24", "--repeats", "1",
                 "--max-model-len", "256", "--decodes", "2", "--context", "16", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and [r["prompt"] for r in doc["rows"]] == [24]
    for row in doc["rows"]:
        assert all(row[k] > 0 for k in ("decode_ms", "held_ms", "prefill_ms", "launch_ms", "idle_launch_ms"))
        # the decode step before the prompt is collected only after the prompt's step is launched
        assert row["held_ms"] >= row["launch_ms"]
