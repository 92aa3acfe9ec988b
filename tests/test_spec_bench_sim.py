"""``bench spec --cost-model``: every run's event log re-simulated, the predicted speed-up (simulated
plain makespan / simulated speculative makespan) beside the live one; the logs kept with --log-dir."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from runtime.cli import main
from simulator.cost.linear_model import LinearCostModel
from simulator.replay.replay import log_config
from tests.model_helpers import make_tiny, one_thread

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

STEP = 0.01  # the cost model's one price: every step costs it, so a makespan is steps × STEP


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("spec-bench"), tokenizer=True)


@pytest.fixture(scope="module")
def bench(tiny, tmp_path_factory):
    """One bench run (ngram:2 and replay drafters at rates 0 and 1, batch 1 and 3, each timed twice):
    its JSON rows, table and log folder."""
    tmp = tmp_path_factory.mktemp("spec-bench-run")
    LinearCostModel({"const": STEP}).save(tmp / "const.json")
    out, table = tmp / "spec.json", io.StringIO()
    with contextlib.redirect_stdout(table):  # (a module fixture has no capsys)
        code = main(["bench", "spec", "--model", str(tiny.folder), "--device", "cpu", "--speculative", "ngram:2",
                     "--acceptance", "0,1", "--batch", "1", "3", "--workload", "repetitive", "--max-tokens", "12",
                     "--repeats", "2", "--cost-model", str(tmp / "const.json"), "--log-dir", str(tmp / "logs"),
                     "--json", str(out)])
    assert code == 0, table.getvalue()
    return json.loads(out.read_text())["results"], table.getvalue(), tmp / "logs"


def test_the_predicted_speedup_is_the_ratio_of_simulated_makespans(bench):
    rows, _, _ = bench
    assert [r["drafter"] for r in rows] == ["off", "ngram:2", "replay@0:2", "replay@1:2"] * 2
    for i in range(0, len(rows), 4):
        plain, *spec = rows[i:i + 4]
        # the plain log re-simulated takes the live schedule again: same workload, same scheduler
        assert plain["sim_steps"] == plain["steps"] and plain["sim_speedup"] is None
        for r in rows[i:i + 4]:
            assert r["sim_seconds"] == pytest.approx(STEP * r["sim_steps"])
        for r in spec:
            assert r["identical"] is True
            # each repeat's speed-up is over the plain run of the same repeat; the figure is their median
            assert len(r["repeat_seconds"]) == len(plain["repeat_seconds"]) == 2
            assert r["speedups"] == pytest.approx([p / s for p, s in zip(plain["repeat_seconds"], r["repeat_seconds"])])
            assert r["speedup"] == pytest.approx(sum(r["speedups"]) / 2)
            assert r["sim_speedup"] == pytest.approx(plain["sim_steps"] / r["sim_steps"])
            assert r["sim_error"] == pytest.approx(r["sim_speedup"] / r["speedup"] - 1)
        by = {r["drafter"]: r for r in spec}
        # no draft accepted: one token a step, live and simulated alike
        assert by["replay@0:2"]["sim_steps"] == by["replay@0:2"]["steps"] == plain["steps"]
        assert by["replay@0:2"]["sim_speedup"] == pytest.approx(1.0)
        # every draft accepted: the simulated run draws the log's rates and takes fewer steps too
        assert by["replay@1:2"]["sim_steps"] < plain["sim_steps"]


def test_the_table_has_the_simulated_columns_and_the_logs_are_kept(bench):
    _, table, logs = bench
    head = table.splitlines()[0]
    assert "sim speed-up" in head and "sim error" in head
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        f"repetitive-b{b}-{d}.jsonl" for b in (1, 3) for d in ("off", "ngram_2", "replay_0_2", "replay_1_2"))
    # a replay drafter stands for a draft model, and its logs say so: re-simulated, it is throttled as one is
    assert log_config(logs / "repetitive-b1-replay_0_2.jsonl")[1].speculative == "model:replay:2"


def test_a_bad_cost_model_is_a_flag_error_before_the_model_loads(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "spec", "--model", "/no/such/model", "--speculative", "ngram:2", "--cost-model", "nope"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("minivllm: error: --cost-model: ")
