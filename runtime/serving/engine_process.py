"""The engine in a child process, seen from the front end: spawn it (``spawn``: CUDA is initialised
in the child only; nothing of the parent's state is inherited), wait until it has built its engine,
then exchange msgpack bytes (runtime/serving/engine_protocol.py) over two pipes.

A reader thread hands each message to the front end and reports the end of the pipe, which comes
whenever the child exits, however it died. ``close`` asks the child to stop (its log flushed and
closed), then terminates and finally kills it if it doesn't; the child, for its part, stops when
this process's end of the command pipe closes (runtime/serving/engine_main.py): no orphan either
way. ``daemon``: multiprocessing also terminates it at this interpreter's exit.

With ``front_ends=N`` (``serve --api-server-count``) the child gets a pair of pipes per front end:
this process is front end 0, and ``other_front_ends`` hands the other pairs to front-end processes
of their own, which talk to the engine through ``EnginePipes`` and hear of its end as the end of
their pipe.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from runtime.engine.config import ConfigError
from runtime.serving.engine_main import EngineSpec, run_engine_process
from runtime.serving.engine_protocol import EngineFailed, EngineStarted, Shutdown, decode_message, encode
from runtime.serving.pipe_writer import PipeWriter, widen

# start-up failures the front end re-raises as themselves (a CLI maps them to a message)
_START_ERRORS: dict[str, type[Exception]] = {"ConfigError": ConfigError, "FileExistsError": FileExistsError,
                                              "FileNotFoundError": FileNotFoundError, "ValueError": ValueError,
                                              "OSError": OSError}


class EngineStartError(RuntimeError):
    """The engine process stopped before its engine was built."""


def start_error(msg: EngineFailed) -> Exception:
    """The child's start-up failure as the nearest exception type we know, with its message."""
    for kind in msg.kinds or [msg.error]:
        if kind in _START_ERRORS:
            return _START_ERRORS[kind](msg.message)
    return EngineStartError(f"the engine failed to start: {msg.error}: {msg.message}")


class EnginePipes:
    """A front end's connection to the engine process over its pair of pipes (an EngineConnection):
    ``commands`` written here, ``outputs`` read here. Waits for the engine's ``EngineStarted``."""

    name: str | None = None  # the engine its end names ("replica 1"); None: the only one

    def __init__(self, commands: Connection, outputs: Connection, start_timeout: float | None = None) -> None:
        self._commands, self._outputs = commands, outputs
        self._writer = PipeWriter(commands, "minivllm-engine-commands")  # the reader hears the end
        self._reader: threading.Thread | None = None
        self._gone = False
        self.started = self._wait_started(start_timeout)

    def _watch(self) -> list:
        """What ends the wait for a message: the pipe (and the process, where it is ours)."""
        return [self._outputs]

    def _exit_status(self) -> str:
        return "unknown"

    def _wait_started(self, timeout: float | None) -> EngineStarted:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(self._watch(), left)
            if not ready:
                raise EngineStartError(f"the engine was not built within {timeout:.0f} s")
            if self._outputs not in ready:  # exited, nothing more to read
                break
            try:
                msg = decode_message(self._outputs.recv_bytes())
            except EOFError:
                break
            if isinstance(msg, EngineStarted):
                return msg
            if isinstance(msg, EngineFailed):
                raise start_error(msg)
        raise EngineStartError(f"the engine process exited with status {self._exit_status()} while starting "
                               "(its output is above)")

    # --- EngineConnection -------------------------------------------------------------------------

    def tokenizer(self) -> Any:
        """The engine's tokenizer, as it pickled it (None if it has none)."""
        data = self.started.tokenizer
        return pickle.loads(data) if data is not None else None  # noqa: S301 (our own child)

    def now(self) -> float:
        """The engine's clock: both processes read the system-wide ``time.monotonic``."""
        return time.monotonic() - self.started.clock_origin

    def start(self, on_message: Callable[[bytes], None], on_lost: Callable[[str], None]) -> None:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, args=(on_message, on_lost),
                                            name="minivllm-engine-reader", daemon=True)
            self._reader.start()

    def _read(self, on_message: Callable[[bytes], None], on_lost: Callable[[str], None]) -> None:
        try:
            while True:
                ready = wait(self._watch())
                if self._outputs not in ready:
                    break
                try:
                    data = self._outputs.recv_bytes()
                except (EOFError, OSError):
                    break
                on_message(data)
        finally:
            self._gone = True
            named = f"{self.name}: " if self.name else ""
            on_lost(f"{named}engine process exited (status {self._exit_status()})")

    def send(self, data: bytes) -> None:
        """Queued, written in order by the writer's thread (a long prompt never stalls the caller)."""
        if self._writer.gone:
            raise OSError("the engine's command pipe is closed")
        self._writer.send(data)

    @property
    def alive(self) -> bool:
        return not self._gone

    def close(self, timeout: float = 30.0) -> None:
        """Close this front end's pipes (front end 0's closing stops the engine), after the commands
        queued are written (within ``timeout`` seconds in all). Idempotent."""
        deadline = time.monotonic() + timeout
        self._writer.close(timeout)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(max(0.0, deadline - time.monotonic()))
        if self._reader is None or not self._reader.is_alive():
            self._outputs.close()


class EngineProcess(EnginePipes):
    """``start_timeout``: seconds to wait for the engine to be built (None: as long as it takes);
    ``front_ends``: how many front ends talk to it (this one and ``other_front_ends``); ``name``: how
    the end of the process is told (a fleet's "replica 1"), so its clients learn which engine died."""

    def __init__(self, spec: EngineSpec, *, start_timeout: float | None = None, front_ends: int = 1,
                 name: str | None = None) -> None:
        self.name = name
        ctx = multiprocessing.get_context("spawn")
        pairs = [ctx.Pipe(duplex=False) for _ in range(2 * front_ends)]
        for read_end, _ in pairs:
            widen(read_end)
        child_commands, commands = zip(*pairs[:front_ends])  # (read end, write end)
        outputs, child_outputs = zip(*pairs[front_ends:])
        self.proc = ctx.Process(target=run_engine_process, args=(spec, list(child_commands), list(child_outputs)),
                                name="minivllm-engine", daemon=True)
        self.proc.start()
        for conn in (*child_commands, *child_outputs):  # the child's ends: kept open here, they would hide its exit
            conn.close()
        self.other_front_ends = list(zip(commands[1:], outputs[1:]))  # (commands, outputs) of front ends 1..N-1
        try:
            super().__init__(commands[0], outputs[0], start_timeout)
        except BaseException:
            self.close(timeout=10.0)
            raise

    def _watch(self) -> list:
        return [self._outputs, self.proc.sentinel]

    def _exit_status(self) -> str:
        self.proc.join(5.0)
        return str(self.proc.exitcode)

    def release_front_ends(self) -> None:
        """The other front ends' pipe ends, closed here once their processes hold them (else the
        engine would not see those front ends go)."""
        for commands, outputs in self.other_front_ends:
            commands.close()
            outputs.close()
        self.other_front_ends = []

    @property
    def alive(self) -> bool:
        return not self._gone and self.proc.exitcode is None

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine: asked, then terminated, then killed. Idempotent."""
        if self.proc.exitcode is None:
            with contextlib.suppress(OSError):
                self.send(encode(Shutdown()))
            self.proc.join(timeout)
        if self.proc.exitcode is None:
            self.proc.terminate()
            self.proc.join(5.0)
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join()
        super().close(5.0)
        self.release_front_ends()
