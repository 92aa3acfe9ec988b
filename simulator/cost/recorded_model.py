"""A recording's own step durations as a cost model (trace-vs-live tests, zero-error timing replay)."""

from __future__ import annotations

from collections.abc import Container, Sequence

import numpy as np

from simulator.cost.cost_model import CostModel, CostModelError
from simulator.cost.engine_timing import EngineTiming
from simulator.cost.logged_run import LoggedRun, LogPath
from traces.events import Aborted, Arrived, Finished, Span, Step


class RecordedCostModel(CostModel):
    """The step durations a log recorded, keyed by step index — and the engine's time between steps.

    ``gap_before(k)`` is what the recording spent between being ready for step k (the previous
    commit, or the arrival that woke an idle engine) and scheduling it: Python overhead, request
    intake. The simulator waits it out before scheduling, so arrivals the live engine took in
    during that time land in the same step: re-simulation reproduces the live decisions.
    """

    def __init__(self, durations: dict[int, float], source: str = "", gaps: dict[int, float] | None = None
                 ) -> None:
        self.durations = durations
        self.gaps = gaps or {}
        self.source = source

    @classmethod
    def from_log(cls, log: LogPath | LoggedRun) -> RecordedCostModel:
        run = log if isinstance(log, LoggedRun) else LoggedRun.read(log)
        steps: list[tuple[int, float, float, int]] = []  # step, start, end, finishes logged before it
        arrival: dict[int, float] = {}
        finished: list[int] = []
        aborted: set[int] = set()
        for ev in run.events:
            if isinstance(ev, Step):
                steps.append((ev.step, ev.start, ev.end, len(finished)))
            elif isinstance(ev, Arrived):
                arrival[ev.request_id] = ev.time
            elif isinstance(ev, Finished):
                finished.append(ev.request_id)
            elif isinstance(ev, Aborted):
                aborted.add(ev.request_id)
        # aborted requests are not part of a re-simulated workload: leave them out of the counts
        arrivals = np.sort([t for rid, t in arrival.items() if rid not in aborted])
        done = np.cumsum([0] + [rid not in aborted for rid in finished])
        durations: dict[int, float] = {}
        gaps: dict[int, float] = {}
        prev_end = None
        for step, start, end, n_finished in steps:
            if prev_end is None:
                ready = float(arrivals[0]) if len(arrivals) else start
            else:
                arrived = int(np.searchsorted(arrivals, prev_end, side="right"))
                idle = arrived - done[n_finished] <= 0 and arrived < len(arrivals)
                ready = float(arrivals[arrived]) if idle else prev_end  # idle: woken by the next arrival
            durations[step] = end - start
            if start > ready:
                gaps[step] = start - ready
            prev_end = end
        return cls(durations, run.path, gaps)

    def step_time(self, step: int, spans: Sequence[Span], verifying: Container[int] = ()) -> float:
        try:
            return self.durations[step]
        except KeyError:
            raise CostModelError(f"step {step} is not in the recorded log {self.source}: "
                                 "the run diverged from the recording") from None

    def gap_before(self, step: int) -> float:
        return self.gaps.get(step, 0.0)

    def timing(self, max_num_batched_tokens: int) -> EngineTiming:
        return EngineTiming(step_time=self.step_time, gap_before=self.gap_before)
