"""SimPy model of a serving engine: the live EngineCore driven in virtual time by a cost model.

Two processes:
- arrivals: at each workload arrival time, ``core.add_request`` (and wake the engine if idle);
- engine:   ``plan = core.schedule(now)``; idle → wait for an arrival; else
            ``yield timeout(cost_model.step_time(plan))`` then ``core.commit`` with synthetic
            tokens (never eos: the core's eos_token_id is None here, and trace requests stop at
            their workload output length through max_tokens + ignore_eos).

Engine time outside steps comes from the cost model where it has it: ``host_gap(previous spans,
or None after idle)`` (fitted models, simulator/host_timing.py) or ``gap_before(step)`` (a
recording's own gaps) is waited out before each schedule, and a request reaches the core
``intake_delay`` seconds after its arrival stamp (which the log keeps).

Ordering at equal times is defined, not left to event ids: an arrival at time t is scheduled
URGENT, so it lands before a step that starts (or commits) at t. Live drivers follow the same
rule — arrivals up to a step's end are added before its commit — which is what lets a
re-simulation with recorded durations reproduce a live log decision for decision.

Same workload + config + cost model + seed → byte-identical log (no clock, no unseeded RNG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heappush
from typing import Any

import simpy
from simpy.events import NORMAL, URGENT, Event

from runtime.engine.config import EngineConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import EventSink, StepResult
from simulator.cost_model import CostModel
from traces.events import make_header
from traces.params import InvalidRequest
from traces.workload import Workload

SYNTHETIC_TOKEN = 0  # the token every simulated step samples (no eos in simulation)

TokenFn = Callable[[int, int], int]  # (request_id, position) -> token id


class SimulationError(RuntimeError):
    """The simulated engine could not make progress."""


class _Env(simpy.Environment):
    """A SimPy environment that can schedule an event at an absolute time.

    ``timeout(t - now)`` lands at ``now + (t - now)``, which floating point may put one ulp
    away from ``t``; workload arrival times must be hit exactly for runs to be comparable.
    """

    def at(self, when: float, priority: int = NORMAL) -> Event:
        event = Event(self)
        event._ok = True  # a triggered event with value None, like simpy's Timeout
        event._value = None
        heappush(self._queue, (when, priority, next(self._eid), event))
        return event


@dataclass
class SimResult:
    num_requests: int = 0  # added to the engine
    num_steps: int = 0
    end_time: float = 0.0  # virtual seconds when the last step ended
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (workload index, reason)


class Simulation:
    def __init__(
        self,
        workload: Workload,
        config: EngineConfig,
        cost_model: CostModel,
        *,
        sink: EventSink | None = None,
        token_fn: TokenFn | None = None,
        progress: Any = None,
        progress_every: int = 2048,
    ) -> None:
        self.workload = workload
        self.config = config
        self.cost_model = cost_model
        self.core = EngineCore(config, eos_token_id=None, sink=sink)
        self.token_fn = token_fn
        self.progress = progress  # anything with .update(n): advanced by finished requests
        self.progress_every = progress_every
        start = min(0.0, workload.requests[0].arrival) if len(workload) else 0.0
        self.env = _Env(initial_time=start)
        self.result = SimResult()
        self._wake: Event | None = None
        self._reported = 0

    def run(self) -> SimResult:
        self.env.process(self._arrivals())  # created first: at t=start arrivals precede the engine
        ahead = getattr(self.cost_model, "plans_ahead", False)
        self.env.process(self._engine_planning_ahead() if ahead else self._engine())
        self.env.run()
        if self.core.has_unfinished():
            raise SimulationError(f"simulation ended with {len(self.core.requests)} unfinished requests")
        self._report_progress()
        return self.result

    # --- processes ----------------------------------------------------------------------------------

    def _arrivals(self):
        env, core, result = self.env, self.core, self.result
        # the engine sees a request this long after its arrival stamp (a front door's intake)
        delay = float(getattr(self.cost_model, "intake_delay", 0.0) or 0.0)
        for i, spec in enumerate(self.workload.requests):
            seen = spec.arrival + delay if delay else spec.arrival
            if seen > env.now:
                yield env.at(seen, URGENT)
            try:
                core.add_request(spec.prompt, spec.params, now=spec.arrival, priority=spec.priority,
                                 cache_salt=spec.cache_salt)
            except InvalidRequest as e:
                result.rejected.append((i, str(e)))
                continue
            result.num_requests += 1
            wake = self._wake
            if wake is not None and not wake.triggered:
                wake.succeed()

    def _engine(self):
        env, core, result = self.env, self.core, self.result
        schedule, commit, step_time = core.schedule, core.commit, self.cost_model.step_time
        gap_before = getattr(self.cost_model, "gap_before", None)
        host_gap = getattr(self.cost_model, "host_gap", None)
        previous: int | None = None  # spans of the step before, None after idle
        token_fn = self.token_fn
        every = self.progress_every
        while True:
            if not core.requests:  # idle: wait for an arrival
                self._wake = env.event()
                yield self._wake
                self._wake = None
                previous = None
            if host_gap is not None or gap_before is not None:
                gap = host_gap(previous) if host_gap is not None else gap_before(result.num_steps)
                if gap > 0:  # engine time before the step (arrivals meanwhile join it)
                    yield env.timeout(gap)
            now = env.now
            plan = schedule(now)
            spans = plan.spans
            if not spans:
                raise SimulationError(
                    f"engine stalled at t={now}: {core.num_waiting} waiting, {core.num_running} running")
            duration = step_time(plan.step, spans)
            previous = len(spans)
            yield env.timeout(duration)
            if token_fn is None:
                tokens = [[SYNTHETIC_TOKEN] for s in spans if s.sample]
            else:
                tokens = [[token_fn(s.request_id, s.start + s.num_tokens)] for s in spans if s.sample]
            commit(plan, StepResult(tokens, duration), now)
            result.num_steps += 1
            result.end_time = env.now
            if result.num_steps % every == 0:
                self._report_progress()

    def _engine_planning_ahead(self):
        """The async engine (runtime/engine/step_loop.py): step k+1 is planned as step k starts, and
        starts when step k ends; a step whose tokens could change the next plan is completed first."""
        env, core = self.env, self.core
        schedule, step_time = core.schedule, self.cost_model.step_time
        host_gap = getattr(self.cost_model, "host_gap", None)
        flight: tuple[Any, float, float, bool] | None = None  # plan, start, end, overlappable
        while True:
            if flight is None and not core.requests:  # idle: wait for an arrival
                self._wake = env.event()
                yield self._wake
                self._wake = None
                gap = host_gap(None) if host_gap is not None else 0.0
                if gap > 0:
                    yield env.timeout(gap)
            if flight is not None and not flight[3]:
                yield from self._land(flight, advanced=False)
                flight = None
            if flight is not None:
                core.advance(flight[0])
            now = env.now
            plan = schedule(now)
            landed = flight
            flight = None
            if plan.spans:
                start = max(now, landed[2]) if landed is not None else now
                flight = (plan, start, start + step_time(plan.step, plan.spans), core.overlappable(plan))
            elif landed is None:
                raise SimulationError(
                    f"engine stalled at t={now}: {core.num_waiting} waiting, {core.num_running} running")
            if landed is not None:
                yield from self._land(landed, advanced=True)

    def _land(self, flight: tuple[Any, float, float, bool], advanced: bool):
        """Wait for a launched step's end, then commit it (``complete`` once ``advance`` ran)."""
        plan, start, end, _ = flight
        if end > self.env.now:
            yield self.env.at(end)
        if self.token_fn is None:
            tokens = [[SYNTHETIC_TOKEN] for s in plan.spans if s.sample]
        else:
            tokens = [[self.token_fn(s.request_id, s.start + s.num_tokens)] for s in plan.spans if s.sample]
        finish = self.core.complete if advanced else self.core.commit
        finish(plan, StepResult(tokens, end - start), start)
        self.result.num_steps += 1
        self.result.end_time = self.env.now
        if self.result.num_steps % self.progress_every == 0:
            self._report_progress()

    def _report_progress(self) -> None:
        if self.progress is None:
            return
        done = self.result.num_requests - len(self.core.requests)
        if done > self._reported:
            self.progress.update(done - self._reported)
            self._reported = done


def simulate(
    workload: Workload,
    config: EngineConfig,
    cost_model: CostModel,
    *,
    sink: EventSink | None = None,
    token_fn: TokenFn | None = None,
    progress: Any = None,
    header_extra: dict[str, Any] | None = None,
) -> SimResult:
    """Run ``workload`` through a simulated engine; write a Header (clock ``sim``) + events to ``sink``."""
    if sink is not None:
        extra = {"workload": {"source": workload.source, "num_requests": len(workload), **workload.meta}}
        extra.update(header_extra or {})
        sink(make_header(config, clock="sim", extra=extra))
    return Simulation(workload, config, cost_model, sink=sink, token_fn=token_fn, progress=progress).run()
