"""The capacity a live run measured at an SLO, from ``minivllm bench matrix``'s summary.json: the
highest load at which the served (or in-process) runs meet the SLO, to set beside a search's.

The matrix ran the workload at a few loads (rate scales of the same slice). Up the loads, the
first run that breaks a term bounds the capacity; between it and the run below (which met every
term), each broken term's latency is interpolated (linear in log latency against the rate scale)
to where it reaches its limit, and the lowest such load is the capacity. A run with errors (served)
or refused requests (in process) breaks the SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from runtime.planning.slo import Slo, SloTerm

SOURCES = ("serve", "live")  # bench serve through HTTP; bench live in process


@dataclass
class LiveCapacity:
    rate_scale: float  # the capacity (NaN where no run met the SLO)
    how: str  # "interpolated" | "at least" (every run met it) | "below" (no run met it)
    runs: list[dict[str, Any]] = field(default_factory=list)  # per run: rate_scale, offered_req_s, terms, ok


def _value(summary: dict[str, Any], term: SloTerm, source: str) -> float:
    if source == "serve":
        stats = summary.get(f"{term.metric}_ms") or {}
        value = stats.get(term.stat)
        return float("nan") if value is None else float(value)
    stats = summary.get(f"{term.metric}_s") or {}
    value = stats.get(term.stat)
    return float("nan") if value is None else float(value) * 1e3


def _clean(summary: dict[str, Any], source: str) -> bool:
    if source == "serve":
        return not summary.get("errors")
    return not summary.get("rejected", 0)


def _crossing(x0: float, v0: float, x1: float, v1: float, limit: float) -> float:
    """Where the latency through (x0, v0) and (x1, v1), linear in log, reaches ``limit``."""
    if not (v0 > 0 and v1 > v0 and limit > 0):
        return x0
    f = (math.log(limit) - math.log(v0)) / (math.log(v1) - math.log(v0))
    return x0 + min(max(f, 0.0), 1.0) * (x1 - x0)


def measured_capacity(matrix: dict[str, Any], slo: Slo, chunked: str | None = None,
                      source: str = "serve") -> LiveCapacity:
    rows = [r for r in matrix.get("rows", []) if source in r and (chunked is None or r.get("chunked") == chunked)]
    rows.sort(key=lambda r: r["rate_scale"])
    runs = []
    for r in rows:
        summary = r[source]
        terms = {t.column: _value(summary, t, source) for t in slo.terms}
        ok = _clean(summary, source) and all(terms[t.column] <= t.limit_ms for t in slo.terms)
        runs.append({"rate_scale": r["rate_scale"], "offered_req_s": r.get("offered_req_s"), "load": r.get("load"),
                     **terms, "ok": ok})
    for i, run in enumerate(runs):
        if run["ok"]:
            continue
        if i == 0:
            return LiveCapacity(float("nan"), "below", runs)
        below = runs[i - 1]
        x = min((_crossing(below["rate_scale"], below[t.column], run["rate_scale"], run[t.column], t.limit_ms)
                 for t in slo.terms if not run[t.column] <= t.limit_ms), default=below["rate_scale"])
        return LiveCapacity(x, "interpolated", runs)
    return LiveCapacity(runs[-1]["rate_scale"] if runs else float("nan"), "at least", runs)
