"""Closed-loop conversations: a turn is sent only after the previous answer (and a think time),
its prompt extends the last one's (a prefix cache serves the repeat), sessions survive a save,
and a trace's chained block ids become conversations."""

from __future__ import annotations

import json

import msgspec
import pytest

from runtime.cli import main
from simulator.cost.host_timing import HostTiming
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.loading import load_cost_model
from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
from simulator.sim import simulate
from tests.sim_helpers import small_config
from traces.events import Admitted, Arrived, Finished, Rejected
from traces.formats import load_workload
from traces.prompt import PromptSynthetic
from traces.sessions import chain_sessions, generate_sessions
from traces.workload import RequestSpec, Workload, trace_params


def _model(overlap: bool = True) -> LinearCostModel:
    m = LinearCostModel({"const": 0.004, "prefill_tokens": 2e-5, "decode_context": 2e-8, "seqs": 3e-4})
    if overlap:
        m = m.with_host(HostTiming(overlap=True, intake_delay=0.002))
    return m


CONFIG = small_config(num_blocks=1024, budget=512)


def _turns(events, workload):
    """When each request (by id) was sent and answered."""
    arrived = {e.request_id: e.time for e in events if isinstance(e, Arrived)}
    finished = {e.request_id: e.time for e in events if isinstance(e, Finished)}
    return arrived, finished


@pytest.mark.parametrize("overlap", [False, True])
def test_a_turn_is_sent_only_after_the_last_answer_and_its_think_time(overlap):
    wl = generate_sessions(30, rate=4.0, think_time=0.5, first_len="uniform:32:128", message_len="uniform:8:64",
                           output_len="uniform:4:32", seed=2)
    events: list = []
    result = simulate(wl, CONFIG, _model(overlap), sink=events.append)
    assert result.num_requests == len(wl) and not result.rejected
    arrived, finished = _turns(events, wl)
    # request ids follow hand-in order; map them back through the prompts (unique per turn)
    by_prompt = {e.prompt.unique_seed: e.request_id for e in events if isinstance(e, Arrived)}
    rid = [by_prompt[r.prompt.unique_seed] for r in wl.requests]
    last: dict[int, int] = {}
    waited = 0
    for i, spec in enumerate(wl.requests):
        if spec.session in last:
            prev = rid[last[spec.session]]
            assert arrived[rid[i]] >= finished[prev] + spec.think_time - 1e-12
            waited += 1
        last[spec.session] = i
    assert waited == len(wl) - 30
    cached = sum(e.num_cached_tokens for e in events if isinstance(e, Admitted))
    assert cached > 0  # later turns hit the earlier turns' prompt blocks


def test_sessions_survive_a_save(tmp_path):
    wl = generate_sessions(5, rate=1.0, think_time=2.0, seed=4)
    wl.save(tmp_path / "w.jsonl")
    back = load_workload(tmp_path / "w.jsonl")
    assert [(r.session, r.think_time) for r in back] == [(r.session, r.think_time) for r in wl]
    assert back.closed_loop


def test_chained_block_ids_are_conversations():
    def req(t, ids):
        return RequestSpec(arrival=t, prompt=PromptSynthetic(num_tokens=512 * len(ids) + 10, segment_ids=list(ids)),
                           params=trace_params(8))

    wl = Workload([req(0, [1]), req(1, [7]), req(2, [1, 2]), req(3, [1, 2, 3]), req(4, [1, 2]), req(5, [7, 8])])
    chained = chain_sessions(wl, think_time=0.25)
    sessions = [r.session for r in chained]
    assert sessions == [0, 1, 0, 0, 2, 1]  # [1, 2] again: [1, 2] was continued already, a conversation of its own
    assert chained.meta["sessions"] == 3 and all(r.think_time == 0.25 for r in chained)


def test_a_refused_turn_lets_its_session_go_on():
    wl = generate_sessions(4, rate=2.0, think_time=0.1, first_len="fixed:600", message_len="fixed:500",
                           output_len="fixed:8", turns="fixed:3", seed=1)
    events: list = []
    result = simulate(wl, CONFIG, _model(), sink=events.append)  # max_model_len 1024: the third turns are refused
    refused = [e for e in events if isinstance(e, Rejected)]
    assert refused and result.num_requests + len(result.rejected) == len(wl)


