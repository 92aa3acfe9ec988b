"""AsyncLLMEngine: one engine thread drives an ``LLMEngine``; asyncio callers stream its
``OutputDelta`` items from bounded queues.

- HTTP never bypasses the scheduler: every request goes through the same EngineCore.
- Backpressure: the command queue is bounded (``max_pending``); when full, ``generate`` raises
  ``EngineOverloaded`` (HTTP 429) at once instead of queueing without limit.
- Slow clients: each request's output queue is bounded; a consumer that falls that far behind is
  aborted (its KV freed) rather than stalling the engine thread or buffering without limit.
- Cancellation: a consumer that stops iterating (client disconnect, timeout) aborts its request;
  aborts are applied by the engine thread between steps (after completing a step in flight, when
  steps overlap) and are idempotent. A request cancelled before the engine took it in is still
  added, then aborted: every accepted request is in the log (Arrived, then Finished or Aborted),
  and the abort counters count exactly the log's ``Aborted`` events.
- Arrival: ``submit`` takes the time the server received the request (engine clock); the log's
  Arrived time and TTFT start there, not when the engine thread picked the request up.
- Steps, detokenization and stop strings are the LLMEngine's (runtime/serving/llm_engine.py), all
  on the engine thread: with overlap the next step is planned and launched before the previous
  one's tokens are back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.executor.jit_counter import JIT
from runtime.serving.llm_engine import LLMEngine, OutputDelta
from runtime.serving.warmup import WarmupReport, warm_up
from traces.params import SamplingParams


class EngineOverloaded(RuntimeError):
    """The engine's input queue is full (HTTP 429)."""


class SlowClient(RuntimeError):
    """The consumer fell a whole output queue behind; its request was aborted."""


class EngineDead(RuntimeError):
    """The engine thread has stopped (HTTP 503)."""


CLIENT_DISCONNECTED = "client disconnected"
CLIENT_TOO_SLOW = "client too slow"


