"""Side-by-side report of several logs (e.g. live vs simulated, chunked prefill on vs off).

``write_report`` puts into one folder: report.md (the runs' Header differences, then the
comparison table), latency_cdf.png, timeline.png, one Chrome trace per run and the per-request,
per-step and per-gap frames as CSV.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.chrome_trace import write_chrome_trace
from analysis.frames import LogFrames
from analysis.header_diff import render_header_differences
from analysis.metrics import summarize
from analysis.plots import latency_cdfs, timeline
from analysis.stalls import DEFAULT_STALL_S

# (label, how to read it from summarize(), format)
ROWS: list[tuple[str, Any, str]] = [
    ("requests finished", lambda s: s["finished"], "{:,}"),
    ("requests rejected (never served)", lambda s: s["rejected"], "{:,}"),
    ("rejected share", lambda s: s["rejected_share"], "{:.1%}"),
    ("steps", lambda s: s["steps"], "{:,}"),
    ("makespan (s)", lambda s: s["makespan_s"], "{:,.2f}"),
    ("output throughput (tok/s)", lambda s: s["output_throughput_tok_s"], "{:,.1f}"),
    ("TTFT p50 (ms)", lambda s: s["ttft_s"]["p50"] * 1e3, "{:,.1f}"),
    ("TTFT p90 (ms)", lambda s: s["ttft_s"]["p90"] * 1e3, "{:,.1f}"),
    ("TTFT p99 (ms)", lambda s: s["ttft_s"]["p99"] * 1e3, "{:,.1f}"),
    ("TPOT p50 (ms)", lambda s: s["tpot_s"]["p50"] * 1e3, "{:,.1f}"),
    ("TPOT p90 (ms)", lambda s: s["tpot_s"]["p90"] * 1e3, "{:,.1f}"),
    ("TPOT p99 (ms)", lambda s: s["tpot_s"]["p99"] * 1e3, "{:,.1f}"),
    ("ITL p50 (ms)", lambda s: s["itl_s"]["p50"] * 1e3, "{:,.1f}"),
    ("ITL p99 (ms)", lambda s: s["itl_s"]["p99"] * 1e3, "{:,.1f}"),
    ("ITL max (ms)", lambda s: s["itl_s"]["max"] * 1e3, "{:,.1f}"),
    ("decode stalls (gaps > {stall_ms} ms)", lambda s: s["stalls"]["count"], "{:,}"),
    ("requests with a stall", lambda s: s["stalls"]["requests"], "{:,}"),
    ("E2E p50 (ms)", lambda s: s["e2e_s"]["p50"] * 1e3, "{:,.1f}"),
    ("E2E p99 (ms)", lambda s: s["e2e_s"]["p99"] * 1e3, "{:,.1f}"),
    ("queueing p90 (ms)", lambda s: s["queue_s"]["p90"] * 1e3, "{:,.1f}"),
    ("preemptions", lambda s: s["preemptions"], "{:,}"),
    ("prefix hit rate", lambda s: s["prefix_hit_rate"], "{:.1%}"),
    ("mean tokens per step", lambda s: s["mean_batch_tokens"], "{:,.1f}"),
    ("mean step (ms)", lambda s: s["mean_step_s"] * 1e3, "{:,.2f}"),
]


def comparison_table(runs: Sequence[tuple[str, LogFrames]], stall_s: float = DEFAULT_STALL_S) -> str:
    """A markdown table: one column per run, one row per metric (stalls: gaps over ``stall_s``)."""
    summaries = [summarize(frames, stall_s) for _, frames in runs]
    lines = ["| metric | " + " | ".join(label for label, _ in runs) + " |",
             "|---|" + "---:|" * len(runs)]
    for name, get, fmt in ROWS:
        name = name.format(stall_ms=f"{stall_s * 1e3:,.0f}")
        lines.append(f"| {name} | " + " | ".join(_cell(fmt, get(s)) for s in summaries) + " |")
    return "\n".join(lines) + "\n"


def _cell(fmt: str, value: Any) -> str:
    return "-" if value != value else fmt.format(value)  # NaN: undefined for this run


def _slug(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "_", label).strip("_") or "run"


def write_report(runs: Sequence[tuple[str, LogFrames]], out_dir: str | Path, title: str = "minivllm report",
                 notes: str = "", stall_s: float = DEFAULT_STALL_S) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    diffs = render_header_differences([label for label, _ in runs], [frames.header for _, frames in runs])
    table = (f"```\n{diffs}```\n\n" if diffs else "") + comparison_table(runs, stall_s)
    latency_cdfs(runs, out / "latency_cdf.png")
    timeline(runs, out / "timeline.png")
    for label, frames in runs:
        slug = _slug(label)
        write_chrome_trace(frames, out / f"{slug}.trace.json")
        frames.requests.to_csv(out / f"{slug}.requests.csv", index=False)
        frames.steps.to_csv(out / f"{slug}.steps.csv", index=False)
        frames.gaps.to_csv(out / f"{slug}.gaps.csv", index=False)
        if len(frames.rejected):
            frames.rejected.to_csv(out / f"{slug}.rejected.csv", index=False)
    md = [f"# {title}\n", notes, "\n" if notes else "", table,
          "\n![latency CDFs](latency_cdf.png)\n\n![timeline](timeline.png)\n",
          "\nChrome traces (open in https://ui.perfetto.dev): "
          + ", ".join(f"`{_slug(label)}.trace.json`" for label, _ in runs) + "\n"]
    path = out / "report.md"
    path.write_text("".join(md))
    return path
