"""Connections that hold a server without a request, beside a replay (``bench serve
--idle-connections N --trickling-connections N``): idle ones open a connection and send nothing;
trickling ones send a request's first line one byte a second and never finish its headers. Each
costs the server a socket and its buffers until the server closes it (``serve --timeout-header``);
the report says how many it closed and after how long, and how many were still open at the end.
The replay's own latencies, against a run without them, say what they cost a normal request.
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass

TRICKLE = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # never the blank line that ends the headers
TRICKLE_EVERY_S = 1.0


@dataclass(frozen=True)
class IdleReport:
    idle: int
    trickling: int
    refused: int  # connections the server did not accept
    closed: int  # closed by the server before the end
    open_at_end: int
    lifetime_p50_s: float | None  # of those the server closed
    lifetime_max_s: float | None

    def render(self) -> str:
        held = f"idle {self.idle:,} + trickling {self.trickling:,}"
        if self.closed:
            life = f"after {self.lifetime_p50_s:.1f} s (p50), {self.lifetime_max_s:.1f} s at most"
        else:
            life = "none"
        return (f"connections without a request ({held}): {self.closed:,} closed by the server, {life}; "
                f"{self.open_at_end:,} still open at the end; {self.refused:,} refused")


def _room_for(sockets: int) -> None:
    """Raise this process's soft open-files limit to fit ``sockets`` more (as far as the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = sockets + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        top = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


class IdleClients:
    """``idle`` + ``trickling`` connections to ``host:port``, held on a thread of their own."""

    def __init__(self, host: str, port: int, idle: int, trickling: int) -> None:
        self.host, self.port, self.idle, self.trickling = host, port, idle, trickling
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="idle-clients", daemon=True)
        self._opened: dict[socket.socket, tuple[float, bool]] = {}  # socket -> (opened at, trickles)
        self._lifetimes: list[float] = []
        self._refused = 0
        self._ready = threading.Event()

    def __enter__(self) -> IdleClients:
        _room_for(self.idle + self.trickling)
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _open(self, trickles: bool) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=10)
        except OSError:
            self._refused += 1
            return
        sock.setblocking(False)
        self._opened[sock] = (time.monotonic(), trickles)

    def _hold(self) -> None:
        try:
            for i in range(self.idle + self.trickling):
                self._open(trickles=i >= self.idle)
        finally:
            self._ready.set()
        sel = selectors.DefaultSelector()
        for sock in self._opened:
            sel.register(sock, selectors.EVENT_READ)
        sent, next_byte = 0, time.monotonic()
        while not self._stop.is_set() and self._opened:
            for key, _ in sel.select(timeout=0.1):
                self._close_if_ended(sel, key.fileobj)
            if time.monotonic() >= next_byte and sent < len(TRICKLE):
                for sock, (_, trickles) in list(self._opened.items()):
                    if trickles:
                        try:
                            sock.send(TRICKLE[sent:sent + 1])
                        except OSError:
                            self._ended(sel, sock)
                sent, next_byte = sent + 1, next_byte + TRICKLE_EVERY_S
        for sock in self._opened:
            sock.close()
        sel.close()

    def _close_if_ended(self, sel: selectors.BaseSelector, sock) -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # EOF or reset: the server closed it (a response to half a request counts as data)
            self._ended(sel, sock)

    def _ended(self, sel: selectors.BaseSelector, sock) -> None:
        opened, _ = self._opened.pop(sock)
        self._lifetimes.append(time.monotonic() - opened)
        sel.unregister(sock)
        sock.close()

    def still_open(self) -> int:
        return len(self._opened)

    def report(self) -> IdleReport:
        """After the ``with`` block."""
        life = sorted(self._lifetimes)
        return IdleReport(self.idle, self.trickling, self._refused, len(life), len(self._opened),
                          life[len(life) // 2] if life else None, life[-1] if life else None)
