"""More HTTP front ends over one engine process (``serve --api-server-count N``, vLLM's flag).

One asyncio process spends tens of µs of CPU on each streamed token (HTTP framing, SSE, the ASGI
layers) and on each request's intake (JSON, validation, tokenising); under load its event loop
queues them, and the client sees first tokens late and tokens merged. Front ends 1..N-1 are
processes of their own, each with its own pair of pipes to the engine (runtime/serving/engine_process.py)
and its own socket on the same port (SO_REUSEPORT: the kernel spreads connections over them); the
server's own process is front end 0. A request's tokens go back to the front end that took it.

Every front end answers every route. /metrics: the engine's counters and histograms are the whole
engine's in each (each front end hears every step's figures), the HTTP-side ones (429s at the door)
are that front end's own.

Lifecycle: a front end whose engine is gone stops and exits non-zero; front end 0 watches the others
and stops the whole server (exit status 1) if one exits while serving; stopping the server sends
each of them SIGTERM first (uvicorn's graceful shutdown), then stops the engine.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.synchronize import Event

from runtime.executor.heap import freeze_heap
from runtime.serving.engine_process import EngineProcess
from runtime.serving.process_name import FRONT_END, name_process
from runtime.serving.server.connections import DEFAULT_TIMEOUTS, Timeouts


def auto_count(cores: int) -> int:
    """``--api-server-count auto``: a front end per 4 cores, 1 to 4. A busy front end is one core's
    worth of event loop; the other three of its four run the engine process's host work (scheduling,
    detokenizing), the intake workers and the kernel's network stack. Past 4, the engine's own step
    loop is the limit: on an H200, 4 front ends already bring the client's ITL to the engine's and
    its TTFT within ~2 ms of it (README). On 2 to 7 cores: 1, the one process as ever."""
    return min(4, max(1, cores // 4))


def machine_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class FrontEndSpec:
    """What a front-end process needs (pickled to it at spawn)."""

    host: str
    port: int
    model_name: str
    api_key: str | None
    max_request_bytes: int
    max_pending: int
    grace_s: float  # uvicorn's graceful-shutdown timeout
    index: int = 0
    count: int = 1
    timeouts: Timeouts = DEFAULT_TIMEOUTS  # idle connections' (runtime/serving/server/connections.py)
    intake_workers: int = 1  # processes taking its large requests in (runtime/serving/server/intake.py)


class FrontEnds:
    """Front ends 1..N-1 of ``process`` (made with ``front_ends=N``): started at once; ``on_dead(reason)``
    once if one exits before ``stop``."""

    def __init__(self, process: EngineProcess, spec: FrontEndSpec, on_dead: Callable[[str], None]) -> None:
        ctx = multiprocessing.get_context("spawn")
        count = len(process.other_front_ends) + 1
        self.procs = []
        self.listening = [ctx.Event() for _ in process.other_front_ends]  # set by each once it listens
        for i, (commands, outputs) in enumerate(process.other_front_ends, start=1):
            proc = ctx.Process(target=run_front_end, args=(dataclasses.replace(spec, index=i, count=count),
                                                          commands, outputs, self.listening[i - 1]),
                               name=f"minivllm-front-end-{i}",
                               daemon=False)  # (a daemon may not start processes: its intake workers; stop() ends it)
            proc.start()
            self.procs.append(proc)
        process.release_front_ends()
        self._stopping = False
        threading.Thread(target=self._watch, args=(on_dead,), name="minivllm-front-ends", daemon=True).start()

    def all_listening(self) -> bool:
        return all(e.is_set() for e in self.listening)

    def _watch(self, on_dead: Callable[[str], None]) -> None:
        ended = wait([p.sentinel for p in self.procs])
        if self._stopping:
            return
        i, proc = next((i, p) for i, p in enumerate(self.procs, start=1) if p.sentinel in ended)
        proc.join(5.0)
        on_dead(f"front-end process {i} exited (status {proc.exitcode})")

    def stop(self, timeout: float) -> None:
        """SIGTERM to each (they finish their responses within their grace), then wait; kill what hangs."""
        self._stopping = True
        for proc in self.procs:
            if proc.exitcode is None:
                proc.terminate()
        for i, proc in enumerate(self.procs, start=1):
            proc.join(timeout)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
            if proc.exitcode != 0:  # (killed, or ended by a signal before its own clean-up)
                print(f"minivllm: front-end process {i} did not stop cleanly (status {proc.exitcode})",
                      file=sys.stderr, flush=True)


def run_front_end(spec: FrontEndSpec, commands: Connection, outputs: Connection, listening: Event) -> None:
    """A front-end process: the app over its pipes to the engine, on its own SO_REUSEPORT socket."""
    name_process(FRONT_END)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the group: front end 0 decides
    stop = StopServing()
    signal.signal(signal.SIGTERM, stop)
    from runtime.serving.async_engine import AsyncLLMEngine
    from runtime.serving.engine_process import EnginePipes
    from runtime.serving.server.app import create_app
    from runtime.serving.server.launch import http_server, tcp_socket

    pipes = EnginePipes(commands, outputs)
    engine = AsyncLLMEngine(connection=pipes, max_pending=spec.max_pending, front_end=spec.index,
                            front_ends=spec.count)
    app = create_app(engine, pipes.tokenizer(), spec.model_name, api_key=spec.api_key,
                     max_request_bytes=spec.max_request_bytes, intake_workers=spec.intake_workers)
    sock = tcp_socket(spec.host, reuse_port=True)
    sock.bind((spec.host, spec.port))
    server = http_server(app, spec.host, spec.port, spec.grace_s, spec.timeouts)
    died: list[str] = []
    closing = threading.Event()

    def on_dead(reason: str) -> None:
        if closing.is_set():  # the engine ended our outputs because we closed our commands: no death
            return
        died.append(reason)
        server.should_exit = True

    engine.on_dead = on_dead
    stop.serving(server)
    try:
        engine.start()
        app.state.server.intake.start()
        freeze_heap()
        serve_when_up(server, sock, app.state.server.intake.up, stop, listening)
    finally:
        app.state.server.close()
        closing.set()
        pipes.close(5.0)
        sock.close()
    sys.exit(1 if died else 0)


def serve_when_up(server, sock, up: threading.Event, stop: StopServing, listening: Event,
                  poll_s: float = 0.1) -> None:
    """``server.run`` on ``sock`` once ``up`` is set (the intake workers started, or failed or timed
    out), ``listening`` set once it listens; never if told to stop first. The kernel hands a
    SO_REUSEPORT socket connections as soon as it listens: a large body landing on a front end still
    starting its intake processes would wait seconds for them."""
    while not up.wait(poll_s):
        if stop.asked:
            return
    sock.listen(server.config.backlog)  # (uvicorn listens again on it: the same socket and backlog)
    listening.set()
    server.run(sockets=[sock])


class StopServing:
    """SIGTERM's handler: the HTTP server is asked to stop (now, or as soon as it exists), never
    interrupted. uvicorn shuts down gracefully, then raises the signal again under this handler: the
    default one would end the process there, before its clean-up (intake workers, one maybe
    mid-spawn), and an exception raised from a handler can land in any callback and be swallowed."""

    def __init__(self) -> None:
        self.asked = False
        self._server = None

    def __call__(self, signum: int, frame) -> None:
        self.asked = True
        if self._server is not None:
            self._server.should_exit = True

    def serving(self, server) -> None:
        self._server = server
        if self.asked:
            server.should_exit = True
