"""The load client's HTTP: one streaming POST at a time per connection, HTTP/1.1 over asyncio streams,
responses parsed by httptools (uvicorn's C parser), idle connections kept for the next request.

httpx (pure-Python h11 under anyio) costs a client time per request: on a light load against one
server (a fake engine of 4 ms steps), the client's TTFT minus the engine's was 4.3 ms with httpx and
3.0 ms with this, paired per request (the server's own part, engine to first event sent, is 0.8 ms).
This does the least HTTP a benchmark needs: ``http://`` or ``https://``, a body sent whole, a response read as
lines of its (de-chunked) body as they arrive.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httptools

CHUNK = 1 << 16


class HttpError(RuntimeError):
    """The server broke the protocol, or closed the connection before it answered."""


class _Parsed:
    """httptools' callbacks: what has arrived of one response."""

    def __init__(self) -> None:
        self.headers_done = False
        self.done = False
        self.body: list[bytes] = []

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(bytes(body))

    def on_message_complete(self) -> None:
        self.done = True


class Response:
    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._parsed = _Parsed()
        self._parser = httptools.HttpResponseParser(self._parsed)

    @property
    def status(self) -> int:
        return self._parser.get_status_code()

    @property
    def keep_alive(self) -> bool:
        """Read to its end, on a connection the server keeps open."""
        return self._parsed.done and self._parser.should_keep_alive()

    async def _headers(self) -> None:
        while not self._parsed.headers_done:
            if not await self._more():
                raise HttpError("the server closed the connection before answering")

    async def _more(self) -> bool:
        """Feed the parser what arrives next; False at the end of the body (or of the connection:
        a body that runs to the close ends there; the caller sees whether it was whole)."""
        if self._parsed.done:
            return False
        data = await self._reader.read(CHUNK)
        if not data:
            return False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise HttpError(f"bad HTTP from the server: {e}") from None
        return True

    async def read(self) -> bytes:
        while await self._more():
            pass
        body, self._parsed.body = b"".join(self._parsed.body), []
        return body

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines (without their end), each as soon as it is whole."""
        pending = b""
        more = True
        while more:
            if self._parsed.body:
                pending += b"".join(self._parsed.body)
                self._parsed.body = []
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    yield line.rstrip(b"\r").decode("utf-8", "replace")
            more = await self._more()
        if pending:  # a last line without its end
            yield pending.rstrip(b"\r").decode("utf-8", "replace")


class HttpStreamClient:
    """POSTs to one server (``base_url``: scheme, host, port and a path prefix), at most
    ``max_connections`` at once."""

    def __init__(self, base_url: str, max_connections: int) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        self._host_header = url.netloc.encode()
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    @asynccontextmanager
    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[Response]:
        """The response, once its headers are in; its connection is kept if it was read to the end."""
        async with self._slots:
            reader, writer = self._idle.pop() if self._idle else await asyncio.open_connection(
                self.host, self.port, ssl=self.ssl)
            keep = False
            try:
                head = [b"POST " + (self.prefix + path).encode() + b" HTTP/1.1", b"Host: " + self._host_header,
                        b"Content-Length: " + str(len(body)).encode()]
                head += [f"{k}: {v}".encode() for k, v in headers.items()]
                writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
                response = Response(reader)
                await response._headers()
                yield response
                keep = response.keep_alive
            finally:
                if keep:
                    self._idle.append((reader, writer))
                else:
                    writer.close()
