"""A live log recorded with ``trace_prompts`` hashes or none (no user's token ids) still folds,
timing-replays, re-simulates and analyzes; execute-replay, which needs the ids, refuses it by name.

With ``hashes`` a re-simulation makes the live engine's decisions again: equal block-hash ids give
equal synthetic tokens, so every prefix hit of a full block is reproduced.
"""

from __future__ import annotations

import msgspec
import pytest

from analysis.frames import load_frames
from runtime.engine.core import EngineCore
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.recorded_model import RecordedCostModel
from simulator.replay.execute import execute_replay
from simulator.replay.policy import LoggedPolicy
from simulator.replay.replay import resimulate, timing_replay
from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, small_config
from traces.events import (
    TRACE_PROMPTS_KEY,
    Arrived,
    Header,
    PrefixHit,
    Step,
    make_header,
    recorded_prompts,
)
from traces.log import LogError, LogWriter, fold, read_log
from traces.prompt import PromptIds, PromptSynthetic, materialize
from traces.workload import Workload


def id_workload(n: int = 40, seed: int = 4, salts: tuple = (None,)) -> Workload:
    """The mixed workload with every prompt as token ids (what a live server sees), salts in turn."""
    wl = mixed_workload(n, seed=seed)
    return Workload([msgspec.structs.replace(r, prompt=PromptIds(materialize(r.prompt).tolist()),
                                             cache_salt=salts[i % len(salts)]) for i, r in enumerate(wl)],
                    seed=seed, source="ids")


def record(workload: Workload, config, executor, *, trace_prompts: str = "ids", tables: list | None = None):
    """Like ``tests.sim_helpers.record_live`` (arrivals up to a step's end join before its commit),
    with ``trace_prompts`` and cache salts; returns (events with a Header first, the core)."""
    extra = {} if trace_prompts == "ids" else {TRACE_PROMPTS_KEY: trace_prompts}
    events: list = [make_header(config, clock="wall", extra=extra)]
    core = EngineCore(config, sink=events.append, trace_prompts=trace_prompts)
    specs, i, now = workload.requests, 0, 0.0

    def arrive_until(t: float) -> None:
        nonlocal i
        while i < len(specs) and specs[i].arrival <= t:
            s = specs[i]
            core.add_request(s.prompt, s.params, now=s.arrival, priority=s.priority, cache_salt=s.cache_salt)
            i += 1

    while True:
        arrive_until(now)
        plan = core.schedule(now)
        if plan.empty:
            if i == len(specs):
                return events, core
            now = specs[i].arrival
            continue
        if tables is not None:
            tables.append([list(t) for t in plan.block_tables])
        result = executor.execute(plan, core.requests)
        arrive_until(now + result.duration)
        core.commit(plan, result, now)
        now += result.duration


def decisions(events: list) -> list:
    """Everything but the prompt records (the log holds no hash values: they follow from the tokens)."""
    out = []
    for ev in events:
        if isinstance(ev, Step):
            out.append((ev.step, ev.start, ev.end, ev.spans, ev.tokens, ev.block_events))
        elif not isinstance(ev, Header | Arrived):
            out.append(ev)
    return out


@pytest.fixture(scope="module", params=["ids", "hashes", "none"])
def live(request, tmp_path_factory):
    mode = request.param
    executor = VaryingDurationExecutor(seed=9)
    events, core = record(id_workload(), small_config(num_blocks=48, budget=128), executor, trace_prompts=mode)
    path = tmp_path_factory.mktemp(mode) / f"live-{mode}.jsonl.gz"
    with LogWriter(path) as w:
        for ev in events:
            w(ev)
    return mode, path, events, core, executor


def test_the_log_holds_no_token_ids_and_folds_to_the_live_state(live):
    mode, path, events, core, _ = live
    back = list(read_log(path))
    assert back == events and recorded_prompts(back[0]) == mode
    prompts = [e.prompt for e in back if isinstance(e, Arrived)]
    assert all(isinstance(p, PromptIds if mode == "ids" else PromptSynthetic) for p in prompts)
    assert any(isinstance(b, PrefixHit) for e in back if isinstance(e, Step) for b in e.block_events)
    state = fold(back)
    assert state.block_state() == core.block_manager.snapshot() and state.computed == {}


def test_timing_replay_and_analysis_work_on_it(live):
    _, path, events, _, _ = live
    report = timing_replay(path, RecordedCostModel.from_log(path))
    assert report.summary["steps"] == sum(isinstance(e, Step) for e in events)
    assert report.summary["step_mape"] == 0.0 and report.summary["ttft"]["max_abs_s"] <= 1e-12
    frames = load_frames(path)
    want = [len(materialize(r.prompt)) for r in id_workload()]
    assert sorted(frames.requests["num_prompt_tokens"]) == sorted(want)


def test_resimulation_runs_and_with_hashes_makes_the_live_decisions(live):
    mode, path, events, _, executor = live
    sim: list = []
    # lengths alone can't say which prompts share a prefix: other decisions, other steps than recorded
    cost = LinearCostModel({"const": 1e-3}) if mode == "none" else RecordedCostModel.from_log(path)
    result = resimulate(path, cost, sink=sim.append, token_fn=executor.token)
    assert result.num_requests == sum(isinstance(e, Arrived) for e in events)
    if mode != "none":
        assert decisions(sim) == decisions(events)
    assert recorded_prompts(sim[0]) == "ids"  # the simulator ran on the tokens it logs: replayable
    LoggedPolicy(iter(sim))


def test_execute_replay_refuses_a_log_without_token_ids_by_name(live):
    mode, path, _, _, executor = live
    if mode == "ids":
        assert execute_replay(path, lambda header: VaryingDurationExecutor(seed=executor.seed)).ok
        return
    built = []
    with pytest.raises(LogError, match=rf"{path}: .*--trace-prompts {mode}.*record with --trace-prompts ids"):
        execute_replay(path, lambda header: built.append(header))
    assert not built  # refused before the executor (a model load) is built
