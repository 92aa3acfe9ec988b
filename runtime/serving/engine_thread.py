"""The engine loop on a thread of the server's own process: for tests (fake executors don't cross
a process boundary) and ``minivllm serve --no-engine-process``. It shares the GIL with HTTP; the
engine process (runtime/serving/engine_process.py) does not.

Commands and messages go through as the same msgpack bytes the process connection carries, so
the tests that run here check the protocol too.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from runtime.serving.engine_loop import EngineLoop, describe
from runtime.serving.engine_protocol import Command, Shutdown, decode_command
from runtime.serving.llm_engine import LLMEngine


class EngineThread:
    def __init__(self, engine: LLMEngine, *, warmup: bool = False) -> None:
        self.engine = engine
        self.warmup = warmup
        self.started = describe(engine)
        self._inbox: queue.Queue[tuple[int, Command]] = queue.Queue()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return self.engine.now()

    def start(self, on_message: Callable[[bytes], None], on_lost: Callable[[str], None]) -> None:
        if self._thread is not None:
            return
        loop = EngineLoop(self.engine, self._inbox, [on_message], warmup=self.warmup)

        def run() -> None:
            try:
                loop.run()
            finally:
                on_lost("engine thread stopped")

        self._thread = threading.Thread(target=run, name="minivllm-engine", daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        self._inbox.put((0, decode_command(data)))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        self._inbox.put((0, Shutdown()))
        if self._thread is not None:
            self._thread.join(timeout)
