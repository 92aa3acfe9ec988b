"""SLO searches find a threshold known in advance: requests one per ``gap`` seconds, one at a time,
each four steps of 100 ms, queue exactly when they come faster than one per 400 ms, so the highest
rate scale with no wait is 0.4 s / gap; with N replicas behind round-robin, N per 0.4 s."""

from __future__ import annotations

import json
import shlex

import pandas as pd
import pytest

from runtime.cli import main
from runtime.planning.cache import ResultCache
from runtime.planning.grid import Grid
from runtime.planning.job import SharedInputs
from runtime.planning.live_capacity import measured_capacity
from runtime.planning.runner import LocalRunner
from runtime.planning.search import search_capacity, search_replicas
from runtime.planning.slo import Slo
from runtime.planning.sweep import Plan
from tests.planning_helpers import ConstantStep, base_config, evenly_spaced
from tests.sim_helpers import REPO, TRACES

# a request that waits 0.5 ms for its admission breaks it
SLO = Slo.parse("queue_max_ms=0.5")


def inputs() -> SharedInputs:
    return SharedInputs(evenly_spaced(20, gap=1.0), ConstantStep(0.1), "constant")


def plan(grid: str = "") -> Plan:
    return Plan(Grid.parse(grid), (1.0,), base_config(max_num_seqs=1), {})


def test_the_capacity_search_finds_the_known_threshold_and_its_margin(tmp_path):
    done = search_capacity(plan(), inputs(), LocalRunner(), ResultCache(tmp_path), SLO, margin_pct=10, tolerance=0.01)
    row = done.table.iloc[0]
    assert 2.5 / 1.01 <= row["capacity_rate_scale"] <= 2.5
    assert row["bounded"] and row["monotone"] and row["error"] == ""
    # every step 10 % slower (0.44 s a request) or faster (0.36 s)
    assert 1 / 0.44 / 1.01 <= row["capacity_if_slower_rate_scale"] <= 1 / 0.44
    assert 1 / 0.36 / 1.01 <= row["capacity_if_faster_rate_scale"] <= 1 / 0.36
    assert row["capacity_req_s"] == pytest.approx(row["capacity_rate_scale"] * 20 / 19)
    assert row["queue_max_ms"] == pytest.approx(0.0, abs=1e-6)
    assert row["limited_by"].startswith("queue_max_ms")
    assert done.answers[0].rate_scale == row["capacity_rate_scale"]
    assert row["point"] == f"rate_scale={done.answers[0].rate_scale!r}"
    # the same search again: every probe from the cache
    again = search_capacity(plan(), inputs(), LocalRunner(), ResultCache(tmp_path), SLO, margin_pct=10, tolerance=0.01)
    assert again.simulations == 0 and again.cached == done.simulations
    pd.testing.assert_frame_equal(done.table, again.table)


def test_one_search_per_configuration():
    done = search_capacity(plan("chunked=on,off budget=512,8"), inputs(), LocalRunner(), ResultCache(None), SLO,
                           tolerance=0.01)
    t = done.table.set_index("config")
    assert t.index.tolist() == ["chunked=on budget=512", "chunked=on budget=8", "chunked=off budget=512",
                                "chunked=off budget=8"]
    cap = t["capacity_rate_scale"]
    assert 2.5 / 1.01 <= cap["chunked=on budget=512"] <= 2.5 and 2.5 / 1.01 <= cap["chunked=off budget=512"] <= 2.5
    # chunks of 8: the 16-token prompt takes two steps, a request five (0.5 s)
    assert 2.0 / 1.01 <= cap["chunked=on budget=8"] <= 2.0
    # a whole prompt must fit one step without chunking: every request refused, at any load
    assert pd.isna(cap["chunked=off budget=8"]) and "rejected" in t.loc["chunked=off budget=8", "limited_by"]
    assert t["capacity_if_slower_rate_scale"].isna().all()  # no margin asked


def test_speculating_with_every_draft_accepted_doubles_the_capacity():
    done = search_capacity(plan("speculative=off,ngram:4 acceptance=0,1"), inputs(), LocalRunner(), ResultCache(None),
                           SLO, tolerance=0.01)
    cap = done.table.set_index("config")["capacity_rate_scale"]
    # a request's three decode tokens in one step (two drafts, the room it has, and one token of its own):
    # two steps a request, 0.2 s; with no draft accepted, four as without speculation
    for config in ("speculative=off acceptance=0", "speculative=off acceptance=1", "speculative=ngram:4 acceptance=0"):
        assert 2.5 / 1.01 <= cap[config] <= 2.5
    assert 5.0 / 1.01 <= cap["speculative=ngram:4 acceptance=1"] <= 5.0
    assert done.answers[3].acceptance == 1.0 and done.answers[3].config.speculative == "ngram:4"