@pytest.mark.parametrize("router", ["round-robin", "least-loaded"])
def test_a_fleet_serves_every_turn(router):
    wl = generate_sessions(40, rate=20.0, think_time=0.2, first_len="uniform:32:256", output_len="uniform:4:64",
                           seed=3)
    sinks = [[], []]
    results = simulate_fleet(wl, [ReplicaSpec(CONFIG, _model(), s.append) for s in sinks], router)
    assert sum(r.num_requests + len(r.rejected) for r in results) == len(wl)  # long turns past max_model_len: refused
    assert all(any(isinstance(e, Finished) for e in s) for s in sinks)


def test_workload_sessions_and_chain_sessions_commands(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    assert main(["workload", "sessions", "-n", "6", "--rate", "2", "--think-time", "1", "--out", str(out)]) == 0
    assert "6 conversations, closed loop" in capsys.readouterr().out
    assert load_workload(out).closed_loop
    log = tmp_path / "sim.jsonl"
    assert main(["simulate", str(out), "--cost-model", "qwen3-0.6b-h200", "--out", str(log), "--no-progress"]) == 0
    assert main(["workload", "info", "data/traces/synthetic_trace.jsonl", "--limit", "50", "--chain-sessions"]) == 0
    assert "conversations among 50 requests" in capsys.readouterr().err


def test_open_loop_workloads_are_not_closed():
    wl = Workload([RequestSpec(arrival=0.0, prompt=PromptSynthetic(num_tokens=8), params=trace_params(2))])
    assert not wl.closed_loop
    assert msgspec.structs.replace(wl.requests[0], session=0).session == 0


def test_fidelity_closed_loop_simulates_the_workload_a_run_replayed(tmp_path, capsys):
    """A closed-loop run judged against its own workload: a run simulated from it is matched exactly;
    with every step twice as long, the closed loop's turns are released later than the log's
    arrivals, so its makespan moves further than an open-loop re-simulation's."""
    wl, log = tmp_path / "s.jsonl", tmp_path / "live.jsonl"
    assert main(["workload", "sessions", "-n", "12", "--rate", "4", "--think-time", "0.5", "--seed", "3",
                 "--out", str(wl)]) == 0
    assert main(["simulate", str(wl), "--cost-model", "qwen3-0.6b-h200", "--out", str(log), "--no-progress"]) == 0
    same = tmp_path / "same.json"
    assert main(["fidelity", str(log), "--cost-model", "qwen3-0.6b-h200", "--closed-loop", str(wl), "--no-replay",
                 "--json", str(same), "--plot", str(tmp_path / "a.png")]) == 0
    report = json.loads(same.read_text())
    assert report["makespan"]["error_pct"] == pytest.approx(0, abs=1e-6)
    assert all(report["metrics"][m]["p50"]["error_pct"] == pytest.approx(0, abs=1e-6) for m in ("ttft", "e2e"))
    load_cost_model("qwen3-0.6b-h200").scaled(2.0).save(tmp_path / "slow.json")
    errors = {}
    for closed in (True, False):
        out = tmp_path / f"slow_{closed}.json"
        assert main(["fidelity", str(log), "--cost-model", str(tmp_path / "slow.json"), "--no-replay", "--json",
                     str(out), "--plot", str(tmp_path / "b.png"), *(["--closed-loop", str(wl)] if closed else [])]) == 0
        errors[closed] = json.loads(out.read_text())["makespan"]["error_pct"]
    assert errors[True] > errors[False] > 0


def test_fidelity_closed_loop_needs_a_closed_loop_workload(tmp_path, capsys):
    log, synthetic = tmp_path / "live.jsonl", tmp_path / "open.jsonl"
    assert main(["workload", "generate", "-n", "5", "--rate", "2", "--out", str(synthetic)]) == 0
    assert main(["simulate", str(synthetic), "--cost-model", "qwen3-0.6b-h200", "--out", str(log),
                 "--no-progress"]) == 0
    with pytest.raises(SystemExit):
        main(["fidelity", str(log), "--cost-model", "qwen3-0.6b-h200", "--closed-loop", str(synthetic)])
    assert "--closed-loop: " in capsys.readouterr().err
