"""How long a connection may hold the server without a request: uvicorn closes a kept-alive
connection idle for ``timeout_keep_alive`` after a response, but waits forever for a request's
line and headers (on a fresh connection, or once a byte of the next request came in): every idle
or trickling client would hold a socket and its buffers for good. ``TimedHttpToolsProtocol`` adds
that deadline: a request's headers must be complete within ``header_s`` of the connection opening
or of the previous response ending, else the connection is closed. (A body in progress is the app's:
its handler reads it, and a client that stops sending is a disconnect like any other.) It is
uvicorn's httptools protocol, the HTTP parser in C: every streamed token is an HTTP chunk, and
h11's pure-Python send costs about as much again as the rest of a token's way to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class Timeouts:
    keep_alive_s: float = 5.0  # idle after a response (uvicorn's and vLLM's default)
    header_s: float = 10.0  # from opening (or the previous response) to a request's complete headers


DEFAULT_TIMEOUTS = Timeouts()


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request's headers (``config.timeout_header``)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._header_s: float = config.timeout_header
        self._header_timer: asyncio.TimerHandle | None = None

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self._header_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is not None and not self._waiting_for_headers():
            self._disarm()  # a request came in whole (its headers, at least)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._waiting_for_headers() and not self.transport.is_closing():
            self._arm()  # (a pipelined request may have started already)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


OPEN_FILES_WANTED = 65536


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files toward the hard one (as vLLM's server does): every
    connection is a file, and a common soft limit of 1,024 would refuse clients long before the
    machine runs short. The limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(OPEN_FILES_WANTED, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def timed_config(config: Any, timeouts: Timeouts) -> Any:
    """``config`` (a ``uvicorn.Config``, not loaded yet) serving with ``timeouts``."""
    config.http = TimedHttpToolsProtocol
    config.timeout_keep_alive = timeouts.keep_alive_s
    config.timeout_header = timeouts.header_s
    return config
