"""The engine in a child process, seen from the front end: spawn it (``spawn``: CUDA is initialised
in the child only; nothing of the parent's state is inherited), wait until it has built its engine,
then exchange msgpack bytes (runtime/serving/engine_protocol.py) over two pipes.

A reader thread hands each message to the front end and reports the end of the pipe, which comes
whenever the child exits, however it died. ``close`` asks the child to stop (its log flushed and
closed), then terminates and finally kills it if it doesn't; the child, for its part, stops when
this process's end of the command pipe closes (runtime/serving/engine_main.py): no orphan either
way. ``daemon``: multiprocessing also terminates it at this interpreter's exit.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from runtime.engine.config import ConfigError
from runtime.serving.engine_main import EngineSpec, run_engine_process
from runtime.serving.engine_protocol import EngineFailed, EngineStarted, Shutdown, decode_message, encode

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


class EngineProcess:
    """``start_timeout``: seconds to wait for the engine to be built (None: as long as it takes)."""

    def __init__(self, spec: EngineSpec, *, start_timeout: float | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        child_commands, self._commands = ctx.Pipe(duplex=False)
        self._outputs, child_outputs = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=run_engine_process, args=(spec, child_commands, child_outputs),
                                name="minivllm-engine", daemon=True)
        self.proc.start()
        child_commands.close()  # the child's ends: kept open here, they would hide its exit from us
        child_outputs.close()
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._gone = False
        try:
            self.started = self._wait_started(start_timeout)
        except BaseException:
            self.close(timeout=10.0)
            raise

    def _wait_started(self, timeout: float | None) -> EngineStarted:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([self._outputs, self.proc.sentinel], left)
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
        self.proc.join(5.0)
        raise EngineStartError(f"the engine process exited with status {self.proc.exitcode} while starting "
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
                ready = wait([self._outputs, self.proc.sentinel])
                if self._outputs not in ready:
                    break
                try:
                    data = self._outputs.recv_bytes()
                except (EOFError, OSError):
                    break
                on_message(data)
        finally:
            self._gone = True
            self.proc.join(5.0)
            on_lost(f"engine process exited (status {self.proc.exitcode})")

    def send(self, data: bytes) -> None:
        with self._send_lock:  # one message at a time on the pipe
            self._commands.send_bytes(data)

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
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(5.0)
        self._commands.close()
        if self._reader is None or not self._reader.is_alive():
            self._outputs.close()
