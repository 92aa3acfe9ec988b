"""``minivllm analyze LOG [LOG ...]``: summary tables, an A/B comparison, plots and Chrome traces."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="latency/throughput report of one or more event logs (A/B)")
    p.add_argument("logs", nargs="+", metavar="LOG", help="event logs (live or simulated)")
    p.add_argument("--labels", help="comma-separated names, one per log (default: file names)")
    p.add_argument("--out", metavar="DIR", help="write report.md, plots, Chrome traces and CSVs here "
                   "(default: print the tables only)")
    p.add_argument("--stall-ms", type=float, default=200.0, action=Bounded, above=0, metavar="MS",
                   help="a gap between two tokens of a request longer than this is a decode stall "
                        "(default: %(default)s)")
    p.set_defaults(func=run)


def load(path: str):
    """The frames of one log; a log with nothing to analyze is a user error, not a table of NaN."""
    from analysis.frames import load_frames

    frames = load_frames(path)
    if frames.header is None:
        if Path(path).stat().st_size == 0:
            raise CLIError(f"{path}: empty file")
        if frames.truncated:
            raise CLIError(f"{path}: the log was cut off inside its first line")
        raise CLIError(f"{path}: no Header line: not a minivllm event log")
    if not len(frames.requests) and not len(frames.rejected):  # all refused: that is the report
        raise CLIError(f"{path}: no requests in the log ({len(frames.steps):,} steps): nothing to analyze")
    return frames


def run(args: argparse.Namespace) -> int:
    from analysis.header_diff import render_header_differences
    from analysis.metrics import render_summary, summarize
    from analysis.report import comparison_table, write_report

    labels = args.labels.split(",") if args.labels else [Path(p).name for p in args.logs]
    if len(labels) != len(args.logs):
        raise CLIError(f"--labels: {len(labels)} labels for {len(args.logs)} logs")
    for path in args.logs:  # every file before the (slow) first read
        if not Path(path).is_file():
            raise CLIError(f"{path}: no such file")
    runs = [(label, load(path)) for label, path in zip(labels, args.logs)]
    stall_s = args.stall_ms / 1e3
    for label, frames in runs:
        print(render_summary(summarize(frames, stall_s), title=label))
    if len(runs) > 1:  # what differs between the runs, before the numbers that compare them
        print(render_header_differences(labels, [frames.header for _, frames in runs]))
        print(comparison_table(runs, stall_s))
    if args.out:
        print(f"wrote {write_report(runs, args.out, stall_s=stall_s)}")
    return 0
