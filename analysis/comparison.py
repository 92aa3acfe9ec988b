"""The runs side by side: one markdown table, one column per run, one row per metric.

``ROWS`` is every metric the report shows; the ``KEY`` ones (latency p50/p90, throughput,
makespan, stalls) make the short table at the top of a report, where each run after the first has
a Δ column: its change against the first run, in percent. ``delta_pct`` is that change. A row in
ms whose values reach ``SECONDS_FROM_MS`` is shown in seconds (an overloaded run waits minutes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# (label, how to read it from summarize(), format, in the key table)
ROWS: list[tuple[str, Callable[[dict], Any], str, bool]] = [
    ("requests finished", lambda s: s["finished"], "{:,}", False),
    ("requests rejected (never served)", lambda s: s["rejected"], "{:,}", False),
    ("rejected share", lambda s: s["rejected_share"], "{:.1%}", False),
    ("steps", lambda s: s["steps"], "{:,}", False),
    ("makespan (s)", lambda s: s["makespan_s"], "{:,.2f}", True),
    ("output throughput (tok/s)", lambda s: s["output_throughput_tok_s"], "{:,.1f}", True),
    ("TTFT p50 (ms)", lambda s: s["ttft_s"]["p50"] * 1e3, "{:,.1f}", True),
    ("TTFT p90 (ms)", lambda s: s["ttft_s"]["p90"] * 1e3, "{:,.1f}", True),
    ("TTFT p99 (ms)", lambda s: s["ttft_s"]["p99"] * 1e3, "{:,.1f}", False),
    ("TPOT p50 (ms)", lambda s: s["tpot_s"]["p50"] * 1e3, "{:,.1f}", True),
    ("TPOT p90 (ms)", lambda s: s["tpot_s"]["p90"] * 1e3, "{:,.1f}", True),
    ("TPOT p99 (ms)", lambda s: s["tpot_s"]["p99"] * 1e3, "{:,.1f}", False),
    ("ITL p50 (ms)", lambda s: s["itl_s"]["p50"] * 1e3, "{:,.1f}", False),
    ("ITL p99 (ms)", lambda s: s["itl_s"]["p99"] * 1e3, "{:,.1f}", False),
    ("ITL max (ms)", lambda s: s["itl_s"]["max"] * 1e3, "{:,.1f}", False),
    ("E2E p50 (ms)", lambda s: s["e2e_s"]["p50"] * 1e3, "{:,.1f}", True),
    ("E2E p90 (ms)", lambda s: s["e2e_s"]["p90"] * 1e3, "{:,.1f}", True),
    ("E2E p99 (ms)", lambda s: s["e2e_s"]["p99"] * 1e3, "{:,.1f}", False),
    ("decode stalls (gaps > stall threshold)", lambda s: s["stalls"]["count"], "{:,}", True),
    ("stall threshold (ms)", lambda s: s["stalls"]["threshold_s"] * 1e3, "{:,.1f}", True),
    ("requests with a stall", lambda s: s["stalls"]["requests"], "{:,}", False),
    ("queueing p90 (ms)", lambda s: s["queue_s"]["p90"] * 1e3, "{:,.1f}", False),
    ("preemptions", lambda s: s["preemptions"], "{:,}", False),
    ("prefix hit rate", lambda s: s["prefix_hit_rate"], "{:.1%}", False),
    ("mean tokens per step", lambda s: s["mean_batch_tokens"], "{:,.1f}", False),
    ("mean step (ms)", lambda s: s["mean_step_s"] * 1e3, "{:,.2f}", False),
]
KEY = [row for row in ROWS if row[3]]
SECONDS_FROM_MS = 10_000.0


def delta_pct(value: float, base: float) -> float:
    """(value - base) / base in percent; NaN where the base is 0 or undefined."""
    if not (base == base and value == value) or base == 0:
        return float("nan")
    return (value - base) / abs(base) * 100.0


def markdown_table(labels: Sequence[str], summaries: Sequence[dict[str, Any]], key: bool = False) -> str:
    """Every row of ``ROWS`` (``key``: the key rows, with a Δ column after each run but the first,
    its change against the first run)."""
    rows = KEY if key else ROWS
    deltas = key and len(labels) > 1
    head = [labels[0]] + [c for label in labels[1:] for c in ([label, "Δ"] if deltas else [label])]
    lines = ["| metric | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for name, get, fmt, _ in rows:
        values = [get(s) for s in summaries]
        if name.endswith("(ms)") and max((abs(v) for v in values if v == v), default=0.0) >= SECONDS_FROM_MS:
            name, fmt, values = name.removesuffix("(ms)") + "(s)", "{:,.2f}", [v / 1e3 for v in values]
        cells = [_cell(fmt, values[0])]
        for v in values[1:]:
            cells.append(_cell(fmt, v))
            if deltas:
                cells.append(_pct(delta_pct(v, values[0])))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(fmt: str, value: Any) -> str:
    return "-" if value != value else fmt.format(value)  # NaN: undefined for this run


def _pct(value: float) -> str:
    return "-" if value != value else f"{value:+.1f}%"
