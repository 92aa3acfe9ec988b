"""Inter-token latency and decode stalls, from the token deliveries of a log (``LogFrames.gaps``).

ITL is every gap between two consecutive deliveries of a request (a delivery is the end of a step
that sampled for it). TPOT averages them per request, so one multi-second gap in a long answer
barely moves it; a user sees the gap. A *stall* is a gap over a threshold judged against the run's
own pace: ``STALL_FACTOR`` × its median decode step (the median duration of the steps that ran a
decode), so a CPU run whose every step takes 250 ms is not all stalls and an H200 run's 100 ms
hiccup is one; a fixed threshold can be given instead. Typically a stall is a long prompt
prefilled whole in the step (chunked prefill off), or a preemption's recompute. Each stall names
the step that ended it and what the steps in it were doing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.frames import LogFrames

STALL_FACTOR = 5.0  # a stall: a gap over this many median decode steps
WORST = 5  # stalls listed, worst first (one per request)


def gap_stats(gaps: pd.Series) -> dict[str, float]:
    """mean, p50, p90, p99, max of gaps in seconds (NaN when there are none)."""
    v = gaps.to_numpy(dtype=float)
    if not len(v):
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "max")}
    p50, p90, p99 = np.percentile(v, (50, 90, 99))
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(v.max())}


def median_decode_step(steps: pd.DataFrame) -> float:
    """Median duration of the steps that ran at least one decode (of all steps if none did; NaN
    without steps)."""
    if not len(steps):
        return float("nan")
    decoding = steps["duration"][steps["decode_seqs"] > 0]
    return float((decoding if len(decoding) else steps["duration"]).median())


def stall_threshold(frames: LogFrames, threshold_s: float | None = None,
                    factor: float = STALL_FACTOR) -> tuple[float, str]:
    """The gap that counts as a stall and how it was chosen: ``threshold_s`` if given, else
    ``factor`` × the run's median decode step."""
    if threshold_s is not None:
        return threshold_s, "fixed"
    step = median_decode_step(frames.steps)
    if step != step:
        return float("inf"), "no steps"
    return factor * step, f"{factor:g} × median decode step {_ms(step, ',.1f')}"


def stalls(frames: LogFrames, threshold_s: float | None = None, worst: int = WORST,
           factor: float = STALL_FACTOR) -> dict[str, Any]:
    """Gaps over the stall threshold (``stall_threshold``): how many, in how many requests, the
    longest gap per request, and the ``worst`` requests' longest gaps with the steps that made them."""
    threshold_s, rule = stall_threshold(frames, threshold_s, factor)
    g = frames.gaps
    over = g[g["gap"] > threshold_s]
    longest = g.loc[g.groupby("request_id")["gap"].idxmax()] if len(g) else g  # (a fleet's ids are unique)
    top = longest[longest["gap"] > threshold_s].sort_values(["gap", "request_id"], ascending=[False, True])
    return {
        "threshold_s": threshold_s,
        "rule": rule,
        "factor": None if rule == "fixed" else factor,
        "count": int(len(over)),
        "requests": int(over["request_id"].nunique()),
        "longest_gap_per_request_s": gap_stats(longest["gap"]),
        "worst": [_describe(row, frames.steps) for row in top.head(worst).itertuples(index=False)],
    }


def _describe(row: Any, steps: pd.DataFrame) -> dict[str, Any]:
    """One stall: the request, the gap, the step that ended it, and the prefill done meanwhile."""
    if "replica" in steps:  # a fleet's: the steps of the replica that served the request
        steps = steps[steps["replica"] == row.replica]
    s = steps.set_index("step")
    inside = s.loc[(s.index > row.prev_step) & (s.index <= row.step)]
    end = s.loc[row.step] if row.step in s.index else None
    return {
        "request_id": int(row.request_id),
        "gap_s": float(row.gap),
        "step": int(row.step),
        "steps_in_gap": int(row.step - row.prev_step),
        "step_prefill_tokens": int(end["prefill_tokens"]) if end is not None else 0,
        "step_decode_seqs": int(end["decode_seqs"]) if end is not None else 0,
        "step_duration_s": float(end["duration"]) if end is not None else float("nan"),
        "gap_prefill_tokens": int(inside["prefill_tokens"].sum()),
    }


def threshold_text(st: dict[str, Any]) -> str:
    """``gaps > 62 ms = 5 × median decode step 12.4 ms`` (the rule only where there is one)."""
    rule = st.get("rule", "fixed")
    return f"gaps > {_ms(st['threshold_s'])}" + ("" if rule == "fixed" else f" = {rule}")


def render_stalls(st: dict[str, Any]) -> str:
    """Plain-text lines: the count, then the worst stalls."""
    longest = st["longest_gap_per_request_s"]
    if not st["count"]:
        return f"decode stalls ({threshold_text(st)}): none (longest gap {_ms(longest['max'])})"
    lines = [f"decode stalls ({threshold_text(st)}): {st['count']:,} in {st['requests']:,} requests; "
             f"longest gap per request p50 {_ms(longest['p50'])}, p99 {_ms(longest['p99'])}, "
             f"max {_ms(longest['max'])}"]
    for w in st["worst"]:
        spread = "" if w["steps_in_gap"] == 1 else (f" (a gap of {w['steps_in_gap']} steps: "
                                                    f"{w['gap_prefill_tokens']:,} prefill tokens in them)")
        lines.append(f"  request {w['request_id']}: {_ms(w['gap_s'])} before step {w['step']}, which ran "
                     f"{w['step_prefill_tokens']:,} prefill tokens + {w['step_decode_seqs']:,} decodes in "
                     f"{_ms(w['step_duration_s'])}{spread}")
    return "\n".join(lines)


def _ms(seconds: float, fmt: str = ",.0f") -> str:
    return "-" if seconds != seconds or seconds == float("inf") else f"{seconds * 1e3:{fmt}} ms"
