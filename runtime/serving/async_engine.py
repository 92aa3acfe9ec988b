"""AsyncLLMEngine: the server's front end to its engine. asyncio callers ``submit`` requests and
stream their ``OutputDelta`` items from bounded queues; the engine runs elsewhere, behind an
``EngineConnection``:

- ``EngineProcess`` (runtime/serving/engine_process.py, what ``minivllm serve`` runs): the engine
  in a child process with its own interpreter, so HTTP, JSON and SSE work never holds the GIL the
  step loop needs (vLLM V1's AsyncLLM / EngineCore split). This process never imports torch.
- ``EngineThread`` (runtime/serving/engine_thread.py): the same engine loop on a thread of this
  process (tests with fake executors, ``--no-engine-process``).

Both speak runtime/serving/engine_protocol.py. The front end owns:

- Validation before queueing (the engine's own rule on its config,
  runtime/engine/admission.py), so an HTTP handler can answer 400/429/503 before it starts streaming.
- Backpressure: at most ``max_pending`` requests sent but not yet taken in by the engine (it tells
  how many it took with every message); past that, ``submit`` raises ``EngineOverloaded`` (429).
- Slow clients: each request's output queue is bounded; a consumer that falls that far behind is
  aborted (its KV freed) rather than buffering without limit.
- Cancellation: a consumer that stops iterating (client disconnect, timeout) aborts its request.
- Arrival: ``submit`` takes the time the server received the request, on the engine's clock
  (``now()``); the log's Arrived time and TTFT start there.
- Order: of an engine message's deltas, those carrying a request's first tokens reach their streams
  first. An event loop runs the streams in the order their items arrive: a first token queued
  behind every running stream's next one would wait for all of them to be sent (TTFT the engine
  did not spend), while a running stream's token waits only for the few new ones.
- Each request's name in the log: the engine reports the id its log gives a request when it takes
  the request in, before any output of it (``StepOutputs.added``); ``RequestStream.name()`` waits
  for it and says it with the run (``EngineStarted.run_id``) and, in a fleet, the replica
  (traces/request_names.py): what the server's response ids are made of.
- A request the engine aborted on its own (its logits went non-finite): its stream ends with
  ``RequestAborted`` naming why; the other streams go on.
- Engine death: every open stream ends with ``EngineDead``; ``alive`` turns False (/health 503)
  and ``on_dead`` is called once (``minivllm serve`` then exits: runtime/cli/serve.py).
- The engine's counters and gauges as of its last message (``state``, ``stats``), for /metrics;
  its latency observations go to ``observer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from runtime.engine.admission import validate_request
from runtime.engine.routers import ReplicaLoad
from runtime.serving.engine_loop import CLIENT_DISCONNECTED, CLIENT_TOO_SLOW
from runtime.serving.engine_protocol import (
    AbortRequest,
    AddRequest,
    EngineFailed,
    EngineReady,
    EngineStarted,
    EngineState,
    StepOutputs,
    decode_message,
    encode,
)
from runtime.serving.engine_thread import EngineThread
from runtime.serving.llm_engine import EngineStats, LLMEngine, OutputDelta, StepTimings, with_extra_eos
from runtime.serving.output_queue import OutputQueue
from runtime.serving.warmup import WarmupReport
from traces.params import InvalidRequest, SamplingParams
from traces.request_names import RequestName

__all__ = ["CLIENT_DISCONNECTED", "CLIENT_TOO_SLOW", "AsyncLLMEngine", "EngineConnection", "EngineDead",
           "EngineOverloaded", "RequestAborted", "RequestStream", "ResponseStream", "SlowClient", "merge_deltas"]


_CANCELLED = "the request was cancelled before the engine took it in"


class EngineOverloaded(RuntimeError):
    """Too many requests wait for the engine to take them in (HTTP 429)."""


class SlowClient(RuntimeError):
    """The consumer fell a whole output queue behind; its request was aborted."""


class EngineDead(RuntimeError):
    """The engine has stopped (HTTP 503). ``failed``: on an error of its own (``EngineFailed``), not
    because its process or thread vanished."""

    def __init__(self, message: str = "", failed: bool = False) -> None:
        super().__init__(message)
        self.failed = failed


class RequestAborted(RuntimeError):
    """The engine aborted this one request (HTTP 500; the message says why, never the prompt)."""


class EngineConnection(Protocol):
    """Where the engine runs. ``start`` delivers each encoded engine message to ``on_message`` and,
    once no more can come, calls ``on_lost`` (on a thread of the connection's own)."""

    started: EngineStarted

    def now(self) -> float: ...
    def start(self, on_message: Callable[[bytes], None], on_lost: Callable[[str], None]) -> None: ...
    def send(self, data: bytes) -> None: ...  # an encoded command; OSError once the engine is gone
    @property
    def alive(self) -> bool: ...
    def close(self, timeout: float) -> None: ...


@dataclass(eq=False)
class _Handle:
    key: int
    loop: asyncio.AbstractEventLoop
    out: OutputQueue
    waiting_tokens: int = 0  # its prompt's tokens until its first token comes (what a router reads)
    done: bool = False  # its last item is queued, or it was cancelled: nothing more goes in
    log_id: int | None = None  # the id the engine's log gives it, once reported (event loop)
    error: BaseException | None = None  # what ended it, if something did
    waiter: asyncio.Future | None = None  # someone waits for ``log_id``


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine | None = None, *, connection: EngineConnection | None = None,
                 max_pending: int = 1024, output_queue_size: int = 4096, warmup: bool = False,
                 on_ready: Callable[[WarmupReport | None], None] | None = None, front_end: int = 0,
                 front_ends: int = 1) -> None:
        """``engine``: run this LLMEngine on a thread here (``warmup``: run runtime/serving/warmup.py
        first); or ``connection``: an engine elsewhere. ``ready`` is set once it is warmed up
        (``on_ready`` gets the warm-up report). ``front_end`` of ``front_ends`` sharing one engine
        process: this one's request keys are those k with k % front_ends == front_end."""
        if (engine is None) == (connection is None):
            raise ValueError("give an engine or a connection")
        self.engine = engine  # the in-process one (tests look inside it), else None
        self.connection: EngineConnection = connection or EngineThread(engine, warmup=warmup)
        started = self.connection.started
        self.config = started.config
        self.model_identity = started.model_identity
        self.extra_eos = tuple(started.extra_eos)
        self.run_id = started.run_id  # the engine's log's name for this run
        self.replica: int | None = None  # its place in a data-parallel fleet (the fleet sets it)
        self.output_queue_size = output_queue_size
        self._max_pending = max_pending
        self.on_ready = on_ready
        self.ready = threading.Event()
        self.warmup_report: WarmupReport | None = None
        self.jit_at_ready = 0
        self.state = EngineState(EngineStats(), kv_blocks_total=self.config.cache.num_blocks)
        self.observer: Callable[[StepTimings], None] | None = None  # the server's latency histograms
        # the request ids the engine gave the adds it took, and the keys it refused (a fleet's router log)
        self.on_added: Callable[[dict[int, int], dict[int, str]], None] | None = None
        self.rejected_overloaded = 0  # 429s at this door
        self.error: EngineDead | None = None
        self.on_dead: Callable[[str], None] | None = None  # called once, on the connection's thread
        self._handles: dict[int, _Handle] = {}  # by key: the request's id here and in the engine
        self._lock = threading.Lock()  # one writer at a time; the counts below match what was sent
        self._next_key, self._key_step = front_end, front_ends
        self._sent = self._adds_sent = 0

    # --- lifecycle -------------------------------------------------------------------------------

    def now(self) -> float:
        """The engine's clock (seconds since it started): what arrival times are stamped with."""
        return self.connection.now()

    def start(self) -> None:
        self.connection.start(self._on_message, self._lost)

    def shutdown(self, timeout: float = 30.0) -> None:
        self.connection.close(timeout)

    @property
    def alive(self) -> bool:
        return self.error is None and self.connection.alive

    @property
    def max_pending(self) -> int:
        return self._max_pending

    @property
    def stats(self) -> EngineStats:
        return self.state.stats

    @property
    def settled(self) -> bool:
        """The engine took in every command sent and has nothing to run: ``state`` is final."""
        return self.state.commands_taken == self._sent and not self.state.busy

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise InvalidRequest if the engine could never serve such a request."""
        validate_request(self.config, num_prompt_tokens, params)

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        """``params`` plus the model's extra end-of-turn ids, as the engine adds them."""
        return with_extra_eos(params, self.extra_eos)

    # --- client side (asyncio) -------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0, *,
               arrival_time: float | None = None, cache_salt: str | None = None) -> RequestStream:
        """Queue a request (call from the event loop). Raises InvalidRequest, EngineOverloaded or
        EngineDead at once. ``arrival_time``: ``now()`` when the request came in (default: when
        the engine takes it in)."""
        if not self.alive:
            raise EngineDead(str(self.error) if self.error else "engine is not running")
        self.validate(len(prompt_token_ids), params)
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.error is not None:  # lost since the check above
                raise EngineDead(str(self.error))
            if self._adds_sent - self.state.adds_taken >= self._max_pending:
                self.rejected_overloaded += 1
                raise EngineOverloaded("the engine's request queue is full; retry later")
            key = self._next_key
            self._next_key += self._key_step
            handle = _Handle(key, loop, OutputQueue(self.output_queue_size), len(prompt_token_ids))
            self._handles[key] = handle  # before it is sent: its first token may come at once
            try:
                self._send(AddRequest(key, list(prompt_token_ids), params, priority, arrival_time, cache_salt))
            except EngineDead:
                del self._handles[key]
                raise
            self._adds_sent += 1
        return RequestStream(self, handle)

    @property
    def next_key(self) -> int:
        """The key the next ``submit`` gives its request (its AddRequest's; ``on_added`` reports by key)."""
        return self._next_key

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                       priority: int = 0) -> AsyncIterator[OutputDelta]:
        stream = self.submit(prompt_token_ids, params, priority)
        try:
            async for item in stream:
                yield item
        finally:
            stream.cancel()

    def _send(self, command: Any) -> None:
        """Under ``_lock``."""
        try:
            self.connection.send(encode(command))
        except OSError:
            raise EngineDead("engine is not running") from None
        self._sent += 1

    def _cancel(self, handle: _Handle, reason: str = CLIENT_DISCONNECTED) -> None:
        """Abort ``handle``'s request unless it already ended (event loop)."""
        if handle.done:
            return
        handle.done = True
        self._handles.pop(handle.key, None)
        if handle.waiter is not None and handle.error is None:  # (a waiter for its log id gives up)
            handle.error = RuntimeError(_CANCELLED)
            _wake(handle)
        with self._lock, contextlib.suppress(EngineDead):  # a dead engine has nothing to abort
            self._send(AbortRequest(handle.key, reason))

    # --- engine messages (the connection's thread) ------------------------------------------------

    def _on_message(self, data: bytes) -> None:
        msg = decode_message(data)
        if isinstance(msg, StepOutputs):
            self._on_outputs(msg)
        elif isinstance(msg, EngineReady):
            self.warmup_report, self.jit_at_ready = msg.warmup, msg.jit_compilations
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready(msg.warmup)
        elif isinstance(msg, EngineFailed):
            self._lost(f"engine failed: {msg.error}", failed=True)

    def load(self) -> ReplicaLoad:
        """What a router sees of this engine: requests sent and not ended, the prompt tokens of those
        without a first token yet, the share of KV blocks in use (as of its last message)."""
        state = self.state
        handles = list(self._handles.values())  # (one C call: safe beside the connection's thread)
        return ReplicaLoad(len(handles), sum([h.waiting_tokens for h in handles]),
                           state.kv_blocks_used / state.kv_blocks_total if state.kv_blocks_total else 0.0)

    def _on_outputs(self, msg: StepOutputs) -> None:
        self.state = msg.state
        if msg.timings is not None and self.observer is not None:
            self.observer(msg.timings)
        if (msg.added or msg.rejected) and self.on_added is not None:
            self.on_added(msg.added, msg.rejected)
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        firsts: dict[asyncio.AbstractEventLoop, list] = {}  # requests' first tokens: their streams go first
        handles = self._handles
        for key, log_id in msg.added.items():  # (before any output of theirs: the engine reports an add at once)
            handle = handles.get(key)
            if handle is not None:
                firsts.setdefault(handle.loop, []).append((handle, log_id))
        for key, delta in zip(msg.keys, msg.deltas):
            handle = handles.get(key)
            if handle is None:  # cancelled
                continue
            handle.waiting_tokens = 0
            if delta.finish_reason is not None:
                handles.pop(key, None)  # (a cancel may pop it too)
            item = delta if delta.error is None else RequestAborted(f"the engine aborted this request: {delta.error}")
            first = delta.num_output_tokens == len(delta.token_ids)
            (firsts if first else batches).setdefault(handle.loop, []).append((handle, item))
        for loop, items in firsts.items():
            batches[loop] = items + batches.get(loop, [])
        for key, why in msg.rejected.items():
            handle = handles.pop(key, None)
            if handle is not None:
                batches.setdefault(handle.loop, []).append((handle, InvalidRequest(why)))
        for loop, items in batches.items():  # one wake-up per loop and step, not per request
            with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening
                loop.call_soon_threadsafe(self._deliver, items)

    def _deliver(self, items: list) -> None:
        """Into the streams' queues (event loop)."""
        for handle, item in items:
            if handle.done:
                continue
            if type(item) is int:  # the id the log gives it
                handle.log_id = item
                _wake(handle)
                continue
            try:
                handle.out.put_nowait(item)
            except asyncio.QueueFull:  # output_queue_size items behind: drop it, free its KV
                self._cancel(handle, CLIENT_TOO_SLOW)
                _replace_all(handle, SlowClient("client fell too far behind; request aborted"))
                continue
            if isinstance(item, BaseException):
                handle.done = True
                handle.error = item
                _wake(handle)
            elif item.finish_reason is not None:
                handle.done = True

    def _lost(self, reason: str, failed: bool = False) -> None:
        """No more messages will come: every open stream ends with EngineDead (``failed``: the engine
        reported an error of its own)."""
        with self._lock:  # no submit slips in between
            first = self.error is None
            if first:
                self.error = EngineDead(reason, failed)
            handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            with contextlib.suppress(RuntimeError):
                handle.loop.call_soon_threadsafe(self._fail, handle, EngineDead(str(self.error), self.error.failed))
        if first and self.on_dead is not None:
            self.on_dead(str(self.error))

    @staticmethod
    def _fail(handle: _Handle, error: BaseException) -> None:
        if not handle.done:
            handle.done = True
            _replace_all(handle, error)


