"""In a data-parallel fleet (two fake engines behind one front door, round-robin), a response's
id names the replica too: ``cmpl-<run>-<replica>-<request id>`` is the request whose ``Arrived``
event that replica's log holds under that id, the log whose Header names that run, and the fleet
log routed it there; bench serve's pairing finds each by it."""

from __future__ import annotations

import time

import openai

from runtime.bench.serve_join import engine_names, join_names
from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.data_parallel import DataParallelEngine
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from tests.test_server_fakes import fake_llm_engine
from traces.events import Arrived, Header, make_header
from traces.fleet_log import FleetLog, fleet_extra, replica_log_path
from traces.log import LogWriter, read_log
from traces.request_names import header_run_id, parse_request_name


def test_a_fleets_response_ids_name_the_replica_and_its_logged_request(smollm2_tokenizer, tmp_path):
    trace = tmp_path / "fleet.jsonl"
    logs = [replica_log_path(trace, i) for i in range(2)]
    replicas = [AsyncLLMEngine(fake_llm_engine(smollm2_tokenizer, log=str(log))) for log in logs]
    route_log = LogWriter(trace)
    route_log(make_header(replicas[0].config, clock="wall", extra=fleet_extra("round-robin", logs, trace)))
    engine = DataParallelEngine(replicas, "round-robin", route_log=route_log)
    prompts = [[30 + i, 4, 5, 6] for i in range(4)]
    ids = []
    engine.start()
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http:
            client = openai.OpenAI(base_url=http.url + "/v1", api_key="unused", max_retries=0)
            for i, prompt in enumerate(prompts):  # one at a time: front-door index i
                stream = i % 2 == 1
                out = client.completions.create(model="m", prompt=prompt, max_tokens=3, stream=stream)
                chunk_ids = {c.id for c in out} if stream else {out.id}
                assert len(chunk_ids) == 1
                ids.extend(chunk_ids)
            deadline = time.monotonic() + 30
            while not engine.settled:
                assert time.monotonic() < deadline
                time.sleep(0.01)
    finally:
        engine.shutdown()
        for r in replicas:
            r.engine.close()
        route_log.close()
    names = [parse_request_name(i) for i in ids]
    assert [(n.replica, n.request_id) for n in names] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    routes = {r.index: (r.replica, r.request_id) for r in FleetLog.read(trace).routes}
    for index, (prompt, name) in enumerate(zip(prompts, names)):
        events = list(read_log(logs[name.replica]))
        header = next(e for e in events if isinstance(e, Header))
        arrived = {e.request_id: e for e in events if isinstance(e, Arrived)}
        assert header_run_id(header) == name.run_id and arrived[name.request_id].prompt.token_ids == prompt
        assert routes[index] == (name.replica, name.request_id)
        assert ids[index] == f"cmpl-{name.run_id}-{name.replica}-{name.request_id}"
    # bench serve pairs each response with its request by the id: the front door's index i is the i-th sent
    assert join_names(list(enumerate(ids)), engine_names(trace)) == {i: i for i in range(4)}
