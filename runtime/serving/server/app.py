"""FastAPI app: OpenAI-compatible /v1/completions and /v1/chat/completions (JSON or SSE),
/v1/models, /health, /ready, /metrics. Errors use OpenAI's body: {"error": {message, type, param, code}}.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime.serving.async_engine import AsyncLLMEngine, EngineDead, EngineOverloaded, RequestStream
from runtime.serving.llm_engine import OutputDelta
from runtime.serving.server.metrics import ServerMetrics
from runtime.serving.server.protocol import ChatCompletionRequest, CompletionRequest, message_text
from traces.params import InvalidRequest, SamplingParams


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = err.get("msg", "invalid request")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    return (f"{param}: {msg}" if param else msg), param


async def merge_streams(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, OutputDelta]]:
    """Interleave several request streams as their items arrive; cancel them all on exit."""
    pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=pending.__getitem__):
                i = pending.pop(fut)
                try:
                    item = fut.result()
                except StopAsyncIteration:
                    continue
                yield i, item
                if item.finish_reason is None:
                    pending[asyncio.ensure_future(streams[i].__anext__())] = i
    finally:
        for fut in pending:
            fut.cancel()
        for s in streams:
            s.cancel()


class OpenAIServer:
    def __init__(self, engine: AsyncLLMEngine, tokenizer: Any, model_name: str) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.vocab_size = len(tokenizer)
        self.metrics = ServerMetrics(engine)

    # --- prompts ----------------------------------------------------------------------------------

    def completion_prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [self._encode(prompt)]
        elif prompt and all(isinstance(p, str) for p in prompt):
            prompts = [self._encode(p) for p in prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]
        else:
            prompts = [list(p) for p in prompt]
        if not prompts or any(not p for p in prompts):
            raise InvalidRequest("prompt: must not be empty")
        for p in prompts:
            bad = next((t for t in p if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise InvalidRequest(f"prompt: token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return prompts

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role, "content": message_text(m)} for m in req.messages]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def submit_all(self, prompts: list[list[int]], params: SamplingParams, n: int,
                   priority: int) -> list[RequestStream]:
        params = self.engine.engine.sampling_params(params)  # + the model's extra end-of-turn ids
        limit = self.engine.core.config.scheduler.max_model_len
        for p in prompts:
            if len(p) + params.max_tokens > limit:
                raise InvalidRequest(
                    f"max_tokens: the prompt ({len(p)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                    f"model's context length (max_model_len={limit})")
        streams: list[RequestStream] = []
        try:
            for p in prompts:
                for j in range(n):
                    seeded = params if params.seed is None or j == 0 else msgspec.structs.replace(
                        params, seed=params.seed + j)
                    streams.append(self.engine.submit(p, seeded, priority))
        except BaseException:
            for s in streams:
                s.cancel()
            raise
        return streams

    # --- logprobs ---------------------------------------------------------------------------------

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def completion_logprobs(self, token_ids: list[int], logprobs: list[dict[int, float]] | None) -> dict | None:
        if logprobs is None:
            return None
        return {
            "tokens": [self._token_text(t) for t in token_ids],
            "token_logprobs": [lp.get(t) for t, lp in zip(token_ids, logprobs)],
            "top_logprobs": [{self._token_text(k): v for k, v in lp.items()} for lp in logprobs],
            "text_offset": [],
        }

    def chat_logprobs(self, token_ids: list[int], logprobs: list[dict[int, float]] | None, top: int) -> dict | None:
        if logprobs is None:
            return None
        content = []
        for t, lp in zip(token_ids, logprobs):
            text = self._token_text(t)
            ranked = sorted(lp.items(), key=lambda kv: -kv[1])[:top]
            content.append({
                "token": text, "logprob": lp.get(t), "bytes": list(text.encode()),
                "top_logprobs": [{"token": self._token_text(k), "logprob": v,
                                  "bytes": list(self._token_text(k).encode())} for k, v in ranked],
            })
        return {"content": content}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def create_app(engine: AsyncLLMEngine, tokenizer: Any, model_name: str) -> FastAPI:
    server = OpenAIServer(engine, tokenizer, model_name)
    app = FastAPI(title="minivllm", version="0.1.0")
    app.state.server = server

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(InvalidRequest)
    async def _invalid_request(_: Request, exc: InvalidRequest) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(EngineOverloaded)
    async def _overloaded(_: Request, exc: EngineOverloaded) -> JSONResponse:
        return error_response(429, str(exc), kind="rate_limit_error", code="overloaded")

    @app.exception_handler(EngineDead)
    async def _dead(_: Request, exc: EngineDead) -> JSONResponse:
        return error_response(503, str(exc), kind="server_error", code="engine_dead")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), kind="invalid_request_error")

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = engine.alive
        return JSONResponse({"status": "ok" if ok else "dead"}, status_code=200 if ok else 503)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        return await health()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "minivllm"}]}

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise StarletteHTTPException(404, f"model {name!r} does not exist; this server serves {model_name!r}")

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        check_model(req.model)
        prompts = server.completion_prompts(req.prompt)
        params = req.sampling_params(req.max_tokens, req.logprobs)
        streams = server.submit_all(prompts, params, req.n, req.priority)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        prompt_tokens = sum(len(p) for p in prompts)
        base = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return EventSourceResponse(_stream_completion(server, streams, base, prompt_tokens, include_usage),
                                       ping=15)
        texts, finish, tokens, lps = await _collect(server, streams)
        choices = [{"index": i, "text": texts[i], "finish_reason": finish[i],
                    "logprobs": server.completion_logprobs(tokens[i], lps[i])} for i in range(len(streams))]
        return {**base, "choices": choices, "usage": _usage(prompt_tokens, sum(len(t) for t in tokens))}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest):
        check_model(req.model)
        prompt = server.chat_prompt(req)
        top = req.top_logprobs or 0
        params = req.sampling_params(req.max_completion_tokens or req.max_tokens,
                                     max(top, 1) if req.logprobs else None)
        streams = server.submit_all([prompt], params, req.n, req.priority)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "object": "chat.completion", "created": created, "model": model_name}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return EventSourceResponse(_stream_chat(server, streams, base, len(prompt), include_usage, top), ping=15)
        texts, finish, tokens, lps = await _collect(server, streams)
        choices = [{"index": i, "message": {"role": "assistant", "content": texts[i]}, "finish_reason": finish[i],
                    "logprobs": server.chat_logprobs(tokens[i], lps[i], top)} for i in range(len(streams))]
        return {**base, "choices": choices, "usage": _usage(len(prompt), sum(len(t) for t in tokens))}

    return app


async def _collect(server: OpenAIServer, streams: list[RequestStream]):
    n = len(streams)
    texts, finish = [""] * n, [None] * n
    tokens: list[list[int]] = [[] for _ in range(n)]
    lps: list[list | None] = [None] * n
    async for i, d in merge_streams(streams):
        texts[i] += d.text
        tokens[i] += d.token_ids
        if d.logprobs is not None:
            lps[i] = (lps[i] or []) + d.logprobs
        if d.finish_reason is not None:
            finish[i] = d.finish_reason
            server.metrics.observe(d.arrival_time, d.first_token_time, server.engine.now(), d.num_output_tokens)
    return texts, finish, tokens, lps


async def _stream(server: OpenAIServer, streams, base: dict, prompt_tokens: int, include_usage: bool,
                  choice: Callable[[int, OutputDelta], dict], first: list[dict] = ()):
    """SSE payloads: ``first`` chunks, then one chunk per delta that carries something, usage, [DONE]."""
    for chunk in first:
        yield json.dumps(chunk)
    completion_tokens = 0
    async for i, d in merge_streams(streams):
        completion_tokens += len(d.token_ids)
        if d.finish_reason is not None:
            server.metrics.observe(d.arrival_time, d.first_token_time, server.engine.now(), d.num_output_tokens)
        if not d.text and d.finish_reason is None and d.logprobs is None:
            continue  # text held back (partial character or possible stop string): nothing to send yet
        yield json.dumps({**base, "choices": [choice(i, d)]})
    if include_usage:
        yield json.dumps({**base, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
    yield "[DONE]"


def _stream_completion(server: OpenAIServer, streams, base: dict, prompt_tokens: int, include_usage: bool):
    def choice(i: int, d: OutputDelta) -> dict:
        return {"index": i, "text": d.text, "finish_reason": d.finish_reason,
                "logprobs": server.completion_logprobs(d.token_ids, d.logprobs)}

    return _stream(server, streams, base, prompt_tokens, include_usage, choice)


def _stream_chat(server: OpenAIServer, streams, base: dict, prompt_tokens: int, include_usage: bool, top: int):
    base = {**base, "object": "chat.completion.chunk"}

    def choice(i: int, d: OutputDelta) -> dict:
        return {"index": i, "delta": {"content": d.text} if d.text else {}, "finish_reason": d.finish_reason,
                "logprobs": server.chat_logprobs(d.token_ids, d.logprobs, top)}

    role = [{**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            for i in range(len(streams))]
    return _stream(server, streams, base, prompt_tokens, include_usage, choice, role)