@dataclass
class _Handle:
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    arrival_time: float | None = None
    cache_salt: str | None = None
    request_id: int | None = None
    done: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)
    abort_reason: str = CLIENT_DISCONNECTED


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, *, max_pending: int = 1024, output_queue_size: int = 4096,
                 on_step: Callable[[list[OutputDelta]], None] | None = None, warmup: bool = False,
                 on_ready: Callable[[WarmupReport | None], None] | None = None) -> None:
        """``on_step``: called on the engine thread after every step (e.g. flush the log);
        ``warmup``: run runtime/serving/warmup.py on the engine thread before taking requests
        (``ready`` is set after it; ``on_ready`` gets its report)."""
        self.engine = engine
        self.warmup = warmup
        self.on_ready = on_ready
        self.ready = threading.Event()
        self.warmup_report: WarmupReport | None = None
        self.jit_at_ready = 0
        self.core = engine.core
        self.stats = engine.stats
        self.output_queue_size = output_queue_size
        self.commands: queue.Queue = queue.Queue(maxsize=max_pending)
        self.on_step = on_step
        self._handles: dict[int, _Handle] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def now(self) -> float:
        return self.engine.now()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="minivllm-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self.commands.put_nowait(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def max_pending(self) -> int:
        return self.commands.maxsize

    # --- client side (asyncio) -------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0, *,
               arrival_time: float | None = None, cache_salt: str | None = None) -> RequestStream:
        """Queue a request (call from the event loop). Raises InvalidRequest, EngineOverloaded or
        EngineDead at once, so an HTTP handler can answer 400/429/503 before it starts streaming.
        ``arrival_time``: engine clock (``now()``) when the request came in (default: when added)."""
        if not self.alive:
            raise EngineDead(f"engine is not running: {type(self.error).__name__}" if self.error
                             else "engine is not running")
        self.core.validate(len(prompt_token_ids), params)
        handle = _Handle(list(prompt_token_ids), params, priority, asyncio.get_running_loop(),
                         asyncio.Queue(maxsize=self.output_queue_size), arrival_time, cache_salt)
        try:
            self.commands.put_nowait(("add", handle))
        except queue.Full:
            self.stats.rejected_overloaded += 1
            raise EngineOverloaded("the engine's request queue is full; retry later") from None
        return RequestStream(self, handle)

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                       priority: int = 0) -> AsyncIterator[OutputDelta]:
        stream = self.submit(prompt_token_ids, params, priority)
        try:
            async for item in stream:
                yield item
        finally:
            stream.cancel()

    def _cancel(self, handle: _Handle) -> None:
        if handle.done or handle.cancelled.is_set():
            return
        handle.cancelled.set()
        with contextlib.suppress(queue.Full):
            self.commands.put_nowait(("abort", handle))

    # --- engine thread -----------------------------------------------------------------------------

    def _warm_up(self) -> None:
        if self.warmup:
            self.warmup_report = warm_up(self.engine)
        # exempt the start-up heap (torch, transformers, the model) from later collections: a full
        # collection over it costs tens of ms, inside some step
        gc.collect()
        gc.freeze()
        self.jit_at_ready = JIT.count
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready(self.warmup_report)

    def _run(self) -> None:
        engine = self.engine
        try:
            self._warm_up()
            while not self._stopping.is_set():
                self._drain_commands(block=not engine.busy)
                if engine.busy:
                    self._handle_outputs(engine.step())
        except BaseException as e:  # surface to every waiting client, then stop
            self.error = e
            for handle in list(self._handles.values()):
                self._push(handle, EngineDead(f"engine failed: {type(e).__name__}"))
            raise
        finally:
            self._abort_all("shutdown")
            gc.unfreeze()  # frozen objects are never freed

    def _handle_outputs(self, deltas: list[OutputDelta]) -> None:
        gone = []
        for delta in deltas:
            handle = self._handles.get(delta.request_id)
            if handle is None:
                continue
            if delta.finished:
                handle.done = True
                del self._handles[delta.request_id]
            elif handle.cancelled.is_set():  # its abort command was lost to a full queue: abort here
                gone.append(handle)
                continue
            self._push(handle, delta)
        for handle in gone:
            if not handle.done:
                self._abort(handle)
        if self.on_step is not None:
            self.on_step(deltas)

    def _drain_commands(self, block: bool) -> None:
        try:
            cmd, handle = self.commands.get(timeout=0.2) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if cmd == "add":
                self._add(handle)
            elif cmd == "abort" and handle.request_id is not None and not handle.done:
                self._abort(handle)
            try:
                cmd, handle = self.commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, handle: _Handle) -> None:
        try:
            rid = self.engine.add_request(handle.prompt_token_ids, handle.params, priority=handle.priority,
                                          arrival_time=handle.arrival_time, cache_salt=handle.cache_salt)
        except ValueError as e:  # validated up front; the pool may have changed since (defensive)
            handle.done = True
            self._push(handle, e)
            return
        handle.request_id = rid
        self._handles[rid] = handle
        if handle.cancelled.is_set():  # the client left while it queued: logged as aborted, like any other
            self._abort(handle)

    def _abort(self, handle: _Handle) -> None:
        """Abort on the engine (engine thread); the client-abort counters count what the log shows."""
        handle.done = True
        self._handles.pop(handle.request_id, None)
        if self.engine.abort(handle.request_id, handle.abort_reason):
            if handle.abort_reason == CLIENT_TOO_SLOW:
                self.stats.slow_client_aborts += 1
            else:
                self.stats.client_aborts += 1

    def _push(self, handle: _Handle, item: Any) -> None:
        def put() -> None:
            if handle.cancelled.is_set():
                return  # dropped or cancelled: nobody reads further items
            try:
                handle.out.put_nowait(item)
            except asyncio.QueueFull:
                # the consumer fell output_queue_size items behind: drop it, free its KV
                handle.abort_reason = CLIENT_TOO_SLOW
                handle.cancelled.set()
                with contextlib.suppress(queue.Full):
                    self.commands.put_nowait(("abort", handle))
                while not handle.out.empty():  # the consumer sees the error next, not stale tokens
                    handle.out.get_nowait()
                handle.out.put_nowait(SlowClient("client fell too far behind; request aborted"))

        with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening
            handle.loop.call_soon_threadsafe(put)

    def _abort_all(self, reason: str) -> None:
        for rid, handle in list(self._handles.items()):
            handle.done = True
            with contextlib.suppress(Exception):  # after an engine error the step in flight may not complete
                self.engine.abort(rid, reason)
        self._handles.clear()


class RequestStream:
    """Async iterator over one request's OutputDelta items; ``cancel()`` aborts the request."""

    def __init__(self, engine: AsyncLLMEngine, handle: _Handle) -> None:
        self._engine = engine
        self._handle = handle
        self._finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> OutputDelta:
        if self._finished:
            raise StopAsyncIteration
        item = await self._handle.out.get()
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        if item.finish_reason is not None:
            self._finished = True
        return item

    def cancel(self) -> None:
        """Abort the request unless it already finished. Idempotent."""
        self._engine._cancel(self._handle)
