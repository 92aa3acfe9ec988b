"""``LLMEngine``: the step-level API every front end drives.

    engine = LLMEngine()                                   # default SmolLM2-135M-Instruct
    rid = engine.add_request("The capital of France is", max_tokens=16, temperature=0)
    while not engine.is_finished(rid):
        for out in engine.step():                          # text deltas of the requests that advanced
            print(out.text, end="", flush=True)

``add_request`` tokenizes (or takes token ids) and queues a request; ``step`` runs one step of the
engine (planned and launched while the previous one is still on the GPU, when steps overlap) and
returns an ``OutputDelta`` per request that got new tokens: the new text, the new ids, and the
finish reason on its last one. Stop strings are found by the incremental detokenizer
(runtime/serving/detokenizer.py) and finish their request through ``core.finish``. ``abort``
takes a request out at any point (after completing a step in flight), freeing its KV.

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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.engine.core import EngineCore
from runtime.engine.request import Request
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import Executor, StepOutput
from runtime.serving.detokenizer import DetokenizerDelta, apply_delta, make_detokenizer
from traces.events import TRACE_PROMPTS_KEY
from traces.log import LogWriter
from traces.params import InvalidRequest, SamplingParams
from traces.prompt import TRACE_PROMPTS
from traces.speculation import num_accepted

PromptInput = str | Sequence[int]


class OutputDelta(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What one step added to one request. (msgspec structs, these and the timings below: the
    engine process sends them to the HTTP front end every step, runtime/serving/engine_protocol.py.)"""

    request_id: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int  # so far, these included
    logprobs: list[dict[int, float]] | None = None
    # engine-clock seconds, for latency metrics
    arrival_time: float = 0.0
    first_token_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0
    error: str | None = None  # the engine aborted the request (finish_reason "abort"): why

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineStats(msgspec.Struct, array_like=True):
    """Counters a server exports (ints: their updates are atomic under the GIL)."""

    requests_finished: dict[str, int] = {}
    requests_aborted: dict[str, int] = {}  # by abort reason (each one logged)
    prompt_tokens: int = 0  # at add_request
    prefilled_prompt_tokens: int = 0  # at a request's first token (vLLM's prompt_tokens)
    generation_tokens: int = 0
    steps: int = 0
    preemptions: int = 0
    prefix_query_tokens: int = 0  # tokens looked up in the prefix cache at each admission
    prefix_hit_tokens: int = 0
    # counted by the server's engine loop when the engine aborts (as logged)
    slow_client_aborts: int = 0
    client_aborts: int = 0
    # speculative decoding, as the log's rounds (traces/speculation.py): decodes that verified drafts,
    # their drafts, the drafts accepted, and those by position ("0": the first draft)
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: dict[str, int] = {}

    def count_round(self, drafts: list[int], committed: list[int]) -> None:
        """A speculating decode's round: its drafts and the tokens it committed (the log's)."""
        accepted = num_accepted(drafts, committed)
        self.spec_drafts += 1
        self.spec_draft_tokens += len(drafts)
        self.spec_accepted_tokens += accepted
        per = self.spec_accepted_per_pos
        for j in range(accepted):
            per[str(j)] = per.get(str(j), 0) + 1


class RequestRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One request's timeline (engine-clock seconds), reported once when it ends."""

    request_id: int
    finish_reason: str  # "stop", "length", … or "abort"
    arrival_time: float
    scheduled_time: float | None  # start of the step that first admitted it
    first_token_time: float | None
    end_time: float
    num_prompt_tokens: int
    num_output_tokens: int


class StepTimings(msgspec.Struct, array_like=True, gc=False):
    """What an observer (the server's histograms) sees of one step, or of an abort between steps."""

    first_token_latencies: list[float] = []  # arrival -> first token
    token_gaps: list[float] = []  # previous token -> this one, per request
    ended: list[RequestRecord] = []

    def __bool__(self) -> bool:
        return bool(self.first_token_latencies or self.token_gaps or self.ended)

    def extend(self, other: StepTimings) -> None:
        self.first_token_latencies += other.first_token_latencies
        self.token_gaps += other.token_gaps
        self.ended += other.ended


