"""Front-door checks, before routing: the request body's size and the API key.

Both answer with OpenAI's error body. ASGI middlewares (not Starlette's BaseHTTPMiddleware, which
buffers streams and swallows cancellation).
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.serving.server.errors import error_response


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds {limit} bytes (--max-request-bytes)")


class BodyLimit:
    """413 for a body over ``max_bytes``: at once from its Content-Length, or while reading a
    chunked one (FastAPI re-raises an HTTPException from the read, so the app's handler answers)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            err = BodyTooLarge(self.max_bytes)
            await error_response(413, err.detail, code="request_too_large")(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)


class ApiKeyGuard:
    """``Authorization: Bearer <key>`` on every path (as vLLM's ``--api-key``; the API's schema and
    docs pages too) but the probes and the scrape, which stay open; a 401 names the scheme
    (``WWW-Authenticate: Bearer``, RFC 6750)."""

    OPEN = frozenset({"/health", "/ready", "/metrics"})

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.OPEN:
            given = Headers(scope=scope).get("authorization", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, self.expected):  # constant time: no key guessing by timing
                response = error_response(401, "missing or incorrect API key (Authorization: Bearer <key>)",
                                          code="invalid_api_key")
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
