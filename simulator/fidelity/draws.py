"""A what-if over redrawn arrivals: the change a config makes, measured on many draws of the
workload's arrival times instead of the one draw a live run recorded.

A short run's tail percentiles rest on a handful of requests (the p90 of 24 is the third largest),
so the change a what-if predicts on the recorded arrivals alone moves from run to run by more than
the change itself. Here the recorded requests (prompts, output lengths, sampling) are kept and
their arrivals redrawn: Poisson at the recorded mean rate, seeded (draw k uses seed k), the base
and the changed config each simulated on every draw. Per metric and statistic the report gives

  pooled_pct     the change on the draws' requests pooled (the statistic of all base requests
                 against that of all changed ones): the estimate, stable across runs
  low_pct/high_pct  the 10th and 90th percentile of the per-draw changes: how far one run of the
                 recorded size may land from it
  same_sign      the share of draws whose change has the pooled change's sign
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from runtime.engine.config import EngineConfig
from simulator.cost.cost_model import CostModel
from simulator.fidelity.statistics import rel_error, stats
from simulator.fleet.speculation import Speculation
from simulator.replay.request_times import METRICS, RequestTimes
from simulator.sim import simulate
from traces.workload import Workload

PERCENTILES = ("p50", "p90", "p99")
SPREAD = (10, 90)  # the per-draw changes' range reported


def redraw_arrivals(workload: Workload, seed: int) -> Workload:
    """``workload``'s requests in their order, arriving Poisson at its mean rate (requests over the
    span of their arrivals), the first at its first's time. ValueError for a closed-loop workload
    (its turns arrive when the previous answer has) or one whose requests all arrive at once."""
    if workload.closed_loop:
        raise ValueError("a closed-loop workload's turns arrive when the previous answer has: no arrivals to redraw")
    requests, span = workload.requests, workload.duration  # (in arrival order)
    if len(requests) < 2 or span <= 0:
        raise ValueError("its requests arrive at once (an offline batch): no arrival rate to redraw from")
    rate = (len(requests) - 1) / span
    gaps = np.random.default_rng(seed).exponential(1 / rate, len(requests) - 1)
    arrivals = requests[0].arrival + np.concatenate(([0.0], np.cumsum(gaps)))
    out = [msgspec.structs.replace(r, arrival=float(t)) for r, t in zip(requests, arrivals)]
    return Workload(out, seed=workload.seed, source=workload.source, meta=workload.meta)


def what_if_over_draws(workload: Workload, model: CostModel, base: EngineConfig, change: EngineConfig, draws: int,
                       speculation: Speculation | None = None) -> dict[str, Any]:
    """``{"draws": n, "metrics": {metric: {"p50": {pooled_pct, low_pct, high_pct, same_sign}, ...}}}``
    for ``change`` against ``base``, each simulated with ``model`` on ``draws`` redrawings of
    ``workload``'s arrivals (seeds 1..draws)."""
    if draws < 1:
        raise ValueError("--draws: at least 1")
    pooled: dict[str, dict[str, list[np.ndarray]]] = {side: {m: [] for m in METRICS} for side in ("base", "change")}
    per_draw: dict[str, dict[str, list[float]]] = {m: {p: [] for p in PERCENTILES} for m in METRICS}
    for seed in range(1, draws + 1):
        drawn = redraw_arrivals(workload, seed)
        values = {}
        for side, config in (("base", base), ("change", change)):
            times = RequestTimes()
            simulate(drawn, config, model, sink=times, speculation=speculation)
            values[side] = times.values()
            for m in METRICS:
                pooled[side][m].append(values[side][m])
        for m in METRICS:
            new, old = stats(values["change"][m]), stats(values["base"][m])
            for p in PERCENTILES:
                per_draw[m][p].append(rel_error(new[p], old[p]))
    out: dict[str, Any] = {}
    for m in METRICS:
        old, new = (stats(np.concatenate(pooled[side][m])) for side in ("base", "change"))
        out[m] = {}
        for p in PERCENTILES:
            effect = rel_error(new[p], old[p])
            changes = np.array([c for c in per_draw[m][p] if math.isfinite(c)])
            low, high = (float(np.percentile(changes, q)) if len(changes) else math.nan for q in SPREAD)
            agree = float(np.mean(np.sign(changes) == np.sign(effect))) if len(changes) and math.isfinite(effect) \
                else math.nan
            out[m][p] = {"pooled_pct": effect, "low_pct": low, "high_pct": high, "same_sign": agree}
    return {"draws": draws, "metrics": out}
