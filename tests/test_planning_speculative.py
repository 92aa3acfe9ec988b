"""Speculative decoding in a sweep: the ``speculative`` axis, the rates its points draw from (shared,
or each point's constant ``acceptance``), and keys that change with the rates a point draws from
and only with those."""

from __future__ import annotations

import pickle

import pandas as pd

from runtime.planning.cache import ResultCache
from runtime.planning.job import SharedInputs
from runtime.planning.point_run import simulate_point
from runtime.planning.runner import LocalRunner
from runtime.planning.slo import Slo
from runtime.planning.sweep import run_sweep
from simulator.fleet.speculation import Speculation
from tests.planning_helpers import FlatCost, small_plan, small_workload

SLO = Slo.parse("ttft_p99_ms=60,tpot_p99_ms=8")


def inputs(speculation: Speculation | None = None) -> SharedInputs:
    return SharedInputs(small_workload(), FlatCost(), "flat", speculation)


def sweep(grid: str, speculation: Speculation | None = None, cache_dir=None):
    return run_sweep(small_plan(grid, (1.0,)), inputs(speculation), LocalRunner(), ResultCache(cache_dir), SLO)


def test_speculating_at_a_high_acceptance_takes_fewer_and_shorter_steps():
    table, _ = sweep("speculative=off,ngram:4 acceptance=0,0.9")
    t = table.set_index("config")
    assert t["speculative"].tolist() == ["off", "off", "ngram:4", "ngram:4"]
    assert t["acceptance"].tolist() == [0.0, 0.9, 0.0, 0.9]
    off, high = t.loc["speculative=off acceptance=0"], t.loc["speculative=ngram:4 acceptance=0.9"]
    assert (table["status"] == "ok").all() and (table["output_tokens"] == off["output_tokens"]).all()
    # four drafts a decode, 90 % of them accepted: a decode commits several tokens for one step's overhead
    assert high["steps"] < off["steps"] / 1.5
    assert high["tpot_p50_ms"] < off["tpot_p50_ms"] and high["e2e_p50_ms"] < off["e2e_p50_ms"]
    # nothing accepted: every decode still verifies four drafts, each step longer for nothing
    assert t.loc["speculative=ngram:4 acceptance=0", "tpot_p50_ms"] > off["tpot_p50_ms"]
    # a point that doesn't speculate simulates alike at any acceptance: one key
    assert t.loc["speculative=off acceptance=0", "key"] == t.loc["speculative=off acceptance=0.9", "key"]
    assert t["key"].nunique() == 3


def test_a_row_is_its_points_own_simulation_and_a_rerun_reads_it_from_the_cache(tmp_path):
    rates = Speculation.constant(0.8)
    first, results = sweep("speculative=off,ngram:4", rates, tmp_path)
    assert results.cached == 0 and first["acceptance"].isna().all()  # the shared rates: no constant of its own
    point = small_plan("speculative=off,ngram:4", (1.0,)).points()[1]
    alone = simulate_point(point.job(SLO), small_workload(), FlatCost(), "flat", rates)
    row = first.iloc[1]
    assert row["speculative"] == "ngram:4" and all(row[c] == v for c, v in alone.items() if v == v)
    again, cached = sweep("speculative=off,ngram:4", rates, tmp_path)
    assert cached.cached == 2 and cached.stats.tasks == 0
    pd.testing.assert_frame_equal(first, again)


def test_the_key_of_a_speculative_point_follows_its_rates_and_no_other_does(tmp_path):
    a, _ = sweep("speculative=off,ngram:4", Speculation.constant(0.8), tmp_path)
    b, results = sweep("speculative=off,ngram:4", Speculation.constant(0.5), tmp_path)
    assert results.cached == 1  # the point that doesn't speculate
    assert a["key"][0] == b["key"][0] and a["key"][1] != b["key"][1]
    assert a["steps"][1] < b["steps"][1]
    c, _ = sweep("speculative=off,ngram:4", Speculation.constant(0.8, seed=1), tmp_path)
    assert c["key"][1] not in (a["key"][1], b["key"][1])


def test_rates_from_a_log_travel_with_the_inputs(tmp_path):
    log = tmp_path / "spec.jsonl"
    point = small_plan("speculative=ngram:4", (1.0,)).points()[0]
    simulate_point(point.job(None, log=str(log)), small_workload(), FlatCost(), "flat", Speculation.constant(0.7))
    rates = Speculation.from_logs([log], per_request=True)
    shared = inputs(rates)
    digest = shared.digest  # the runner's, before the inputs go out
    copy = pickle.loads(pickle.dumps(shared))  # as a Ray worker gets them
    assert copy.speculation == rates and copy.speculation.fingerprint() == rates.fingerprint()
    assert copy.digest == digest
    table, _ = run_sweep(small_plan("speculative=ngram:2,ngram:4", (1.0,)), copy, LocalRunner(), ResultCache(None), SLO)
    assert (table["status"] == "ok").all()
    assert table["key"][1] != sweep("speculative=ngram:4", Speculation.constant(0.7))[0]["key"][0]


def test_a_speculative_point_with_no_rates_is_a_failed_row_that_says_why():
    table, _ = sweep("speculative=off,ngram:4")
    assert table["status"].tolist() == ["ok", "failed"]
    assert "needs acceptance rates" in table["error"][1]
