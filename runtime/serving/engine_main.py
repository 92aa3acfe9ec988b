"""The engine process: what runtime/serving/engine_process.py spawns. It builds the ``LLMEngine``
(model, KV pool, event log), warms it up, and runs the engine loop (runtime/serving/engine_loop.py)
on commands from the front end until told to stop.

Threads: the main one runs the loop; one per front end reads its commands from its pipe into the
loop's inbox; one per front end writes the loop's messages to its other pipe (so a step never
waits on a front end). There is one front end but for ``serve --api-server-count N``.

Stopping, always with the log flushed and closed: a ``Shutdown`` command, the end of front end 0's
command pipe (it is gone, however it died; the other front ends' processes are its to watch: the end of
one's command pipe ends its outputs, nothing more) or
SIGTERM end the loop between steps; while the model loads or warms up they end it at once. SIGINT
is ignored: a terminal's Ctrl-C reaches the whole process group, and the front end decides. A stop
that doesn't finish within ``GRACE_S`` (a hung step) exits hard: never an orphan.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from runtime.serving.engine_loop import EngineLoop, describe
from runtime.serving.engine_protocol import Command, EngineFailed, Shutdown, decode_command, encode
from runtime.serving.llm_engine import LLMEngine
from runtime.serving.pipe_writer import PipeWriter
from runtime.serving.process_name import ENGINE, name_process

GRACE_S = 30.0


@dataclass(frozen=True)
class EngineSpec:
    """What the child builds, pickled to it at spawn: ``factory(**kwargs)`` returns the LLMEngine
    (``LLMEngine`` itself for ``minivllm serve``; a test passes one with a fake executor).
    ``warmup``: run the warm-up first (None: on CUDA)."""

    factory: Callable[..., LLMEngine] = LLMEngine
    kwargs: dict[str, Any] = field(default_factory=dict)
    warmup: bool | None = None


class _EngineProcess:
    def __init__(self, spec: EngineSpec, commands: list[Connection], outputs: list[Connection]) -> None:
        self.spec = spec
        self.loop: EngineLoop | None = None
        self.inbox: queue.Queue[tuple[int, Command]] = queue.Queue()
        self._exit_armed = False
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # front end 0 owns the server: when it goes, the engine stops; another front end's end is its
        # process's (its owner sees that and decides)
        self.outs = [PipeWriter(conn, "minivllm-engine-out", self.stop if i == 0 else None)
                     for i, conn in enumerate(outputs)]
        for i, conn in enumerate(commands):
            threading.Thread(target=self._read, args=(i, conn), name=f"minivllm-engine-in-{i}", daemon=True).start()

    def send_all(self, data: bytes) -> None:
        for out in self.outs:
            out.send(data)

    def run(self) -> None:
        try:
            try:
                engine = self.spec.factory(**self.spec.kwargs)
            except Exception as e:  # a bad flag or file: the front end reports it as its own
                self.send_all(encode(EngineFailed(type(e).__name__, str(e), [c.__name__ for c in type(e).__mro__])))
                return
            try:
                self._serve(engine)
            finally:
                engine.close()  # the log: flushed and closed
        finally:
            for out in self.outs:
                out.close()

    def _serve(self, engine: LLMEngine) -> None:
        warmup = self.spec.warmup
        parts = getattr(engine, "parts", None)  # None: an engine over parts built elsewhere
        if warmup is None:
            warmup = parts is not None and parts.runner.device.type == "cuda"
        announce_build(parts, warmup)  # before the front end hears of the engine and says "serving"
        tokenizer = pickle.dumps(engine.tokenizer) if engine.tokenizer is not None else None
        self.send_all(encode(describe(engine, tokenizer)))
        self.loop = EngineLoop(engine, self.inbox, [out.send for out in self.outs], warmup=warmup)
        self.loop.run()

    def _read(self, client: int, commands: Connection) -> None:
        while True:
            try:
                cmd = decode_command(commands.recv_bytes())
            except (EOFError, OSError):  # the front end is gone
                if client:  # its outputs end too: its own close waits for their end, not the engine's
                    self.outs[client].close(GRACE_S)
                    return
                cmd = Shutdown()
            self.inbox.put((client, cmd))
            if isinstance(cmd, Shutdown):
                self.stop()
                return

    def stop(self) -> None:
        """From any thread: the loop stops between steps; loading or warming up stops at once."""
        loop = self.loop
        if loop is not None and loop.serving:
            self._arm_exit()
            loop.stop()
        else:
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs on the main thread

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._arm_exit()
        loop = self.loop
        if loop is not None and loop.serving:
            loop.stop()
        else:
            raise SystemExit(128 + signum)

    def _arm_exit(self) -> None:
        if not self._exit_armed:
            self._exit_armed = True
            timer = threading.Timer(GRACE_S, os._exit, (1,))
            timer.daemon = True
            timer.start()


def run_engine_process(spec: EngineSpec, commands: list[Connection], outputs: list[Connection]) -> None:
    """The spawned process's target: a command pipe and an output pipe per front end."""
    name_process(ENGINE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _EngineProcess(spec, commands, outputs).run()
    except SystemExit:
        raise
    except BaseException as e:  # type and stack only: the message could quote a prompt
        print(f"minivllm engine process: unhandled {type(e).__name__}\n{''.join(traceback.format_tb(e.__traceback__))}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # the log is closed already; interpreter shutdown can hang on what the failure left behind


def announce_build(parts: Any, warmup: bool) -> None:
    """On stderr: how long each stage of the engine's build took (``parts``: its EngineParts, None
    for an engine over parts built elsewhere), and that the warm-up begins."""
    if parts is not None:
        print(f"minivllm: {parts.describe_build()}", file=sys.stderr, flush=True)
    if warmup:
        print("minivllm: warming up (every kernel specialisation and graph serving can hit) …", file=sys.stderr,
              flush=True)
