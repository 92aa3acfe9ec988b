"""Requests the engine refused (``Rejected`` events): counted, never silently left out.

A refused request is usually one of the longest (over max_model_len, more KV than the pool, over
the chunked-off budget); leaving it out of a report makes every latency percentile look better.
The percentiles stay over served requests; the report says how many were refused, and why.
"""

from __future__ import annotations

import re
from typing import Any

from analysis.frames import LogFrames

_NUMBER = re.compile(r"\d[\d,]*")


def reason_kind(reason: str) -> str:
    """A reason with its numbers replaced by N, so refusals of one kind count together."""
    return _NUMBER.sub("N", reason)


def rejected_summary(frames: LogFrames) -> dict[str, Any]:
    """count, share of all requests offered, prompt tokens refused and counts per reason kind."""
    rej = frames.rejected
    n, served = int(len(rej)), int(len(frames.requests))
    kinds = rej["reason"].map(reason_kind).value_counts() if n else None
    return {
        "rejected": n,
        "rejected_share": n / (n + served) if n + served else 0.0,
        "rejected_prompt_tokens": int(rej["num_prompt_tokens"].sum()) if n else 0,
        # most frequent first; equal counts in name order (a stable report)
        "rejected_reasons": {} if kinds is None else dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def render_rejected(summary: dict[str, Any]) -> str:
    """The line a report opens with when requests were refused ("" when none was)."""
    n = summary["rejected"]
    if not n:
        return ""
    offered = n + summary["requests"]
    reasons = "; ".join(f"{count:,}× {kind}" for kind, count in list(summary["rejected_reasons"].items())[:3])
    return (f"!! {n:,} rejected of {offered:,} requests ({summary['rejected_share']:.1%}): never served, so "
            f"not in the latency percentiles below (over the {summary['requests']:,} served). {reasons}")
