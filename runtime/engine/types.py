"""The contract between a policy, an executor and the log: what a step plan is, what an executor
returns, and what the core hands back per request. ``Span`` is part of the log's vocabulary
(``traces.events``) and is re-exported here so the engine's users find every contract type in one
place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import msgspec

from runtime.engine.request import Request
from traces.events import Event, Span

__all__ = [
    "PLACEHOLDER", "Admission", "EventSink", "Executor", "KnownStep", "OverlappingExecutor", "RequestDelta", "Span",
    "StepOutput", "StepPlan", "StepResult",
]


class Admission(msgspec.Struct, frozen=True, gc=False):
    request_id: int
    num_cached_tokens: int
    num_reserved_blocks: int


class StepPlan(msgspec.Struct, frozen=True, gc=False):  # a Struct: built once a step, cheaply
    """What the policy decided for one step; everything an executor needs besides weights.

    ``block_tables[i]`` is the live table of ``spans[i]``'s request: read it during the step,
    don't keep it.
    """

    step: int
    spans: list[Span]
    block_tables: list[list[int]]
    admitted: list[Admission]
    preempted: list[int]
    num_scheduled_tokens: int
    num_sampling: int  # spans that sample: how many token lists the executor returns
    # speculative decoding: request id -> the drafts its span verifies after its last token (the
    # span is 1 + len(drafts) tokens); None when no span speculates
    drafts: dict[int, list[int]] | None = None

    @property
    def empty(self) -> bool:
        return not self.spans


class StepResult(msgspec.Struct, frozen=True, gc=False):
    """What the executor did: tokens per sampling span (in span order) and the time it took. A
    speculating span's tokens are the drafts it accepted (a prefix of its drafts) and one more."""

    token_ids: list[list[int]]
    duration: float
    # optional per sampling span: list (one per token) of {token_id: logprob} (sampled + top-N)
    logprobs: list[list[dict[int, float]]] | None = None
    # request id -> why its token means nothing (its logits were NaN, say): the token is still a
    # valid id and committed as any other; the driver then aborts the request with that reason
    failed: dict[int, str] | None = None
    device_time: float | None = None  # the device's own time for the step, when the executor timed it


class KnownStep(msgspec.Struct, gc=False):
    """A launch handle whose result is known at launch (a simulated step): ``ready`` is when its
    tokens reach the host, in the driver's time; a later launch may hold it back (the host is
    busy launching), so it is not frozen."""

    result: StepResult
    ready: float


class Executor(Protocol):
    def execute(self, plan: StepPlan, requests: Mapping[int, Request]) -> StepResult: ...


class OverlappingExecutor(Executor, Protocol):
    """An executor that can start a step and hand back its tokens later (runtime/engine/step_loop.py).

    ``launch`` may be called again before the previous step is collected; a decode span whose
    input token is still a PLACEHOLDER then reads it from the previous launch's sampled ids."""

    def launch(self, plan: StepPlan, requests: Mapping[int, Request]) -> object: ...

    def collect(self, handle: object) -> StepResult: ...


class RequestDelta(msgspec.Struct, frozen=True, gc=False):
    """New output of one request in one step (a msgspec Struct: cheap to build 256 times a step)."""

    request_id: int
    new_token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class StepOutput:
    plan: StepPlan
    result: StepResult | None
    deltas: list[RequestDelta]


EventSink = Callable[[Event], None]

# stands for a sampled token between ``advance`` and ``complete`` (never a real token id)
PLACEHOLDER = -1


