"""The fidelity table over several runs (simulator/fidelity/fidelity_table.py, ``minivllm fidelity-table``),
the intake delay fitted by re-simulation (simulator/fitting/intake.py) and decode-only training steps."""

from __future__ import annotations

import json
import math
import re

import pytest

from simulator.cost.host_timing import HostTiming
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.recorded_model import RecordedCostModel
from simulator.cost.step_data import StepData
from simulator.fidelity.fidelity_table import (
    kind_table,
    markdown,
    overrides_between,
    pair_row,
    repeat_spread,
    run_row,
    same_workload,
    sensitivity_table,
    short_names,
    sign_table,
    signs_beyond,
    within,
)
from simulator.fitting.fit import decode_steps, fit_cost_model
from simulator.fitting.intake import fit_intake_delay, live_ttft_p50, simulated_ttft_p50
from tests.sim_helpers import VARYING_TRUTH, record_on_off

TRUTH = VARYING_TRUTH


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return record_on_off(tmp_path_factory.mktemp("table"))


def test_rows_of_logs_with_one_file_name_are_told_apart_by_their_folders():
    paths = ["runs/demo1/live.jsonl", "runs/demo2/live.jsonl", "live1.jsonl", "x/live1.jsonl.gz", "/t/y/b.jsonl"]
    assert short_names(paths) == {"runs/demo1/live.jsonl": "demo1/live", "runs/demo2/live.jsonl": "demo2/live",
                                  "live1.jsonl": "live1", "x/live1.jsonl.gz": "x/live1", "/t/y/b.jsonl": "b"}
    assert short_names(["/r/live.jsonl", "/s/r/live.jsonl"]) == {"/r/live.jsonl": "r/live",
                                                                 "/s/r/live.jsonl": "s/r/live"}
    assert short_names(["a/live.jsonl", "a/live.jsonl.gz"]) == {"a/live.jsonl": "a/live.jsonl",
                                                                "a/live.jsonl.gz": "a/live.jsonl.gz"}


def test_overrides_name_every_config_difference(logs):
    on, off = logs
    assert overrides_between(on, off) == ["scheduler.enable_chunked_prefill=false",
                                          "scheduler.max_num_batched_tokens=1024"]
    assert overrides_between(on, on) == []


def test_recorded_durations_meet_every_goal(logs):
    on, _ = logs
    row = run_row(on, RecordedCostModel.from_log(on), "fit")
    assert row["run"] == "on" and within(row) == []
    assert all(abs(v) < 1e-9 for v in row["errors"].values()) and abs(row["makespan"]) < 1e-9
    assert "| on | fit | +0.0%" in markdown([row]) and "| met |" in markdown([row])
    assert row["step_time_by_kind"] == {"decode": pytest.approx(0, abs=1e-9), "prefill": pytest.approx(0, abs=1e-9)}
    assert "| on | +0.0% | +0.0% |" in kind_table([row])


def test_pair_row_checks_the_what_if_against_the_other_live_run(logs):
    on, off = logs
    row = pair_row(on, off, LinearCostModel(TRUTH), "what-if")
    assert row["overrides"] == overrides_between(on, off) and row["replayed"]  # on's workload, off's config
    assert set(row["signs"]) == {*row["errors"], "makespan"}
    for key, ok in row["signs"].items():
        p, a = row["predicted_change"][key], row["live_change"][key]
        if math.isfinite(p) and math.isfinite(a) and p != 0 and a != 0:
            assert ok == ((p > 0) == (a > 0)), key
    table = sign_table([row])
    assert table.splitlines()[2].startswith("| on → off |")
    missed = within(row)
    assert all(isinstance(m, str) for m in missed)
    assert ("met" if not missed else f"{len(missed)} missed") in markdown([row])


def test_a_pair_of_loads_simulates_each_run_from_its_own_log(logs, tmp_path):
    """Two runs of one config under other arrivals (a load what-if): no override, each run simulated
    from its own log; the errors are the second run's, the changes sim against sim and live against
    live."""
    from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, record_live, small_config
    from traces.log import LogWriter

    paths = []
    for rate in (10, 60):
        path = tmp_path / f"load_{rate}.jsonl"
        with LogWriter(path) as w:
            for ev in record_live(mixed_workload(40, seed=5, rate=rate), small_config(num_blocks=64, budget=64),
                                  VaryingDurationExecutor(seed=2)):
                w(ev)
        paths.append(path)
    low, high = paths
    assert not same_workload(low, high) and same_workload(*logs)
    model = LinearCostModel(TRUTH)
    row = pair_row(low, high, model, "what-if")
    assert row["overrides"] == [] and not row["replayed"]
    assert row["errors"] == pytest.approx(run_row(high, model)["errors"], nan_ok=True)
    assert row["live_change"]["ttft_p90"] > 0 and row["predicted_change"]["ttft_p90"] > 0  # more load, longer waits
    assert row["signs"]["ttft_p90"]


