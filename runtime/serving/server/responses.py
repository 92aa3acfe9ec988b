"""Engine output -> OpenAI response bodies: whole (collected) or as SSE chunks, and the ids they carry.

Per-token logprob text and bytes come from runtime/serving/server/token_text.py (one incremental
decoder per choice); a whole response that carries logprobs is built in a worker thread, so a big
batch never holds the event loop.
A stream that fails after it started ends with an OpenAI error body as its last event, then
``[DONE]`` (vLLM's behaviour; the ``openai`` client raises it as an APIError).

Ids: each engine request's name in the server's event log (traces/request_names.py) behind the
endpoint's prefix, ``cmpl-<run>-<request id>`` (one engine) or ``cmpl-<run>-<replica>-<request id>``
(a data-parallel fleet). A call is one engine request per prompt and choice. Its body's ``id``
(every streamed chunk's too) names the first; the ``X-Request-Id`` header lists them all,
comma-separated, in the order of the choices' ``index``. The engine reports a request's log id as
it takes the request in, before any output of it, so a stream's headers and first chunk wait for
at most one engine iteration, never for a token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from sse_starlette.sse import EventSourceResponse
from starlette.types import Message, Send

from runtime.serving.async_engine import EngineDead, ResponseStream
from runtime.serving.outputs import OutputDelta
from runtime.serving.server.errors import classify, log_unexpected
from runtime.serving.server.token_text import ChoiceTokens, TokenBytes

HEADER = "X-Request-Id"


async def response_ids(prefix: str, streams: Sequence[ResponseStream]) -> list[str]:
    """``<prefix>-<name>`` of each stream's request, once the engine reported them all. Raises what
    ended a request that has none (refused, the engine gone), having cancelled them all."""
    try:
        names = [await s.name() for s in streams]
    except BaseException:
        for s in streams:
            s.cancel()
        raise
    return [f"{prefix}-{name}" for name in names]


def id_header(ids: Sequence[str]) -> dict[str, str]:
    return {HEADER: ", ".join(ids)}


class EventStream(EventSourceResponse):
    """The SSE response of a stream: sse-starlette's, less its per-event cost. It wraps every
    event's send in a timeout scope (``anyio.move_on_after``), even without a timeout; a token's
    event is a few hundred bytes, and the scope costs about as much as writing them. With no
    ``send_timeout`` (ours: a slow client is caught by its bounded queue,
    runtime/serving/async_engine.py) an event is sent as it is."""

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


async def merge_streams(streams: Sequence[ResponseStream]) -> AsyncIterator[tuple[int, OutputDelta]]:
    """Interleave several request streams as their items arrive; cancel them all on exit."""
    if len(streams) == 1:  # the common case, without a task per item
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            streams[0].cancel()
        return
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


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass
class Collected:
    """Everything the engine sent for one choice."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None


async def collect(streams: Sequence[ResponseStream]) -> list[Collected]:
    out = [Collected() for _ in streams]
    async for i, d in merge_streams(streams):
        c = out[i]
        c.text.append(d.text)
        c.token_ids += d.token_ids
        if d.logprobs is not None:
            c.logprobs = (c.logprobs or []) + d.logprobs
        if d.finish_reason is not None:
            c.finish_reason = d.finish_reason
    return out


class Render:
    """Logprobs in the completions and chat shapes; ``choice()`` makes the state one choice's
    tokens share (runtime/serving/server/token_text.py), kept across a stream's chunks."""

    def __init__(self, tokenizer: Any) -> None:
        self.token_bytes = TokenBytes(tokenizer)

    def choice(self) -> ChoiceTokens:
        return ChoiceTokens(self.token_bytes)

    def completion_logprobs(self, token_ids: list[int], logprobs: list[dict[int, float]] | None,
                            tokens: ChoiceTokens) -> dict | None:
        if logprobs is None:
            return None
        texts, offsets, tops = [], [], []
        for t, lp in zip(token_ids, logprobs):
            top = {tokens.peek(k)[0]: v for k, v in lp.items()}
            text, _, offset = tokens.add(t)
            texts.append(text)
            offsets.append(offset)
            tops.append(top)
        return {"tokens": texts, "token_logprobs": [lp.get(t) for t, lp in zip(token_ids, logprobs)],
                "top_logprobs": tops, "text_offset": offsets}

    def chat_logprobs(self, token_ids: list[int], logprobs: list[dict[int, float]] | None, top: int,
                      tokens: ChoiceTokens) -> dict | None:
        if logprobs is None:
            return None
        content = []
        for t, lp in zip(token_ids, logprobs):
            ranked = []
            for k, v in sorted(lp.items(), key=lambda kv: -kv[1])[:top]:
                text, data = tokens.peek(k)
                ranked.append({"token": text, "logprob": v, "bytes": list(data)})
            text, data, _ = tokens.add(t)
            content.append({"token": text, "logprob": lp.get(t), "bytes": list(data), "top_logprobs": ranked})
        return {"content": content}


async def build(make: Callable[[], dict], heavy: bool) -> dict:
    """``make()`` in a worker thread when it decodes many tokens (logprobs), else inline."""
    return await asyncio.to_thread(make) if heavy else make()


async def sse_events(streams: Sequence[ResponseStream], base: dict, prompt_tokens: int, include_usage: bool,
                     choice: Callable[[int, OutputDelta], dict], first: Sequence[dict] = (),
                     shutdown: anyio.Event | None = None) -> AsyncIterator[bytes]:
    """SSE events, encoded: ``first`` chunks, one chunk per delta that carries something, usage,
    [DONE]; on a failure after the start (``shutdown`` set included), an error event then [DONE]."""
    stopper = asyncio.ensure_future(_fail_on(shutdown, streams)) if shutdown is not None else None
    # every chunk is ``base`` plus its choice: ``base`` is encoded once, not once per token
    head, tail = b"data: " + msgspec.json.encode(base)[:-1] + b',"choices":[', b"]}\r\n\r\n"
    encode = msgspec.json.encode
    try:
        for chunk in first:
            yield _event(chunk)
        completion_tokens = 0
        async for i, d in merge_streams(streams):
            completion_tokens += len(d.token_ids)
            if not d.text and d.finish_reason is None and d.logprobs is None:
                continue  # text held back (partial character or possible stop string): nothing to send yet
            yield head + encode(choice(i, d)) + tail
        if include_usage:
            yield _event({**base, "choices": [], "usage": usage(prompt_tokens, completion_tokens)})
    except Exception as exc:  # the status line is gone: say it in the stream (client disconnects aren't Exceptions)
        status, body = classify(exc)
        if status >= 500 and body["error"]["code"] == "internal_error":
            log_unexpected(exc, "a stream")
        yield _event(body)
    finally:
        if stopper is not None:
            stopper.cancel()
    yield b"data: [DONE]\r\n\r\n"


def _event(payload: dict) -> bytes:
    """One SSE event (sse-starlette sends bytes as they are): msgspec's JSON is several times
    faster than json.dumps, and this runs once per streamed chunk."""
    return b"data: " + msgspec.json.encode(payload) + b"\r\n\r\n"


async def _fail_on(shutdown: anyio.Event, streams: Sequence[ResponseStream]) -> None:
    """When the server starts stopping, end the streams with EngineDead (one waiter per response,
    not a race per streamed item)."""
    await shutdown.wait()
    for s in streams:
        s.fail(EngineDead("the server is shutting down"))
