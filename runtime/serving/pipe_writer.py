"""One direction of a pipe between the front end and the engine process, written by a thread of its
own: the writer (the front end's event loop, the engine's step loop) never waits on the reader.

A plain ``send_bytes`` waits whenever the message is larger than what the pipe holds: a 40k-token
prompt is ~200 KB of msgpack, the kernel's default pipe holds 64 KB, and the reader drains it only
when its thread gets the GIL of a busy process (the engine's, mid-step). Waiting there stalled
every stream of that front end. So each pipe is widened to ``PIPE_BYTES`` where the system lets
it, and messages are queued and written in order by one thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import queue
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

PIPE_BYTES = 1 << 20  # Linux's default pipe-max-size: several long prompts in flight at once
# how long a pipe's reader or writer thread may wait for the GIL while the process's main thread runs
# (the engine's step loop, a front end's event loop): CPython's 5 ms default sat in the path of every
# streamed token at load (on an H200 at 0.8 load: TTFT gap 4.5-6.7 ms and ITL +10-17 % over the
# engine's, against 3.5-3.7 ms and +2-5 % at 0.5 ms)
GIL_SWITCH_S = 0.0005


def favour_pipe_threads() -> None:
    """For a process whose pipes are read and written by threads of their own (the engine process, a
    front end): they get the GIL within GIL_SWITCH_S."""
    sys.setswitchinterval(GIL_SWITCH_S)


def widen(conn: Connection) -> None:
    """Grow the pipe behind ``conn`` to PIPE_BYTES (best effort: a smaller pipe only costs waits)."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if set_size is not None:
        with contextlib.suppress(OSError):  # above the system's pipe-max-size, or over the user's quota
            fcntl.fcntl(conn.fileno(), set_size, PIPE_BYTES)


class PipeWriter:
    """``send`` queues; a thread writes. ``on_gone``: called (from that thread) when the reader is gone.
    A process that makes one has pipe threads (this one, and the reader of the pipe back): it favours
    them (``favour_pipe_threads``)."""

    def __init__(self, conn: Connection, name: str, on_gone: Callable[[], None] | None = None) -> None:
        favour_pipe_threads()
        self._conn = conn
        self._on_gone = on_gone
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.gone = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        """Never waits; dropped once the reader is gone (``gone``)."""
        if not self.gone:
            self._queue.put(data)

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self._conn.send_bytes(data)
            except OSError:
                self.gone = True
                if self._on_gone is not None:
                    self._on_gone()
                return

    def close(self, timeout: float = 10.0) -> None:
        """After what is queued is written (or ``timeout`` passed). Idempotent."""
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._conn.close()
