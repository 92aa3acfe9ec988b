"""The shipped H200 cost model against live served runs it never saw (tests/data/h200/heldout_*:
recorded on another H200 machine after the model was fitted, at loads not in its fit set). A refit that
loses the fidelity docs/BENCHMARKS.md reports fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cost.loading import load_cost_model
from simulator.fidelity.fidelity_table import pair_row, run_row

H = Path(__file__).resolve().parent / "data" / "h200"  # served runs the shipped model was not fitted on
RUNS = ("heldout_conv_on_0.7", "heldout_conv_on_1.0", "heldout_code_on_0.7", "heldout_code_off_0.7")


@pytest.fixture(scope="module")
def model():
    return load_cost_model("qwen3-0.6b-h200")


def _cells(row: dict) -> list[float]:
    return [*row["errors"].values(), row["makespan"]]


def test_held_out_runs_within_ten_percent_and_mostly_five(model):
    """Every cell within 10 % but the TTFT p90 at capacity, within 15 %: there four identical live runs
    on one machine span 30 % (docs/BENCHMARKS.md; 1 % of step time moves it 26-38 %)."""
    rows = {name: run_row(H / f"{name}.jsonl.gz", model) for name in RUNS}
    cells = [c for row in rows.values() for c in _cells(row)]
    assert abs(rows["heldout_conv_on_1.0"]["errors"]["ttft_p90"]) <= 15, rows["heldout_conv_on_1.0"]
    others = [c for name, row in rows.items() for key, c in [*row["errors"].items(), ("makespan", row["makespan"])]
              if (name, key) != ("heldout_conv_on_1.0", "ttft_p90")]
    assert all(abs(c) <= 10 for c in others), others
    assert sum(abs(c) <= 5 for c in cells) >= 0.9 * len(cells), cells  # measured: 27 of 28


def test_chunked_off_what_if_from_a_chunked_on_run(model):
    """Fitted on chunked-on runs only: the chunked-off live run of the same workload within 10 %,
    and every on → off difference (TTFT −38 %, TPOT +152 %, E2E −29 %, makespan −5 % live) signed right."""
    row = pair_row(H / "heldout_code_on_0.7.jsonl.gz", H / "heldout_code_off_0.7.jsonl.gz", model)
    assert "scheduler.enable_chunked_prefill=false" in row["overrides"]
    assert all(abs(c) <= 10 for c in _cells(row)), row
    assert all(row["signs"].values()), row["signs"]
