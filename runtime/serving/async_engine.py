"""AsyncLLMEngine: one engine thread owns ``step()``; asyncio callers stream from bounded queues.

- HTTP never bypasses the scheduler: every request goes through the same EngineCore.
- Backpressure: the command queue is bounded (``max_pending``); when full, ``generate`` raises
  ``EngineOverloaded`` (HTTP 429) at once instead of queueing without limit.
- Slow clients: each request's output queue is bounded; a consumer that falls that far behind is
  aborted (its KV freed) rather than stalling the engine thread or buffering without limit.
- Cancellation: a consumer that stops iterating (client disconnect, timeout) aborts its request;
  aborts are applied by the engine thread between steps (after completing a step in flight, when
  steps overlap) and are idempotent.
- Steps run through a StepLoop (runtime/engine/step_loop.py): with ``overlap`` the next step is planned
  and launched before the previous one's tokens are back.
- Stop strings: the engine thread detokenizes, and finishes a request whose text hit a stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.engine.core import EngineCore
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import Executor, RequestDelta, StepOutput
from runtime.serving.detokenizer import apply_delta
from traces.params import SamplingParams


class EngineOverloaded(RuntimeError):
    """The engine's input queue is full (HTTP 429)."""


class SlowClient(RuntimeError):
    """The consumer fell a whole output queue behind; its request was aborted."""


class EngineDead(RuntimeError):
    """The engine thread has stopped (HTTP 503)."""


@dataclass(frozen=True, slots=True)
class StreamDelta:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    logprobs: list[dict[int, float]] | None = None
    # seconds on the engine clock: arrival and first token (for metrics)
    arrival_time: float = 0.0
    first_token_time: float | None = None


@dataclass
class _Handle:
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    detokenizer: Any
    request_id: int | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    num_output_tokens: int = 0
    done: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)


class EngineStats:
    """Counters the server exports; updated by the engine thread (ints: atomic under the GIL)."""

    def __init__(self) -> None:
        self.requests_finished: dict[str, int] = {}
        self.rejected_overloaded = 0
        self.slow_client_aborts = 0
        self.client_aborts = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0
        self.preemptions = 0
        self.prefix_hit_tokens = 0


