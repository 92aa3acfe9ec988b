"""A sweep in this process: one row per point in grid order, each the summary ``simulate`` gives the
same point, results cached by point so a re-run simulates only what is missing."""

from __future__ import annotations

import json
import shlex

import pandas as pd
import pytest

from analysis.frames import load_frames
from analysis.metrics import summarize
from runtime.cli import main
from runtime.planning.cache import ResultCache
from runtime.planning.runner import LocalRunner
from runtime.planning.slo import Slo
from runtime.planning.sweep import run_sweep
from tests.planning_helpers import FailsOnBigBatches, FlatCost, small_inputs, small_plan
from tests.sim_helpers import TRACES
from traces.log import read_header

SLO = Slo.parse("ttft_p99_ms=60,tpot_p99_ms=8")


def sweep(cache_dir=None, plan=None, inputs=None, runner=None):
    table, results = run_sweep(plan or small_plan(), inputs or small_inputs(), runner or LocalRunner(),
                               ResultCache(cache_dir), SLO)
    return table, results


def test_a_row_per_point_in_grid_order_loads_fastest():
    table, results = sweep()
    assert len(table) == 8 * 2 and (table["status"] == "ok").all()
    assert table["point"].tolist()[:3] == ["chunked=on replicas=1 router=round-robin rate_scale=1",
                                           "chunked=on replicas=1 router=round-robin rate_scale=3",
                                           "chunked=on replicas=1 router=least-loaded rate_scale=1"]
    assert table["config"].nunique() == 8 and table["point"].is_unique
    # one replica routes alike under any router: the two points are one simulation
    assert len(results.tasks) == 12
    one = table[table["replicas"] == 1]
    assert (one.groupby(["chunked", "rate_scale"])["ttft_p99_ms"].nunique() == 1).all()
    assert table.loc[table["rate_scale"] == 3, "offered_req_s"].iloc[0] == 3 * table["offered_req_s"].iloc[0]
    assert {"goodput_req_s", "goodput_per_replica_req_s", "slo_attainment", "meets_slo", "itl_p99_ms",
            "e2e_p50_ms", "output_throughput_tok_s"} <= set(table.columns)


def test_the_metrics_are_those_of_the_points_own_simulation(tmp_path):
    plan, inputs = small_plan(), small_inputs()
    table, _ = sweep(plan=plan, inputs=inputs)
    from runtime.planning.point_run import simulate_point

    point = plan.points()[13]  # chunked off, 2 replicas, round-robin, rate 3
    alone = simulate_point(point.job(SLO, log=str(tmp_path / "p.jsonl")), inputs.workload, FlatCost(), "flat")
    row = table.iloc[13]
    assert row["point"] == point.text
    for column, value in alone.items():
        assert row[column] == value or (value != value and row[column] != row[column]), column
    # the log the point wrote summarizes to the same numbers, and its Header names the point
    written = summarize(load_frames(tmp_path / "p.jsonl"))
    assert written["ttft_s"]["p99"] * 1e3 == row["ttft_p99_ms"] and written["steps"] == row["steps"]
    assert read_header(tmp_path / "p.jsonl").extra["point"] == point.text
    assert read_header(tmp_path / "p.replica0.jsonl").extra["point"] == point.text


def test_a_rerun_simulates_only_what_the_cache_lacks(tmp_path):
    first, results = sweep(tmp_path)
    assert results.cached == 0
    files = sorted(tmp_path.rglob("*.json"))
    assert len(files) == 12
    for f in files[:5]:  # as if the sweep had been killed before these
        f.unlink()
    again, resumed = sweep(tmp_path)
    assert resumed.cached == 7 and len(resumed.tasks) - resumed.cached == 5
    pd.testing.assert_frame_equal(first, again)
    third, cached = sweep(tmp_path)
    assert cached.cached == 12 and cached.stats.tasks == 0
    pd.testing.assert_frame_equal(first, third)


