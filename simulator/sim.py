"""The live EngineCore driven in virtual time by a cost model: a discrete-event loop of its own.

Two kinds of event, in one loop:
- an arrival: at each workload arrival time (plus the cost model's ``intake_delay``, the front
  door's), ``core.add_request``; an idle engine wakes at the first one it takes;
- a step: ``plan = core.schedule(now)``, ``now + cost_model.step_time(plan)`` its end, then
  ``core.commit`` with synthetic tokens (never eos: the core's eos_token_id is None here, and trace
  requests stop at their workload output length through max_tokens + ignore_eos).

Engine time outside steps comes from the cost model where it has it: ``host_gap(previous spans,
or None after idle)`` (fitted models, simulator/host_timing.py) or ``gap_before(step)`` (a
recording's own gaps) is waited out before each schedule.

Ordering at equal times is defined: an arrival at time t lands before a step that starts (or
commits) at t — every arrival up to a step's end is added before its commit. Live drivers follow
the same rule, which is what lets a re-simulation with recorded durations reproduce a live log
decision for decision. (This is the order the SimPy model this loop replaced gave, its arrival
events urgent; its logs are the same bytes.)

Runs of decode steps are landed at once: while every running request decodes one token a step, no
request waits or arrives and none reaches its length (``EngineCore.decode_run``), each step differs
from the one before only by one token per request, so the model prices the run's steps from their
span count, context sum and longest context in one call (``decode_durations``), the core advances
the run in one call, taking and caching blocks at the steps one-by-one planning would
(``land_decode_run``), and a LogWriter writes the steps after the first without spans
(``decode_steps``). The log, the engine state and the result are those of stepping through them
(tests/test_sim_plain_runs.py); on the Azure conv trace most steps are such runs
(docs/BENCHMARKS.md, ``bench sim``).

Same workload + config + cost model + seed → byte-identical log (no clock, no unseeded RNG).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from runtime.engine.config import EngineConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import EventSink, StepPlan, StepResult
from simulator.cost_model import CostModel
from simulator.model_base import TimedModel, for_step_budget
from traces.events import make_header
from traces.params import InvalidRequest
from traces.workload import Workload

SYNTHETIC_TOKEN = 0  # the token every simulated step samples (no eos in simulation)
MIN_RUN = 3  # decode steps worth landing at once (Simulation._plain_run)
# a step's tokens without a token_fn: this one list for every sampling span (read, never changed)
_SYNTHETIC = [[SYNTHETIC_TOKEN]]
# (n, context, longest, end, count, due) -> durations: TimedModel.decode_durations
DecodeDurations = Callable[[int, int, int, float, int, float], list[float]]

TokenFn = Callable[[int, int], int]  # (request_id, position) -> token id


class SimulationError(RuntimeError):
    """The simulated engine could not make progress."""


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
        plain_runs: bool = True,
    ) -> None:
        """``plain_runs``: land runs of decode steps at once (``_plain_run``; the same log and
        result, faster; False steps through them one by one)."""
        self.workload = workload
        self.config = config
        self.plain_runs = plain_runs
        # a model of padded prefill steps pads them to this config's captured counts
        self.cost_model = for_step_budget(cost_model, config.scheduler.max_num_batched_tokens)
        self.core = EngineCore(config, eos_token_id=None, sink=sink)
        self.token_fn = token_fn
        self.progress = progress  # anything with .update(n): advanced by finished requests
        self.progress_every = progress_every
        self.start = min(0.0, workload.requests[0].arrival) if len(workload) else 0.0
        self.result = SimResult()
        self._reported = 0

    def run(self) -> SimResult:
        delay = float(getattr(self.cost_model, "intake_delay", 0.0) or 0.0)
        specs = self.workload.requests
        # the engine sees a request this long after its arrival stamp (a front door's intake)
        self._seen = [s.arrival + delay for s in specs] if delay else [s.arrival for s in specs]
        self._arrived = 0  # specs handed to the engine so far (in workload order)
        if getattr(self.cost_model, "plans_ahead", False):
            self._run_planning_ahead()
        else:
            self._run_sequential()
        core = self.core
        if core.has_unfinished():
            raise SimulationError(f"simulation ended with {len(core.requests)} unfinished requests")
        self._report_progress()
        return self.result

    def _arrive_until(self, t: float) -> None:
        """Add every request seen by ``t`` (in workload order, up to the first seen later)."""
        seen, specs, core, result = self._seen, self.workload.requests, self.core, self.result
        arrived, num = self._arrived, len(seen)
        while arrived < num and seen[arrived] <= t:
            spec = specs[arrived]
            arrived += 1
            try:
                core.add_request(spec.prompt, spec.params, now=spec.arrival, priority=spec.priority,
                                 cache_salt=spec.cache_salt)
            except InvalidRequest as e:
                result.rejected.append((arrived - 1, str(e)))
                continue
            result.num_requests += 1
        self._arrived = arrived

    def _wait_for_work(self, now: float) -> float | None:
        """Idle: the time of the next arrival the engine takes, with it added; None when none is left."""
        seen, requests = self._seen, self.core.requests
        while not requests and self._arrived < len(seen):
            now = max(now, seen[self._arrived])
            self._arrive_until(now)
        return now if requests else None

    def _run_sequential(self) -> None:
        core = self.core
        schedule, commit, step_time = core.schedule, core.commit, self.cost_model.step_time
        gap_before = getattr(self.cost_model, "gap_before", None)
        host_gap = getattr(self.cost_model, "host_gap", None)
        if isinstance(self.cost_model, TimedModel) and self.cost_model.host is None and gap_before is None:
            host_gap = None  # a fitted model without host timing: no gaps (not asked once a step)
        decode_durations, plain_run = self._run_decode_durations(), core.decode_run
        if host_gap is not None or gap_before is not None:
            decode_durations = None  # steps with gaps between them are not plain
        seen, num, requests, arrive_until = self._seen, len(self._seen), core.requests, self._arrive_until
        result, token_fn, every = self.result, self.token_fn, self.progress_every
        previous: int | None = None  # spans of the step before, None after idle
        now = self.start
        arrive_until(now)
        while True:
            if not requests:  # idle: wake at the next arrival the engine takes
                woke = self._wait_for_work(now)
                if woke is None:
                    return
                now, previous = woke, None
            if host_gap is not None or gap_before is not None:
                gap = host_gap(previous) if host_gap is not None else gap_before(self.result.num_steps)
                if gap > 0:  # engine time before the step (arrivals meanwhile join it)
                    now = now + gap
                    arrive_until(now)
            plan = schedule(now)
            spans = plan.spans
            if not spans:
                raise SimulationError(
                    f"engine stalled at t={now}: {core.num_waiting} waiting, {core.num_running} running")
            duration = step_time(plan.step, spans)
            previous = len(spans)
            end = now + duration
            if decode_durations is not None and (limit := plain_run(plan)) >= MIN_RUN:
                ends = self._plain_run(plan, now, end, limit, decode_durations)
                if ends is not None:
                    now = ends[-1]
                    continue
            if self._arrived < num and seen[self._arrived] <= end:
                arrive_until(end)
            if token_fn is None:  # (this runs once a simulated step: kept inline)
                tokens = _SYNTHETIC * plan.num_sampling
            else:
                tokens = [[token_fn(s.request_id, s.start + s.num_tokens)] for s in spans if s.sample]
            commit(plan, StepResult(tokens, duration), now, False)  # no deltas: the log is the output
            now = end
            result.num_steps += 1
            result.end_time = end
            if result.num_steps % every == 0:
                self._report_progress()

    def _run_planning_ahead(self) -> None:
        """The async engine (runtime/engine/step_loop.py): step k+1 is planned as step k starts and
        starts when step k ends, so an arrival during step k joins step k+2 at the earliest; a step
        whose tokens could change the next plan is completed before the next one is planned. With
        the model's ``launch_time``, step k ends no earlier than step k+1's launch (the host
        collects k after launching k+1)."""
        core = self.core
        schedule, step_time, advance, complete = core.schedule, self.cost_model.step_time, core.advance, core.complete
        overlappable = core.overlappable
        host_gap = getattr(self.cost_model, "host_gap", None)
        launch_time = getattr(self.cost_model, "launch_time", None)
        decode_durations, plain_run = self._run_decode_durations(), core.decode_run
        if launch_time is not None:
            decode_durations = None  # (a decode plan's launch is 0, but the run's next plan is not known)
        seen, num, requests, arrive_until = self._seen, len(self._seen), core.requests, self._arrive_until
        result, token_fn, every = self.result, self.token_fn, self.progress_every
        flight: tuple[Any, float, float, bool, list] | None = None  # plan, start, end, overlappable, tokens
        now = self.start
        arrive_until(now)
        while True:
            if flight is None and not requests:  # idle: wake at the next arrival the engine takes
                woke = self._wait_for_work(now)
                if woke is None:
                    return
                now = woke + (host_gap(None) if host_gap is not None else 0.0)
                arrive_until(now)
            if flight is not None and not flight[3]:
                now = self._land(flight, advanced=False)
                flight = None
            if flight is not None and decode_durations is not None and (limit := plain_run(flight[0])) >= MIN_RUN:
                ends = self._plain_run(flight[0], flight[1], flight[2], limit, decode_durations)
                if ends is not None:  # the step after: planned as the last landed one started, as in the loop
                    now = ends[-1]
                    plan = schedule(ends[-2])
                    flight = None if not plan.spans else (  # (none: it preempted all, as the loop has it)
                        plan, now, now + step_time(plan.step, plan.spans), overlappable(plan),
                        _SYNTHETIC * plan.num_sampling)
                    continue
            if flight is not None:
                advance(flight[0], flight[4])  # the tokens are known: advance writes them
            plan = schedule(now)
            landed, flight = flight, None
            spans = plan.spans
            if spans:
                start = now
                if landed is not None and landed[2] > now:  # (max(now, landed end) without a call)
                    start = landed[2]
                if token_fn is None:  # (this runs once a simulated step: _tokens inline)
                    tokens = _SYNTHETIC * plan.num_sampling
                else:
                    tokens = self._tokens(plan)
                end = start + step_time(plan.step, spans)  # its device work follows the landed step's
                if launch_time is not None:
                    # the host launches this plan from `now` on and only then collects the landed
                    # step: an eager launch longer than the landed step's device work holds its end
                    # back (simulator/launch.py); this step's device work ends after its last launch
                    ready = now + launch_time(plan.num_scheduled_tokens - len(spans))
                    if landed is not None and ready > landed[2]:
                        landed = (landed[0], landed[1], ready, landed[3], landed[4])
                        start = ready
                    if ready > end:
                        end = ready
                flight = (plan, start, end, overlappable(plan), tokens)
            elif landed is None:
                raise SimulationError(
                    f"engine stalled at t={now}: {core.num_waiting} waiting, {core.num_running} running")
            if landed is not None:  # _land(landed, advanced=True), inline: it runs once a simulated step
                plan, start, now, _, tokens = landed
                if self._arrived < num and seen[self._arrived] <= now:
                    arrive_until(now)
                complete(plan, StepResult(tokens, now - start), start, False)  # no deltas: the log is the output
                result.num_steps += 1
                result.end_time = now
                if result.num_steps % every == 0:
                    self._report_progress()

    def _run_decode_durations(self) -> DecodeDurations | None:
        """The model's ``decode_durations`` when runs of decode steps are landed at once (``_plain_run``):
        with synthetic tokens and a model that prices a decode step from its span count, context sum
        and longest context; else None."""
        if self.token_fn is not None or not self.plain_runs:
            return None
        return getattr(self.cost_model, "decode_durations", None)  # (TimedModel's, or a faster one)

    def _plain_run(self, plan: StepPlan, start: float, end: float, limit: int,
                   decode_durations: DecodeDurations) -> list[float] | None:
        """Land ``plan`` (planned, not advanced; from ``start`` to ``end``) and the decode steps after it
        at once: ``limit`` (``EngineCore.decode_run``) steps at most, each ending before the next
        arrival the engine takes, so that the log, state and times are those of as many trips round
        a loop. Returns their ends, or None (nothing done) when fewer than MIN_RUN would be landed."""
        core = self.core
        seen, arrived = self._seen, self._arrived
        due = seen[arrived] if arrived < len(seen) else math.inf  # an arrival landing with a step ends the run
        if end >= due:
            return None
        spans = plan.spans
        n = len(spans)
        context = n  # Σ (start + 1)
        longest = 0
        for s in spans:
            context += s.start
            if s.start >= longest:
                longest = s.start + 1
        # the steps after plan (its own the model priced already): step i decodes each span's start + i
        durations = decode_durations(n, context + n, longest + 1, end, limit - 1, due)
        if len(durations) < MIN_RUN - 1:
            return None
        ends = list(accumulate(durations, initial=end))
        core.land_decode_run(plan, ends, start, SYNTHETIC_TOKEN)
        note = getattr(self.cost_model, "note_decodes", None)  # (a RangeTracker counts them)
        if note is not None:
            note(n, context + n, longest + 1, durations)
        result = self.result
        before = result.num_steps
        result.num_steps += len(ends)
        result.end_time = ends[-1]
        if result.num_steps // self.progress_every != before // self.progress_every:
            self._report_progress()
        return ends

    def _tokens(self, plan: StepPlan) -> list[list[int]]:
        token_fn = self.token_fn
        if token_fn is None:
            return _SYNTHETIC * plan.num_sampling
        return [[token_fn(s.request_id, s.start + s.num_tokens)] for s in plan.spans if s.sample]

    def _land(self, flight: tuple[Any, float, float, bool, list], advanced: bool) -> float:
        """A launched step ends: arrivals up to its end join, then it is committed (``complete``
        once ``advance`` ran). Returns its end."""
        plan, start, end, _, tokens = flight
        arrived = self._arrived
        if arrived < len(self._seen) and self._seen[arrived] <= end:
            self._arrive_until(end)
        if advanced:
            self.core.complete(plan, StepResult(tokens, end - start), start, False)  # no deltas: the log is the output
        else:
            self.core.commit(plan, StepResult(tokens, end - start), start, False)
        result = self.result
        result.num_steps += 1
        result.end_time = end
        if result.num_steps % self.progress_every == 0:
            self._report_progress()
        return end

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
    plain_runs: bool = True,
) -> SimResult:
    """Run ``workload`` through a simulated engine; write a Header (clock ``sim``) + events to ``sink``
    (``plain_runs``: Simulation's)."""
    if sink is not None:
        extra = {"workload": {"source": workload.source, "num_requests": len(workload), **workload.meta}}
        extra.update(header_extra or {})
        sink(make_header(config, clock="sim", extra=extra))
    return Simulation(workload, config, cost_model, sink=sink, token_fn=token_fn, progress=progress,
                      plain_runs=plain_runs).run()