class AsyncLLMEngine:
    def __init__(
        self,
        core: EngineCore,
        executor: Executor,
        detokenizer_factory: Callable[[list[int], SamplingParams], Any],
        *,
        max_pending: int = 1024,
        output_queue_size: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        on_step: Callable[[Any], None] | None = None,
        overlap: bool = False,
    ) -> None:
        self.core = core
        self.executor = executor
        self.loop = StepLoop(core, executor, self.now, overlap=overlap)
        self.detokenizer_factory = detokenizer_factory
        self.output_queue_size = output_queue_size
        self.commands: queue.Queue = queue.Queue(maxsize=max_pending)
        self.stats = EngineStats()
        self.on_step = on_step
        self._clock = clock
        self._t0 = clock()
        self._handles: dict[int, _Handle] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock() - self._t0

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

    # --- client side (asyncio) -------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0) -> RequestStream:
        """Queue a request (call from the event loop). Raises InvalidRequest, EngineOverloaded or
        EngineDead at once, so an HTTP handler can answer 400/429/503 before it starts streaming."""
        if not self.alive:
            raise EngineDead(f"engine is not running: {self.error!r}" if self.error else "engine is not running")
        self.core.validate(len(prompt_token_ids), params)
        prompt = list(prompt_token_ids)
        handle = _Handle(prompt, params, priority, asyncio.get_running_loop(),
                         asyncio.Queue(maxsize=self.output_queue_size),
                         self.detokenizer_factory(prompt, params))
        try:
            self.commands.put_nowait(("add", handle))
        except queue.Full:
            self.stats.rejected_overloaded += 1
            raise EngineOverloaded("the engine's request queue is full; retry later") from None
        return RequestStream(self, handle)

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                       priority: int = 0) -> AsyncIterator[StreamDelta]:
        stream = self.submit(prompt_token_ids, params, priority)
        try:
            async for item in stream:
                yield item
        finally:
            stream.cancel()

    def _cancel(self, handle: _Handle) -> None:
        if handle.done:
            return
        if not handle.cancelled.is_set():
            self.stats.client_aborts += 1
        handle.cancelled.set()
        with contextlib.suppress(queue.Full):
            self.commands.put_nowait(("abort", handle))

    # --- engine thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        core, loop = self.core, self.loop
        try:
            while not self._stopping.is_set():
                idle = not core.has_unfinished() and not loop.busy
                self._drain_commands(block=idle)
                if not core.has_unfinished() and not loop.busy:
                    continue
                self._handle_outputs(loop.step())
        except BaseException as e:  # surface to every waiting client, then stop
            self.error = e
            for handle in list(self._handles.values()):
                self._push(handle, EngineDead(f"engine failed: {e!r}"))
            raise
        finally:
            self._abort_all("shutdown")

    def _handle_outputs(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            if out.result is None:
                continue
            self.stats.steps += 1
            self.stats.preemptions += len(out.plan.preempted)
            self.stats.prefix_hit_tokens += sum(a.num_cached_tokens for a in out.plan.admitted)
            now = self.now()
            for delta in out.deltas:
                self._deliver(delta, now)
            if self.on_step is not None:
                self.on_step(out)

    def _drain_commands(self, block: bool) -> None:
        try:
            cmd, handle = self.commands.get(timeout=0.2) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if cmd == "add":
                self._add(handle)
            elif cmd == "abort" and handle.request_id is not None and not handle.done:
                self._handle_outputs(self.loop.drain())  # never abort a request inside a step in flight
                if not handle.done:  # (it may have finished in that step)
                    handle.done = True
                    self._handles.pop(handle.request_id, None)
                    self.core.abort(handle.request_id, self.now(), "client disconnected")
            try:
                cmd, handle = self.commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, handle: _Handle) -> None:
        if handle.cancelled.is_set():
            return
        now = self.now()
        try:
            rid = self.core.add_request(handle.prompt_token_ids, handle.params, now, handle.priority)
        except ValueError as e:  # validated up front; the pool may have changed since (defensive)
            handle.done = True
            self._push(handle, e)
            return
        handle.request_id = rid
        handle.arrival_time = now
        self._handles[rid] = handle
        self.stats.prompt_tokens += len(handle.prompt_token_ids)

    def _deliver(self, delta: RequestDelta, now: float) -> None:
        handle = self._handles.get(delta.request_id)
        if handle is None:
            return
        if handle.first_token_time is None:
            handle.first_token_time = now
        handle.num_output_tokens += len(delta.new_token_ids)
        self.stats.generation_tokens += len(delta.new_token_ids)
        text, finish, stop_hit = apply_delta(handle.detokenizer, delta.new_token_ids, delta.finish_reason)
        if stop_hit:
            self.core.finish(delta.request_id, now, "stop")
        item = StreamDelta(text, delta.new_token_ids, finish, len(handle.prompt_token_ids),
                           handle.num_output_tokens, delta.logprobs, handle.arrival_time, handle.first_token_time)
        if finish is not None:
            handle.done = True
            del self._handles[delta.request_id]
            self.stats.requests_finished[finish] = self.stats.requests_finished.get(finish, 0) + 1
        self._push(handle, item)

    def _push(self, handle: _Handle, item: Any) -> None:
        def put() -> None:
            if handle.cancelled.is_set():
                return  # dropped or cancelled: nobody reads further items
            try:
                handle.out.put_nowait(item)
            except asyncio.QueueFull:
                # the consumer fell output_queue_size items behind: drop it, free its KV
                handle.cancelled.set()
                self.stats.slow_client_aborts += 1
                with contextlib.suppress(queue.Full):
                    self.commands.put_nowait(("abort", handle))
                while not handle.out.empty():  # the consumer sees the error next, not stale tokens
                    handle.out.get_nowait()
                handle.out.put_nowait(SlowClient("client fell too far behind; request aborted"))

        with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening
            handle.loop.call_soon_threadsafe(put)

    def _abort_all(self, reason: str) -> None:
        with contextlib.suppress(Exception):  # after an engine error the step may not complete
            self.loop.drain()
        for rid, handle in list(self._handles.items()):
            handle.done = True
            self.core.abort(rid, self.now(), reason)
        self._handles.clear()


class RequestStream:
    """Async iterator over one request's StreamDelta items; ``cancel()`` aborts the request."""

    def __init__(self, engine: AsyncLLMEngine, handle: _Handle) -> None:
        self._engine = engine
        self._handle = handle
        self._finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamDelta:
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
