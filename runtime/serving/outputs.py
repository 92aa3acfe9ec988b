"""What an engine hands its callers: per-request deltas, counters, per-request timelines and step
timings. msgspec structs: the engine process sends them to the HTTP front end every step
(runtime/serving/engine_protocol.py)."""

from __future__ import annotations

import msgspec

from traces.speculation import num_accepted


class OutputDelta(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What one step added to one request."""

    request_id: int  # the caller's id for it (a server's front end names its requests; else the log's)
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
