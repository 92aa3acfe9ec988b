"""Latency SLOs of a run: ``ttft_p99_ms=1000,tpot_p99_ms=50``.

A term bounds one statistic (mean, p50, p90, p99, max) of one latency (TTFT, TPOT, E2E, queue,
ITL) over a run's served requests, in milliseconds. A run meets the SLO when every term holds and
the engine refused no request (a refused request waited forever).

Goodput counts the requests that meet the terms one by one: a request is good when it finished and
its own TTFT, TPOT, E2E and queueing are within the limits of the terms on them (ITL has no value
per request; a TPOT is undefined for one output token and bounds nothing then), as ``bench serve
--slo`` counts them; ``goodput_req_s`` = good requests / makespan, ``slo_attainment`` = good /
requests offered (refused ones included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

METRICS = ("ttft", "tpot", "e2e", "queue", "itl")
STATS = ("mean", "p50", "p90", "p99", "max")
PER_REQUEST = ("ttft", "tpot", "e2e", "queue")  # latencies a single request has


class SloError(ValueError):
    """An SLO spec that can't be read; the message names the term."""


@dataclass(frozen=True)
class SloTerm:
    metric: str
    stat: str
    limit_ms: float

    @property
    def column(self) -> str:
        """The table column it bounds: ``ttft_p99_ms``."""
        return f"{self.metric}_{self.stat}_ms"


@dataclass(frozen=True)
class Slo:
    terms: tuple[SloTerm, ...]

    @classmethod
    def parse(cls, text: str) -> Slo:
        terms = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            pieces = key.split("_")
            if not sep or len(pieces) != 3 or pieces[0] not in METRICS or pieces[1] not in STATS or pieces[2] != "ms":
                raise SloError(f"SLO term {part!r}: expected METRIC_STAT_ms=LIMIT, METRIC one of {', '.join(METRICS)}, "
                               f"STAT one of {', '.join(STATS)} (e.g. ttft_p99_ms=1000)")
            try:
                limit = float(value)
            except ValueError:
                raise SloError(f"SLO term {part!r}: {value!r} is not a number") from None
            if not (limit > 0 and math.isfinite(limit)):
                raise SloError(f"SLO term {part!r}: the limit must be a positive number")
            if any(t.column == key for t in terms):
                raise SloError(f"SLO term {part!r}: {key} given twice")
            terms.append(SloTerm(pieces[0], pieces[1], limit))
        if not terms:
            raise SloError("an SLO needs at least one term, e.g. ttft_p99_ms=1000,tpot_p99_ms=50")
        return cls(tuple(terms))

    def text(self) -> str:
        return ",".join(f"{t.column}={t.limit_ms:g}" for t in self.terms)

    def violations(self, metrics: dict[str, Any]) -> list[str]:
        """The terms a run's metrics break (NaN breaks a term: no request got that far), and the
        refusals."""
        out = []
        for t in self.terms:
            value = metrics[t.column]
            if not value <= t.limit_ms:
                out.append(f"{t.column} {value:,.1f} > {t.limit_ms:g}")
        if metrics.get("rejected", 0):
            out.append(f"{metrics['rejected']:,} rejected")
        return out

    def request_limits_s(self) -> dict[str, float]:
        """Per latency with a value per request, the tightest limit on it (seconds)."""
        limits: dict[str, float] = {}
        for t in self.terms:
            if t.metric in PER_REQUEST:
                limits[t.metric] = min(limits.get(t.metric, math.inf), t.limit_ms / 1e3)
        return limits

    def good_requests(self, latencies: pd.DataFrame, finished: pd.Series) -> int:
        """How many requests meet every per-request limit (``latencies``: analysis.metrics.latencies)."""
        good = finished.to_numpy(dtype=bool).copy()
        for metric, limit in self.request_limits_s().items():
            values = latencies[metric].to_numpy(dtype=float)
            ok = values <= limit
            if metric == "tpot":
                ok |= pd.isna(latencies[metric]).to_numpy()
            good &= ok
        return int(good.sum())