def _replace_all(handle: _Handle, error: BaseException) -> None:
    """The consumer sees ``error`` next, not stale tokens."""
    while not handle.out.empty():
        handle.out.get_nowait()
    handle.out.put_nowait(error)
    handle.error = error
    _wake(handle)


def _wake(handle: _Handle) -> None:
    """Whoever waits for the request's log id: it is known, or the request ended without one (event loop)."""
    waiter = handle.waiter
    if waiter is None or waiter.done():
        return
    if handle.log_id is not None:
        waiter.set_result(handle.log_id)
    elif handle.error is not None:
        waiter.set_exception(handle.error)


class ResponseStream(Protocol):
    """What the server reads of one request: a ``RequestStream``, or a fleet's ``FleetStream``
    (runtime/serving/fleet_stream.py)."""

    def __aiter__(self) -> ResponseStream: ...
    def __anext__(self) -> Awaitable[OutputDelta]: ...
    async def log_id(self) -> int: ...
    async def name(self) -> RequestName: ...
    def cancel(self) -> None: ...
    def fail(self, error: BaseException) -> None: ...


class RequestStream:
    """Async iterator over one request's OutputDelta items; ``cancel()`` aborts the request.

    A consumer that fell behind gets the deltas waiting in its queue merged into one (vLLM V1's
    output collector does the same): under load the HTTP side sends fewer, larger SSE events
    instead of falling further behind one token at a time."""

    def __init__(self, engine: AsyncLLMEngine, handle: _Handle) -> None:
        self._engine = engine
        self._handle = handle
        self._finished = False
        self._error: BaseException | None = None  # met while merging: raised on the next call

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> OutputDelta:
        if self._finished:
            raise StopAsyncIteration
        out = self._handle.out
        item = self._error or await out.get()
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        if item.finish_reason is None and not out.empty():
            item = self._merge_waiting(item, out)
        if item.finish_reason is not None:
            self._finished = True
        return item

    def _merge_waiting(self, first: OutputDelta, out: OutputQueue) -> OutputDelta:
        deltas = [first]
        while not out.empty() and deltas[-1].finish_reason is None:
            item = out.get_nowait()
            if isinstance(item, BaseException):
                self._error = item
                break
            deltas.append(item)
        return merge_deltas(deltas)

    async def log_id(self) -> int:
        """The id the engine's log gives this request (``Arrived.request_id``), as soon as the engine
        took it in (before its first output). Raises what ended the request if it ended without one
        (refused, the engine gone)."""
        handle = self._handle
        if handle.log_id is None:
            if handle.error is not None:
                raise handle.error
            if handle.done:
                raise RuntimeError(_CANCELLED)
            if handle.waiter is None:
                handle.waiter = handle.loop.create_future()
            await asyncio.shield(handle.waiter)
        return handle.log_id

    @property
    def taken_in(self) -> bool:
        """The engine told this request's log id (it took the request in)."""
        return self._handle.log_id is not None

    async def name(self) -> RequestName:
        """The request's name in the log: the run, the replica (in a fleet) and the log's id."""
        log_id = await self.log_id()
        return RequestName(self._engine.run_id, self._engine.replica, log_id)

    def cancel(self) -> None:
        """Abort the request unless it already finished. Idempotent."""
        self._engine._cancel(self._handle)

    def fail(self, error: BaseException) -> None:
        """Abort the request and end the stream with ``error`` (event loop); a request whose last
        item is already queued keeps it."""
        if not self._handle.done:
            self._engine._cancel(self._handle)
            _replace_all(self._handle, error)


def merge_deltas(deltas: Sequence[OutputDelta]) -> OutputDelta:
    """Consecutive deltas of one request as one: the last one's state, everyone's tokens."""
    if len(deltas) == 1:
        return deltas[0]
    logprobs = None if deltas[0].logprobs is None else [lp for d in deltas for lp in d.logprobs or ()]
    return msgspec.structs.replace(deltas[-1], text="".join(d.text for d in deltas),
                                   token_ids=[t for d in deltas for t in d.token_ids], logprobs=logprobs)
