"""The simulator: determinism, equivalence with a live-driven engine, stops, rejections."""

from __future__ import annotations

import msgspec
import pytest

from simulator.cost.cost_model import CostModelError
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.recorded_model import RecordedCostModel
from simulator.replay.replay import resimulate
from simulator.sim import SYNTHETIC_TOKEN, simulate
from tests.helpers import SeededTokenExecutor
from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, record_live, small_config
from traces.events import (
    Admitted,
    Arrived,
    Finished,
    Header,
    Preempted,
    Step,
)
from traces.log import LogWriter, fold, read_log
from traces.params import SamplingParams
from traces.prompt import PromptIds
from traces.workload import RequestSpec, Workload

COST = LinearCostModel({"const": 0.003, "prefill_tokens": 2e-5, "prefill_attention": 1e-9,
                        "decode_seqs": 1e-4, "decode_context": 1e-7, "seqs": 5e-5})

CONFIGS = {
    "chunked": dict(chunked=True),
    "unchunked": dict(chunked=False, budget=1024),
    "tight-kv": dict(num_blocks=40, budget=128),  # forces preemptions
    "no-prefix": dict(prefix=False, block_size=8),
    "priority": dict(policy="priority", num_blocks=48),
}


def _sim_log(tmp_path, name, workload, config, cost=COST, **kw):
    path = tmp_path / name
    with LogWriter(path) as w:
        simulate(workload, config, cost, sink=w, **kw)
    return path


def test_same_inputs_give_byte_identical_logs(tmp_path):
    wl, cfg = mixed_workload(80, seed=3), small_config(num_blocks=48, budget=128)
    a = _sim_log(tmp_path, "a.jsonl", wl, cfg)
    b = _sim_log(tmp_path, "b.jsonl", mixed_workload(80, seed=3), small_config(num_blocks=48, budget=128))
    assert a.read_bytes() == b.read_bytes()
    assert read_log(a).__next__().clock == "sim"
    c = _sim_log(tmp_path, "c.jsonl", mixed_workload(80, seed=4), cfg)
    assert a.read_bytes() != c.read_bytes()


def _decisions(events):
    """Everything the scheduler and block manager decided, with times; tokens left out (they
    depend on the token source)."""
    out = []
    for ev in events:
        if isinstance(ev, Step):
            blocks = [(type(b).__name__, msgspec.to_builtins(b)) for b in ev.block_events]
            out.append(("step", ev.step, ev.start, ev.end, [tuple(msgspec.to_builtins(s)) for s in ev.spans],
                        [len(t) for t in ev.tokens], blocks))
        elif isinstance(ev, Admitted | Preempted | Finished | Arrived):
            d = msgspec.to_builtins(ev)
            out.append(d)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_resimulating_a_live_log_reproduces_it(tmp_path, name):
    """Live run (EngineCore + seeded executor) → its workload re-simulated with the recorded
    durations and the same token function → the same log, event for event."""
    cfg = small_config(**CONFIGS[name])
    wl = mixed_workload(70, seed=11)
    executor = VaryingDurationExecutor(seed=5)
    live = record_live(wl, cfg, executor)
    path = tmp_path / "live.jsonl"
    with LogWriter(path) as w:
        for ev in live:
            w(ev)
    assert sum(isinstance(e, Preempted) for e in live) > 0 or name != "tight-kv"

    sim_events: list = []
    result = resimulate(path, RecordedCostModel.from_log(path), sink=sim_events.append, token_fn=executor.token)
    assert result.num_steps == sum(isinstance(e, Step) for e in live)
    assert isinstance(sim_events[0], Header) and sim_events[0].clock == "sim"
    assert sim_events[1:] == live[1:]

    # with the simulator's own synthetic tokens the decisions are still the live ones
    synth: list = []
    resimulate(path, RecordedCostModel.from_log(path), sink=synth.append)
    assert _decisions(synth[1:]) == _decisions(live[1:])
    assert all(t == [SYNTHETIC_TOKEN] for ev in synth if isinstance(ev, Step) for t in ev.tokens)


@pytest.mark.parametrize("name", ["chunked", "tight-kv"])
def test_resimulating_an_async_engine_log_reproduces_its_decisions_and_times(tmp_path, name):
    """A log with engine overhead between steps and requests stamped when taken in (as the async
    engine writes them): the recorded durations and gaps put every arrival in the same step."""
    from tests.sim_helpers import record_async_style

    cfg = small_config(**CONFIGS[name])
    executor = VaryingDurationExecutor(seed=9)
    live = record_async_style(mixed_workload(70, seed=12, rate=80), cfg, executor)
    path = tmp_path / "live.jsonl"
    with LogWriter(path) as w:
        for ev in live:
            w(ev)
    model = RecordedCostModel.from_log(path)
    assert len(model.gaps) > 10
    sim: list = []
    resimulate(path, model, sink=sim.append, token_fn=executor.token)
    strip = lambda evs: [msgspec.structs.replace(e, start=0.0, end=0.0) if isinstance(e, Step)
                         else msgspec.structs.replace(e, time=0.0) for e in evs[1:] if not isinstance(e, Arrived)]
    assert strip(sim) == strip(live)
    times = lambda evs: [(e.start, e.end) for e in evs if isinstance(e, Step)]
    for (a, b), (c, d) in zip(times(sim), times(live)):
        assert a == pytest.approx(c, abs=1e-9) and b == pytest.approx(d, abs=1e-9)
    # ... whereas without the gaps the simulated engine runs ahead and takes requests in earlier
    ahead: list = []
    try:
        resimulate(path, RecordedCostModel(model.durations), sink=ahead.append, token_fn=executor.token)
    except CostModelError:  # ran past the recorded steps
        return
    assert strip(ahead) != strip(live)