def test_intake_delay_fitted_by_resimulation_matches_the_live_ttft(logs):
    on, _ = logs
    model = LinearCostModel(TRUTH)
    model = model.with_host(HostTiming(wake=0.004))
    live = live_ttft_p50(on)
    base = simulated_ttft_p50(model, on, 0.0)
    assert simulated_ttft_p50(model, on, 0.01) > base
    fitted, out = fit_intake_delay(model, [on])
    assert model.intake_delay == 0.0 and model.host.wake == 0.004  # (the model itself is left as it was)
    model = fitted
    assert out["intake_delay_s"] >= 0 and model.intake_delay == out["intake_delay_s"]
    assert model.host.intake_delay == out["intake_delay_s"]
    assert model.host.wake == pytest.approx(max(0.004 - out["intake_delay_s"], 0.0))
    if base < live:
        assert out["sim_ttft_p50_s_after"][0] == pytest.approx(live, rel=0.05, abs=1e-3)
    else:  # the simulation is already slower: no delay
        assert out["intake_delay_s"] == 0.0


def test_decode_steps_of_a_log_join_the_fit(logs, tmp_path):
    on, off = logs
    dec = decode_steps([str(off)])
    assert len(dec.durations) and (dec.features[:, 1] == 0).all()
    model = fit_cost_model([str(on)], kind="linear-absolute", decode_steps_of=[str(off)])
    n_on = len(StepData.from_logs([str(on)]).durations)
    assert model.meta["training"]["steps"] == n_on + len(dec.durations)  # (the chosen fit learns every step)


@pytest.fixture
def true_model(tmp_path):
    """The model the test logs were written with, as a file."""
    model = tmp_path / "m.json"
    LinearCostModel(TRUTH).save(model)
    return model