class StopsAfter:
    """A progress bar whose reader gives up (Ctrl-C) once ``n`` points are in."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def update(self, k: int) -> None:
        self.seen += k
        if self.seen >= self.n:
            raise KeyboardInterrupt


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path):
    import pytest

    with pytest.raises(KeyboardInterrupt):
        run_sweep(small_plan(), small_inputs(), LocalRunner(), ResultCache(tmp_path), SLO, progress=StopsAfter(4))
    assert len(list(tmp_path.rglob("*.json"))) == 4 and not list(tmp_path.rglob("*.tmp"))
    resumed, results = sweep(tmp_path)
    assert results.cached == 4 and len(results.tasks) == 12
    pd.testing.assert_frame_equal(resumed, sweep()[0])


def test_another_cost_model_or_slo_is_another_key(tmp_path):
    a, _ = sweep(tmp_path)
    b, results = run_sweep(small_plan(), small_inputs(FlatCost(const=0.004)), LocalRunner(), ResultCache(tmp_path), SLO)
    assert results.cached == 0 and not set(a["key"]) & set(b["key"])
    c, results = run_sweep(small_plan(), small_inputs(), LocalRunner(), ResultCache(tmp_path),
                           Slo.parse("ttft_p99_ms=61,tpot_p99_ms=8"))
    assert results.cached == 0


def test_a_failed_point_is_a_row_that_says_why(tmp_path):
    table, results = run_sweep(small_plan(), small_inputs(FailsOnBigBatches()), LocalRunner(retries=1),
                               ResultCache(tmp_path), SLO)
    failed = table[table["status"] == "failed"]
    assert len(table) == 16 and 0 < len(failed) < 16
    assert failed["error"].str.contains("RuntimeError: no model for so many spans").all()
    assert failed["ttft_p99_ms"].isna().all()
    assert len(results.stats.retries) == len(results.stats.failed) == len(set(failed["key"]))
    assert len(list(tmp_path.rglob("*.json"))) == len(set(table.loc[table["status"] == "ok", "key"]))


def test_the_sweep_command_writes_the_table_and_each_rows_command_reruns_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
    rc = main(["sweep", trace, "--cost-model", "qwen3-0.6b-h200", "--limit", "60", "--grid",
               "chunked=on,off replicas=1,2", "--rate-scale", "4,16", "--slo", "ttft_p99_ms=100,tpot_p99_ms=20",
               "--in-process", "--no-progress", "--out", "sw"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Pareto front" in out and "minivllm simulate" in out
    table = pd.read_parquet(tmp_path / "sw" / "sweep.parquet")
    assert len(table) == 8 and pd.read_csv(tmp_path / "sw" / "sweep.csv")["point"].tolist() == table["point"].tolist()
    assert {p.name for p in (tmp_path / "sw" / "plots").iterdir()} == {"latency_vs_load.png", "goodput_per_replica.png",
                                                                     "pareto.png"}
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text())["points"] == 8
    row = table.iloc[7]  # chunked off, 2 replicas, rate 16
    words = shlex.split(row["command"])
    assert words[:2] == ["minivllm", "simulate"] and "--point" in words
    assert main([*words[1:], "--no-progress", "--json", "alone.json"]) == 0
    summary = json.loads((tmp_path / "alone.json").read_text())["summary"]
    assert summary["ttft_s"]["p99"] * 1e3 == row["ttft_p99_ms"] and summary["tpot_s"]["p50"] * 1e3 == row["tpot_p50_ms"]
    assert read_header(tmp_path / words[words.index("--out") + 1]).extra["point"] == row["point"]
    # run again: every point from the cache, the same table
    assert main(["sweep", trace, "--cost-model", "qwen3-0.6b-h200", "--limit", "60", "--grid",
                 "chunked=on,off replicas=1,2", "--rate-scale", "4,16", "--slo", "ttft_p99_ms=100,tpot_p99_ms=20",
                 "--in-process", "--no-progress", "--out", "sw"]) == 0
    assert "0 simulations in process, 8 points from the cache" in capsys.readouterr().out
    pd.testing.assert_frame_equal(table, pd.read_parquet(tmp_path / "sw" / "sweep.parquet"))


def _rerun_matches(row, tmp_path) -> list[str]:
    """Run ``row``'s command; its summary is the row's. The command's words."""
    words = shlex.split(row["command"])
    assert main([*words[1:], "--no-progress", "--json", "alone.json"]) == 0
    summary = json.loads((tmp_path / "alone.json").read_text())["summary"]
    assert summary["steps"] == row["steps"] and summary["output_tokens"] == row["output_tokens"]
    assert summary["ttft_s"]["p99"] * 1e3 == row["ttft_p99_ms"] and summary["tpot_s"]["p50"] * 1e3 == row["tpot_p50_ms"]
    assert summary["e2e_s"]["mean"] * 1e3 == row["e2e_mean_ms"]
    return words


