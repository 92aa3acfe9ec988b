"""Every failure as OpenAI's error body ``{"error": {message, type, param, code}}``, never a
plain-text 500: known exceptions map to 4xx/5xx by ``classify``; anything else is caught by the
outermost middleware (``CatchAll``) and answered 500 in the same shape. A stream that already
started gets the same body as its last event instead (runtime/serving/server/responses.py).

Messages may name a field but never quote prompt text; an unexpected exception is logged by its
type and traceback only (its message could hold a prompt).
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.serving.async_engine import EngineDead, EngineOverloaded, RequestAborted, SlowClient
from runtime.serving.server.protocol import FieldError
from traces.params import InvalidRequest, SamplingParams

log = logging.getLogger("minivllm.server")

# a leading field name in an InvalidRequest message ("max_tokens must be >= 1, got 0")
_LEADING_FIELD = re.compile(r"([a-z_]+)\b")
_KNOWN_FIELDS = frozenset(SamplingParams.__struct_fields__) | {"prompt", "messages"}
_HTTP_CODES = {413: "request_too_large"}


class ModelNotFound(LookupError):
    """A model id this server does not serve (404, as OpenAI answers it)."""

    def __init__(self, served: str) -> None:  # (the name asked for is client text: not echoed)
        super().__init__(f"no such model; this server serves {served!r}")


class Classified(Exception):
    """An error already answered elsewhere (an intake worker): its status and body as they are."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(status)
        self.status, self.body = status, body


class ErrorResponse(JSONResponse):
    """ASCII JSON: a client string with a lone surrogate (valid JSON escape) still encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None) -> ErrorResponse:
    return ErrorResponse(error_body(message, kind, param, code), status_code=status)


def _validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """(message, param) of pydantic's first error; param as OpenAI writes it (messages[0].role).
    Of a union's errors (``stop``: a string or a list), the branch whose type the value had."""
    errs = exc.errors()
    err = errs[0]
    if err.get("type", "").endswith("_type"):  # this branch's type was wrong: a sibling's error says more
        field = err.get("loc", ())[:2]
        siblings = [e for e in errs if e.get("loc", ())[:2] == field]
        # one whose value had the branch's type; else the branch that got furthest ([true, 2] as token ids)
        err = next((e for e in siblings if not e.get("type", "").endswith("_type")),
                   max(siblings, key=lambda e: len(e.get("loc", ()))))
    if err.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    param = ""
    for part in err.get("loc", ())[1:]:  # [0] is "body"
        if isinstance(part, int):
            param += f"[{part}]"
        elif str(part).isidentifier() and part not in ("str", "int", "float", "bool", "list", "dict"):
            param += f".{part}" if param else str(part)
        # else a union member's tag ("list[int]"): not a field
    msg = "unknown field" if err.get("type") == "extra_forbidden" else str(err.get("msg", "invalid request"))
    return (f"{param}: {msg}" if param else msg), (param or None)


def classify(exc: BaseException) -> tuple[int, dict]:
    """HTTP status and OpenAI error body for an exception (500 for anything unexpected)."""
    if isinstance(exc, Classified):
        return exc.status, exc.body
    if isinstance(exc, FieldError):
        return 400, error_body(str(exc), param=exc.param)
    if isinstance(exc, InvalidRequest):
        m = _LEADING_FIELD.match(str(exc))
        return 400, error_body(str(exc), param=m.group(1) if m and m.group(1) in _KNOWN_FIELDS else None)
    if isinstance(exc, RequestValidationError):
        message, param = _validation_error(exc)
        return 400, error_body(message, param=param)
    if isinstance(exc, EngineOverloaded):
        return 429, error_body(str(exc), "rate_limit_error", code="overloaded")
    if isinstance(exc, EngineDead):
        return 503, error_body(str(exc), "server_error", code="engine_dead")
    if isinstance(exc, SlowClient):
        return 503, error_body(str(exc), "server_error", code="slow_client")
    if isinstance(exc, ModelNotFound):
        return 404, error_body(str(exc), param="model", code="model_not_found")
    if isinstance(exc, RequestAborted):
        return 500, error_body(str(exc), "server_error", code="request_aborted")
    if isinstance(exc, HTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return exc.status_code, error_body(str(exc.detail), kind, code=_HTTP_CODES.get(exc.status_code))
    return 500, error_body(f"internal server error ({type(exc).__name__})", "server_error", code="internal_error")


def log_unexpected(exc: BaseException, where: str) -> None:
    """Type and stack only: the exception's message may quote the prompt."""
    log.error("unhandled %s in %s\n%s", type(exc).__name__, where, "".join(traceback.format_tb(exc.__traceback__)))


def install(app: FastAPI) -> None:
    """Handlers for the known exceptions (inside the app, so a handler's response is the answer)."""

    async def handle(_: Request, exc: Exception) -> ErrorResponse:
        status, body = classify(exc)
        return ErrorResponse(body, status_code=status)

    for cls in (Classified, RequestValidationError, InvalidRequest, EngineOverloaded, EngineDead, SlowClient,
                RequestAborted, ModelNotFound, HTTPException):
        app.add_exception_handler(cls, handle)


class CatchAll:
    """Last line: an exception no handler took becomes a 500 with an OpenAI body (or, if the
    response already started, a closed connection) instead of Starlette's plain-text 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            log_unexpected(exc, f"{scope.get('method')} {scope.get('path')}")
            if not started:
                status, body = classify(exc)
                await ErrorResponse(body, status_code=status)(scope, receive, send)
