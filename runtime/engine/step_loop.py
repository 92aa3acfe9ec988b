"""StepLoop: drives EngineCore steps, overlapping the host work of one step with the device work
of the step before it.

A sequential step is schedule → execute → commit: on a GPU the host waits while the forward runs,
then the GPU waits while the host commits and plans the next step. For a small model the two
halves are about the same size, so half the time one side idles. With overlap, one call does::

    core.advance(n)          what committing step n needs besides its token values (lengths,
                             full blocks, placeholders, requests at their length limit)
    plan = core.schedule()   step n+1: sees exactly the state a sequential run would
    executor.launch(n+1)     queued behind step n; decode inputs that are still placeholders
                             are read from step n's sampled ids on the device
    core.complete(n)         waits for step n's tokens, writes them over the placeholders, logs

Only steps whose token values cannot change the next plan are overlapped
(``EngineCore.overlappable``: no sampled request can stop on eos / a stop token / a stop string
and none uses penalties); any other step is completed, and handed to the caller, before the next
one is planned. So the event log is exactly what a sequential run writes, only faster.

Step times with overlap: a step starts when it is planned or when the previous one ended, whichever
is later, and ends when its tokens are on the host, so the logged steps tile the timeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from runtime.engine.core import EngineCore
from runtime.engine.types import Executor, OverlappingExecutor, StepOutput, StepPlan


@dataclass(slots=True)
class _InFlight:
    plan: StepPlan
    handle: object
    planned_at: float
    overlappable: bool


class StepLoop:
    def __init__(self, core: EngineCore, executor: Executor | OverlappingExecutor, clock: Callable[[], float],
                 overlap: bool = True) -> None:
        """``overlap`` takes effect only with an OverlappingExecutor (one with launch / collect)."""
        self.core, self.executor, self.clock = core, executor, clock
        self.overlap = overlap and hasattr(executor, "launch")
        self._in_flight: _InFlight | None = None
        self._last_end = float("-inf")

    @property
    def busy(self) -> bool:
        """A launched step is not completed yet."""
        return self._in_flight is not None

    def step(self) -> list[StepOutput]:
        """Plan and launch one step; return the steps completed by this call, in order: none (the
        first launch), one, or a single empty one when there was nothing to plan and nothing in
        flight (the engine is idle, or stalled if requests remain)."""
        core = self.core
        if not self.overlap:
            return [core.step(self.clock(), self.executor)]
        previous = self._in_flight
        if previous is not None and not previous.overlappable:
            self._in_flight = None
            return [self._complete(previous, advanced=False)]
        if previous is not None:
            core.advance(previous.plan)
        now = self.clock()
        plan = core.schedule(now)
        self._in_flight = None
        if not plan.empty:
            overlappable = core.overlappable(plan)
            self._in_flight = _InFlight(plan, self.executor.launch(plan, core.requests), now, overlappable)
        if previous is None:
            return [] if self._in_flight is not None else [StepOutput(plan, None, [])]
        return [self._complete(previous, advanced=True)]

    def drain(self) -> list[StepOutput]:
        """Complete the step in flight, if any."""
        previous, self._in_flight = self._in_flight, None
        return [] if previous is None else [self._complete(previous, advanced=False)]

    def _complete(self, launched: _InFlight, advanced: bool) -> StepOutput:
        result = self.executor.collect(launched.handle)
        end = self.clock()
        start = max(launched.planned_at, self._last_end)
        self._last_end = end
        result = msgspec.structs.replace(result, duration=end - start)
        finish = self.core.complete if advanced else self.core.commit
        return StepOutput(launched.plan, result, finish(launched.plan, result, start))
