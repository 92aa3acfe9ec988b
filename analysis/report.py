"""Side-by-side report of several logs (e.g. live vs simulated, chunked prefill on vs off).

``write_report`` puts into one folder report.md — a one-line conclusion, the warnings (e.g. a
simulation outside its cost model's profiled range), the key metrics with each run's change
against the first, how a stall was judged, the Header fields that differ, the plots, then every
metric — and latency_cdf.png, timeline.png. The per-request, per-step and per-gap frames as CSV
(``csv``) and one Chrome trace per run (``chrome_trace``) only when asked: on a million-step log
they are hundreds of MB.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.chrome_trace import write_chrome_trace
from analysis.comparison import markdown_table
from analysis.conclusion import conclusion
from analysis.frames import LogFrames
from analysis.header_diff import render_header_differences
from analysis.metrics import summarize
from analysis.plots import latency_cdfs, timeline


def comparison_table(runs: Sequence[tuple[str, LogFrames]], stall_s: float | None = None,
                     summaries: Sequence[dict[str, Any]] | None = None, key: bool = False) -> str:
    """Markdown: one column per run, one row per metric (``key``: the key rows with Δ columns)."""
    summaries = summaries or [summarize(frames, stall_s) for _, frames in runs]
    return markdown_table([label for label, _ in runs], summaries, key=key)


def stall_rule(labels: Sequence[str], summaries: Sequence[dict[str, Any]]) -> str:
    """What Δ is and how a stall was judged (each run's threshold is a row of the key table)."""
    delta = f"Δ: change against {labels[0]}. " if len(labels) > 1 else ""
    factor = summaries[0]["stalls"].get("factor")
    rule = (f"longer than {factor:g} × the run's median decode step (the median duration of its steps that ran "
            "a decode)" if factor else f"longer than {summaries[0]['stalls']['threshold_s'] * 1e3:,.0f} ms")
    return f"{delta}Decode stall: a gap between two tokens of a request {rule}."


def _slug(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "_", label).strip("_") or "run"


def _write_frames(label: str, frames: LogFrames, out: Path, csv: bool, chrome_trace: bool) -> list[str]:
    slug, written = _slug(label), []
    if chrome_trace:
        written.append(write_chrome_trace(frames, out / f"{slug}.trace.json").name)
    if csv:
        tables = {"requests": frames.requests, "steps": frames.steps, "gaps": frames.gaps}
        if len(frames.rejected):
            tables["rejected"] = frames.rejected
        for name, table in tables.items():
            table.to_csv(out / f"{slug}.{name}.csv", index=False)
            written.append(f"{slug}.{name}.csv")
    return written


def write_report(runs: Sequence[tuple[str, LogFrames]], out_dir: str | Path, title: str = "minivllm report",
                 notes: str = "", stall_s: float | None = None, warnings: Sequence[str] = (),
                 summaries: Sequence[dict[str, Any]] | None = None, csv: bool = False,
                 chrome_trace: bool = False, headline: Sequence[str] = ()) -> Path:
    """``headline``: the lines that lead the report in place of the run-by-run conclusion."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = [label for label, _ in runs]
    summaries = summaries or [summarize(frames, stall_s) for _, frames in runs]
    latency_cdfs(runs, out / "latency_cdf.png")
    timeline(runs, out / "timeline.png")
    files = {label: _write_frames(label, frames, out, csv, chrome_trace) for label, frames in runs}
    md = [f"# {title}\n\n"]
    if notes:
        md.append(f"{notes}\n\n")
    if headline:
        md.append(f"**{headline[0]}.**\n\n" + "".join(f"{line}.\n\n" for line in headline[1:]))
    elif len(runs) > 1:
        md.append(f"**{conclusion(labels, summaries)}.**\n\n")
    if warnings:  # one quote, a paragraph a warning
        md.append("> " + "\n>\n> ".join(warnings) + "\n\n")
    md += [markdown_table(labels, summaries, key=True), f"\n{stall_rule(labels, summaries)}\n\n"]
    diffs = render_header_differences(labels, [frames.header for _, frames in runs])
    if diffs:
        md.append(f"```\n{diffs}```\n\n")
    md.append("![latency CDFs](latency_cdf.png)\n\n![timeline](timeline.png)\n\n")
    md += ["## All metrics\n\n", markdown_table(labels, summaries), "\n"]
    traces = [f"`{name}`" for names in files.values() for name in names if name.endswith(".trace.json")]
    tables = [f"`{name}`" for names in files.values() for name in names if name.endswith(".csv")]
    if traces:
        md.append("Chrome traces (open in https://ui.perfetto.dev): " + ", ".join(traces) + "\n\n")
    if tables:
        md.append("CSV: " + ", ".join(tables) + "\n\n")
    if not (csv and chrome_trace):
        md.append("(`minivllm analyze --csv` writes the per-request, per-step and per-gap CSVs; "
                  "`--chrome-trace` a Chrome trace per run.)\n")
    path = out / "report.md"
    path.write_text("".join(md).rstrip("\n") + "\n")
    return path