@pytest.mark.parametrize("grid, flags, column, rerun", [
    # one rate for every point (a point that doesn't speculate re-runs without it)
    ("speculative=off,ngram:4", ["--acceptance", "0.8"], [0.8, 0.8], ["", "0.8"]),
    ("speculative=ngram:4 acceptance=0.5,0.9", [], [0.5, 0.9], ["0.5", "0.9"]),  # each point its own
], ids=["flag", "axis"])
def test_a_speculative_rows_command_reruns_it(grid, flags, column, rerun, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
    assert main(["sweep", trace, "--cost-model", "qwen3-0.6b-h200", "--limit", "60", "--grid", grid, *flags,
                 "--rate-scale", "4", "--in-process", "--no-progress", "--out", "sw"]) == 0
    assert "speculative decoding" in capsys.readouterr().out
    table = pd.read_parquet(tmp_path / "sw" / "sweep.parquet")
    assert table["acceptance"].tolist() == column
    for (_, row), rate in zip(table.iterrows(), rerun):
        words = _rerun_matches(row, tmp_path)
        assert words[words.index("--speculative") + 1] == row["speculative"]
        assert (words[words.index("--acceptance") + 1] if "--acceptance" in words else "") == rate


def test_a_speculative_logs_own_rates_are_a_sweeps_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
    assert main(["simulate", trace, "--cost-model", "qwen3-0.6b-h200", "--limit", "60", "--speculative", "ngram:4",
                 "--acceptance", "0.7", "--no-progress", "--out", "spec.jsonl"]) == 0
    assert main(["sweep", "spec.jsonl", "--cost-model", "qwen3-0.6b-h200", "--grid", "speculative=off,ngram:2",
                 "--rate-scale", "2", "--in-process", "--no-progress", "--out", "sw"]) == 0
    out = capsys.readouterr().out
    assert "speculative decoding, K=2: drafts and acceptance from spec.jsonl (per request, recorded at K=4)" in out
    table = pd.read_parquet(tmp_path / "sw" / "sweep.parquet")
    assert table["speculative"].tolist() == ["off", "ngram:2"]
    for _, row in table.iterrows():
        words = _rerun_matches(row, tmp_path)
        assert "--acceptance" not in words  # the log's own rates: simulate's default too


def test_the_sweep_command_names_a_bad_flag(capsys):
    trace = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
    for extra, words in ((["--grid", "budget=512", "--max-num-batched-tokens", "1024"], "set the same thing"),
                         (["--grid", "budgets=512"], "unknown axis"), (["--rate-scale", "1,x"], "--rate-scale"),
                         (["--slo", "ttft=1"], "--slo"), (["--in-process", "--workers", "2"], "--in-process"),
                         (["--grid", "speculative=ngram:4", "--speculative", "ngram:2"], "set the same thing"),
                         (["--grid", "acceptance=0.5", "--acceptance", "0.5"], "set the same thing"),
                         (["--grid", "speculative=ngram:4 acceptance=0.5", "--acceptance-per", "request"],
                          "--acceptance-per"),
                         (["--grid", "speculative=ngram:4", "--acceptance", "2"], "--acceptance")):
        try:
            main(["sweep", trace, "--cost-model", "qwen3-0.6b-h200", "--limit", "20", "--no-progress", *extra])
        except SystemExit as e:
            assert e.code == 2
        assert words in capsys.readouterr().err
