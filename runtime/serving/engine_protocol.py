"""The messages between the HTTP front end and the engine loop (runtime/serving/engine_loop.py),
as msgpack bytes: over a pipe to the engine process, or through a queue to the in-process engine
thread (the same bytes both ways, so the tests of the one cover the other's protocol).

Front end -> engine: ``AddRequest`` (its own key for the request, prompt ids, params, arrival time
on the engine clock), ``AbortRequest``, ``Shutdown``.
Engine -> front end: ``EngineStarted`` once the engine is built (its config and clock origin, the
tokenizer, its run's name), ``EngineReady`` after the warm-up, ``StepOutputs`` after every loop
iteration that did something (the deltas by key, the log ids of the requests it took in, the step
timings for the latency histograms, a snapshot of the engine's counters and gauges),
``EngineFailed`` before the engine stops on an error.
"""

from __future__ import annotations

import msgspec

from runtime.engine.config import EngineConfig
from runtime.serving.outputs import EngineStats, OutputDelta, StepTimings
from runtime.serving.warmup import WarmupReport
from traces.params import SamplingParams

# --- front end -> engine --------------------------------------------------------------------------


class AddRequest(msgspec.Struct, tag="add", array_like=True, gc=False):
    key: int  # the request's id, at the front end and in the engine alike (its deltas carry it)
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_time: float | None = None  # engine clock
    cache_salt: str | None = None


class AbortRequest(msgspec.Struct, tag="abort", array_like=True, gc=False):
    key: int
    reason: str


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True, gc=False):
    pass


Command = AddRequest | AbortRequest | Shutdown

# --- engine -> front end --------------------------------------------------------------------------


class EngineStarted(msgspec.Struct, tag="started", array_like=True, gc=False):
    config: EngineConfig
    clock_origin: float  # time.monotonic() at the engine clock's zero
    model_identity: str
    extra_eos: list[int]
    tokenizer: bytes | None = None  # pickled (a spawned child of ours: trusted); None: none or in-process
    run_id: str = ""  # what its log's Header calls this run: part of every response id (traces/request_names.py)


class EngineReady(msgspec.Struct, tag="ready", array_like=True, gc=False):
    warmup: WarmupReport | None
    jit_compilations: int  # Triton compilations before serving (the rest are stalls while serving)


class EngineState(msgspec.Struct, array_like=True, gc=False):
    """What /metrics reads of the engine, as of the message that carries it."""

    stats: EngineStats
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_cached_free: int = 0
    kv_blocks_reserved: int = 0
    jit_compilations: int = 0
    busy: bool = False  # it has a step to run
    adds_taken: int = 0  # AddRequests taken in so far (the rest wait in the pipe: backpressure)
    commands_taken: int = 0  # all commands so far (equal to those sent: the snapshot is current)


class StepOutputs(msgspec.Struct, tag="outputs", array_like=True, gc=False):
    keys: list[int]
    deltas: list[OutputDelta]  # deltas[i] belongs to keys[i] (its request_id)
    state: EngineState
    timings: StepTimings | None = None
    rejected: dict[int, str] = {}  # key -> why the engine refused it (validated up front: defensive)
    added: dict[int, int] = {}  # key -> the id its log gives it, for the adds taken since the last message


class EngineFailed(msgspec.Struct, tag="failed", array_like=True, gc=False):
    error: str  # the exception's type name
    message: str = ""  # only for failures while starting (config, files); a request's text never
    kinds: list[str] = []  # the type's bases, so the front end can re-raise a start-up error as one


Message = EngineStarted | EngineReady | StepOutputs | EngineFailed

encode = msgspec.msgpack.encode  # the function, not a shared Encoder: several threads encode
decode_command = msgspec.msgpack.Decoder(Command).decode
decode_message = msgspec.msgpack.Decoder(Message).decode
