"""Runs of decode steps landed at once (StepLoop.land_run, simulator/fleet/decode_run.py,
LogWriter.decode_steps): the same events, log bytes and result as stepping through them one by
one, for any workload and config, in both of the simulator's loops."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator.fleet.replica as replica_module
from simulator.cost.host_timing import HostTiming
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.loading import load_cost_model
from simulator.cost.ranges import track_ranges
from simulator.sim import simulate
from tests.sim_helpers import mixed_workload, small_config
from traces.decode_splits import DecodeSplits
from traces.events import Preempted, Step
from traces.generators import generate
from traces.log import LogWriter
from traces.step_codec import StepCodec


def _linear(overlap: bool) -> LinearCostModel:
    m = LinearCostModel({"const": 0.002, "prefill_tokens": 1e-5, "decode_context": 2e-8, "seqs": 3e-4,
                         "longest_program": 7e-7})
    m = m.with_decode_splits(DecodeSplits(8, 132))
    if overlap:  # steps planned ahead (the other loop)
        m = m.with_host(HostTiming(overlap=True, intake_delay=0.001))
    return m


MODELS = {"linear, one after another": lambda: _linear(False), "linear, planned ahead": lambda: _linear(True),
          "shipped trees, planned ahead": lambda: load_cost_model("qwen3-0.6b-h200")}


def _run(workload, config, model, plain_runs: bool, path):
    events: list = []
    result = simulate(workload, config, model, sink=events.append, plain_runs=plain_runs)
    with LogWriter(path) as writer:
        simulate(workload, config, model, sink=writer, plain_runs=plain_runs)
    return events, result, path.read_bytes()


def _same(workload, config, model, tmp_path) -> int:
    fast = _run(workload, config, model, True, tmp_path / "fast.jsonl")
    slow = _run(workload, config, model, False, tmp_path / "slow.jsonl")
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    return sum(isinstance(e, Step) for e in fast[0])


def test_a_decode_heavy_workload_gives_the_same_log_in_both_loops(tmp_path, monkeypatch):
    """Most of its steps are landed in runs (the fast path is taken), and the log is the same."""
    landed: list[int] = []
    land = replica_module.land_decode_run

    def counting(core, plan, ends, start, token):
        landed.append(len(ends))
        return land(core, plan, ends, start, token)

    monkeypatch.setattr(replica_module, "land_decode_run", counting)
    wl = generate(40, rate=5.0, input_len="uniform:8:120", output_len="uniform:50:300", seed=3)
    for name, make in MODELS.items():
        landed.clear()
        steps = _same(wl, small_config(block_size=16, num_blocks=512), make(), tmp_path)
        assert sum(landed) > 0.4 * 2 * steps, name  # (two fast runs: the list and the writer)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), rate=st.floats(2.0, 200.0),
       block_size=st.sampled_from([1, 2, 4, 16]), num_blocks=st.integers(16, 400), chunked=st.booleans(),
       prefix=st.booleans(), max_num_seqs=st.integers(1, 12), model=st.sampled_from(sorted(MODELS)),
       long_outputs=st.booleans())
def test_any_workload_and_config_give_the_same_log(tmp_path, seed, n, rate, block_size, num_blocks, chunked, prefix,
                                                   max_num_seqs, model, long_outputs):
    """Small KV pools (preemption), shared prefixes (prefix caching), bursts, one-block pages; long
    outputs (long runs of decodes, cut by arrivals, finishes and a full KV pool)."""
    if long_outputs:
        wl = generate(n, rate=rate / 10, cv=2.0, input_len="uniform:1:200", output_len="uniform:1:150",
                      shared_prefix=32, seed=seed)
    else:
        wl = mixed_workload(n, seed=seed, rate=rate)
    config = small_config(chunked=chunked, num_blocks=num_blocks, budget=256, block_size=block_size, prefix=prefix,
                          max_num_seqs=max_num_seqs)
    try:
        _same(wl, config, MODELS[model](), tmp_path)
    except Exception as e:  # a config that cannot hold a request fails alike both ways
        assert "stalled" in str(e) or "unfinished" in str(e), e


def test_the_writer_refuses_a_run_it_does_not_hold():
    writer = LogWriter.__new__(LogWriter)  # (no file: the refusal touches nothing)
    writer._run = None
    writer._codec = StepCodec()  # (nothing written yet: the last step did not leave out its spans)
    assert writer.decode_steps([1.0, 2.0], {}, [], [], 0) is False


def test_a_kv_pool_too_small_for_the_decodes_preempts_the_same_way(tmp_path):
    """Runs stop before a plan would need more blocks than the pool has: the preemptions that follow
    are those of one-by-one steps."""
    preempted = 0
    for seed in range(8):
        wl = generate(20, rate=2.0, cv=2.0, input_len="uniform:1:60", output_len="uniform:50:300", seed=seed)
        config = small_config(num_blocks=24 + seed, block_size=(1, 2, 4, 16)[seed % 4], prefix=False,
                              max_num_seqs=(1, 8)[seed % 2])  # (one: a request that preempts itself)
        _same(wl, config, _linear(True), tmp_path)
        events: list = []
        simulate(wl, config, _linear(True), sink=events.append)
        preempted += sum(isinstance(e, Preempted) for e in events)
    assert preempted > 20


def test_a_range_tracker_counts_the_steps_of_runs_too(tmp_path):
    """`simulate` and `fidelity` wrap the model in a RangeTracker: its report is the same either way."""
    wl = generate(30, rate=5.0, input_len="uniform:8:120", output_len="uniform:50:300", seed=5)
    config = small_config(block_size=16, num_blocks=512)
    reports = []
    for plain_runs in (True, False):
        tracker = track_ranges(load_cost_model("qwen3-0.6b-h200"))
        tracker.ranges.hi["decode_context"] = 300.0  # (so that some steps lie outside)
        events: list = []
        simulate(wl, config, tracker, sink=events.append, plain_runs=plain_runs)
        reports.append((tracker.report.to_dict(), events))
    assert reports[0] == reports[1] and reports[0][0]["outside_steps"] > 0
