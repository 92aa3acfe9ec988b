"""`minivllm fidelity`: re-simulating a live log and comparing the latency distributions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis.frames import load_frames
from analysis.metrics import latencies
from runtime.cli import main
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.recorded_model import RecordedCostModel
from simulator.fidelity.fidelity import check, fidelity, times_of_log
from simulator.replay.request_times import RequestTimes
from tests.sim_helpers import (
    VARYING_TRUTH,
    VaryingDurationExecutor,
    mixed_workload,
    record_live,
    record_on_off,
    small_config,
)
from traces.log import LogWriter, read_log

TRUTH = VARYING_TRUTH


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return record_on_off(tmp_path_factory.mktemp("fidelity"))


def test_request_times_agree_with_the_analysis(logs):
    on, _ = logs
    times = RequestTimes()
    for ev in read_log(on):
        times(ev)
    ours = times.values()
    theirs = latencies(load_frames(on).requests)
    for m in ("ttft", "tpot", "e2e", "queue", "prefill"):
        assert np.sort(ours[m]) == pytest.approx(np.sort(theirs[m].dropna().to_numpy()))
    assert (theirs["queue"] + theirs["prefill"]).to_numpy() == pytest.approx(theirs["ttft"].to_numpy(), nan_ok=True)
    assert len(ours["itl"]) == sum(max(n - 1, 0) for n in load_frames(on).requests["num_output_tokens"])


def test_recorded_durations_give_zero_error(logs):
    on, _ = logs
    report, dists = fidelity(on, RecordedCostModel.from_log(on))
    for m, row in report["metrics"].items():
        for s in ("p50", "p90", "p99", "mean"):
            e = row[s]["error_pct"]
            assert math.isnan(e) or abs(e) < 1e-9, (m, s, e)
    assert report["makespan"]["error_pct"] == pytest.approx(0, abs=1e-9)
    assert report["steps"]["live"] == report["steps"]["sim"] and report["replay"]["step_mape"] < 1e-9
    assert check(report, 0.1) == [] and set(dists) == {"live", "sim"}


def test_the_true_model_is_close_and_a_slow_one_fails_the_tolerance(logs):
    on, _ = logs
    report, _ = fidelity(on, LinearCostModel(TRUTH))
    assert abs(report["makespan"]["error_pct"]) < 1 and report["replay"]["step_mape"] < 1e-6
    slow, _ = fidelity(on, LinearCostModel({k: 2 * v for k, v in TRUTH.items()}))
    bad = check(slow, 5)
    assert any(line.startswith("TTFT") for line in bad) and slow["metrics"]["e2e"]["p50"]["error_pct"] > 5


def test_what_if_states_the_config_change_and_checks_the_sign(logs):
    on, off = logs
    report, dists = fidelity(on, LinearCostModel(TRUTH), overrides=["scheduler.enable_chunked_prefill=false"],
                             what_if_live=off)
    w = report["what_if"]
    assert "enable_chunked_prefill on → off" in w["config_changes"]
    assert any("so a whole prompt fits a step" in c for c in w["config_changes"])  # the budget, stated
    assert any("max_num_batched_tokens 64 → 1,024" in c for c in w["live_config_changes"])
    # the true model predicts the other live run exactly: every sign right, no error
    for m in ("ttft", "e2e"):
        cell = w["predicted_change"][m]["p50"]
        assert cell["same_sign"] and cell["predicted_pct"] == pytest.approx(cell["live_pct"], abs=1e-6)
        assert w["vs_live"][m]["p50"]["error_pct"] == pytest.approx(0, abs=1e-6)
    assert {"sim (what-if)", "live (what-if)"} <= set(dists)


def test_bad_what_if_names_the_fields(logs):
    on, _ = logs
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        fidelity(on, LinearCostModel(TRUTH), overrides=["scheduler.chunky=1"])


def test_cli_prints_the_table_writes_json_and_a_plot_and_exits_on_tolerance(logs, tmp_path, capsys):
    on, off = logs
    js, png = tmp_path / "f.json", tmp_path / "cdf.png"
    assert main(["fidelity", str(on), "--cost-model", "recorded", "--json", str(js), "--plot", str(png),
                 "--tolerance", "1"]) == 0
    out = capsys.readouterr().out
    for word in ("TTFT", "TPOT", "ITL", "E2E", "queue", "p99", "makespan", "per-step MAPE", "within ±1%",
                 "by kind of step: decode-only steps"):
        assert word in out
    doc = json.loads(js.read_text())
    assert doc["tolerance"]["exceeded"] == [] and png.stat().st_size > 1000
    assert doc["replay"]["by_kind"]["decode"]["error_pct"] == pytest.approx(0, abs=1e-9)
    slow = tmp_path / "slow.json"
    LinearCostModel({k: 3 * v for k, v in TRUTH.items()}).save(slow)
    assert main(["fidelity", str(on), "--cost-model", str(slow), "--tolerance", "5", "--plot", str(png),
                 "--what-if", "scheduler.enable_chunked_prefill=false", "--what-if-live", str(off)]) == 1
    out = capsys.readouterr().out
    assert "beyond ±5%" in out and "predicted Δ" in out and "chunked prefill off" in out


def test_an_overlapped_live_log_is_simulated_with_overlap(logs):
    """record_live's steps tile, as an async-scheduling engine's do: a model fitted on sequential
    steps is run overlapped there, and the report says so."""
    from simulator.cost.host_timing import HostTiming, fit_host_timing, log_overlaps

    on, _ = logs
    assert log_overlaps(on) and fit_host_timing([on]).overlap
    model = LinearCostModel(TRUTH)
    model = model.with_host(HostTiming(gap_const=1e-4, overlap=False))
    report, _ = fidelity(on, model, replay=False)
    # simulated with the log's overlap; the caller's model is left as it was
    assert not model.host.overlap and "simulated with overlap" in report["notes"][0]
    assert abs(report["makespan"]["error_pct"]) < 1


def test_sensitivity_is_one_where_the_step_time_cannot_change_the_schedule(tmp_path):
    # every request is there before the first step: the schedule is the same at any speed, so every
    # latency and the makespan scale with the step time (elasticity 1)
    path = tmp_path / "burst.jsonl"
    with LogWriter(path) as w:
        for ev in record_live(mixed_workload(30, seed=5, rate=1e9), small_config(num_blocks=64, budget=64),
                              VaryingDurationExecutor(seed=2)):
            w(ev)
    report, _ = fidelity(path, LinearCostModel(TRUTH), replay=False, sensitivity_pct=3)
    sens = report["sensitivity"]
    assert sens["step_change_pct"] == 3
    for m in ("ttft", "tpot", "e2e"):
        assert sens[m] == pytest.approx({"p50": 1.0, "p90": 1.0}, rel=1e-6)
    assert sens["makespan"] == pytest.approx(1.0, rel=1e-6)


def test_sensitivity_with_arrivals_spread_out(logs):
    # arrivals spread over time: the makespan moves less than the steps (idle time does not scale),
    # and a longer step queues more work behind it, so some latency moves more
    on, _ = logs
    report, _ = fidelity(on, LinearCostModel(TRUTH), replay=False, sensitivity_pct=2)
    sens = report["sensitivity"]
    assert 0 < sens["makespan"] < 1
    assert max(sens[m][p] for m in ("ttft", "tpot", "e2e") for p in ("p50", "p90")) > 1.05
    assert fidelity(on, RecordedCostModel.from_log(on), replay=False, sensitivity_pct=2)[0]["sensitivity"] is None


def test_cli_sensitivity_says_how_close_the_steps_must_be(logs, tmp_path, capsys):
    on, _ = logs
    png = tmp_path / "cdf.png"
    model = tmp_path / "truth.json"
    LinearCostModel(TRUTH).save(model)
    assert main(["fidelity", str(on), "--cost-model", str(model), "--plot", str(png), "--sensitivity", "2",
                 "--tolerance", "50", "--no-replay"]) == 0
    out = capsys.readouterr().out
    assert "per 1 % of step time: TTFT p50" in out and "for ±50% the step times must be within: " in out
    assert main(["fidelity", str(on), "--cost-model", "recorded", "--plot", str(png), "--sensitivity", "2"]) == 0
    assert "cannot be scaled" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["fidelity", str(on), "--cost-model", "recorded", "--sensitivity", "50"])
    assert exit_.value.code == 2
    assert "--sensitivity: must be < 50, got 50" in capsys.readouterr().err


def test_by_arrival_windows_count_every_request_once_and_show_where_a_slow_model_diverges(logs):
    """Recorded durations give the live numbers in every window; a model 3× too slow diverges, and
    most in the last windows, where its queue has built up."""
    on, _ = logs
    report, _ = fidelity(on, RecordedCostModel.from_log(on), replay=False, arrival_windows=4)
    rows = report["by_arrival"]
    arrival = times_of_log(on).by_request()[0]
    assert len(rows) == 4 and rows[0]["from_s"] == 0 and rows[-1]["to_s"] == pytest.approx(arrival[-1] - arrival[0])
    assert sum(r["live"]["requests"] for r in rows) == report["live"]["requests"]
    for r in rows:
        assert r["live"]["requests"] == r["sim"]["requests"]
        for key in ("ttft_p50", "ttft_p90", "queue_p50", "queue_p90"):
            assert r["sim"][key] == pytest.approx(r["live"][key], abs=1e-9, nan_ok=True), (r, key)
    slow = LinearCostModel({k: 3 * v for k, v in TRUTH.items()})
    rows = fidelity(on, slow, replay=False, arrival_windows=4)[0]["by_arrival"]
    excess = [r["sim"]["ttft_p90"] - r["live"]["ttft_p90"] for r in rows]
    assert all(e > 0 for e in excess) and excess[-1] > excess[0]


def test_cli_by_arrival_prints_the_windows(logs, tmp_path, capsys):
    on, _ = logs
    js = tmp_path / "f.json"
    assert main(["fidelity", str(on), "--cost-model", "recorded", "--by-arrival", "3", "--no-replay",
                 "--plot", str(tmp_path / "c.png"), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "by arrival time" in out
    table = [line for line in out.splitlines() if line[:1] in "│┃"]
    assert sum(line.startswith("│") for line in table) == 3 and "TTFT p50" in table[0]
    columns = {tuple(i for i, c in enumerate(line) if c in "│┃") for line in table}
    assert len(columns) == 1 and len(next(iter(columns))) == 9  # 8 columns, aligned in every row
    assert len(json.loads(js.read_text())["by_arrival"]) == 3
    with pytest.raises(SystemExit):
        main(["fidelity", str(on), "--cost-model", "recorded", "--by-arrival", "0"])
    assert "--by-arrival: must be >= 1" in capsys.readouterr().err



def test_by_arrival_puts_requests_that_arrive_at_once_in_one_window():
    from simulator.fidelity.fidelity import by_arrival

    live = RequestTimes(arrival={0: 1.0, 1: 1.0}, first={0: 1.5, 1: 2.0}, admitted={0: 1.0, 1: 1.25})
    sim = RequestTimes(arrival={0: 1.0, 1: 1.0}, first={0: 1.5})  # request 1 got no first token
    (row,) = by_arrival(live, sim, 5)
    assert row["live"]["requests"] == row["sim"]["requests"] == 2
    assert row["live"]["ttft_p50"] == pytest.approx(0.75) and row["sim"]["ttft_p50"] == pytest.approx(0.5)
    assert row["live"]["queue_p90"] == pytest.approx(0.225) and math.isnan(row["sim"]["queue_p50"])
