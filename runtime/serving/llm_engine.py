"""``LLMEngine``: the step-level API every front end drives.

    engine = LLMEngine()                                   # default SmolLM2-135M-Instruct
    rid = engine.add_request("The capital of France is", max_tokens=16, temperature=0)
    while not engine.is_finished(rid):
        for out in engine.step():                          # text deltas of the requests that advanced
            print(out.text, end="", flush=True)

``add_request`` tokenizes (or takes token ids) and queues a request; ``step`` runs one step of the
engine (planned and launched while the previous one is still on the GPU, when steps overlap) and
returns an ``OutputDelta`` per request that got new tokens: the new text, the new ids, and the
finish reason on its last one. The engine only drives: what a step means to each request (text,
stop strings, counts, timings) is the output processor's (runtime/serving/output_processor.py);
a stop string it finds ends its request in the core, in that step, in ``_deliver`` alone.
``abort`` takes a request out at any point (after completing a step in flight), freeing its KV.

A request whose token the executor marks as meaningless (``StepResult.failed``: its logits went
NaN or infinite) is aborted with that reason (the log's ``Aborted``) at the end of the step call;
its last delta has no text, finish reason "abort" and ``error`` set. The other requests of the
step go on as if nothing happened. (When steps overlap, the step launched behind it already
holds it: that step completes first, so its log shows the request in one step more than a
sequential run's.)

``LLM`` (offline batches) and the server's engine loop (runtime/serving/engine_loop.py) are built on it.
Time is ``clock()`` since the engine started, passed into the core as ``now``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from runtime.engine.core import EngineCore
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import Executor, StepOutput
from runtime.serving.output_processor import OutputProcessor
from runtime.serving.outputs import EngineStats, OutputDelta, StepTimings
from traces.events import TRACE_PROMPTS_KEY
from traces.log import LogWriter
from traces.params import InvalidRequest, SamplingParams
from traces.prompt import TRACE_PROMPTS
from traces.request_names import RUN_ID_KEY

__all__ = ["EngineStats", "LLMEngine", "OutputDelta", "PromptInput", "StepTimings", "with_extra_eos"]

PromptInput = str | Sequence[int]


def with_extra_eos(params: SamplingParams, extra_eos: Sequence[int]) -> SamplingParams:
    """``params`` plus a model's extra end-of-turn ids as stop tokens, unless eos is ignored."""
    extra = tuple(t for t in extra_eos if t not in params.stop_token_ids)
    if extra and not params.ignore_eos:
        params = msgspec.structs.replace(params, stop_token_ids=params.stop_token_ids + extra)
    return params


def new_run_id() -> str:
    """What a start's log and response ids call it (traces/request_names.py): eight hex digits, fresh
    for every start."""
    return secrets.token_hex(4)