def test_the_replica_search_finds_the_fewest_that_carry_a_load():
    done = search_replicas(plan("router=round-robin"), inputs(), LocalRunner(), ResultCache(None), SLO, rate_scale=7.0,
                           margin_pct=10)
    row = done.table.iloc[0]
    # 7 requests per second need 7 × 0.4 = 2.8 replicas; 3.08 with slower steps, 2.52 with faster
    assert (row["replicas_needed"], row["replicas_if_slower"], row["replicas_if_faster"]) == (3, 4, 3)
    assert row["limited_by"].startswith("queue_max_ms")  # two replicas: over
    assert done.answers[0].replicas == 3 and row["point"] == "router=round-robin replicas=3 rate_scale=7"


def test_the_live_capacity_is_read_from_a_bench_matrix():
    matrix = json.loads((REPO / "docs" / "results" / "serve_h200_conv_Q.json").read_text())
    slo = Slo.parse("ttft_p99_ms=300")
    live = measured_capacity(matrix, slo, chunked="on")
    runs = live.runs
    assert [r["ok"] for r in runs] == [True, False]
    assert live.how == "interpolated" and runs[0]["rate_scale"] < live.rate_scale < runs[1]["rate_scale"]
    assert measured_capacity(matrix, Slo.parse("ttft_p99_ms=5000"), chunked="off").how == "at least"
    assert measured_capacity(matrix, Slo.parse("ttft_p99_ms=10"), chunked="off").how == "below"


def test_the_search_command_answers_with_the_command_of_its_answer(tmp_path, capsys):
    trace = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
    live = str(REPO / "docs" / "results" / "serve_h200_conv_Q.json")
    rc = main(["search", trace, "--cost-model", "qwen3-0.6b-h200", "--limit", "80", "--grid", "chunked=on,off",
               "--slo", "ttft_p99_ms=300,tpot_p99_ms=30", "--tolerance", "0.1", "--start", "8", "--margin-pct", "0",
               "--in-process", "--no-progress", "--live", live, "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    table = pd.read_csv(tmp_path / "search.csv")
    assert table["config"].tolist() == ["chunked=on", "chunked=off"]
    assert (table["capacity_rate_scale"] > 1).all() and table["command"].str.startswith("minivllm simulate").all()
    assert "live capacity" in out and {"live_capacity_rate_scale", "capacity_error_pct"} <= set(table.columns)
    doc = json.loads((tmp_path / "search.json").read_text())
    assert doc["slo"] == "ttft_p99_ms=300,tpot_p99_ms=30" and len(doc["rows"]) == 2


def test_a_speculative_answers_command_reruns_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
    assert main(["search", trace, "--cost-model", "qwen3-0.6b-h200", "--limit", "40", "--grid",
                 "speculative=off,ngram:4", "--acceptance", "0.8", "--slo", "ttft_p99_ms=300,tpot_p99_ms=3",
                 "--tolerance", "0.2", "--start", "8", "--margin-pct", "0", "--in-process", "--no-progress",
                 "--out", "se"]) == 0
    assert "speculative decoding, K=4: drafts and acceptance from a constant rate" in capsys.readouterr().out
    table = pd.read_parquet(tmp_path / "se" / "search.parquet")
    assert table["speculative"].tolist() == ["off", "ngram:4"] and (table["acceptance"] == 0.8).all()
    # a decode's tokens in fewer steps: the TPOT limit is met at a higher load
    assert table["capacity_rate_scale"][1] > table["capacity_rate_scale"][0]
    for _, row in table.iterrows():
        words = shlex.split(row["command"])
        assert ("--acceptance" in words) == (row["speculative"] != "off")
        assert main([*words[1:], "--no-progress", "--json", "answer.json"]) == 0
        summary = json.loads((tmp_path / "answer.json").read_text())["summary"]
        assert summary["ttft_s"]["p99"] * 1e3 == row["ttft_p99_ms"]
        assert summary["tpot_s"]["p99"] * 1e3 == row["tpot_p99_ms"]
