"""One direction of a pipe between the front end and the engine process, written by a thread of its
own: the writer (the front end's event loop, the engine's step loop) never waits on the reader.

A plain ``send_bytes`` waits whenever the message is larger than what the pipe holds: a 40k-token
prompt is ~200 KB of msgpack, the kernel's default pipe holds 64 KB, and the reader drains it only
when its thread gets the GIL of a busy process (the engine's, mid-step). Waiting there stalled
every stream of that front end. So each pipe is widened to ``PIPE_BYTES`` where the system lets
it, and what the pipe cannot take at once is queued and written in order by one thread.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import select
import struct
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
_HEADER = struct.Struct("!i")  # Connection.send_bytes's length prefix (for messages under 2 GiB)
_MAX_FRAME = 0x7FFFFFFF


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
    """``send`` never waits. A message is written at once when nothing is queued before it and the
    pipe has room (the usual case: no thread hand-over, which costs up to GIL_SWITCH_S in a busy
    process); what does not fit is queued and written in order by a thread. Framed as
    ``Connection.send_bytes`` frames it, so the reader's ``recv_bytes`` reads it. ``on_gone``: called
    (from whichever thread wrote) when the reader is gone. A process that makes one has pipe threads
    (this one, and the reader of the pipe back): it favours them (``favour_pipe_threads``)."""

    def __init__(self, conn: Connection, name: str, on_gone: Callable[[], None] | None = None) -> None:
        favour_pipe_threads()
        self._conn = conn
        self._fd = conn.fileno()
        os.set_blocking(self._fd, False)  # this end only: the reader's is another open file
        self._on_gone = on_gone
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # a frame queued, or closing
        self._queue: collections.deque[memoryview] = collections.deque()  # the first: being written
        self._closing = False
        self.gone = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        """Never waits; dropped once the reader is gone (``gone``)."""
        if len(data) > _MAX_FRAME:
            raise ValueError(f"a message of {len(data)} bytes is larger than a frame holds")
        frame = memoryview(_HEADER.pack(len(data)) + data)
        with self._lock:
            if self.gone or self._closing:
                return
            if not self._queue:
                written = self._write(frame)
                if written == len(frame):
                    return
                frame = frame[written:]
            if not self.gone:
                self._queue.append(frame)
                self._ready.notify()
                return
        self._lost()

    def _write(self, frame: memoryview) -> int:
        """Bytes of ``frame`` the pipe took now (0 when full, or when the reader is gone: ``gone``).
        Called with the lock held."""
        try:
            return os.write(self._fd, frame)
        except BlockingIOError:
            return 0
        except OSError:
            self.gone = True
            self._queue.clear()
            return 0

    def _lost(self) -> None:
        if self._on_gone is not None:
            self._on_gone()

    def _run(self) -> None:
        room = select.poll()
        room.register(self._fd, select.POLLOUT)
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:  # closing, everything written
                    return
                frame = self._queue[0]  # a sender queues behind it meanwhile: order kept
            room.poll()  # wait for room in the pipe, the lock free
            with self._lock:
                if self._conn.closed:  # closed after a timeout: its descriptor may be another file's now
                    return
                written = self._write(frame)
                if not self.gone:
                    if written == len(frame):
                        self._queue.popleft()
                    else:
                        self._queue[0] = frame[written:]
            if self.gone:
                return self._lost()

    def close(self, timeout: float = 10.0) -> None:
        """After what is queued is written (or ``timeout`` passed). Idempotent."""
        with self._lock:
            self._closing = True
            self._ready.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            self._conn.close()
