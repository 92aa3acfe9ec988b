"""Timing-replay (LoggedPolicy decisions re-timed) and execute-replay (recorded plans re-run)."""

from __future__ import annotations

import math

import pytest

from runtime.engine.types import StepResult
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.recorded_model import RecordedCostModel
from simulator.replay.execute import execute_replay, render_execute_report
from simulator.replay.policy import LoggedPolicy
from simulator.replay.replay import render_by_kind, render_timing_replay, resimulate, timing_replay
from simulator.sim import simulate
from tests.helpers import SeededTokenExecutor
from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, record_live, small_config
from traces.block_runs import block_ids
from traces.events import Arrived, BlockCached, PrefixHit, Step
from traces.importers.log import read_log_workload
from traces.log import FoldedState, LogWriter


@pytest.fixture(scope="module")
def live_log(tmp_path_factory):
    """A live-style log with preemptions, prefix hits and finishes, and the tables its executor saw."""
    cfg = small_config(num_blocks=40, budget=128)
    tables: list = []
    executor = VaryingDurationExecutor(seed=5)
    events = record_live(mixed_workload(60, seed=21), cfg, executor, tables=tables)
    path = tmp_path_factory.mktemp("replay") / "live.jsonl"
    with LogWriter(path) as w:
        for ev in events:
            w(ev)
    return path, events, tables, executor


def test_timing_replay_with_recorded_durations_has_zero_error(live_log):
    path, events, _, _ = live_log
    report = timing_replay(path, RecordedCostModel.from_log(path))
    s = report.summary
    assert s["steps"] == sum(isinstance(e, Step) for e in events)
    assert s["step_mape"] == 0.0
    assert (report.steps["predicted"] == report.steps["recorded"]).all()
    assert (report.steps["pred_start"] == report.steps["rec_start"]).all()
    for key in ("ttft", "e2e"):
        assert s[key]["n"] == 66
        assert s[key]["max_abs_s"] <= 1e-12 and s[key]["mape"] <= 1e-9
    assert "MAPE 0.00%" in render_timing_replay(report)


def test_timing_replay_with_a_model_keeps_decisions_and_respects_arrivals(live_log):
    path, events, _, _ = live_log
    fast = LinearCostModel({"const": 1e-4})
    report = timing_replay(path, fast)
    steps = report.steps
    assert len(steps) == sum(isinstance(e, Step) for e in events)
    assert (steps["predicted"] == 1e-4).all()
    assert (steps["pred_start"].iloc[1:].to_numpy() >= steps["pred_end"].iloc[:-1].to_numpy()).all()
    assert report.summary["step_mape"] > 90
    # faster steps → earlier (or equal) first tokens, never before arrival
    r = report.requests.dropna()
    assert (r["ttft_pred"] <= r["ttft_rec"] + 1e-12).all() and (r["ttft_pred"] > 0).all()


def test_timing_replay_splits_the_step_time_error_by_kind_of_step(tmp_path):
    """A model right on decode-only steps and 3 ms slow on every step with prefill: the split says
    so, where the total mixes the two."""
    truth = LinearCostModel({"const": 2e-3, "prefill_tokens": 1e-5, "decode_seqs": 1e-4, "prefill_step": 1e-3})
    path = tmp_path / "log.jsonl"
    with LogWriter(path) as w:
        simulate(mixed_workload(40, seed=3), small_config(), truth, sink=w)
    slow = LinearCostModel({**truth.coefficients, "prefill_step": 4e-3})
    s = timing_replay(path, slow).summary
    decode, prefill = s["by_kind"]["decode"], s["by_kind"]["prefill"]
    assert decode["steps"] > 0 and prefill["steps"] > 0 and decode["steps"] + prefill["steps"] == s["steps"]
    assert decode["error_pct"] == pytest.approx(0, abs=1e-9) and decode["mape"] == pytest.approx(0, abs=1e-9)
    assert prefill["predicted_s"] - prefill["recorded_s"] == pytest.approx(3e-3 * prefill["steps"])
    assert decode["recorded_s"] + prefill["recorded_s"] == pytest.approx(s["step_time_recorded_s"])
    assert "decode-only steps" in render_timing_replay(timing_replay(path, slow)) and "+0.0%" in render_by_kind(
        s["by_kind"])


def test_logged_policy_rebuilds_the_plans_the_executor_saw(live_log):
    path, events, tables, _ = live_log
    from traces.log import read_log

    policy = LoggedPolicy(read_log(path))
    live_steps = [e for e in events if isinstance(e, Step)]
    n = 0
    for logged, want_tables, live in zip(policy.steps(), tables, live_steps):
        assert logged.plan.spans == live.spans
        assert logged.plan.block_tables == want_tables
        for s in logged.plan.spans:  # request state as the live scheduler left it for the executor
            req = policy.requests[s.request_id]
            assert req.num_computed_tokens == s.start
            assert s.start + s.num_tokens <= req.num_tokens
        n += 1
    assert n == len(live_steps) == len(tables)
    assert not policy.requests  # every request finished


