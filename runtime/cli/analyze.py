"""``minivllm analyze LOG [LOG ...]``: summary tables, an A/B comparison, plots; CSVs and Chrome
traces when asked (``--csv``, ``--chrome-trace``: hundreds of MB on a million-step log)."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="latency/throughput report of one or more event logs (A/B)")
    p.add_argument("logs", nargs="+", metavar="LOG", help="event logs (live or simulated)")
    p.add_argument("--labels", help="comma-separated names, one per log (default: file names)")
    p.add_argument("--out", metavar="DIR", help="write report.md and plots here (default: print the tables only)")
    p.add_argument("--csv", action="store_true", help="with --out: also the per-request, per-step and per-gap "
                   "CSVs of each run")
    p.add_argument("--chrome-trace", action="store_true", help="with --out: also a Chrome trace per run "
                   "(https://ui.perfetto.dev)")
    p.add_argument("--stall-factor", type=float, action=Bounded, above=0, metavar="K",
                   help="a gap between two tokens of a request longer than K × the run's median decode step "
                        "(of the steps that ran a decode) is a decode stall (default: 5, analysis/stalls.py)")
    p.add_argument("--stall-ms", type=float, action=Bounded, above=0, metavar="MS",
                   help="a fixed stall threshold instead, the same for every run")
    p.add_argument("--what-if", action="store_true",
                   help="three logs: BASE and CHANGE simulated from one cost model, then LIVE, the run BASE "
                        "simulates; the conclusion counts a change of CHANGE against BASE only beyond the model's "
                        "error (BASE against LIVE), and states that error on a line of its own")
    p.add_argument("--draws", metavar="JSON",
                   help="with --what-if: the report of `minivllm fidelity LIVE --what-if ... --draws N --json JSON` "
                        "(the same change over N redrawings of the arrivals): the conclusion weighs that change, "
                        "pooled, with the range one run may land in, instead of CHANGE's one draw")
    p.set_defaults(func=run)


def read_draws(path: str, live: str) -> dict:
    """The ``what_if.draws`` of a fidelity report on the ``live`` log; a CLI error names ``--draws``
    and what is wrong."""
    import json

    try:
        report = json.loads(Path(path).read_text())
        draws = report["what_if"]["draws"]
        _ = draws["metrics"]["ttft"]["p50"]["pooled_pct"], draws["draws"]
        measured = Path(report["live_log"])
    except FileNotFoundError:
        raise CLIError(f"--draws: {path}: no such file") from None
    except (OSError, ValueError) as e:
        raise CLIError(f"--draws: {path}: not a JSON report ({e})") from None
    except (KeyError, TypeError):
        raise CLIError(f"--draws: {path}: no what_if.draws in it (minivllm fidelity LIVE --what-if FIELD=VALUE "
                       "--draws N --json PATH writes one)") from None
    if not (measured.exists() and measured.samefile(live)):
        raise CLIError(f"--draws: {path}: measured the what-if on {measured}, not on {live}, the LIVE log given")
    return draws


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


def what_if_lines(labels: list[str], summaries: list[dict], draws: dict | None = None) -> list[str]:
    """The what-if's conclusion weighed against the model's error, and that error (analysis/what_if.py)."""
    from analysis.what_if import error_line, headline, weigh

    base, change, live = summaries
    weighed = weigh(base, change, live, draws)
    return [headline(labels[1], labels[0], weighed, draws["draws"] if draws else None),
            error_line(labels[2], base, live)]


def run(args: argparse.Namespace) -> int:
    from analysis.comparison import markdown_table
    from analysis.conclusion import conclusion
    from analysis.header_diff import render_header_differences
    from analysis.metrics import render_summary, summarize
    from analysis.report import stall_rule, write_report
    from analysis.stalls import STALL_FACTOR
    from runtime.cli.analyze_range import range_warning

    labels = args.labels.split(",") if args.labels else [Path(p).name for p in args.logs]
    if len(labels) != len(args.logs):
        raise CLIError(f"--labels: {len(labels)} labels for {len(args.logs)} logs")
    if (args.csv or args.chrome_trace) and not args.out:
        raise CLIError("--csv and --chrome-trace write into the --out folder: give --out DIR")
    for path in args.logs:  # every file before the (slow) first read
        if not Path(path).is_file():
            raise CLIError(f"{path}: no such file")
    if args.what_if and len(args.logs) != 3:
        raise CLIError(f"--what-if: give three logs (BASE CHANGE LIVE), not {len(args.logs)}")
    if args.draws and not args.what_if:
        raise CLIError("--draws: needs --what-if (three logs: BASE CHANGE LIVE)")
    draws = read_draws(args.draws, args.logs[2]) if args.draws else None
    runs = [(label, load(path)) for label, path in zip(labels, args.logs)]
    stall_s = None if args.stall_ms is None else args.stall_ms / 1e3
    factor = STALL_FACTOR if args.stall_factor is None else args.stall_factor
    summaries = [summarize(frames, stall_s, factor) for _, frames in runs]
    warnings = [f"{label}: {w}" for label, frames in runs if (w := range_warning(frames))]
    from analysis.speculation import acceptance_summary, render_acceptance

    for label, summary, path in zip(labels, summaries, args.logs):
        print(render_summary(summary, title=label))
        spec = acceptance_summary(path)
        if spec is not None:
            print(render_acceptance(spec, title=label))
    from analysis.outages import outage_lines

    for label, path in zip(labels, args.logs):
        for line in outage_lines(path):
            print(f"{label}: {line}" if len(runs) > 1 else line)
    for w in warnings:
        print(w)
    if len(runs) > 1:  # what differs between the runs, before the numbers that compare them
        print(render_header_differences(labels, [frames.header for _, frames in runs]))
        print(markdown_table(labels, summaries, key=True))
        print(stall_rule(labels, summaries))
    headline = what_if_lines(labels, summaries, draws) if args.what_if else []
    if headline:
        print("\n".join(f"{'conclusion' if i == 0 else 'model error'}: {line}" for i, line in enumerate(headline)))
    elif len(runs) > 1:
        print(f"conclusion: {conclusion(labels, summaries)}")
    if args.out:
        path = write_report(runs, args.out, stall_s=stall_s, warnings=warnings, summaries=summaries,
                            csv=args.csv, chrome_trace=args.chrome_trace, headline=headline)
        print(f"wrote {path}")
    return 0