class LLMEngine:
    """``model``: None (default SmolLM2), an HF folder, a .gguf file or ``random:<shape>``;
    ``trace``: write the run's event log there (``if_exists``: what to do with a file already
    there, ``traces.log.IF_EXISTS``; ``trace_prompts``: what the log keeps of each prompt, token
    ids, block hashes or its length only, ``traces.prompt.TRACE_PROMPTS``); ``run_id``: this run's
    name in the log's Header (traces/request_names.py; default: a fresh one); ``options``: engine
    config fields by name (runtime/executor/setup.py), e.g. ``max_num_seqs=8, policy="priority"``."""

    def __init__(self, model: str | None = None, *, trace: str | None = None, trace_prompts: str = "ids",
                 if_exists: str = "overwrite", clock: Callable[[], float] = time.monotonic,
                 clock_origin: float | None = None, run_id: str | None = None, **options: Any) -> None:
        from runtime.executor.setup import build_engine  # the real executor: torch

        if trace_prompts not in TRACE_PROMPTS:  # before a log is opened (and an older one rotated)
            raise ValueError(f"trace_prompts must be one of {', '.join(TRACE_PROMPTS)}; got {trace_prompts!r}")
        parts = build_engine(model, **options)
        run_id = run_id or new_run_id()
        writer = LogWriter(trace, if_exists=if_exists) if trace else None
        if writer is not None:
            header = parts.header("wall")
            header = msgspec.structs.replace(header, extra={**header.extra, RUN_ID_KEY: run_id})
            if trace_prompts != "ids":  # the default is not written: an ids log reads as it always did
                header = msgspec.structs.replace(header, extra={**header.extra, TRACE_PROMPTS_KEY: trace_prompts})
            writer(header)
        self._setup(parts.core(writer, trace_prompts=trace_prompts), parts.runner, parts.loaded.tokenizer,
                    overlap=parts.overlap, clock=clock, extra_eos=parts.loaded.spec.eos_token_ids[1:], writer=writer,
                    clock_origin=clock_origin, run_id=run_id)
        self.parts = parts
        self.vocab_size = parts.loaded.spec.vocab_size

    @classmethod
    def from_core(cls, core: EngineCore, executor: Executor, tokenizer: Any = None, *, overlap: bool = False,
                  clock: Callable[[], float] = time.monotonic, extra_eos: Sequence[int] = (),
                  writer: LogWriter | None = None, run_id: str | None = None) -> LLMEngine:
        """An engine over parts built elsewhere (any executor: tests, the simulator's cost model);
        ``run_id``: the run its log's Header names, when the caller wrote one (default: a fresh one)."""
        self = cls.__new__(cls)
        self._setup(core, executor, tokenizer, overlap=overlap, clock=clock, extra_eos=extra_eos, writer=writer,
                    run_id=run_id)
        self.parts = None
        return self

    def _setup(self, core: EngineCore, executor: Executor, tokenizer: Any, *, overlap: bool,
               clock: Callable[[], float], extra_eos: Sequence[int], writer: LogWriter | None,
               clock_origin: float | None = None, run_id: str | None = None) -> None:
        """``clock_origin``: the clock reading the log's time counts from (default: now; the
        replicas of a data-parallel server share the front door's, so their logs share a time axis)."""
        self.core = core
        self.executor = executor
        self.tokenizer = tokenizer
        self.vocab_size: int | None = len(tokenizer) if tokenizer is not None else None
        self.writer = writer
        self.stats = EngineStats()
        self._clock = clock
        self._t0 = clock() if clock_origin is None else clock_origin
        self.run_id = run_id or new_run_id()  # what the log's Header calls this run (traces/request_names.py)
        self._extra_eos = tuple(extra_eos)  # more end-of-turn ids (e.g. Qwen's <|endoftext|>)
        self.output = OutputProcessor(tokenizer, self.stats)  # every unfinished request's state
        self._ready: list[OutputDelta] = []  # deltas of a step completed outside ``step`` (abort)
        # called on the stepping thread with each step's timings (the server's latency histograms)
        self.observer: Callable[[StepTimings], None] | None = None
        self.loop = StepLoop(core, executor, self.now, overlap=overlap)

    def now(self) -> float:
        """Seconds since the engine started (the log's clock)."""
        return self._clock() - self._t0

    @property
    def clock_origin(self) -> float:
        """``clock()`` when the engine started: another process reading the same clock
        (``time.monotonic`` is system-wide) converts its readings with it."""
        return self._t0

    @property
    def extra_eos(self) -> tuple[int, ...]:
        """The model's end-of-turn ids beyond its eos (added as stop tokens by ``sampling_params``)."""
        return self._extra_eos

    # --- requests --------------------------------------------------------------------------------

    def encode(self, prompt: PromptInput) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequest("prompt: this model has no tokenizer; pass token ids")
            return list(self.tokenizer(prompt)["input_ids"])
        ids = [int(t) for t in prompt]
        vocab = self.vocab_size
        if vocab is not None and ids and not (min(ids) >= 0 and max(ids) < vocab):
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise InvalidRequest(f"prompt: token id {bad} is outside the vocabulary [0, {vocab})")
        return ids

    def sampling_params(self, params: SamplingParams | None = None, **fields: Any) -> SamplingParams:
        """``params`` (default: ``SamplingParams()``) with ``fields`` replaced, plus the model's extra
        end-of-turn ids as stop tokens unless eos is ignored."""
        params = params or SamplingParams()
        if fields:
            params = msgspec.structs.replace(params, **fields)
        return with_extra_eos(params, self._extra_eos)

    def add_request(self, prompt: PromptInput, params: SamplingParams | None = None, *, priority: int = 0,
                    arrival_time: float | None = None, cache_salt: str | None = None,
                    request_id: int | None = None, **sampling: Any) -> int:
        """Queue a request and return its id. ``sampling``: SamplingParams fields (``max_tokens=…``,
        ``temperature=…``) over ``params``; ``arrival_time``: engine-clock seconds (default: now; a
        server passes when it received the request); ``cache_salt``: prefix-cache entries are shared
        only between requests with the same salt; ``request_id``: the caller's id for it, which its
        deltas carry and ``abort`` takes (a server's front end names requests before the engine
        sees them; give one to every request or to none). Default: the id the log gives it."""
        ids = self.encode(prompt)
        params = self.sampling_params(params, **sampling)
        if request_id is not None:
            self.output.check_new(request_id)
        now = self.now() if arrival_time is None else arrival_time
        text = self.output.text_of(ids, params)
        core_id = self.core.add_request(ids, params, now, priority, cache_salt=cache_salt, text_stop=text.watch)
        return self.output.add(self.core.requests[core_id], text, now, request_id)

    def log_id(self, request_id: int) -> int | None:
        """The id the log gives an unfinished request (None once it ended)."""
        return self.output.core_id(request_id)

    @property
    def unfinished(self) -> list[int]:
        """The ids of the requests not finished or aborted yet."""
        return self.output.request_ids

    def is_finished(self, request_id: int) -> bool:
        """True once the request finished or was aborted (False while queued or running)."""
        if request_id in self.output:
            return False
        if not 0 <= request_id < self.core.num_requests_added:
            raise KeyError(f"unknown request id {request_id}")
        return True

    def abort(self, request_id: int, reason: str = "abort") -> bool:
        """End an unfinished request now, freeing its KV; False if it already ended. A step in
        flight is completed first: its deltas come out of the next ``step``."""
        if request_id not in self.output:
            return False
        self._ready += self._deliver(self.loop.drain())
        core_id = self.output.core_id(request_id)
        if core_id is None:  # it finished in that step
            return False
        now = self.now()
        if not self.core.abort(core_id, now, reason):
            return False
        timings = self.output.aborted(request_id, reason, now)
        if self.observer is not None:
            self.observer(timings)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.output)

    @property
    def busy(self) -> bool:
        """``step`` has work: a step in flight, requests to run or deltas to hand out."""
        return self.loop.busy or self.core.has_unfinished() or bool(self._ready)

    # --- the step ----------------------------------------------------------------------------------

    def step(self) -> list[OutputDelta]:
        """Run one engine step; the deltas of the step(s) it completed (none for the first launch of
        an overlapped run). Raises RuntimeError if requests remain but none can be scheduled."""
        ready, self._ready = self._ready, []
        if self.output.failing:  # marked while an abort drained a step
            ready += self._abort_failing()
        if not self.loop.busy and not self.core.has_unfinished():
            return ready
        outputs = self.loop.step()
        if any(out.plan.empty for out in outputs) and self.core.has_unfinished():
            raise RuntimeError(f"engine stalled with {len(self.core.requests)} unfinished requests")
        deltas = ready + self._deliver(outputs)
        return deltas + self._abort_failing() if self.output.failing else deltas

    def _abort_failing(self) -> list[OutputDelta]:
        """Abort the requests the executor marked failed; their last deltas, with the error."""
        out: list[OutputDelta] = []
        failing = self.output.failing
        while failing:
            core_id = next(iter(failing))
            reason, state = failing[core_id]
            self.abort(state.request_id, reason)  # (a step in flight completes first; its tokens in it stay unsent)
            del failing[core_id]
            out.append(state.delta("", [], "abort", None, error=reason))
        return out

    def _deliver(self, outputs: list[StepOutput]) -> list[OutputDelta]:
        """The completed steps' deltas (the output processor's; a stop string ended its request in
        the commit already)."""
        deltas: list[OutputDelta] = []
        for out in outputs:
            if out.result is None:
                continue
            done = self.output.process(out, self.now())
            deltas += done.deltas
            if self.observer is not None:
                self.observer(done.timings)
        return deltas

    def close(self) -> None:
        """Flush and close the log (if any). Unfinished requests stay unfinished in it."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
