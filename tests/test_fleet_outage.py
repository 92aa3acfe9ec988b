"""A fleet that outlives a replica (``serve --data-parallel-size N``): kill -9 one replica's engine
process under load, and its requests in flight end with an error event naming it while the other
replica's all finish; the router skips it; it is started again after its back-off with a log of its
own; /health says degraded, then ok; the fleet log records the death and the return, and every
request it names is in some replica's log. Fake engines in real processes (tests/test_server_fakes.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import httpx
import pytest

from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.data_parallel import DataParallelEngine
from runtime.serving.engine_main import EngineSpec
from runtime.serving.engine_process import EngineProcess
from runtime.serving.replica_restarts import RestartPolicy
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from tests.test_server_fakes import fake_llm_engine
from tests.test_server_harness import wait_until
from traces.events import Arrived, ReplicaDown, ReplicaUp, make_header
from traces.fleet_log import FleetLog, fleet_extra, relative_log, replica_log_path, restart_log_path
from traces.log import LogWriter, read_log

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kills processes")

STREAMS = 8
TOKENS = 250  # at DELAY s a step: seconds of streaming, long past the kill
DELAY = 0.02


class Fleet:
    """Two fake replicas in engine processes behind a live server, logged as ``serve`` logs a fleet."""

    def __init__(self, tokenizer, tmp_path: Path, policy: RestartPolicy) -> None:
        self.tokenizer, self.trace = tokenizer, tmp_path / "fleet.jsonl"
        self.said: list[str] = []
        self.deaths: list[str] = []
        logs = [replica_log_path(self.trace, i) for i in range(2)]
        replicas = [self.start_replica(i)[0] for i in range(2)]
        self.route_log = LogWriter(self.trace)
        extra = fleet_extra("round-robin", logs, self.trace)
        self.route_log(make_header(replicas[0].config, clock="wall", extra=extra))
        self.engine = DataParallelEngine(replicas, "round-robin", route_log=self.route_log, restart=self.start_replica,
                                         policy=policy, say=self.said.append)
        self.engine.on_dead = self.deaths.append
        self.engine.start()
        self.http = ServerThread(create_app(self.engine, tokenizer, "m")).__enter__()

    def start_replica(self, i: int, restart: int = 0) -> tuple[AsyncLLMEngine, str]:
        log = replica_log_path(self.trace, i) if restart == 0 else restart_log_path(self.trace, i, restart)
        spec = EngineSpec(fake_llm_engine, {"tokenizer": self.tokenizer, "delay": DELAY, "log": str(log)}, warmup=False)
        process = EngineProcess(spec, start_timeout=120, name=f"replica {i}")
        return AsyncLLMEngine(connection=process), relative_log(log, self.trace)

    @property
    def url(self) -> str:
        return self.http.url if self.http is not None else ""

    def pid(self, i: int) -> int:
        return self.engine.replicas[i].connection.proc.pid

    def health(self) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=10)

    def close(self) -> None:
        if self.http is None:
            return
        self.http, http = None, self.http
        http.__exit__(None, None, None)
        self.engine.shutdown()
        self.route_log.close()


@pytest.fixture
def fleet(smollm2_tokenizer, tmp_path):
    f = Fleet(smollm2_tokenizer, tmp_path, RestartPolicy(restarts=3, backoff_s=1.0))
    try:
        yield f
    finally:
        f.close()


def _stream(url: str, prompt: str, out: list, started: threading.Event) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": TOKENS, "stream": True, "ignore_eos": True}
    data = []
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                    started.set()
    finally:
        out.append(data)


def _outcome(data: list[str]) -> str | dict:
    """"ok" for a stream that ran to its last token, else its error event."""
    assert data and data[-1] == "[DONE]", data[-3:]
    last = json.loads(data[-2])
    if "error" in last:
        return last["error"]
    assert sum(len(json.loads(d)["choices"][0]["text"]) > 0 for d in data[:-1] if "choices" in d) > 0
    return "ok"


def test_a_killed_replica_fails_its_own_streams_only_and_comes_back(fleet):
    assert fleet.health().json()["status"] == "ok"
    results: list[list[str]] = []
    started = [threading.Event() for _ in range(STREAMS)]
    clients = [threading.Thread(target=_stream, args=(fleet.url, f"Story number {i}:", results, started[i]))
               for i in range(STREAMS)]
    for c in clients:
        c.start()
    for s in started:
        assert s.wait(60), "a stream never started"
    in_flight = [r.load().outstanding for r in fleet.engine.replicas]
    assert in_flight == [STREAMS // 2] * 2  # round-robin: half each, none finished yet
    os.kill(fleet.pid(1), signal.SIGKILL)
    wait_until(lambda: fleet.health().json()["status"] != "ok", 30, "/health to see the death")
    body = fleet.health()
    assert body.status_code == 200 and body.json()["status"] == "degraded"
    assert [r["status"] for r in body.json()["replicas"]] == ["up", "restarting"]
    # the router skips the dead replica: a request now is served by the live one
    r = httpx.post(fleet.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 or fleet.health().json()["status"] == "ok", r.text
    for c in clients:
        c.join(60)
        assert not c.is_alive(), "a stream hung"
    outcomes = [_outcome(d) for d in results]
    errors = [o for o in outcomes if o != "ok"]
    assert outcomes.count("ok") == STREAMS // 2, outcomes  # the healthy replica: not one failed
    assert len(errors) == STREAMS // 2
    assert all(e["code"] == "engine_dead" and "replica 1" in e["message"] for e in errors), errors
    wait_until(lambda: fleet.health().json()["status"] == "ok", 60, "the replica to come back")
    assert fleet.health().json()["replicas"][1]["restarts"] == 1
    for i in range(4):  # both serve again (round-robin: two each)
        r = httpx.post(fleet.url + "/v1/completions", json={"model": "m", "prompt": f"again {i}", "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200, r.text
    wait_until(lambda: fleet.engine.settled, 30, "the fleet to go idle")
    metrics = httpx.get(fleet.url + "/metrics", timeout=10).text
    assert "minivllm_replicas_up 2.0" in metrics and "minivllm_replica_restarts_total 1.0" in metrics
    assert any("starting it again" in s for s in fleet.said) and not fleet.deaths
    fleet.close()
    _check_logs(fleet.trace)


def _check_logs(trace: Path) -> None:
    """The death and the return are in the fleet log; every request it names is in its log."""
    events = list(read_log(trace))
    downs = [e for e in events if isinstance(e, ReplicaDown)]
    ups = [e for e in events if isinstance(e, ReplicaUp)]
    assert [(d.replica, d.restarting) for d in downs] == [(1, True)] and "replica 1" in downs[0].reason
    assert [(u.replica, u.log) for u in ups] == [(1, relative_log(restart_log_path(trace, 1, 1), trace))]
    assert downs[0].time <= ups[0].time
    fleet = FleetLog.read(trace)
    assert fleet.log_replicas == [0, 1, 1] and fleet.replicas == 2
    (outage,) = fleet.outages
    assert (outage.replica, outage.log, outage.next_log) == (1, 1, 2) and outage.up is not None
    arrived = [{e.request_id for e in read_log(p) if isinstance(e, Arrived)} for p in fleet.replica_logs]
    routed = [r for r in fleet.routes if r.request_id is not None]
    assert routed and all(r.request_id in arrived[r.replica] for r in routed)
    assert any(r.replica == 2 for r in routed)  # the restarted replica served, in its new log
    from analysis.outages import outage_lines

    (line,) = outage_lines(trace)
    assert line.startswith("outage: replica 1 down at") and f"{STREAMS // 2} requests in flight failed" in line


def test_a_request_sent_to_a_replica_that_died_before_taking_it_in_is_served_by_another(fleet):
    """Between a replica's death and its front end noticing, the router may still send it a request;
    that request reached no engine (no log id, no token), so it goes to a replica up instead of
    failing. A stopped replica holds its requests untaken until it is killed."""
    stopped = fleet.pid(1)
    os.kill(stopped, signal.SIGSTOP)
    answers: list[httpx.Response] = []

    def ask(i: int) -> None:
        answers.append(httpx.post(fleet.url + "/v1/completions", json={"model": "m", "prompt": f"q{i}",
                                                                        "max_tokens": 3}, timeout=60))

    clients = [threading.Thread(target=ask, args=(i,)) for i in range(2)]  # round-robin: one each
    try:
        for c in clients:
            c.start()
        wait_until(lambda: [r.load().outstanding for r in fleet.engine.replicas][1] == 1, 30,
                   "a request to reach the stopped replica")
    finally:
        os.kill(stopped, signal.SIGKILL)
    for c in clients:
        c.join(60)
        assert not c.is_alive(), "a request hung"
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    wait_until(lambda: fleet.engine.settled, 30, "the fleet to go idle")
    fleet.close()
    log = FleetLog.read(fleet.trace)
    routed = [r for r in log.routes if r.request_id is not None]
    # both served and logged by replica 0, each once, in their places in the arrival order
    assert sorted((r.replica, r.index) for r in routed) == [(0, 0), (0, 1)]
    assert sum(isinstance(e, Arrived) for e in read_log(log.replica_logs[0])) == 2


def test_analyze_shows_each_outage_on_a_line(fleet, capsys):
    from runtime.cli import main

    os.kill(fleet.pid(0), signal.SIGKILL)
    wait_until(lambda: fleet.health().json()["replicas"][0]["restarts"] == 1
               and fleet.health().json()["status"] == "ok", 60, "the replica to come back")
    for i in range(4):
        r = httpx.post(fleet.url + "/v1/completions", json={"model": "m", "prompt": f"q{i}", "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200, r.text
    wait_until(lambda: fleet.engine.settled, 30, "the fleet to go idle")
    fleet.close()
    assert main(["analyze", str(fleet.trace)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("outage:")]
    assert len(lines) == 1 and "replica 0 down at" in lines[0] and "back with fleet.replica0.restart1.jsonl" in lines[0]
    assert "0 requests in flight failed (replica 0: engine process exited (status -9))" in lines[0]


def test_with_no_restart_left_the_fleet_answers_503_then_stops(smollm2_tokenizer, tmp_path):
    f = Fleet(smollm2_tokenizer, tmp_path, RestartPolicy(restarts=0))
    try:
        os.kill(f.pid(0), signal.SIGKILL)
        wait_until(lambda: f.health().json()["status"] == "degraded", 30, "/health to see the death")
        assert [r["status"] for r in f.health().json()["replicas"]] == ["failed", "up"]
        for i in range(3):  # every request goes to the one left
            r = httpx.post(f.url + "/v1/completions", json={"model": "m", "prompt": f"q{i}", "max_tokens": 2},
                           timeout=60)
            assert r.status_code == 200, r.text
        assert not f.deaths
        os.kill(f.pid(1), signal.SIGKILL)
        wait_until(lambda: f.health().status_code == 503, 30, "/health to see the second death")
        assert f.health().json()["status"] == "dead"
        r = httpx.post(f.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        assert "no replica is running" in r.json()["error"]["message"]
        assert len(f.deaths) == 1  # the server is told once: it stops, as for one engine
    finally:
        f.close()
    downs = [e for e in read_log(f.trace) if isinstance(e, ReplicaDown)]
    assert [(d.replica, d.restarting) for d in downs] == [(0, False), (1, False)]
