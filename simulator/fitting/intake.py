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
from pathlib import Path
from typing import Any

import numpy as np

from simulator.replay.replay import resimulate
from simulator.replay.request_times import RequestTimes, times_of_log


def _ttft_p50(times: RequestTimes) -> float:
    v = times.values()["ttft"]
    return float(np.percentile(v, 50)) if len(v) else float("nan")


def live_ttft_p50(path: str | Path) -> float:
    return _ttft_p50(times_of_log(path))


def _queue_bound(times: RequestTimes) -> bool:
    """Most of the run's median TTFT is queueing (queue p50 at least half the TTFT p50)."""
    v = times.values()
    return len(v["ttft"]) > 0 and float(np.percentile(v["queue"], 50)) >= 0.5 * _ttft_p50(times)


def simulated_ttft_p50(model: Any, path: str | Path, delay: float) -> float:
    model.intake_delay = delay
    times = RequestTimes()
    resimulate(path, model, sink=times)
    return _ttft_p50(times)


def fit_intake_delay(model: Any, logs: Sequence[str | Path], *, iterations: int = 12) -> dict[str, Any]:
    """Set ``model.intake_delay`` (and its host timing's) to the delay whose simulation of ``logs``
    has their TTFT p50: the summed relative error is 0 (bisection on its sign; 0 when the
    simulation is already slow). Relative, so that a log whose TTFT is seconds of queueing does not
    outweigh one whose TTFT is a few steps. A log whose TTFT is mostly queueing is left out: there a
    0.1 % step-time error moves the TTFT more than the front door does; with only such logs the delay
    stays as it is. Returns what it found."""
    times = {p: times_of_log(p) for p in logs}
    queued = [str(p) for p in logs if _queue_bound(times[p])]
    logs = [p for p in logs if str(p) not in queued]
    if not logs:
        return {"logs": [], "left_out": queued}
    live = [_ttft_p50(times[p]) for p in logs]

    def excess(delay: float) -> float:
        return sum(simulated_ttft_p50(model, p, delay) / t - 1 for p, t in zip(logs, live) if t > 0)

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
    host = getattr(model, "host", None)
    if host is not None:  # a wake from idle includes the intake: keep their sum
        host.wake = max(host.wake + host.intake_delay - delay, 0.0)
        host.intake_delay = delay
    model.intake_delay = delay
    after = [simulated_ttft_p50(model, p, delay) for p in logs]
    out = {"logs": [str(p) for p in logs], "intake_delay_s": delay, "live_ttft_p50_s": live,
           "ttft_p50_relative_excess_before": before / len(logs), "sim_ttft_p50_s_after": after}
    if queued:
        out["left_out"] = queued
    return out


SERVICE_GRID = (0.0, 0.25e-3, 0.5e-3, 1e-3, 2e-3)  # candidate front-door service times (s)


def _ttft_p90(times: RequestTimes) -> float:
    v = times.values()["ttft"]
    return float(np.percentile(v, 90)) if len(v) else float("nan")


def fit_intake_service(model: Any, logs: Sequence[str | Path], grid: Sequence[float] = SERVICE_GRID,
                       *, iterations: int = 8) -> dict[str, Any]:
    """The front door as a queue: for each candidate service time (one worker, FIFO: requests
    closer together than it wait), the intake delay fitted anew to the logs' median TTFT
    (``fit_intake_delay``), then the summed relative error of their TTFT p90, which is where a
    burst's queueing at the door shows. Keeps the candidate with the least (the first on a tie);
    a model without host timing is left as it is."""
    host = getattr(model, "host", None)
    if host is None:
        return {}
    live = {str(p): _ttft_p90(times_of_log(p)) for p in logs}
    start = (host.intake_delay, host.wake, host.intake_service)
    scores = []
    for service in grid:
        host.intake_delay, host.wake = start[:2]
        host.intake_service = service
        model.intake_delay = start[0]
        fitted = fit_intake_delay(model, logs, iterations=iterations)
        error = 0.0
        for p in fitted.get("logs", []):
            times = RequestTimes()
            resimulate(p, model, sink=times)
            error += abs(_ttft_p90(times) / live[p] - 1)
        scores.append((error, service, host.intake_delay, host.wake))
    error, service, delay, wake = min(scores, key=lambda s: s[0])
    host.intake_delay, host.wake, host.intake_service = delay, wake, service
    model.intake_delay = delay
    return {"service_s": service, "intake_delay_s": delay,
            "ttft_p90_abs_relative_error": {f"{s * 1e3:g} ms": e for e, s, _, _ in scores}}
