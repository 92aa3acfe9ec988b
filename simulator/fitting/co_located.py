"""Fit what sharing a device costs: the factor a step behind another replica's work runs longer.

A co-located profile (``minivllm profile --co-located K``) runs K engines' sweeps on one device at
once, each from the same moment, each logging its steps as the engine measured them. Priced by the
engine's own model (fitted on the profile it ran alone), the steps are replayed engine by engine on
one ``Device`` (simulator/fleet/device.py), each engine launching its next step when its last one has
ended plus the host's gap the log shows, the way a simulated replica does. The slowdown is the one
that makes the replay's time equal the measured: the sum over engines of the time to their last step
within the window where every engine was still sweeping.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.cost.cost_model import CostModelError
from simulator.cost.logged_run import LoggedRun
from simulator.cost.shared_device import SharedDevice
from simulator.cost.step_data import StepData
from simulator.fleet.device import Device
from traces.events import Step

SLOWDOWN_RANGE = (0.1, 16.0)  # a factor outside this is a broken profile, not a device


@dataclass(frozen=True)
class MemberSteps:
    """One engine's steps within the common window: the host's gap before each (0 where its steps
    tile, as overlapped steps do) and its price alone."""

    gaps: np.ndarray
    alone: np.ndarray
    measured: float  # seconds from its first step's start to its last step's end


def member_steps(runs: Sequence[LoggedRun], predict) -> list[MemberSteps]:
    """Each run's steps up to the first moment one of the runs had ended its sweep (every engine's
    clock from its own first step: they began together). ``predict(run)``: its steps' prices alone."""
    timed = []
    for run in runs:
        steps = [e for e in run.events if isinstance(e, Step)]
        if not steps:
            raise CostModelError(f"{run.path}: no Step events")
        t0 = steps[0].start
        starts = np.array([s.start - t0 for s in steps])
        ends = np.array([s.end - t0 for s in steps])
        timed.append((starts, ends, np.asarray(predict(run), dtype=float)))
    window = min(ends[-1] for _, ends, _ in timed)
    out = []
    for starts, ends, alone in timed:
        n = int(np.searchsorted(ends, window, side="right"))
        gaps = np.maximum(starts[:n] - np.concatenate([[0.0], ends[: n - 1]]), 0.0)
        out.append(MemberSteps(gaps, alone[:n], float(ends[n - 1]) if n else 0.0))
    return out


def replay(members: Sequence[MemberSteps], slowdown: float, shared: bool = True) -> float:
    """The summed time of the members' steps replayed on one device (``shared``; else each alone)."""
    devices = [Device(0, len(members))] * len(members) if shared else [Device(i) for i in range(len(members))]
    launches = [(float(m.gaps[0]), i, 0) for i, m in enumerate(members) if len(m.alone)]
    heapq.heapify(launches)
    total = 0.0
    while launches:  # the device serves launches in time order
        t, i, k = heapq.heappop(launches)
        m = members[i]
        end = devices[i].run(t, float(m.alone[k]), slowdown)
        if k + 1 < len(m.alone):
            heapq.heappush(launches, (end + float(m.gaps[k + 1]), i, k + 1))
        else:
            total += end
    return total


def fit_shared_device(runs: Sequence[LoggedRun], model) -> SharedDevice:
    """The slowdown (bisection: the replay's time grows with it) of ``runs``, a co-located profile's
    logs, priced by ``model`` (a fitted model: ``predict_steps``)."""
    if len(runs) < 2:
        raise CostModelError("a co-located profile needs the logs of 2 or more engines that shared the device")
    members = member_steps(runs, lambda run: model.predict_steps(StepData.from_logs([run])))
    steps = sum(len(m.alone) for m in members)
    measured = sum(m.measured for m in members)
    if steps < 2 * len(members) or measured <= 0:
        raise CostModelError("the co-located logs overlap by too few steps to fit a slowdown")
    lo, hi = SLOWDOWN_RANGE
    if not replay(members, lo) <= measured <= replay(members, hi):
        raise CostModelError(f"the co-located steps took {measured:.3f} s in all, outside what any slowdown in "
                             f"{lo}-{hi} gives on one device: not a profile of engines sharing it")
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if replay(members, mid) < measured else (lo, mid)
    slowdown = (lo * hi) ** 0.5

    def error(t: float) -> float:
        return round((t - measured) / measured * 100, 2)

    return SharedDevice(slowdown=round(slowdown, 4), replicas=len(runs), steps=steps,
                        error_unshared_pct=error(replay(members, 1.0, shared=False)),
                        error_serial_pct=error(replay(members, 1.0)))
