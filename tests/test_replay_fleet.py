"""``replay`` on a fleet log (the front door's routing; the steps are in its replicas' logs) replays
every replica's log with its own step times and executor; a replay that compared no step exits
non-zero with one line saying so; a missing replica log is one line naming it."""

from __future__ import annotations

import json

import pytest

from runtime.cli import main
from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, record_live, small_config
from traces.events import Routed, make_header
from traces.fleet_log import fleet_extra, replica_log_path
from traces.log import LogWriter
from traces.workload import Workload

SEED = 2


def _fleet(tmp_path, requests: int = 16):
    """Two replicas, the workload's requests dealt alternately (round-robin), each recorded live."""
    path = tmp_path / "fleet.jsonl"
    config = small_config(num_blocks=64, budget=64)
    wl = mixed_workload(requests, seed=5, rate=30)
    logs = [replica_log_path(path, i) for i in range(2)]
    for i, log in enumerate(logs):
        part = Workload(wl.requests[i::2], seed=wl.seed)
        with LogWriter(log) as w:
            for ev in (record_live(part, config, VaryingDurationExecutor(seed=SEED)) if len(part) else
                       [make_header(config, clock="wall")]):
                w(ev)
    with LogWriter(path) as w:
        w(make_header(config, clock="wall", extra=fleet_extra("round-robin", logs, path, data_parallel=True)))
        for k, spec in enumerate(wl.requests):
            w(Routed(time=spec.arrival, index=k, replica=k % 2, request_id=k // 2))
    return path, logs


def test_timing_replay_of_a_fleet_log_replays_each_replica_with_its_own_step_times(tmp_path, capsys):
    path, logs = _fleet(tmp_path)
    out_json = tmp_path / "r.json"
    assert main(["replay", str(path), "--cost-model", "recorded", "--json", str(out_json),
                 "--steps-csv", str(tmp_path / "steps.csv")]) == 0
    out = capsys.readouterr().out
    assert f"(replica 0 of {path})" in out and f"(replica 1 of {path})" in out
    assert "nan" not in out.lower()
    doc = json.loads(out_json.read_text())
    assert [r["log"] for r in doc["replicas"]] == [str(p) for p in logs]
    for r in doc["replicas"]:
        assert r["steps"] > 0 and r["step_mape"] == 0.0 and r["ttft"]["mae_s"] == 0.0
    assert "replica" in (tmp_path / "steps.csv").read_text().splitlines()[0]


def test_execute_replay_of_a_fleet_log_runs_every_replica(tmp_path, capsys, monkeypatch):
    import runtime.executor.setup as setup

    path, _ = _fleet(tmp_path)
    built = []

    def factory(model, **options):
        def make(header):
            built.append(header)
            return VaryingDurationExecutor(seed=SEED)
        return make

    monkeypatch.setattr(setup, "replay_executor_factory", factory)
    assert main(["replay", str(path), "--execute", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert len(built) == 2 and out.count("tokens match the log") == 2
    assert "steps executed: 0 " not in out


def test_a_replay_that_compares_nothing_exits_non_zero(tmp_path, capsys, monkeypatch):
    import runtime.executor.setup as setup

    path, _ = _fleet(tmp_path, requests=0)
    monkeypatch.setattr(setup, "replay_executor_factory",
                        lambda model, **options: lambda header: VaryingDurationExecutor(seed=SEED))
    for flags in (["--cost-model", "recorded"], ["--execute", "--no-progress"]):
        with pytest.raises(SystemExit) as e:
            main(["replay", str(path), *flags])
        assert e.value.code != 0
        assert f"{path}: nothing compared: its replicas' logs hold no steps" in capsys.readouterr().err
    single = tmp_path / "empty.jsonl"
    with LogWriter(single) as w:
        w(make_header(small_config(), clock="wall"))
    with pytest.raises(SystemExit):
        main(["replay", str(single), "--cost-model", "recorded"])
    assert f"{single}: nothing compared: it holds no steps" in capsys.readouterr().err


def test_a_missing_replica_log_is_one_line_naming_it(tmp_path, capsys):
    path, logs = _fleet(tmp_path)
    logs[1].unlink()
    with pytest.raises(SystemExit):
        main(["replay", str(path), "--cost-model", "recorded"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(logs[1]) in err[0]