def with_extra_eos(params: SamplingParams, extra_eos: Sequence[int]) -> SamplingParams:
    """``params`` plus a model's extra end-of-turn ids as stop tokens, unless eos is ignored."""
    extra = tuple(t for t in extra_eos if t not in params.stop_token_ids)
    if extra and not params.ignore_eos:
        params = msgspec.structs.replace(params, stop_token_ids=params.stop_token_ids + extra)
    return params


class _NoText:
    """Detokenizer stand-in for models without a tokenizer (token-id prompts only)."""

    def add(self, ids: list[int]) -> DetokenizerDelta:
        return DetokenizerDelta("", False)

    def finish(self) -> DetokenizerDelta:
        return DetokenizerDelta("", False)


def _through_stop(req: _Active, new_ids: list[int], logprobs: list | None) -> tuple[list[int], list | None]:
    """The tokens of a multi-token delta up to the one that completed a stop string (the detokenizer
    reads no further); the response's counts lose the rest."""
    used = len(req.detokenizer.token_ids) - (req.num_output_tokens - len(new_ids))
    req.num_output_tokens -= len(new_ids) - used
    return new_ids[:used], None if logprobs is None else logprobs[:used]


@dataclass(slots=True)
class _Active:
    request: Request  # the core's (it outlives the core's table, for the last delta's counts)
    detokenizer: Any
    arrival_time: float
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float = 0.0
    num_output_tokens: int = 0

    def record(self, reason: str, end: float) -> RequestRecord:
        r = self.request
        return RequestRecord(r.request_id, reason, self.arrival_time, self.scheduled_time, self.first_token_time,
                             end, r.num_prompt_tokens, self.num_output_tokens)


