"""FastAPI app: OpenAI-compatible /v1/completions and /v1/chat/completions (JSON or SSE),
/v1/models, /health, /ready, /metrics.

A request's path: ``StampArrival`` notes when it came in (engine clock) -> ``ApiKeyGuard`` and
``BodyLimit``, the front door's checks before routing (ASGI middlewares: Starlette's
BaseHTTPMiddleware buffers streams and swallows cancellation) -> the body model (protocol.py,
intake.py) and prompt ids (prompts.py), a large body's in an intake process (intake.py) ->
``AsyncLLMEngine.submit`` with that arrival time (the engine runs in its own process,
runtime/serving/engine_process.py) -> a whole response or SSE, whose id names the request in the
engine's log (responses.py). Every failure is an OpenAI error body (errors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.serving.async_engine import AsyncLLMEngine, ResponseStream
from runtime.serving.outputs import OutputDelta
from runtime.serving.server import errors
from runtime.serving.server.endpoints import ENDPOINTS
from runtime.serving.server.health import health as health_of
from runtime.serving.server.intake import Intake
from runtime.serving.server.metrics import ServerMetrics
from runtime.serving.server.prompts import Prompts
from runtime.serving.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.serving.server.responses import (
    EventStream,
    Render,
    build,
    collect,
    id_header,
    response_ids,
    sse_events,
    usage,
)
from traces.params import SamplingParams

DEFAULT_MAX_REQUEST_BYTES = 8 << 20
T = TypeVar("T")


class StampArrival:
    """``scope["state"]["arrival_time"]``: the engine clock when the request came in, before its
    body is read, so the log's Arrived time (and TTFT) is what the client saw."""

    def __init__(self, app: ASGIApp, now) -> None:
        self.app, self.now = app, now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["arrival_time"] = self.now()
        await self.app(scope, receive, send)


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
            await errors.error_response(413, err.detail, code="request_too_large")(scope, receive, send)
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
                response = errors.error_response(
                    401, "missing or incorrect API key (Authorization: Bearer <key>)", code="invalid_api_key")
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class OpenAIServer:
    def __init__(self, engine: AsyncLLMEngine, tokenizer: Any, model_name: str, intake_workers: int = 1) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.prompts = Prompts(tokenizer, engine)
        self.intake = Intake(self.prompts, tokenizer, model_name, intake_workers)
        self.render = Render(tokenizer)
        self.metrics = ServerMetrics(engine, model_name)
        # front ends 1..N-1 of ``--api-server-count N`` all listening (set by ``serve``): until then
        # /ready says 503, so that a client sends nothing that could wait on one still starting
        self.others_listening: Callable[[], bool] = lambda: True

    def check_model(self, name: str | None) -> None:
        self.intake.check_model(name)

    def close(self) -> None:
        """Stop what the app started besides the engine (the intake workers)."""
        self.intake.close()

    def submit_all(self, prompts: list[list[int]], req: CompletionRequest | ChatCompletionRequest,
                   params: SamplingParams, raw: Request, prompt_param: str) -> list[ResponseStream]:
        """One engine request per prompt and choice, all checked before any is queued."""
        params = self.engine.sampling_params(params)  # + the model's extra end-of-turn ids
        given = req.requested_max_tokens is not None
        fitted = [self.prompts.fit(p, params, prompt_param, req.max_tokens_param, given) for p in prompts]
        arrival = raw.state.arrival_time
        streams: list[ResponseStream] = []
        try:
            for p, pp in zip(prompts, fitted):
                for j in range(req.n):
                    seeded = pp if pp.seed is None or j == 0 else msgspec.structs.replace(pp, seed=pp.seed + j)
                    streams.append(self.engine.submit(p, seeded, req.priority, arrival_time=arrival,
                                                      cache_salt=req.cache_salt))
        except BaseException:
            for s in streams:
                s.cancel()
            raise
        return streams


