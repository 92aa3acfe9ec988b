"""The latency metrics ``minivllm regress`` checks and their relative tolerances (``--tolerance``).

Light on purpose (no pandas): the CLI's help lists the metrics without loading the analysis.
"""

from __future__ import annotations

import fnmatch
import math

CHECKS = ("decisions", "tokens", "latency")
# metric -> (summary key, statistic); seconds
METRICS: dict[str, tuple[str, str]] = {
    f"{name}_{stat}": (f"{name}_s", stat) for name in ("ttft", "tpot", "itl", "e2e") for stat in ("p50", "p90", "p99")
}
METRICS["makespan"] = ("makespan_s", "")
DEFAULT_TOLERANCE = 0.10


class ToleranceError(ValueError):
    """A malformed ``--tolerance`` value (the message names the bad part)."""


def parse_tolerances(spec: str) -> dict[str, float]:
    """``"ttft_p50=0.1,e2e_*=0.5,*=0.2"`` → ``{pattern: relative tolerance}``; a pattern must match a metric."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ToleranceError(f"{part!r}: expected METRIC=FRACTION (e.g. ttft_p50=0.1)")
        if not any(fnmatch.fnmatchcase(m, key) for m in METRICS):
            raise ToleranceError(f"{key!r} matches no metric; metrics: {', '.join(METRICS)} (patterns like e2e_* work)")
        try:
            tol = float(value)
        except ValueError:
            raise ToleranceError(f"{key}: {value!r} is not a number") from None
        if not (math.isfinite(tol) and tol >= 0):
            raise ToleranceError(f"{key}: the tolerance must be a finite number >= 0, got {value}")
        out[key] = tol
    return out


def tolerance_for(metric: str, tolerances: dict[str, float], default: float = DEFAULT_TOLERANCE) -> float:
    """An exact name wins; else the last pattern that matches; else ``default``."""
    if metric in tolerances:
        return tolerances[metric]
    matching = [tol for pattern, tol in tolerances.items() if fnmatch.fnmatchcase(metric, pattern)]
    return matching[-1] if matching else default
