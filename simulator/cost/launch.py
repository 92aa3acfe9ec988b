"""Eager launches that hold back the step before them (the overlapped engine).

With async scheduling the host plans and launches step k+1 while step k runs, and only then
collects step k's tokens (runtime/engine/step_loop.py). A step that carries prefill runs eagerly
(no CUDA graph): launching its kernels one by one takes the host about 5 ms on the H200 machines,
more than a decode step's device work (2-4 ms). So a decode step followed by a prefill step is
logged about that long, and the prefill step after it short (its kernels ran as they were
launched). A cost model fitted on logged durations charges that to the wrong steps, and a
simulation without it misses how long an arrival during decode waits for its first step
(with a constant intake delay instead, the simulated conv TTFT p50 comes out ~6 % long at higher
loads on the H200).

The model (HostTiming.eager_launch, simulator/sim.py): planning and launching a step that carries
prefill takes ``eager_launch + eager_launch_per_token · extra tokens`` (tokens beyond one per
span); the step in flight ends no earlier than that launch; the launched step's device work follows
the step before's and its own last launch. Fitted here from the logs: a step followed by a prefill
step lasts ``max(GPU time, launch of the next)``, the GPU time being the step model's.

On by default where every fitted step carries its time on the device (a GPU profile sweep: the step
model then learns those and the launch is fitted apart); ``cost-model fit --eager-launch`` elsewhere.
The shipped models are fitted on served logs without times on the device and have none.

The step model learns the device's work, and a prefill step's time on the device is its work only
when the launch kept ahead of it. Its CUDA events time it from the step before's end on the device;
a small model's short prefill is launched more slowly than the device runs it, so its kernels run as
they come and it ends as the launch does: just before the host collects the step before (within
``LAUNCH_BOUND_S``: on an H100, 222 of a profile's 469 prefills under 320 tokens ended within 0.05 ms
of it, 2 more within 0.1 ms, the rest later). Such a step's time says only that its work took no
longer (``launch_bound``): learned as work, it prices a served prefill of another shape, after a step
of another length, at that launch's span (sessions' prefills on cached prefixes came out ~1 ms long
and every decode step behind them late: TPOT p50 +7.2 % against +1.1 % with them left out).
The simulation already ends such a step no earlier than its launch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from simulator.cost.features import FEATURES
from simulator.cost.host_timing import HostTiming
from simulator.cost.step_data import StepData

MIN_STEPS = 10  # steps followed by a prefill step needed to fit the launch
LAUNCH_BOUND_S = 1e-4  # a prefill ending on the device no later than this after the held step's logged end


def fit_eager_launch(data: StepData, device: np.ndarray) -> dict[str, Any] | None:
    """``eager_launch`` and ``eager_launch_per_token`` from the steps of ``data`` followed by a prefill
    step (``data.next_extra`` > 0) whose GPU times the step model puts at
    ``device``: least squares of ``duration − max(device, launch)`` (a step whose device work outlasts
    the launch says only that the launch was shorter). None when no step was followed by one."""
    from scipy.optimize import least_squares

    nxt = data.next_extra
    if nxt is None or (nxt > 0).sum() < MIN_STEPS:
        return None
    rows = nxt > 0
    y, dev, x = data.durations[rows], device[rows], nxt[rows].astype(float)

    def residual(c: np.ndarray) -> np.ndarray:
        return y - np.maximum(dev, c[0] + c[1] * x)

    guess = [float(np.median(y)), 0.0]
    c = least_squares(residual, guess, bounds=([0.0, 0.0], [np.inf, np.inf])).x
    bound = c[0] + c[1] * x > dev
    return {"eager_launch": float(c[0]), "eager_launch_per_token": float(c[1]),
            "steps_followed_by_prefill": int(rows.sum()), "launch_bound_share": float(bound.mean())}


def launch_pairs(data: StepData) -> np.ndarray:
    """The steps whose logged durations a launch moves, as a mask over ``data``'s rows: a decode-only
    step whose next step (tiled) carries prefill is logged until that step's launch ends, and the
    prefill step after it short by as much (its kernels ran as they were launched). Neither logged
    duration is the step's GPU time; with the launch modelled, the step model leaves them out."""
    nxt = data.next_extra
    if nxt is None:
        return np.zeros(len(data.durations), dtype=bool)
    held = (data.features[:, FEATURES.index("prefill_tokens")] == 0) & (nxt > 0)
    return held | np.r_[False, held[:-1]]


def launch_bound(data: StepData) -> np.ndarray:
    """The prefill steps whose time on the device is their launch's span, not their work, as a mask
    over ``data``'s rows (logged durations, times on the device): each tiles after a decode step that its
    launch held back, and ends on the device no later than ``LAUNCH_BOUND_S`` after that step's logged
    end (the host collects it once the launch has returned). The decode step's device end is taken as
    its logged start plus its time on the device: no earlier than it was, so a step is missed rather
    than taken wrongly."""
    nxt, device = data.next_extra, data.device
    if nxt is None or device is None or not len(nxt):
        return np.zeros(len(data.durations), dtype=bool)
    prefill = data.features[:, FEATURES.index("prefill_tokens")] > 0
    after_held = np.r_[False, (nxt[:-1] > 0) & ~prefill[:-1]] & prefill
    span = np.r_[np.nan, data.durations[:-1] - device[:-1]]  # from the step before's device end to its logged end
    return after_held & (device - span < LAUNCH_BOUND_S)


def held_back_excess(data: StepData, device: np.ndarray) -> dict[str, Any] | None:
    """How much longer than ``device`` the steps followed by a prefill step are logged, on average,
    against the other steps (what ``--eager-launch`` would model); None without such steps."""
    nxt = data.next_extra
    if nxt is None or not (nxt > 0).any() or (nxt > 0).all():
        return None
    rows = nxt > 0
    resid = data.durations - device
    return {"steps": int(rows.sum()), "excess_s": float(resid[rows].mean()),
            "others_excess_s": float(resid[~rows].mean())}


def with_eager_launch(host: HostTiming, data: StepData, device: np.ndarray
                      ) -> tuple[HostTiming, dict[str, Any] | None]:
    """``host`` with the launch fitted (``fit_eager_launch``), and what was fitted (None: nothing,
    ``host`` as it was)."""
    fitted = fit_eager_launch(data, device)
    if fitted is not None:
        host = replace(host, eager_launch=fitted["eager_launch"],
                       eager_launch_per_token=fitted["eager_launch_per_token"])
    return host, fitted
