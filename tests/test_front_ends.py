"""More front ends over one engine process (``serve --api-server-count N``,
runtime/serving/server/front_ends.py): each front end hears its own requests' tokens and its own
command counts, every step's engine figures; `minivllm serve` runs them on one port, none loads
torch, and a front end that dies takes the server down with exit status 1 (a supervisor restarts
it), while SIGTERM stops them all cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from runtime.serving.async_engine import AsyncLLMEngine, EngineDead
from runtime.serving.engine_main import EngineSpec
from runtime.serving.engine_process import EnginePipes, EngineProcess
from runtime.serving.process_name import FRONT_END, INTAKE
from runtime.serving.server.launch import free_port
from tests.proc_helpers import engine_child, named_children, running
from tests.test_engine_process import TINY_FLAGS, _maps_torch, tiny  # noqa: F401 (a fixture)
from tests.test_server_fakes import fake_llm_engine
from tests.test_server_harness import wait_until
from traces.params import SamplingParams

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


async def _tokens(engine: AsyncLLMEngine, prompt: list[int], n: int) -> list[int]:
    out = []
    async for d in engine.generate(prompt, SamplingParams(max_tokens=n, ignore_eos=True)):
        out += d.token_ids
    return out


def test_two_front_ends_share_one_engine_each_hearing_its_own(smollm2_tokenizer):
    process = EngineProcess(EngineSpec(fake_llm_engine, {"tokenizer": smollm2_tokenizer}, warmup=False),
                            start_timeout=120, front_ends=2)
    commands, outputs = process.other_front_ends[0]
    first = AsyncLLMEngine(connection=process, front_ends=2)
    second = AsyncLLMEngine(connection=EnginePipes(commands, outputs), front_end=1, front_ends=2)
    assert (first.next_key, second.next_key) == (0, 1)
    dead = []
    for engine in (first, second):
        engine.on_dead = dead.append
        engine.start()
    try:
        async def both():
            prompts = [[5, 6, 7], [9, 10], [5, 6, 7], [11] * 20]
            runs = [_tokens(first if i % 2 == 0 else second, p, 6 + i) for i, p in enumerate(prompts)]
            return await asyncio.gather(*runs)

        got = asyncio.run(both())
        assert [len(t) for t in got] == [6, 7, 8, 9]
        assert got[0] == got[2][:6]  # the same prompt, whichever front end sent it
        assert (first.next_key, second.next_key) == (4, 5)
        # each front end's count of what the engine took is its own, so each one's backpressure is right;
        # each hears every step, on its own pipe: wait until both have heard the last one
        wait_until(lambda: all(e.settled and sum(e.stats.requests_finished.values()) == 4 for e in (first, second)),
                   30, "both front ends to hear the last step")
        assert first.state.adds_taken == second.state.adds_taken == 2
        assert first.stats.requests_finished == second.stats.requests_finished == {"length": 4}  # the whole engine's
        os.kill(process.proc.pid, signal.SIGKILL)
        wait_until(lambda: len(dead) == 2, 30, "both front ends to hear the engine die")
        assert not first.alive and not second.alive
        with pytest.raises(EngineDead):
            asyncio.run(_tokens(second, [5], 2))
    finally:
        first.shutdown(10)
        second.shutdown(10)


def test_a_front_end_that_closes_its_pipes_hears_its_outputs_end_while_the_engine_serves_on(smollm2_tokenizer):
    """A front end leaving (its server stopped) closes its commands; the engine then ends that front
    end's outputs, so its close returns without waiting for the whole engine to stop."""
    process = EngineProcess(EngineSpec(fake_llm_engine, {"tokenizer": smollm2_tokenizer}, warmup=False),
                            start_timeout=120, front_ends=2)
    pipes = EnginePipes(*process.other_front_ends[0])
    first = AsyncLLMEngine(connection=process, front_ends=2)
    second = AsyncLLMEngine(connection=pipes, front_end=1, front_ends=2)
    for engine in (first, second):
        engine.start()
    try:
        assert len(asyncio.run(_tokens(second, [5, 6, 7], 4))) == 4
        pipes.close(20)  # (before the engine ended these outputs, this waited out its 20 s)
        assert not pipes.alive
        assert process.alive and len(asyncio.run(_tokens(first, [9, 10], 5))) == 5
    finally:
        first.shutdown(10)
        second.shutdown(10)