class LLMEngine:
    """``model``: None (default SmolLM2), an HF folder, a .gguf file or ``random:<shape>``;
    ``trace``: write the run's event log there (``if_exists``: what to do with a file already
    there, ``traces.log.IF_EXISTS``; ``trace_prompts``: what the log keeps of each prompt, token
    ids, block hashes or its length only, ``traces.prompt.TRACE_PROMPTS``); ``options``: engine
    config fields by name (runtime/executor/setup.py), e.g. ``max_num_seqs=8, policy="priority"``."""

    def __init__(self, model: str | None = None, *, trace: str | None = None, trace_prompts: str = "ids",
                 if_exists: str = "overwrite", clock: Callable[[], float] = time.monotonic,
                 clock_origin: float | None = None, **options: Any) -> None:
        from runtime.executor.setup import build_engine  # the real executor: torch

        if trace_prompts not in TRACE_PROMPTS:  # before a log is opened (and an older one rotated)
            raise ValueError(f"trace_prompts must be one of {', '.join(TRACE_PROMPTS)}; got {trace_prompts!r}")
        parts = build_engine(model, **options)
        writer = LogWriter(trace, if_exists=if_exists) if trace else None
        if writer is not None:
            header = parts.header("wall")
            if trace_prompts != "ids":  # the default is not written: an ids log reads as it always did
                header = msgspec.structs.replace(header, extra={**header.extra, TRACE_PROMPTS_KEY: trace_prompts})
            writer(header)
        self._setup(parts.core(writer, trace_prompts=trace_prompts), parts.runner, parts.loaded.tokenizer,
                    overlap=parts.overlap, clock=clock, extra_eos=parts.loaded.spec.eos_token_ids[1:], writer=writer,
                    clock_origin=clock_origin)
        self.parts = parts
        self.vocab_size = parts.loaded.spec.vocab_size

    @classmethod
    def from_core(cls, core: EngineCore, executor: Executor, tokenizer: Any = None, *, overlap: bool = False,
                  clock: Callable[[], float] = time.monotonic, extra_eos: Sequence[int] = (),
                  writer: LogWriter | None = None) -> LLMEngine:
        """An engine over parts built elsewhere (any executor: tests, the simulator's cost model)."""
        self = cls.__new__(cls)
        self._setup(core, executor, tokenizer, overlap=overlap, clock=clock, extra_eos=extra_eos, writer=writer)
        self.parts = None
        return self

    def _setup(self, core: EngineCore, executor: Executor, tokenizer: Any, *, overlap: bool,
               clock: Callable[[], float], extra_eos: Sequence[int], writer: LogWriter | None,
               clock_origin: float | None = None) -> None:
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
        self._extra_eos = tuple(extra_eos)  # more end-of-turn ids (e.g. Qwen's <|endoftext|>)
        self._active: dict[int, _Active] = {}
        self._ready: list[OutputDelta] = []  # deltas of a step completed outside ``step`` (abort)
        self._failing: dict[int, tuple[str, _Active]] = {}  # marked failed by the executor, to abort
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
                    arrival_time: float | None = None, cache_salt: str | None = None, **sampling: Any) -> int:
        """Queue a request and return its id. ``sampling``: SamplingParams fields (``max_tokens=…``,
        ``temperature=…``) over ``params``; ``arrival_time``: engine-clock seconds (default: now; a
        server passes when it received the request); ``cache_salt``: prefix-cache entries are shared
        only between requests with the same salt."""
        ids = self.encode(prompt)
        params = self.sampling_params(params, **sampling)
        now = self.now() if arrival_time is None else arrival_time
        rid = self.core.add_request(ids, params, now, priority, cache_salt=cache_salt)
        detok = _NoText() if self.tokenizer is None else make_detokenizer(self.tokenizer, ids, params)
        self._active[rid] = _Active(self.core.requests[rid], detok, now)
        self.stats.prompt_tokens += len(ids)
        return rid

    def is_finished(self, request_id: int) -> bool:
        """True once the request finished or was aborted (False while queued or running)."""
        if not 0 <= request_id < self.core.num_requests_added:
            raise KeyError(f"unknown request id {request_id}")
        return request_id not in self._active

    def abort(self, request_id: int, reason: str = "abort") -> bool:
        """End an unfinished request now, freeing its KV; False if it already ended. A step in
        flight is completed first: its deltas come out of the next ``step``."""
        if request_id not in self._active:
            return False
        self._ready += self._deliver(self.loop.drain())
        if request_id not in self._active:  # it finished in that step
            return False
        active = self._active.pop(request_id)
        now = self.now()
        if not self.core.abort(request_id, now, reason):
            return False
        self.stats.requests_aborted[reason] = self.stats.requests_aborted.get(reason, 0) + 1
        if self.observer is not None:
            self.observer(StepTimings(ended=[active.record("abort", now)]))
        return True

    def has_unfinished(self) -> bool:
        return bool(self._active)

    @property
    def busy(self) -> bool:
        """``step`` has work: a step in flight, requests to run or deltas to hand out."""
        return self.loop.busy or self.core.has_unfinished() or bool(self._ready)

    # --- the step ----------------------------------------------------------------------------------

    def step(self) -> list[OutputDelta]:
        """Run one engine step; the deltas of the step(s) it completed (none for the first launch of
        an overlapped run). Raises RuntimeError if requests remain but none can be scheduled."""
        ready, self._ready = self._ready, []
        if self._failing:  # marked while an abort drained a step
            ready += self._abort_failing()
        if not self.loop.busy and not self.core.has_unfinished():
            return ready
        outputs = self.loop.step()
        if any(out.plan.empty for out in outputs) and self.core.has_unfinished():
            raise RuntimeError(f"engine stalled with {len(self.core.requests)} unfinished requests")
        deltas = ready + self._deliver(outputs)
        return deltas + self._abort_failing() if self._failing else deltas

    def _abort_failing(self) -> list[OutputDelta]:
        """Abort the requests the executor marked failed; their last deltas, with the error."""
        out: list[OutputDelta] = []
        while self._failing:
            rid = next(iter(self._failing))
            reason, active = self._failing[rid]
            self.abort(rid, reason)  # (a step in flight completes first; rid's tokens in it stay unsent)
            del self._failing[rid]
            r = active.request
            out.append(OutputDelta(rid, "", [], "abort", r.num_prompt_tokens, active.num_output_tokens, None,
                                   active.arrival_time, active.first_token_time, r.num_cached_tokens,
                                   r.num_preemptions, error=reason))
        return out

    def _deliver(self, outputs: list[StepOutput]) -> list[OutputDelta]:
        deltas: list[OutputDelta] = []
        stats = self.stats
        for out in outputs:
            if out.result is None:
                continue
            failed = out.result.failed
            if failed:
                self._failing.update((rid, (why, self._active[rid])) for rid, why in failed.items()
                                     if rid in self._active and rid not in self._failing)
            timings = StepTimings()
            now = self.now()
            self._count_step(out, now)
            for d in out.deltas:
                req = self._active.get(d.request_id)
                if req is None:
                    continue
                if d.new_token_ids:
                    if req.first_token_time is None:
                        req.first_token_time = now
                        stats.prefilled_prompt_tokens += req.request.num_prompt_tokens
                        timings.first_token_latencies.append(now - req.arrival_time)
                    else:
                        timings.token_gaps.append(now - req.last_token_time)
                    req.last_token_time = now
                req.num_output_tokens += len(d.new_token_ids)
                stats.generation_tokens += len(d.new_token_ids)
                if self._failing and d.request_id in self._failing:  # its tokens mean nothing: no text
                    if d.finish_reason is not None:  # the core ended it in this very step (its log: Finished)
                        del self._active[d.request_id]
                        stats.requests_finished[d.finish_reason] = stats.requests_finished.get(d.finish_reason, 0) + 1
                        timings.ended.append(req.record(d.finish_reason, now))
                    continue
                new_ids, logprobs = d.new_token_ids, d.logprobs
                text, finish, stop_hit = apply_delta(req.detokenizer, new_ids, d.finish_reason)
                if stop_hit:
                    self.core.finish(d.request_id, now, "stop")
                    if len(new_ids) > 1:  # a speculative round: the response ends at the stop string's token
                        new_ids, logprobs = _through_stop(req, new_ids, logprobs)
                if finish is not None:
                    del self._active[d.request_id]
                    stats.requests_finished[finish] = stats.requests_finished.get(finish, 0) + 1
                    timings.ended.append(req.record(finish, now))
                r = req.request
                deltas.append(OutputDelta(d.request_id, text, new_ids, finish, r.num_prompt_tokens,
                                          req.num_output_tokens, logprobs, req.arrival_time,
                                          req.first_token_time, r.num_cached_tokens, r.num_preemptions))
            if self.observer is not None:
                self.observer(timings)
        return deltas

    def _count_step(self, out: StepOutput, now: float) -> None:
        stats = self.stats
        stats.steps += 1
        stats.preemptions += len(out.plan.preempted)
        start = now - out.result.duration  # the step's start: when its admissions left the queue
        drafts = out.plan.drafts
        if drafts:  # speculative rounds, from the committed tokens (the log's Step.tokens)
            for d in out.deltas:
                draft = drafts.get(d.request_id)
                if draft:
                    stats.count_round(draft, d.new_token_ids)
        for a in out.plan.admitted:
            stats.prefix_hit_tokens += a.num_cached_tokens
            req = self._active.get(a.request_id)
            if req is None:
                continue
            # looked up: the whole sequence so far (prompt, plus outputs when resuming a preempted one)
            stats.prefix_query_tokens += req.request.num_prompt_tokens + req.num_output_tokens
            if req.scheduled_time is None:
                req.scheduled_time = start

    def close(self) -> None:
        """Flush and close the log (if any). Unfinished requests stay unfinished in it."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
