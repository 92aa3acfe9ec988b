"""Data-parallel serving: replicas behind one front door, routed by the simulator's routers. Checked
with the official openai client against fake engines: every request is routed once and logged by
its replica, the fleet log reads as one run, /metrics sums the replicas, and the live routing of a
round-robin fleet is the simulated fleet's on the same workload."""

from __future__ import annotations

import time

import openai
import pytest

from analysis.frames import load_frames
from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.data_parallel import DataParallelEngine, combined_state
from runtime.serving.engine_protocol import EngineState
from runtime.serving.llm_engine import EngineStats
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from tests.test_server_fakes import fake_llm_engine
from traces.events import Routed, make_header
from traces.fleet_log import FleetLog, fleet_extra, replica_log_path
from traces.log import LogWriter, read_log


def _fleet(tokenizer, tmp_path, router: str, n: int = 2):
    trace = tmp_path / "fleet.jsonl"
    logs = [replica_log_path(trace, i) for i in range(n)]
    engines = []
    for log in logs:
        llm = fake_llm_engine(tokenizer, log=str(log))
        llm.writer(make_header(llm.core.config, clock="wall"))
        engines.append(AsyncLLMEngine(llm))
    route_log = LogWriter(trace)
    route_log(make_header(engines[0].config, clock="wall", extra=fleet_extra(router, logs, trace)))
    return DataParallelEngine(engines, router, route_log=route_log), route_log, trace


def _serve_and_send(engine, tokenizer, prompts, stream=False):
    engine.start()
    app = create_app(engine, tokenizer, "m")
    with ServerThread(app) as http:
        client = openai.OpenAI(base_url=http.url + "/v1", api_key="unused", max_retries=0)
        for prompt in prompts:  # one at a time: the order at the front door is the order sent
            out = client.completions.create(model="m", prompt=prompt, max_tokens=4, temperature=0, stream=stream)
            if stream:
                list(out)
        deadline = time.monotonic() + 30
        while not engine.settled:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        metrics = client.with_options(base_url=http.url).get("/metrics", cast_to=str)
    return metrics


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "prefix-affinity"])
def test_every_request_is_routed_once_and_logged_by_its_replica(smollm2_tokenizer, tmp_path, router):
    engine, route_log, trace = _fleet(smollm2_tokenizer, tmp_path, router)
    prompts = [f"Tell me about the number {i}." for i in range(8)]
    try:
        metrics = _serve_and_send(engine, smollm2_tokenizer, prompts, stream=router == "least-loaded")
    finally:
        engine.shutdown()
        for r in engine.replicas:
            r.engine.close()
        route_log.close()
    fleet = FleetLog.read(trace)
    routes = sorted(fleet.routes, key=lambda r: r.index)
    assert [r.index for r in routes] == list(range(8)) and all(r.request_id is not None for r in routes)
    if router == "round-robin":
        assert [r.replica for r in routes] == [i % 2 for i in range(8)]
    frames = load_frames(trace)
    assert sorted(frames.requests["request_id"]) == list(range(8))
    assert (frames.requests["status"] == "finished").all()
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 8.0' in metrics
    for i, log in enumerate(fleet.replica_logs):  # each replica logged exactly the requests routed to it
        ids = sorted(e.request_id for e in read_log(log) if type(e).__name__ == "Arrived")
        assert ids == sorted(r.request_id for r in routes if r.replica == i)


def test_the_live_round_robin_split_is_the_simulated_one(smollm2_tokenizer, tmp_path):
    """The fleet's requests re-simulated on two replicas, round-robin: each replica gets the requests it got live."""
    from simulator.cost.loading import load_cost_model
    from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
    from traces.formats import load_workload
    from traces.workload import Workload

    engine, route_log, trace = _fleet(smollm2_tokenizer, tmp_path, "round-robin")
    try:
        _serve_and_send(engine, smollm2_tokenizer, [f"Question {i}: why?" for i in range(6)])
    finally:
        engine.shutdown()
        for r in engine.replicas:
            r.engine.close()
        route_log.close()
    fleet = FleetLog.read(trace)
    live = {(r.replica, r.index) for r in fleet.routes}
    workload = Workload([r for log in fleet.replica_logs for r in load_workload(log)])  # sorted by arrival
    routed: list[Routed] = []
    config = engine.config
    simulate_fleet(workload, [ReplicaSpec(config, load_cost_model("qwen3-0.6b-h200"))] * 2, "round-robin",
                   route_sink=routed.append)
    assert {(r.replica, r.index) for r in routed} == live


def test_metrics_sum_the_replicas():
    a = EngineState(EngineStats(requests_finished={"stop": 2}, prompt_tokens=10, steps=3), num_running=1,
                    kv_blocks_total=100, kv_blocks_used=5, busy=False)
    b = EngineState(EngineStats(requests_finished={"stop": 1, "length": 4}, prompt_tokens=7, steps=2),
                    num_running=2, kv_blocks_total=100, kv_blocks_used=7, busy=True)
    c = combined_state([a, b])
    assert c.stats.requests_finished == {"stop": 3, "length": 4} and c.stats.prompt_tokens == 17
    assert (c.num_running, c.kv_blocks_total, c.kv_blocks_used, c.busy) == (3, 200, 12, True)


def test_serve_refuses_data_parallel_without_engine_processes(capsys):
    from runtime.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--data-parallel-size", "2", "--no-engine-process", "--port", "0"])
    assert exc.value.code == 2 and "--data-parallel-size" in capsys.readouterr().err
