"""Inter-token latency and decode stalls, from the token deliveries of a log (``LogFrames.gaps``).

ITL is every gap between two consecutive deliveries of a request (a delivery is the end of a step
that sampled for it). TPOT averages them per request, so one multi-second gap in a long answer
barely moves it; a user sees the gap. A *stall* is a gap over a threshold (200 ms by default):
typically a long prompt prefilled whole in the step (chunked prefill off), or a preemption's
recompute. Each stall names the step that ended it and what the steps in it were doing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.frames import LogFrames

DEFAULT_STALL_S = 0.2
WORST = 5  # stalls listed, worst first (one per request)


def gap_stats(gaps: pd.Series) -> dict[str, float]:
    """mean, p50, p90, p99, max of gaps in seconds (NaN when there are none)."""
    v = gaps.to_numpy(dtype=float)
    if not len(v):
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "max")}
    p50, p90, p99 = np.percentile(v, (50, 90, 99))
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(v.max())}


def stalls(frames: LogFrames, threshold_s: float = DEFAULT_STALL_S, worst: int = WORST) -> dict[str, Any]:
    """Gaps over ``threshold_s``: how many, in how many requests, the longest gap per request, and
    the ``worst`` requests' longest gaps with the steps that made them."""
    g = frames.gaps
    over = g[g["gap"] > threshold_s]
    longest = g.loc[g.groupby("request_id")["gap"].idxmax()] if len(g) else g
    top = longest[longest["gap"] > threshold_s].sort_values(["gap", "request_id"], ascending=[False, True])
    return {
        "threshold_s": threshold_s,
        "count": int(len(over)),
        "requests": int(over["request_id"].nunique()),
        "longest_gap_per_request_s": gap_stats(longest["gap"]),
        "worst": [_describe(row, frames.steps) for row in top.head(worst).itertuples(index=False)],
    }


def _describe(row: Any, steps: pd.DataFrame) -> dict[str, Any]:
    """One stall: the request, the gap, the step that ended it, and the prefill done meanwhile."""
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


def render_stalls(st: dict[str, Any]) -> str:
    """Plain-text lines: the count, then the worst stalls."""
    ms = st["threshold_s"] * 1e3
    longest = st["longest_gap_per_request_s"]
    if not st["count"]:
        return f"decode stalls (gaps > {ms:,.0f} ms): none (longest gap {_ms(longest['max'])})"
    lines = [f"decode stalls (gaps > {ms:,.0f} ms): {st['count']:,} in {st['requests']:,} requests; "
             f"longest gap per request p50 {_ms(longest['p50'])}, p99 {_ms(longest['p99'])}, "
             f"max {_ms(longest['max'])}"]
    for w in st["worst"]:
        spread = "" if w["steps_in_gap"] == 1 else (f" (a gap of {w['steps_in_gap']} steps: "
                                                    f"{w['gap_prefill_tokens']:,} prefill tokens in them)")
        lines.append(f"  request {w['request_id']}: {_ms(w['gap_s'])} before step {w['step']}, which ran "
                     f"{w['step_prefill_tokens']:,} prefill tokens + {w['step_decode_seqs']:,} decodes in "
                     f"{_ms(w['step_duration_s'])}{spread}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1e3:,.0f} ms"
