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

A step call has one wait in it: for the tokens of the step it completes. ``step()`` is
``begin()`` (everything before that wait) then ``end()`` (collect and complete), so a driver that
owns the time between the two, the simulator's replica process waiting out virtual time, runs
this very loop: the overlap rules exist once. An executor whose ``launch`` returns a ``KnownStep``
(a simulated step: tokens and end known at launch) lets ``advance`` write the tokens at once.
``land_run`` has the step being waited for and a run of plain decode steps after it landed at
once by its caller (simulator/fleet/decode_run.py: the simulator's fast path, the log of as many
loop turns) and leaves the loop as those turns would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from runtime.engine.core import EngineCore
from runtime.engine.types import Executor, KnownStep, OverlappingExecutor, StepOutput, StepPlan


@dataclass(slots=True)
class _InFlight:
    plan: StepPlan
    handle: object
    planned_at: float
    overlappable: bool


class StepLoop:
    def __init__(self, core: EngineCore, executor: Executor | OverlappingExecutor, clock: Callable[[], float],
                 overlap: bool = True, deltas: bool = True) -> None:
        """``overlap`` takes effect only with an OverlappingExecutor (one with launch / collect);
        ``deltas=False``: completed steps carry no per-request deltas (a driver that reads only the log)."""
        self.core, self.executor, self.clock, self.deltas = core, executor, clock, deltas
        self._launches = hasattr(executor, "launch")
        self.overlap = overlap and self._launches
        self._in_flight: _InFlight | None = None  # launched, not completed (overlap)
        self.waiting: _InFlight | None = None  # the step ``end`` collects and completes
        self._advanced = False  # whether ``waiting`` was advanced before the next plan
        self._last_end = float("-inf")

    @property
    def busy(self) -> bool:
        """A launched step is not completed yet."""
        return self._in_flight is not None or self.waiting is not None

    @property
    def in_flight(self) -> _InFlight | None:
        """The step launched and not yet waited for (overlap): what the next ``begin`` completes."""
        return self._in_flight

    def step(self) -> list[StepOutput]:
        """Plan and launch one step; return the steps completed by this call, in order: none (the
        first launch), one, or a single empty one when there was nothing to plan and nothing in
        flight (the engine is idle, or stalled if requests remain)."""
        done = self.begin()
        return self.end() if self.waiting is not None else done

    def begin(self) -> list[StepOutput]:
        """Everything of a step call before its wait. Returns what completes without one (an empty
        step, or nothing after the first launch); else ``waiting`` is the step ``end`` completes."""
        core = self.core
        if not self.overlap:
            now = self.clock()
            plan = core.schedule(now)
            if plan.empty:
                return [StepOutput(plan, None, [])]
            if not self._launches:
                result = self.executor.execute(plan, core.requests)
                return [StepOutput(plan, result, core.commit(plan, result, now, self.deltas))]
            self.waiting, self._advanced = _InFlight(plan, self.executor.launch(plan, core.requests), now, False), False
            return []
        previous = self._in_flight
        if previous is not None and not previous.overlappable:
            self._in_flight = None
            self.waiting, self._advanced = previous, False
            return []
        if previous is not None:
            handle = previous.handle
            core.advance(previous.plan, handle.result.token_ids if type(handle) is KnownStep else None)
        now = self.clock()
        plan = core.schedule(now)
        self._in_flight = None
        if not plan.empty:
            self._in_flight = _InFlight(plan, self.executor.launch(plan, core.requests), now, core.overlappable(plan))
        if previous is None:
            return [] if self._in_flight is not None else [StepOutput(plan, None, [])]
        self.waiting, self._advanced = previous, True
        return []

    def end(self) -> list[StepOutput]:
        """Collect and complete ``waiting`` (the wait of the step call)."""
        waiting, self.waiting = self.waiting, None
        return [] if waiting is None else [self._complete(waiting, self._advanced)]

    def drain(self) -> list[StepOutput]:
        """Complete the step in flight, if any."""
        previous, self._in_flight = self._in_flight, None
        return [] if previous is None else [self._complete(previous, advanced=False)]

    def land_run(self, ends: list[float], land: Callable[[StepPlan, list[float], float], None]) -> None:
        """Have ``land(plan, ends, start)`` apply ``waiting`` or the step in flight (not advanced) and
        the ``len(ends) - 1`` plain decode steps after it, step i ending at ``ends[i]``, the first
        starting at ``start``; the clock reads ``ends[-1]`` now. With overlap the step after them is
        planned as the last landed one started and launched, as the loop would have."""
        waiting = self.waiting if self.waiting is not None else self._in_flight
        self.waiting = self._in_flight = None
        land(waiting.plan, ends, max(waiting.planned_at, self._last_end))
        self.executor.collect(waiting.handle)
        self._last_end = ends[-1]
        if self.overlap:
            core = self.core
            plan = core.schedule(ends[-2])
            if not plan.empty:
                self._in_flight = _InFlight(plan, self.executor.launch(plan, core.requests), ends[-2],
                                            core.overlappable(plan))

    def _complete(self, launched: _InFlight, advanced: bool) -> StepOutput:
        core = self.core
        result = self.executor.collect(launched.handle)
        if not self.overlap:  # a sequential step: it started when planned and took what the executor says
            return StepOutput(launched.plan, result, core.commit(launched.plan, result, launched.planned_at,
                                                                 self.deltas))
        end = self.clock()
        start = max(launched.planned_at, self._last_end)
        self._last_end = end
        result = msgspec.structs.replace(result, duration=end - start)
        finish = core.complete if advanced else core.commit
        return StepOutput(launched.plan, result, finish(launched.plan, result, start, self.deltas))