def _serve(tiny, tmp_path: Path, count: int):  # noqa: F811 (the fixture's value)
    from runtime.bench.server_process import ServerProcess

    server = ServerProcess(["--model", str(tiny.folder), *TINY_FLAGS, "--api-server-count", str(count)],
                           port=free_port(), log_file=str(tmp_path / "server.out"))
    server.wait_ready(120)
    return server


def _processes(pid: int, front_ends: int) -> tuple[int, list[int]]:
    """(the engine, the other front ends) among the server's children, by the names they give
    themselves (runtime/serving/process_name.py); the intake workers have a name of their own."""
    wait_until(lambda: len(named_children(pid, FRONT_END)) == front_ends - 1, 60, "the front ends to start")
    return engine_child(pid), named_children(pid, FRONT_END)


def test_serve_runs_its_front_ends_on_one_port(tiny, tmp_path):  # noqa: F811
    server = _serve(tiny, tmp_path, 3)
    try:
        engine, front_ends = _processes(server.proc.pid, 3)
        assert len(front_ends) == 2 and not any(_maps_torch(p) for p in [server.proc.pid, *front_ends])
        body = {"prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0}
        texts = set()
        for _ in range(12):  # a connection each: the kernel spreads them over the front ends
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200
            texts.add(r.json()["choices"][0]["text"])
        assert len(texts) == 1
        served = 0
        for line in httpx.get(server.url + "/metrics").text.splitlines():
            if line.startswith("vllm:request_success_total") and 'finished_reason="length"' in line:
                served = float(line.rsplit(" ", 1)[1])
        assert served == 12  # the whole engine's, whichever front end answered
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
        wait_until(lambda: not any(running(p) for p in [engine, *front_ends]), 20, "every process to exit")
    finally:
        server.stop()
    out = (tmp_path / "server.out").read_text()
    assert "Traceback" not in out and "did not stop cleanly" not in out


def test_a_dead_front_end_takes_the_server_down(tiny, tmp_path):  # noqa: F811
    from runtime.cli.serve import ENGINE_DIED_STATUS

    server = _serve(tiny, tmp_path, 2)
    try:
        engine, (front_end,) = _processes(server.proc.pid, 2)
        # (killed while it still spawns its intake worker, the half-born child prints multiprocessing's
        # traceback of a parent gone: /ready answers from whichever front end the kernel picks)
        wait_until(lambda: named_children(front_end, INTAKE), 60, "front end 1's intake worker to start")
        os.kill(front_end, signal.SIGKILL)
        assert server.proc.wait(60) == ENGINE_DIED_STATUS
        wait_until(lambda: not running(engine), 20, "the engine to exit")
    finally:
        server.stop()
    out = (tmp_path / "server.out").read_text()
    assert "front-end process 1 exited" in out and "Traceback" not in out


def test_a_front_end_listens_only_once_its_intake_workers_are_up_or_never_if_told_to_stop():
    """Front ends 1..N-1 start while front end 0 warms up or serves: listening before their intake
    workers are up would hand the first long prompts to a process still starting them (seconds).
    ``listening`` (what front end 0's /ready waits for) is set once the socket listens."""
    import threading
    from types import SimpleNamespace

    from runtime.serving.server.front_ends import StopServing, serve_when_up

    calls: list[str] = []

    class Server:
        config = SimpleNamespace(backlog=2048)

        def run(self, sockets):
            calls.append(f"run (up: {up.is_set()}, listening: {listening.is_set()})")

    class Sock:
        def listen(self, backlog):
            calls.append(f"listen {backlog} (up: {up.is_set()})")

    up, stop, listening = threading.Event(), StopServing(), threading.Event()
    threading.Timer(0.3, up.set).start()
    serve_when_up(Server(), Sock(), up, stop, listening, poll_s=0.01)
    assert calls == ["listen 2048 (up: True)", "run (up: True, listening: True)"]
    up, listening = threading.Event(), threading.Event()
    threading.Timer(0.2, stop, args=(signal.SIGTERM, None)).start()
    serve_when_up(Server(), Sock(), up, stop, listening, poll_s=0.01)
    assert stop.asked and not listening.is_set() and len(calls) == 2  # told to stop: never listened

