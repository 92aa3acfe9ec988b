"""The statistics a fidelity report and a what-if compare: a run's latencies summarized, and the
signed relative difference of two figures."""

from __future__ import annotations

import math

import numpy as np

STATS = ("mean", "p50", "p90", "p99")


def stats(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {"n": 0, **dict.fromkeys(STATS, math.nan)}
    return {"n": int(len(values)), "mean": float(values.mean()),
            **{f"p{p}": float(np.percentile(values, p)) for p in (50, 90, 99)}}


def rel_error(sim: float, live: float) -> float:
    """(sim - live) / live in %; NaN where live is 0 or unknown (a queue p50 of 0, say)."""
    if not (math.isfinite(sim) and math.isfinite(live)) or live == 0:
        return math.nan
    return (sim - live) / live * 100
