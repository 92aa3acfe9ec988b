"""CLI smoke tests: workload, simulate, replay, cost-model (through runtime.cli.main)."""

from __future__ import annotations

import json

import pytest

from runtime.cli import main
from tests.sim_helpers import DATA, VaryingDurationExecutor, mixed_workload, record_live, small_config
from traces.events import Admitted, Preempted, Step
from traces.log import LogWriter, read_header, read_log

AZURE = str(DATA / "azure_conv_head200.csv")
MOONCAKE = str(DATA / "mooncake_head200.jsonl")


def _fails(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_workload_convert_generate_info(tmp_path, capsys):
    w = tmp_path / "w.jsonl"
    assert main(["workload", "convert", AZURE, "--limit", "50", "--rate-scale", "2", "--out", str(w)]) == 0
    assert "50 requests" in capsys.readouterr().out
    g = tmp_path / "g.jsonl"
    assert main(["workload", "generate", "-n", "30", "--rate", "5", "--cv", "2", "--input-len", "lognormal:300:1",
                 "--shared-prefix", "32", "--out", str(g)]) == 0
    assert main(["workload", "info", str(g)]) == 0
    assert "30 requests" in capsys.readouterr().out


def test_simulate_trace_chunked_off_defaults_budget_to_max_model_len(tmp_path, capsys):
    out, js = tmp_path / "sim.jsonl", tmp_path / "s.json"
    assert main(["simulate", AZURE, "--cost-model", "qwen3-0.6b-h200", "--limit", "40", "--chunked", "off",
                 "--no-progress", "--out", str(out), "--json", str(js)]) == 0
    text = capsys.readouterr().out
    for word in ("TTFT", "TPOT", "E2E", "p99", "throughput", "preemptions", "prefix hit rate"):
        assert word in text
    header = read_header(out)
    sched = header.config["scheduler"]
    assert header.clock == "sim" and not sched["enable_chunked_prefill"]
    assert sched["max_num_batched_tokens"] == sched["max_model_len"]
    summary = json.loads(js.read_text())["summary"]
    assert summary["finished"] == 40 and summary["rejected"] == 0


def test_simulate_mooncake_with_engine_flags(tmp_path, capsys):
    out = tmp_path / "m.jsonl.gz"
    assert main(["simulate", MOONCAKE, "--cost-model", "qwen3-0.6b-h200", "--limit", "12", "--num-blocks", "20000",
                 "--block-size", "32", "--max-num-batched-tokens", "4096", "--max-num-seqs", "8",
                 "--prefix-caching", "off", "--seed", "3", "--no-progress", "--out", str(out)]) == 0
    header = read_header(out)
    assert header.block_size == 32 and header.num_blocks == 20000 and header.seed == 3
    assert header.config["cache"]["enable_prefix_caching"] is False
    assert sum(isinstance(e, Step) for e in read_log(out)) > 0


def _live_log(tmp_path):
    path = tmp_path / "live.jsonl"
    with LogWriter(path) as w:
        for ev in record_live(mixed_workload(40, seed=5), small_config(num_blocks=40, budget=128),
                              VaryingDurationExecutor(seed=2)):
            w(ev)
    return path


def test_simulate_a_log_with_its_recorded_durations_reproduces_its_decisions(tmp_path):
    live = _live_log(tmp_path)
    out = tmp_path / "resim.jsonl"
    assert main(["simulate", str(live), "--cost-model", "recorded", "--no-progress", "--out", str(out)]) == 0
    pick = lambda p: [(type(e).__name__, getattr(e, "step", None), getattr(e, "spans", None))
                      for e in read_log(p) if isinstance(e, Step | Admitted | Preempted)]
    assert pick(out) == pick(live)


def test_replay_timing_recorded_and_model(tmp_path, capsys):
    live = _live_log(tmp_path)
    js = tmp_path / "r.json"
    assert main(["replay", str(live), "--cost-model", "recorded", "--json", str(js)]) == 0
    assert "per-step MAPE: 0.00%" in capsys.readouterr().out
    assert json.loads(js.read_text())["e2e"]["max_abs_s"] <= 1e-12
    csv = tmp_path / "steps.csv"
    assert main(["replay", str(live), "--cost-model", "qwen3-0.6b-h200", "--steps-csv", str(csv)]) == 0
    assert "TTFT error" in capsys.readouterr().out and csv.read_text().startswith("step,recorded,predicted")
    assert "exactly one of" in _fails(["replay", str(live)], capsys)


def test_cost_model_fit_eval_analytic(tmp_path, capsys):
    logs = []
    for seed in (1, 2):
        out = tmp_path / f"s{seed}.jsonl"
        main(["simulate", AZURE, "--cost-model", "qwen3-0.6b-h200", "--limit", "30", "--seed", str(seed),
              "--no-progress", "--out", str(out)])
        logs.append(str(out))
    m = tmp_path / "m.json"
    assert main(["cost-model", "fit", logs[0], "--holdout", logs[1], "--out", str(m), "--hardware", "sim"]) == 0
    doc = json.loads(m.read_text())
    assert doc["provenance"] == "fit" and doc["hardware"] == "sim" and doc["fit_date"]
    assert doc["heldout"]["logs"] == [logs[1]] and doc["heldout"]["mape"] < 1.0
    assert main(["cost-model", "eval", str(m), *logs]) == 0
    assert "per-step MAPE" in capsys.readouterr().out
    assert main(["cost-model", "eval", "qwen3-0.6b-h200", logs[0]]) == 0  # a shipped name, as simulate takes
    assert "per-step MAPE over" in capsys.readouterr().out
    a = tmp_path / "a.json"
    assert main(["cost-model", "analytic", "qwen3-0.6b-h200", "--out", str(a)]) == 0
    from simulator.cost.loading import load_cost_model
    from simulator.cost.roofline import H200, QWEN3_0_6B, analytic_cost_model

    assert load_cost_model(str(a)).coefficients == analytic_cost_model(QWEN3_0_6B, H200).coefficients
    assert json.loads(a.read_text())["coefficients"]["prefill_step"] == 0.0  # written out, not left missing


def test_user_errors_are_one_line_messages(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,10,2\n2023-11-16 18:17:04,x,2\n")
    err = _fails(["simulate", str(bad), "--cost-model", "qwen3-0.6b-h200", "--out", str(tmp_path / "o.jsonl")],
                 capsys)
    assert f"{bad}:3: field ContextTokens" in err
    assert main(["workload", "convert", str(bad), "--skip-bad-rows", "--out", str(tmp_path / "w.jsonl")]) == 0
    assert "skipped 1 bad rows" in capsys.readouterr().err  # a notice: stdout stays the command's output
    assert "no such workload file" in _fails(["simulate", str(tmp_path / "none.csv"), "--cost-model", "x",
                                              "--out", "o"], capsys)
    assert "no such cost model" in _fails(["simulate", AZURE, "--cost-model", "nope", "--out",
                                           str(tmp_path / "o.jsonl")], capsys)
    assert "needs a recorded log" in _fails(["simulate", AZURE, "--cost-model", "recorded", "--out",
                                             str(tmp_path / "o.jsonl")], capsys)


def test_count_steps_counts_the_step_events(tmp_path):
    """execute-replay's progress total, counted without decoding the log."""
    from runtime.cli.replay import count_steps

    live = _live_log(tmp_path)
    steps = sum(isinstance(e, Step) for e in read_log(live))
    gz = tmp_path / "live.jsonl.gz"
    with LogWriter(gz) as w:
        for ev in read_log(live):
            w(ev)
    assert steps > 10 and count_steps(str(live)) == count_steps(str(gz)) == steps
    cut = tmp_path / "cut.jsonl.gz"  # a killed writer's gzip stream: the steps before the cut
    cut.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    assert 0 < count_steps(str(cut)) < steps


def test_simulate_is_byte_identical_across_processes(tmp_path):
    """Two processes with different hash seeds write the same log."""
    import os
    import subprocess
    import sys

    from tests.sim_helpers import REPO

    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"p{hash_seed}.jsonl"
        subprocess.run([sys.executable, "-m", "runtime", "simulate", MOONCAKE, "--cost-model", "qwen3-0.6b-h200",
                        "--limit", "30", "--num-blocks", "30000", "--no-progress", "--out", str(out)],
                       check=True, cwd=REPO, env={**os.environ, "PYTHONHASHSEED": hash_seed}, capture_output=True)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and len(outs[0]) > 10_000
