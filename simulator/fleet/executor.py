"""The cost-model executor: a step's launch returns its virtual end (a ``KnownStep``); collecting
it is immediate, since the replica process has already waited until then.

Timing of overlapped steps (the async engine): step k+1, launched at ``now`` while step k is in
flight, runs on the device after k; with an eager ``launch_time`` the host launches k+1 until
``now + launch`` and only then collects k, so k's tokens reach the host no earlier, and k+1 ends no
earlier than its launch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from runtime.engine.request import Request
from runtime.engine.types import KnownStep, StepPlan, StepResult
from simulator.cost.engine_timing import EngineTiming

SYNTHETIC_TOKEN = 0  # the token every simulated step samples (no eos in simulation)
# a step's tokens without a token_fn: this one list for every sampling span (read, never changed)
_SYNTHETIC = [[SYNTHETIC_TOKEN]]

TokenFn = Callable[[int, int], int]  # (request_id, position) -> token id


class CostModelExecutor:
    def __init__(self, timing: EngineTiming, clock: Callable[[], float], token_fn: TokenFn | None = None) -> None:
        self.step_time, self.launch_time = timing.step_time, timing.launch_time
        self.clock, self.token_fn = clock, token_fn
        self.in_flight: KnownStep | None = None  # launched, not collected

    def launch(self, plan: StepPlan, requests: Mapping[int, Request]) -> KnownStep:
        now = self.clock()
        token_fn = self.token_fn
        if token_fn is None:
            tokens = _SYNTHETIC * plan.num_sampling
        else:
            tokens = [[token_fn(s.request_id, s.start + s.num_tokens)] for s in plan.spans if s.sample]
        previous = self.in_flight
        start = previous.ready if previous is not None and previous.ready > now else now
        duration = self.step_time(plan.step, plan.spans)
        end = start + duration  # its device work follows the step in flight
        if self.launch_time is not None:
            ready = now + self.launch_time(plan.num_scheduled_tokens - len(plan.spans))
            if previous is not None and ready > previous.ready:
                previous.ready = ready
            if ready > end:
                end = ready
        self.in_flight = step = KnownStep(StepResult(tokens, duration), end)
        return step

    def collect(self, handle: KnownStep) -> StepResult:
        if handle is self.in_flight:
            self.in_flight = None
        return handle.result
