"""OutputProcessor: what each completed step means to the requests' callers (vLLM v1's split of
an output processor from the engine driver). It owns every unfinished request's state on the
serving side: its detokenizer and stop strings, its timeline and the engine's counters; it turns a
``StepOutput`` into ``OutputDelta`` items and the step's latency observations. It never calls into
the core: a request with stop strings hands the core a ``StopWatch`` over its detokenizer
(``text_of``), so the commit ends it in the step a stop string completed in, its tokens cut there,
as a stop token would; the processor then takes that step's text from the watch.

A request is named by the caller's id when the caller gives one (a server's front end names its
requests before the engine sees them) and by the core's id otherwise; the core's id is what its
step outputs and its log use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.engine.request import Request
from runtime.engine.types import StepOutput
from runtime.serving.detokenizer import DetokenizerDelta, StopWatch, make_detokenizer, step_text
from runtime.serving.outputs import EngineStats, OutputDelta, RequestRecord, StepTimings
from traces.params import SamplingParams


class _NoText:
    """Detokenizer stand-in for models without a tokenizer (token-id prompts only)."""

    def add(self, ids: list[int]) -> DetokenizerDelta:
        return DetokenizerDelta("", False)

    def finish(self) -> DetokenizerDelta:
        return DetokenizerDelta("", False)


@dataclass(slots=True, frozen=True)
class RequestText:
    """A request's text: its detokenizer, and the watch over it the core is given when it has stop
    strings (None: the processor decodes its tokens itself)."""

    detokenizer: Any
    watch: StopWatch | None


@dataclass(slots=True)
class RequestState:
    request_id: int  # the caller's id
    request: Request  # the core's (it outlives the core's table, for the last delta's counts)
    text: RequestText
    arrival_time: float
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float = 0.0
    num_output_tokens: int = 0

    def record(self, reason: str, end: float) -> RequestRecord:
        r = self.request
        return RequestRecord(r.request_id, reason, self.arrival_time, self.scheduled_time, self.first_token_time,
                             end, r.num_prompt_tokens, self.num_output_tokens)

    def delta(self, text: str, token_ids: list[int], finish: str | None, logprobs: list | None,
              error: str | None = None) -> OutputDelta:
        r = self.request
        return OutputDelta(self.request_id, text, token_ids, finish, r.num_prompt_tokens, self.num_output_tokens,
                           logprobs, self.arrival_time, self.first_token_time, r.num_cached_tokens,
                           r.num_preemptions, error)


@dataclass(slots=True)
class Processed:
    """One step's outputs: the deltas and the latency observations."""

    deltas: list[OutputDelta] = field(default_factory=list)
    timings: StepTimings = field(default_factory=StepTimings)


class OutputProcessor:
    def __init__(self, tokenizer: Any, stats: EngineStats) -> None:
        self.tokenizer = tokenizer
        self.stats = stats
        self._states: dict[int, RequestState] = {}  # by the core's id: step outputs name requests so
        self._core_ids: dict[int, int] = {}  # the caller's id -> the core's
        # marked failed by the executor (core id -> why, its state): the driver aborts them
        self.failing: dict[int, tuple[str, RequestState]] = {}

    def check_new(self, request_id: int) -> None:
        if request_id in self._core_ids:
            raise ValueError(f"request id {request_id} is already in use")

    def text_of(self, prompt_ids: list[int], params: SamplingParams) -> RequestText:
        """A new request's text, before the core takes it (its watch goes with it: ``text_stop``)."""
        if self.tokenizer is None:
            return RequestText(_NoText(), None)
        detok = make_detokenizer(self.tokenizer, prompt_ids, params)
        return RequestText(detok, StopWatch(detok) if params.stop else None)

    def add(self, request: Request, text: RequestText, arrival: float, request_id: int | None = None) -> int:
        """Track a request the core took; returns the caller's id for it."""
        rid = request.request_id if request_id is None else request_id
        self._states[request.request_id] = RequestState(rid, request, text, arrival)
        self._core_ids[rid] = request.request_id
        self.stats.prompt_tokens += request.num_prompt_tokens
        return rid

    def __contains__(self, request_id: int) -> bool:
        """The caller's request is unfinished."""
        return request_id in self._core_ids

    def __bool__(self) -> bool:
        return bool(self._states)

    @property
    def request_ids(self) -> list[int]:
        """The callers' ids of the unfinished requests."""
        return list(self._core_ids)

    def core_id(self, request_id: int) -> int | None:
        return self._core_ids.get(request_id)

    def _end(self, core_id: int) -> RequestState:
        state = self._states.pop(core_id)
        del self._core_ids[state.request_id]
        return state

    def aborted(self, request_id: int, reason: str, now: float) -> StepTimings:
        """The caller's request was aborted (the core logged it): forget it, count it."""
        state = self._end(self._core_ids[request_id])
        self.stats.requests_aborted[reason] = self.stats.requests_aborted.get(reason, 0) + 1
        return StepTimings(ended=[state.record("abort", now)])

    def _finished(self, state: RequestState, reason: str, now: float, timings: StepTimings) -> None:
        self._end(state.request.request_id)
        self.stats.requests_finished[reason] = self.stats.requests_finished.get(reason, 0) + 1
        timings.ended.append(state.record(reason, now))

    # --- a completed step ---------------------------------------------------------------------------

    def process(self, out: StepOutput, now: float) -> Processed:
        """``out``'s deltas, text and counts (``out.result`` must be set: the step completed)."""
        done = Processed()
        failed = out.result.failed
        if failed:
            self.failing.update((rid, (why, self._states[rid])) for rid, why in failed.items()
                                if rid in self._states and rid not in self.failing)
        self._count_step(out, now)
        stats, timings, states, failing = self.stats, done.timings, self._states, self.failing
        for d in out.deltas:
            state = states.get(d.request_id)
            if state is None:
                continue
            new_ids, logprobs = d.new_token_ids, d.logprobs
            if new_ids:
                if state.first_token_time is None:
                    state.first_token_time = now
                    stats.prefilled_prompt_tokens += state.request.num_prompt_tokens
                    timings.first_token_latencies.append(now - state.arrival_time)
                else:
                    timings.token_gaps.append(now - state.last_token_time)
                state.last_token_time = now
            state.num_output_tokens += len(new_ids)
            stats.generation_tokens += len(new_ids)
            if failing and d.request_id in failing:  # its tokens mean nothing: no text
                if d.finish_reason is not None:  # the core ended it in this very step (its log: Finished)
                    self._finished(state, d.finish_reason, now, timings)
                continue
            finish = d.finish_reason
            text = step_text(state.text.detokenizer, state.text.watch, new_ids, finish)
            if finish is not None:
                self._finished(state, finish, now, timings)
            done.deltas.append(state.delta(text, new_ids, finish, logprobs))
        return done

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
            state = self._states.get(a.request_id)
            if state is None:
                continue
            # looked up: the whole sequence so far (prompt, plus outputs when resuming a preempted one)
            stats.prefix_query_tokens += state.request.num_prompt_tokens + state.num_output_tokens
            if state.scheduled_time is None:
                state.scheduled_time = start
