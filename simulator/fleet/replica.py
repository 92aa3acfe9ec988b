"""An engine replica as a SimPy process: the live ``StepLoop`` over the same ``EngineCore``, with
the cost-model executor, in virtual time.

The process is the simulated twin of the live engine loop: requests are handed in by the front
door (``add``) at their times; an idle replica sleeps until one comes; host time the model has
(``host_gap`` or a recording's ``gap_before``) is waited out before a step is planned; between a
step's launch and its completion the process waits until the step's end, so every request that
arrives by then joins before the step is committed (an arrival at time t lands before a step that
starts or ends at t; live drivers take requests in between steps the same way).

Runs of plain decode steps are landed at once (simulator/fleet/decode_run.py): while every running request
decodes one token a step and no request waits or arrives, each step differs from the one before by
one token per request, so the model prices the run in one call and the core advances it in one,
writing the log of as many loop turns (tests/test_sim_plain_runs.py). A run ends before the next
time the front door hands a request to any replica (``due``), so the state a router reads is
always the step-by-step state.

Same workload + config + cost model + seed → byte-identical log (no clock, no unseeded RNG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import simpy

from runtime.engine.config import EngineConfig
from runtime.engine.core import EngineCore
from runtime.engine.drafters import parse_speculative
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import EventSink
from simulator.cost.cost_model import CostModel
from simulator.fleet.decode_run import decode_run, land_decode_run
from simulator.fleet.device import Device
from simulator.fleet.environment import SimEnvironment
from simulator.fleet.executor import SYNTHETIC_TOKEN, CostModelExecutor, TokenFn
from simulator.fleet.speculation import RateMatcher, RoundDraws, SimDrafter
from traces.params import InvalidRequest
from traces.workload import RequestSpec

MIN_RUN = 3  # decode steps worth landing at once


class SimulationError(RuntimeError):
    """The simulated engine could not make progress."""


@dataclass
class SimResult:
    num_requests: int = 0  # added to the engine
    num_steps: int = 0
    end_time: float = 0.0  # virtual seconds when the last step ended
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (workload index, reason)


class Replica:
    def __init__(self, env: SimEnvironment, config: EngineConfig, model: CostModel, *, due: Callable[[], float],
                 sink: EventSink | None = None, token_fn: TokenFn | None = None, plain_runs: bool = True,
                 progress: Any = None, progress_every: int = 2048, rates: RateMatcher | None = None,
                 device: Device | None = None) -> None:
        """``due()``: the next time the front door hands any replica a request (inf: none is coming);
        ``plain_runs``: land runs of decode steps at once (the same log, faster); ``rates``: what a
        speculative config's drafts and acceptances are drawn from (simulator/fleet/speculation.py),
        never the config's own drafter, which would read placeholder tokens; ``device``: the device
        it runs on (simulator/fleet/device.py; None: one of its own)."""
        self.env, self.config, self.due = env, config, due
        self.timing = timing = model.timing(config.scheduler.max_num_batched_tokens)
        spec = parse_speculative(config.speculative)
        draws = drafter = None
        if spec is not None:
            if rates is None:
                raise SimulationError(f"speculative decoding ({spec}) in a simulation needs acceptance rates to draw "
                                      "drafts from (--acceptance LOG or RATE): its tokens are placeholders, a "
                                      "drafter's proposals on them would mean nothing")
            draws = RoundDraws(spec.num_tokens, rates, rates.speculation.seed)
            drafter = SimDrafter(draws, throttled=spec.method == "model")
        self.core = EngineCore(config, eos_token_id=None, sink=sink, drafter=drafter)
        clock = self._clock
        self.executor = CostModelExecutor(timing, clock, token_fn, draws, device)
        self.loop = StepLoop(self.core, self.executor, clock, overlap=timing.plans_ahead, deltas=False)
        self.result = SimResult()
        self.progress, self.progress_every, self._reported = progress, progress_every, 0
        self._closed = False  # no request will come any more
        self.dead = False  # killed (a fleet's outage): its process ended where it waited, nothing more logged
        self.process: simpy.Process | None = None
        self._wake = None  # the event an idle replica sleeps on
        # (a shared device's other replicas launch steps between those of a run: every step one at a time)
        runs = (plain_runs and token_fn is None and timing.decode_durations is not None and drafter is None
                and (device is None or not device.shared))
        if timing.plans_ahead:
            runs = runs and timing.launch_time is None  # (a decode plan's launch is 0, but the next plan is not known)
        else:
            runs = runs and timing.host_gap is None and timing.gap_before is None  # steps with gaps are not plain
        self._runs = runs

    def _clock(self) -> float:
        return self.env.now

    # --- the front door's side --------------------------------------------------------------------

    def add(self, spec: RequestSpec, index: int) -> int | None:
        """Hand a request in (now, at its front-door time); its request id, or None if refused."""
        try:
            rid = self.core.add_request(spec.prompt, spec.params, now=spec.arrival, priority=spec.priority,
                                        cache_salt=spec.cache_salt)
        except InvalidRequest as e:
            self.result.rejected.append((index, str(e)))
            return None
        self.result.num_requests += 1
        self._notify()
        return rid

    def close(self) -> None:
        """No more requests: an idle replica's process ends."""
        self._closed = True
        self._notify()

    def start(self) -> None:
        """Start its SimPy process."""
        self.process = self.env.process(self.run())

    def kill(self) -> None:
        """Stop now, as a killed engine process does: its process is interrupted where it waits, the
        step in flight never ends, its requests stay unfinished in its log (a fleet's outage,
        simulator/fleet/outages.py)."""
        self.dead = True
        if self.process is not None and self.process.is_alive:
            self.process.interrupt()

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    # --- the process ------------------------------------------------------------------------------

    def run(self):
        """The replica's SimPy process (a generator)."""
        env, core, loop, timing = self.env, self.core, self.loop, self.timing
        requests, result, at = core.requests, self.result, env.at
        host_gap, gap_before, plans_ahead = timing.host_gap, timing.gap_before, timing.plans_ahead
        runs, every = self._runs, self.progress_every
        previous: int | None = None  # spans of the step before, None after idle (sequential host gaps)
        previous_drafts = 0  # drafts it verified
        try:
            while True:
                if not requests and not loop.busy:  # idle: sleep until a request comes
                    if self._closed:
                        self._report_progress()
                        return
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None
                    previous = None
                    if not requests:
                        continue
                    if plans_ahead and host_gap is not None and (gap := host_gap(None)) > 0:
                        yield at(env.now + gap)
                if not plans_ahead and (host_gap is not None or gap_before is not None):
                    gap = host_gap(previous, previous_drafts) if host_gap is not None else gap_before(result.num_steps)
                    if gap > 0:  # engine time before the step (arrivals meanwhile join it)
                        yield at(env.now + gap)
                flight = loop.in_flight
                if runs and flight is not None and flight.overlappable and self._land_run(flight):
                    yield at(self._run_ends[-1])
                    self._finish_run()
                    continue
                done = loop.begin()
                waiting = loop.waiting
                if waiting is None:
                    if done and done[0].plan.empty and not loop.busy and requests:
                        raise SimulationError(f"engine stalled at t={env.now}: {core.num_waiting} waiting, "
                                              f"{core.num_running} running")
                    continue
                if not plans_ahead:
                    plan = waiting.plan
                    previous = len(plan.spans)
                    previous_drafts = sum(map(len, plan.drafts.values())) if plan.drafts else 0
                    if runs and self._land_run(waiting):
                        yield at(self._run_ends[-1])
                        self._finish_run()
                        continue
                end = waiting.handle.ready
                if end > env.now:
                    yield at(end)
                loop.end()
                result.num_steps += 1
                result.end_time = end
                if result.num_steps % every == 0:
                    self._report_progress()
        except simpy.Interrupt:  # killed (``kill``): nothing more happens to it
            return

    def _land_run(self, launched) -> bool:
        """Whether ``launched`` (a step not yet completed) and the plain decode steps after it can be
        landed at once: at least MIN_RUN of them, each ending before ``due``; their ends are kept."""
        core = self.core
        limit = decode_run(core, launched.plan)
        if limit < MIN_RUN:
            return False
        end = launched.handle.ready
        due = self.due()
        if end >= due:
            return False
        spans = launched.plan.spans
        n = len(spans)
        context = n  # Σ (start + 1)
        longest = 0
        for s in spans:
            context += s.start
            if s.start >= longest:
                longest = s.start + 1
        # the steps after it (its own the model priced already): step i decodes each span's start + i
        durations = self.timing.decode_durations(n, context + n, longest + 1, end, limit - 1, due)
        if len(durations) < MIN_RUN - 1:
            return False
        self._run_ends = list(accumulate(durations, initial=end))
        if self.timing.note_decodes is not None:
            self.timing.note_decodes(n, context + n, longest + 1, durations)
        return True

    def _finish_run(self) -> None:
        ends = self._run_ends
        core = self.core
        self.loop.land_run(ends, lambda plan, ends, start: land_decode_run(core, plan, ends, start, SYNTHETIC_TOKEN))
        result = self.result
        before = result.num_steps
        result.num_steps += len(ends)
        result.end_time = ends[-1]
        if result.num_steps // self.progress_every != before // self.progress_every:
            self._report_progress()

    def _report_progress(self) -> None:
        if self.progress is None:
            return
        done = self.result.num_requests - len(self.core.requests)
        if done > self._reported:
            self.progress.update(done - self._reported)
            self._reported = done
