"""The cost-model executor: a step's launch returns its virtual end (a ``KnownStep``); collecting
it is immediate, since the replica process has already waited until then.

Timing of overlapped steps (the async engine): step k+1, launched at ``now`` while step k is in
flight, runs on the device after k; with an eager ``launch_time`` the host launches k+1 until
``now + launch`` and only then collects k, so k's tokens reach the host no earlier, and k+1 ends no
earlier than its launch.

A replica whose device it shares with other replicas (simulator/fleet/device.py) runs a step's
device work after what the others launched on it before (longer by the model's ``shared_slowdown``
when it waited); the step's duration then includes that wait, as a live engine's measured step does.

Speculative decoding (simulator/fleet/speculation.py): a span that verifies drafts commits the
drafts ``draws`` accepts and one token of its own; the step is priced by its spans, a verify span
being a span of 1 + d tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from runtime.engine.request import Request
from runtime.engine.types import KnownStep, StepPlan, StepResult
from simulator.cost.engine_timing import EngineTiming
from simulator.fleet.device import Device
from simulator.fleet.speculation import DRAFT_TOKEN, RoundDraws

SYNTHETIC_TOKEN = 0  # the token every simulated step samples (no eos in simulation)
# a step's tokens without a token_fn: this one list for every sampling span (read, never changed)
_SYNTHETIC = [[SYNTHETIC_TOKEN]]

TokenFn = Callable[[int, int], int]  # (request_id, position) -> token id


class CostModelExecutor:
    def __init__(self, timing: EngineTiming, clock: Callable[[], float], token_fn: TokenFn | None = None,
                 draws: RoundDraws | None = None, device: Device | None = None) -> None:
        """``draws``: the acceptances of speculative rounds (needed when a plan carries drafts);
        ``device``: the device it shares with other replicas (None: one of its own)."""
        self.step_time, self.launch_time = timing.step_time, timing.launch_time
        self.shared_slowdown = timing.shared_slowdown
        self.clock, self.token_fn, self.draws = clock, token_fn, draws
        self.device = device if device is not None and device.shared else None
        self.in_flight: KnownStep | None = None  # launched, not collected

    def launch(self, plan: StepPlan, requests: Mapping[int, Request]) -> KnownStep:
        now = self.clock()
        token_fn = self.token_fn
        if plan.drafts is not None:
            tokens = self._verify(plan)
        elif token_fn is None:
            tokens = _SYNTHETIC * plan.num_sampling
        else:
            tokens = [[token_fn(s.request_id, s.start + s.num_tokens)] for s in plan.spans if s.sample]
        previous = self.in_flight
        start = previous.ready if previous is not None and previous.ready > now else now
        duration = self.step_time(plan.step, plan.spans, plan.drafts or ())
        if self.device is None:
            end = start + duration  # its device work follows the step in flight
        else:  # ... and what the other replicas launched on the device before it
            end = self.device.run(start, duration, self.shared_slowdown)
            duration = end - start
        if self.launch_time is not None:
            ready = now + self.launch_time(plan.num_scheduled_tokens - len(plan.spans))
            if previous is not None and ready > previous.ready:
                previous.ready = ready
            if ready > end:
                end = ready
        self.in_flight = step = KnownStep(StepResult(tokens, duration), end)
        return step

    def _verify(self, plan: StepPlan) -> list[list[int]]:
        """A speculating step's tokens: per verify span, its accepted drafts and one token more."""
        draws, token_fn, drafts = self.draws, self.token_fn, plan.drafts
        if draws is None:
            raise ValueError("a plan with drafts needs the acceptance draws (CostModelExecutor(draws=...))")
        tokens = []
        for s in plan.spans:
            if not s.sample:
                continue
            rid = s.request_id
            draft = drafts.get(rid)
            if not draft:
                position = s.start + s.num_tokens
                tokens.append([SYNTHETIC_TOKEN if token_fn is None else token_fn(rid, position)])
                continue
            n = draws.accepted(rid, s.start + 1, len(draft))
            own = SYNTHETIC_TOKEN if token_fn is None else token_fn(rid, s.start + 1 + n)
            if n < len(draft) and own == draft[n]:  # (a token_fn's): the rejected draft must differ
                own = DRAFT_TOKEN + 1
            tokens.append(draft[:n] + [own])
        return tokens

    def collect(self, handle: KnownStep) -> StepResult:
        if handle is self.in_flight:
            self.in_flight = None
        return handle.result
