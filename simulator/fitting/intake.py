"""The front door's delay, fitted by re-simulation: the ``intake_delay`` at which a model's
simulation of live logs has their median TTFT.

An overlapped engine's log cannot show the delay directly (HostData's estimate needs gaps between
steps, and overlapped steps tile): a request that arrives while step k runs is first scheduled in
step k+2 or later (the engine plans k+1 while k runs; the request crosses a process boundary),
which a simulation that takes it into step k+1 misses by one step or more. The delay that closes
that gap on the calibration logs is found by bisection: the simulated TTFT p50 grows with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from simulator.cost.logged_run import LoggedRun, LogPath, read_runs
from simulator.cost.model_base import TimedModel
from simulator.replay.replay import resimulate
from simulator.replay.request_times import RequestTimes, times_of_log


def _ttft_p50(times: RequestTimes) -> float:
    v = times.values()["ttft"]
    return float(np.percentile(v, 50)) if len(v) else float("nan")


def live_ttft_p50(log: LogPath | LoggedRun) -> float:
    return _ttft_p50(times_of_log(log))


def _queue_bound(times: RequestTimes) -> bool:
    """Most of the run's median TTFT is queueing (queue p50 at least half the TTFT p50)."""
    v = times.values()
    return len(v["ttft"]) > 0 and float(np.percentile(v["queue"], 50)) >= 0.5 * _ttft_p50(times)


def simulated_ttft_p50(model: TimedModel, log: LogPath | LoggedRun, delay: float) -> float:
    times = RequestTimes()
    resimulate(log, model.with_intake_delay(delay), sink=times)
    return _ttft_p50(times)


def fit_intake_delay(model: TimedModel, logs: Sequence[LogPath | LoggedRun], *, iterations: int = 12
                     ) -> tuple[TimedModel, dict[str, Any]]:
    """``model`` with the intake delay (its own and its host timing's) whose simulation of ``logs``
    has their TTFT p50: the summed relative error is 0 (bisection on its sign; 0 when the
    simulation is already slow). Relative, so that a log whose TTFT is seconds of queueing does not
    outweigh one whose TTFT is a few steps. A log whose TTFT is mostly queueing is left out: there a
    0.1 % step-time error moves the TTFT more than the front door does; with only such logs the
    model is returned as it is. Returns the model and what it found. Each log is read once, for its
    latencies and every re-simulation."""
    runs = read_runs(logs)
    times = {r.path: times_of_log(r) for r in runs}
    queued = [r.path for r in runs if _queue_bound(times[r.path])]
    runs = [r for r in runs if r.path not in queued]
    if not runs:
        return model, {"logs": [], "left_out": queued}
    live = [_ttft_p50(times[r.path]) for r in runs]

    def excess(delay: float) -> float:
        return sum(simulated_ttft_p50(model, r, delay) / t - 1 for r, t in zip(runs, live) if t > 0)

    lo, hi = 0.0, max(live)
    before = excess(0.0)
    if before >= 0:
        delay = 0.0
    else:
        for _ in range(iterations):
            mid = (lo + hi) / 2
            if excess(mid) < 0:
                lo = mid
            else:
                hi = mid
        delay = (lo + hi) / 2
    host = model.host
    if host is not None:  # a wake from idle includes the intake: keep their sum
        model = model.with_host(replace(host, wake=max(host.wake + host.intake_delay - delay, 0.0),
                                        intake_delay=delay))
    else:
        model = model.with_intake_delay(delay)
    after = [simulated_ttft_p50(model, r, delay) for r in runs]
    out = {"logs": [r.path for r in runs], "intake_delay_s": delay, "live_ttft_p50_s": live,
           "ttft_p50_relative_excess_before": before / len(runs), "sim_ttft_p50_s_after": after}
    if queued:
        out["left_out"] = queued
    return model, out


SERVICE_GRID = (0.0, 0.25e-3, 0.5e-3, 1e-3, 2e-3)  # candidate front-door service times (s)


def _ttft_p90(times: RequestTimes) -> float:
    v = times.values()["ttft"]
    return float(np.percentile(v, 90)) if len(v) else float("nan")


def fit_intake_service(model: TimedModel, logs: Sequence[LogPath | LoggedRun], grid: Sequence[float] = SERVICE_GRID,
                       *, iterations: int = 8) -> tuple[TimedModel, dict[str, Any]]:
    """The front door as a queue: for each candidate service time (one worker, FIFO: requests
    closer together than it wait), the intake delay fitted anew to the logs' median TTFT
    (``fit_intake_delay``), then the summed relative error of their TTFT p90, which is where a
    burst's queueing at the door shows. Keeps the candidate with the least (the first on a tie);
    a model without host timing is returned as it is. Returns the model and what it found."""
    host = model.host
    if host is None:
        return model, {}
    runs = {r.path: r for r in read_runs(logs)}
    live = {path: _ttft_p90(times_of_log(r)) for path, r in runs.items()}
    scores = []
    for service in grid:
        # each candidate from the model's own delay and wake (``with_host`` sets its intake delay too)
        fitted, found = fit_intake_delay(model.with_host(replace(host, intake_service=service)), list(runs.values()),
                                         iterations=iterations)
        error = 0.0
        for p in found.get("logs", []):
            times = RequestTimes()
            resimulate(runs[p], fitted, sink=times)
            error += abs(_ttft_p90(times) / live[p] - 1)
        scores.append((error, service, fitted))
    error, service, best = min(scores, key=lambda s: s[0])
    assert best.host is not None
    return best, {"service_s": service, "intake_delay_s": best.host.intake_delay,
                  "ttft_p90_abs_relative_error": {f"{s * 1e3:g} ms": e for e, s, _ in scores}}