def test_command_writes_tables_and_json(logs, true_model, tmp_path, capsys):
    from runtime.cli import main

    on, off = logs
    model = true_model
    out = tmp_path / "t.json"
    assert main(["fidelity-table", "--cost-model", str(model), "--run", f"fit:{on}", "--pair", f"what-if:{on}:{off}",
                 "--sensitivity", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "elasticity to the step time" in text and re.search(r"\| on \| -?\d+\.\d\d / [+-]\d", text)
    assert "| on | fit |" in text and "| on → off | what-if |" in text and "predicted / live change" in text
    assert "by kind of step" in text and "| run | decode-only steps | steps with prefill |" in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["kind"] for r in rows] == ["run", "what-if"]


def test_a_flag_takes_several_logs_at_once(logs, true_model, tmp_path):
    from runtime.cli import main

    on, off = logs
    model = true_model
    out = tmp_path / "t.json"
    assert main(["fidelity-table", "--cost-model", str(model), "--run", f"fit:{on}", f"held-out:{off}",
                 "--json", str(out)]) == 0
    assert [(r["run"], r["role"]) for r in json.loads(out.read_text())["rows"]] == [("on", "fit"), ("off", "held-out")]


def test_sensitivity_rows_divide_each_error_by_its_elasticity(logs):
    on, _ = logs
    slow = LinearCostModel({k: 1.1 * v for k, v in TRUTH.items()})
    row = run_row(on, slow, "held-out", sensitivity_pct=2)
    assert set(row["elasticity"]) == {*row["errors"], "makespan"}
    line = sensitivity_table([row]).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "on"
    for key, cell in zip([*row["errors"], "makespan"], cells[1:]):
        e = row["elasticity"][key]
        err = row["makespan"] if key == "makespan" else row["errors"][key]
        assert cell == f"{e:.2f} / {err / e:+.1f}%"
    assert "elasticity" not in run_row(on, slow) and sensitivity_table([run_row(on, slow)]).count("\n") == 1


def test_a_sign_is_judged_only_beyond_the_repeat_spread(logs):
    """Two runs of one config span nothing; the on/off pair's own difference is its spread; a sign
    is judged where the live difference is larger than the spread (or the spread is unknown)."""
    on, off = logs
    assert set(repeat_spread(on, on).values()) == {0.0}
    row = pair_row(on, off, LinearCostModel(TRUTH), "what-if")
    spread = repeat_spread(on, off)
    for key, change in row["live_change"].items():
        assert spread[key] == pytest.approx(abs(change), nan_ok=True)
    assert signs_beyond(row, spread) == {}  # no difference exceeds itself
    judged = signs_beyond(row, {k: 0.0 for k in spread})
    assert judged == {k: ok for k, ok in row["signs"].items() if row["live_change"][k] != 0}
    assert signs_beyond(row, {}) == row["signs"] and signs_beyond(row, {"makespan": math.nan}) == row["signs"]
    half = {k: abs(v) / 2 for k, v in row["live_change"].items()}
    assert signs_beyond(row, half) == judged


def test_command_counts_the_signs_beyond_the_repeats(logs, tmp_path, capsys):
    from runtime.cli import main

    on, off = logs
    out = tmp_path / "t.json"
    assert main(["fidelity-table", "--cost-model", "recorded:" + str(on), "--pair", f"what-if:{on}:{off}",
                 "--repeat", f"{on}:{on}", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "run-to-run spread of the live repeats" in text and "of the live differences beyond the spread" in text
    doc = json.loads(out.read_text())
    assert set(doc["repeat_spread"].values()) == {0.0} and "signs_beyond_spread" in doc["rows"][0]
    capsys.readouterr()
    for argv, message in (
            (["--pair", f"w:{on}:{off}", "--repeat", str(on)], f"--repeat: expected A_LOG:B_LOG, got '{on}'"),
            (["--run", str(on)], f"--run: expected ROLE:LOG, got '{on}'"),
            (["--pair", f"w:{on}"], f"--pair: expected ROLE:ON_LOG:OFF_LOG, got 'w:{on}'"),
            (["--run", f"fit:{tmp_path}/none.jsonl"], f"{tmp_path}/none.jsonl: no such log"),
            (["--repeat", f"{on}:{on}"], "--run: give at least one --run ROLE:LOG, --pair ROLE:ON_LOG:OFF_LOG or "
                                              "--closed-loop ROLE:LOG:WORKLOAD")):
        with pytest.raises(SystemExit) as exc:
            main(["fidelity-table", "--cost-model", "recorded:" + str(on), *argv])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err == f"minivllm: error: {message}\n", err


def test_a_runs_goals_are_per_metric():
    """TTFT within 10 %, TPOT and E2E within 5 %, the makespan within 3 % (a what-if's within 10 %)."""
    errors = {"ttft_p50": 9.0, "ttft_p90": -9.5, "tpot_p50": 4.0, "tpot_p90": -4.9, "e2e_p50": 4.5, "e2e_p90": 0.0}
    row = {"kind": "run", "errors": errors, "makespan": 2.5}
    assert within(row) == []
    missed = within({**row, "errors": {**errors, "tpot_p50": 5.5}, "makespan": 3.5})
    assert missed == ["tpot_p50 +5.5%", "makespan +3.5%"]
    assert within({**row, "kind": "what-if", "errors": {**errors, "tpot_p50": 9.0}, "makespan": 9.0, "signs": {}}) == []


def test_a_pair_of_one_replica_and_a_fleet_is_simulated_run_by_run(tmp_path):
    """1 → 2 replicas (a fleet log against a replica's): no config override says it, so each run is
    simulated from its own log; with the model that made both, every error is 0 and each predicted
    change the simulated one."""
    from runtime.cli import main
    from simulator.cost.loading import load_cost_model

    wl, one, two = tmp_path / "w.jsonl", tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main(["workload", "generate", "-n", "40", "--rate", "40", "--input-len", "uniform:32:256",
                 "--output-len", "uniform:16:64", "--out", str(wl)]) == 0
    for log, replicas in ((one, "1"), (two, "2")):
        assert main(["simulate", str(wl), "--cost-model", "qwen3-0.6b-h200", "--replicas", replicas,
                     "--devices", "1", "--out", str(log), "--no-progress"]) == 0
    row = pair_row(one, two, load_cost_model("qwen3-0.6b-h200"), "what-if")
    assert not row["replayed"] and all(abs(v) < 1e-9 for v in row["errors"].values())
    assert row["predicted_change"] == pytest.approx(row["live_change"]) and row["live_change"]["tpot_p50"] > 0