def test_requests_finish_at_their_workload_output_length(tmp_path):
    wl = mixed_workload(40, seed=2)
    events: list = []
    simulate(wl, small_config(), COST, sink=events.append)
    want = {i: r.params.max_tokens for i, r in enumerate(wl.requests)}
    got = {e.request_id: e.num_output_tokens for e in events if isinstance(e, Finished)}
    assert got == want
    assert all(e.reason == "length" for e in events if isinstance(e, Finished))
    state = fold(events)
    assert state.tables == {} and not state.computed


def test_arrivals_are_logged_at_their_times_and_steps_never_precede_them():
    wl = mixed_workload(50, seed=8, rate=5.0)  # sparse: the engine idles between bursts
    events: list = []
    simulate(wl, small_config(), COST, sink=events.append)
    arrived = {e.request_id: e.time for e in events if isinstance(e, Arrived)}
    assert sorted(arrived.values()) == [r.arrival for r in wl.requests]
    prev_end = 0.0
    for ev in events:
        if isinstance(ev, Step):
            assert ev.start >= prev_end
            assert all(arrived[s.request_id] <= ev.start for s in ev.spans)
            prev_end = ev.end


def test_requests_the_engine_cannot_serve_are_rejected_and_counted():
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    wl = Workload([RequestSpec(arrival=0.0, prompt=PromptIds([1] * 10), params=params),
                   RequestSpec(arrival=0.1, prompt=PromptIds([2] * 2000), params=params),  # > max_model_len
                   RequestSpec(arrival=0.2, prompt=PromptIds([3] * 10), params=params)])
    events: list = []
    result = simulate(wl, small_config(), COST, sink=events.append)
    assert result.num_requests == 2 and [i for i, _ in result.rejected] == [1]
    assert "max_model_len" in result.rejected[0][1]
    assert sum(isinstance(e, Finished) for e in events) == 2


def test_progress_counts_finished_requests():
    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    wl = mixed_workload(30, seed=1)
    simulate(wl, small_config(), COST, progress=bar)
    assert bar.n == len(wl)


def test_empty_workload():
    result = simulate(Workload([]), small_config(), COST)
    assert result.num_steps == 0 and result.num_requests == 0


def test_live_driver_matches_seeded_executor_tokens():
    """Sanity of the reference driver itself: a run with a constant-duration executor finishes."""
    wl = mixed_workload(20, seed=4)
    events = record_live(wl, small_config(), SeededTokenExecutor(seed=1))
    assert sum(isinstance(e, Finished) for e in events) == len(wl)


class _AheadCost(LinearCostModel):
    """COST on an engine that plans step k+1 as step k starts (async scheduling)."""

    plans_ahead = True


def test_an_engine_planning_ahead_admits_a_request_two_steps_after_it_arrives():
    """Step k is planned when step k-1 starts: a request that arrived after that start waits for
    step k+1, and steps start where the one before ended (they tile, as an async engine's do)."""
    wl = mixed_workload(60, seed=5, rate=120)
    cfg = small_config(chunked=True)
    logs = {}
    for name, cost in (("sequential", COST), ("ahead", _AheadCost(COST.coefficients))):
        events: list = []
        simulate(wl, cfg, cost, sink=events.append)
        logs[name] = events
    events = logs["ahead"]
    steps = {e.step: e for e in events if isinstance(e, Step)}
    arrived = {e.request_id: e.time for e in events if isinstance(e, Arrived)}
    checked = 0
    for e in events:
        if isinstance(e, Admitted) and e.step - 1 in steps:
            planned_at = steps[e.step - 1].start
            assert arrived[e.request_id] <= planned_at + 1e-12, (e, planned_at)
            checked += 1
    assert checked > 20
    ordered = [steps[k] for k in sorted(steps)]
    assert all(b.start >= a.end - 1e-12 for a, b in zip(ordered, ordered[1:]))
    assert any(b.start == a.end for a, b in zip(ordered, ordered[1:]))
    admitted = lambda evs: [(e.request_id, e.step) for e in evs if isinstance(e, Admitted)]
    assert admitted(logs["ahead"]) != admitted(logs["sequential"])
    assert sum(isinstance(e, Finished) for e in events) == len(wl)