def test_execute_replay_with_the_recording_executor_matches(live_log):
    path, _, _, executor = live_log
    report = execute_replay(path, lambda header: VaryingDurationExecutor(seed=executor.seed))
    assert report.ok and report.steps > 0 and report.compared_tokens > 0
    assert all(math.isclose(a, b) for a, b in report.durations)
    assert "tokens match the log" in render_execute_report(report)


def test_execute_replay_reports_the_first_divergent_step(live_log):
    path, events, _, executor = live_log

    class Flipper(SeededTokenExecutor):
        """Right tokens except for request 7's 3rd output token."""

        def execute(self, plan, requests):
            out = []
            for s in plan.spans:
                if not s.sample:
                    continue
                req = requests[s.request_id]
                tok = self.token(s.request_id, s.start + s.num_tokens)
                if s.request_id == 7 and req.num_output_tokens == 2:
                    tok += 1
                out.append([tok])
            return StepResult(out, 0.01)

    report = execute_replay(path, Flipper(seed=executor.seed))
    assert not report.ok and report.mismatched_steps == 1
    d = report.first
    assert d.request_id == 7 and d.got == [d.expected[0] + 1]
    first_sample_steps = [e.step for e in events if isinstance(e, Step)
                          for s in e.spans if s.request_id == 7 and s.sample]
    assert d.step == first_sample_steps[2]
    text = render_execute_report(report)
    assert f"FIRST DIVERGENCE at step {d.step}, request 7" in text and "block table" in text

    everything = execute_replay(path, SeededTokenExecutor(seed=executor.seed + 1), stop_at_first=False)
    sampling_steps = sum(1 for e in events if isinstance(e, Step) and e.tokens)
    assert everything.mismatched_steps == sampling_steps < everything.steps


@pytest.fixture(scope="module")
def salted_log(tmp_path_factory):
    """A live log of id prompts sharing a 64-token prefix, their cache salts taking turns."""
    from tests.test_log_trace_prompts import id_workload, record

    cfg = small_config(num_blocks=64, budget=128)
    executor = VaryingDurationExecutor(seed=3)
    tables: list = []
    wl = id_workload(45, seed=8, salts=(None, "tenant-a", "tenant-b"))
    events, core = record(wl, cfg, executor, tables=tables)
    path = tmp_path_factory.mktemp("salted") / "live.jsonl"
    with LogWriter(path) as w:
        for ev in events:
            w(ev)
    unsalted, _ = record(id_workload(45, seed=8), cfg, executor)
    return path, events, core, tables, executor, unsalted


def _hits(events):
    return [b for e in events if isinstance(e, Step) for b in e.block_events if isinstance(b, PrefixHit)]


def test_a_prefix_hit_never_crosses_cache_salts(salted_log):
    _, events, _, _, _, unsalted = salted_log
    salt = {e.request_id: e.cache_salt for e in events if isinstance(e, Arrived)}
    assert set(salt.values()) == {None, "tenant-a", "tenant-b"}
    state, owner = FoldedState(events[0].num_blocks), {}
    for ev in events:
        for b in getattr(ev, "block_events", ()):
            state.apply_block_event(b)
            if isinstance(b, BlockCached):  # cached by the one request computing it
                for i in block_ids(b.runs):
                    owner[state.tables[b.request_id][i]] = b.request_id
            elif isinstance(b, PrefixHit):
                assert all(salt[b.request_id] == salt[owner[block]] for block in block_ids(b.runs))
    assert 0 < len(_hits(events)) < len(_hits(unsalted))  # sharing within a salt, less of it overall


def test_fold_and_logged_policy_follow_a_salted_log(salted_log):
    from traces.log import fold, read_log

    path, events, core, tables, executor, _ = salted_log
    assert list(read_log(path)) == events
    assert fold(read_log(path)).block_state() == core.block_manager.snapshot()
    policy = LoggedPolicy(read_log(path))
    assert [s.plan.block_tables for s in policy.steps()] == tables
    assert execute_replay(path, lambda header: VaryingDurationExecutor(seed=executor.seed)).ok


def test_a_salted_log_is_a_workload_that_keeps_its_salts(salted_log, tmp_path):
    path, events, _, _, _, _ = salted_log
    wl = read_log_workload(path)
    assert [r.cache_salt for r in wl] == [e.cache_salt for e in events if isinstance(e, Arrived)]
    wl.save(tmp_path / "w.jsonl")
    assert [r.cache_salt for r in read_log_workload(tmp_path / "w.jsonl")] == [r.cache_salt for r in wl]


def test_resimulating_a_salted_log_reproduces_it(salted_log):
    path, events, _, _, executor, _ = salted_log
    sim: list = []
    resimulate(path, RecordedCostModel.from_log(path), sink=sim.append, token_fn=executor.token)
    assert sim[1:] == events[1:]