async def _until_disconnected(raw: Request) -> None:
    """Returns when the client hangs up (the body is read: the next ASGI message is the disconnect)."""
    try:
        while (await raw.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # can't tell: never report a disconnect
        await asyncio.Event().wait()


async def unless_gone(raw: Request, streams: Sequence[ResponseStream], work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client left first (its requests are then aborted, as a
    stream's are, instead of running to the end for nobody)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnected(raw))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        for s in streams:
            s.cancel()
        raise
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    for s in streams:
        s.cancel()
    return None


def create_app(engine: AsyncLLMEngine, tokenizer: Any, model_name: str, *, api_key: str | None = None,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, intake_workers: int = 1) -> FastAPI:
    """``intake_workers``: processes that take large requests in (runtime/serving/server/intake.py)."""
    server = OpenAIServer(engine, tokenizer, model_name, intake_workers)
    app = FastAPI(title="minivllm", version="0.1.0")
    app.state.server = server
    app.state.api_key_required = bool(api_key)
    errors.install(app)
    # outermost last: CatchAll -> StampArrival -> ApiKeyGuard -> BodyLimit -> routes
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key)
    app.add_middleware(StampArrival, now=engine.now)
    app.add_middleware(errors.CatchAll)

    @app.get("/health")
    async def health() -> JSONResponse:
        body, status = health_of(engine)
        return JSONResponse(body, status_code=status)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """200 once warmed up (every kernel compiled, every graph captured) and this front end's
        intake workers started, and (front end 0) front ends 1..N-1 listening, each only once its own
        workers are up; 503 before, as vLLM."""
        if not engine.alive:
            return await health()
        if not engine.ready.is_set():
            return JSONResponse({"status": "warming up"}, status_code=503)
        if not server.intake.up.is_set():
            return JSONResponse({"status": "starting intake workers"}, status_code=503)
        if not server.others_listening():
            return JSONResponse({"status": "starting front ends"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    card = {"id": model_name, "object": "model", "created": 0, "owned_by": "minivllm",
            "max_model_len": engine.config.scheduler.max_model_len}  # (as vLLM's card has it)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}")  # ids may hold slashes ("org/name")
    async def model(model_id: str) -> dict:
        server.check_model(model_id)
        return card

    for endpoint in ENDPOINTS:  # (the body is read by the handler: its schema, for /docs, given here)
        schema = {"requestBody": {"required": True,
                                  "content": {"application/json": {"schema": endpoint.body.model_json_schema()}}}}
        app.post(endpoint.path, openapi_extra=schema)(handler(server, endpoint))

    return app


def handler(server: OpenAIServer, endpoint: Any) -> Callable:
    """The route of one endpoint (runtime/serving/server/endpoints.py): prompt ids, one engine
    request per prompt and choice, then a whole response or SSE chunks."""

    async def handle(raw: Request, response: Response) -> Any:
        req, prompts = await server.intake.take(endpoint, raw)
        streams = server.submit_all(prompts, req, endpoint.sampling_params(req), raw, endpoint.prompt_param)
        created = int(time.time())
        prompt_tokens = sum(len(p) for p in prompts)
        render = server.render
        if req.stream:  # the headers and the first chunk say the ids: the engine reports them first
            ids = await unless_gone(raw, streams, response_ids(endpoint.id_prefix, streams))
            if ids is None:
                return _client_gone()
            base = {"id": ids[0], "object": endpoint.chunk_object, "created": created, "model": server.model_name}
            tokens = [render.choice() for _ in streams]

            def chunk(i: int, d: OutputDelta) -> dict:
                return endpoint.chunk(i, d.text, d.finish_reason,
                                      endpoint.logprobs(render, req, d.token_ids, d.logprobs, tokens[i]))

            first = endpoint.first_chunks(base, len(streams))
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return _event_stream(lambda stop: sse_events(streams, base, prompt_tokens, include_usage, chunk, first,
                                                         shutdown=stop), id_header(ids))
        outs = await unless_gone(raw, streams, collect(streams))
        if outs is None:
            return _client_gone()
        ids = await response_ids(endpoint.id_prefix, streams)  # (known: reported before any output)
        response.headers.update(id_header(ids))
        base = {"id": ids[0], "object": endpoint.object, "created": created, "model": server.model_name}

        def make() -> dict:
            choices = [endpoint.choice(i, "".join(c.text), c.finish_reason,
                                       endpoint.logprobs(render, req, c.token_ids, c.logprobs, render.choice()))
                       for i, c in enumerate(outs)]
            return {**base, "choices": choices, "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in outs))}

        return await build(make, heavy=endpoint.has_logprobs(req))

    handle.__name__ = type(endpoint).__name__.lower()
    return handle


def _event_stream(events: Callable[[anyio.Event], AsyncIterator[bytes]], headers: dict[str, str]) -> EventStream:
    """An SSE response whose events end with an error event and [DONE] when the server stops: the
    shutdown signal comes 5 s before sse-starlette cancels a stream, so clients get a clean end."""
    shutdown = anyio.Event()
    return EventStream(events(shutdown), headers=headers, ping=15, shutdown_event=shutdown, shutdown_grace_period=5)


def _client_gone() -> Response:
    """Nobody reads it; 499 (nginx's "client closed request") keeps access logs honest."""
    return errors.error_response(499, "the client closed the connection", code="client_closed")
