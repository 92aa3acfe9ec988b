"""``minivllm regress BASELINE_LOG NEW_LOG``: the same decisions and latencies within tolerances, or exit 1.

    minivllm regress golden.jsonl.gz new.jsonl --tolerance 'ttft_p50=0.1,e2e_*=0.25' --json out.json
    minivllm regress live.jsonl resim.jsonl --ignore tokens          # a simulation samples its own tokens
    minivllm regress run1.jsonl run2.jsonl --ignore decisions --tolerance '*=0.5' --two-sided

Exit status: 0 passed, 1 a check failed (the report says which), 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError


def register(sub: argparse._SubParsersAction) -> None:
    from analysis.tolerances import CHECKS, DEFAULT_TOLERANCE, METRICS

    p = sub.add_parser("regress", help="compare a log with a baseline log: decisions, tokens, latency "
                                       "(exit 1 past tolerances)")
    p.add_argument("baseline", metavar="BASELINE_LOG", help="the reference event log")
    p.add_argument("new", metavar="NEW_LOG", help="the event log to check against it")
    p.add_argument("--tolerance", default="", metavar="SPEC",
                   help="relative tolerances, METRIC=FRACTION comma-separated; METRIC may be a pattern "
                        f"(e2e_*, *). Metrics: {', '.join(METRICS)} (default: none, all at --default-tolerance)")
    p.add_argument("--default-tolerance", type=float, default=DEFAULT_TOLERANCE, action=Bounded, at_least=0,
                   metavar="FRACTION", help="tolerance of a metric --tolerance doesn't name (default: %(default)s)")
    p.add_argument("--two-sided", action="store_true",
                   help="fail on a change either way (default: off, only a slowdown fails)")
    p.add_argument("--min-delta-ms", type=float, default=0.0, action=Bounded, at_least=0, metavar="MS",
                   help="a latency change smaller than this never fails (noise) (default: %(default)s)")
    p.add_argument("--ignore", default="", metavar="CHECKS",
                   help=f"comma-separated checks to skip: {', '.join(CHECKS)} (default: none)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON; '-' prints it instead of the "
                                                  "text (default: off)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from analysis.regress import regress, render_report
    from analysis.tolerances import CHECKS, ToleranceError, parse_tolerances
    from traces.log import read_header

    ignore = tuple(filter(None, (c.strip() for c in args.ignore.split(","))))
    unknown = [c for c in ignore if c not in CHECKS]
    if unknown:
        raise CLIError(f"--ignore: unknown check {unknown[0]!r}; checks: {', '.join(CHECKS)}")
    try:
        tolerances = parse_tolerances(args.tolerance)
    except ToleranceError as e:
        raise CLIError(f"--tolerance: {e}") from None
    for path in (args.baseline, args.new):
        if not Path(path).is_file():
            raise CLIError(f"{path}: no such file")
        read_header(path)  # not a log: one line naming the file (LogError), before the comparison
    report = regress(args.baseline, args.new, tolerances=tolerances, default_tolerance=args.default_tolerance,
                     two_sided=args.two_sided, min_delta_s=args.min_delta_ms / 1e3, ignore=ignore)
    if args.json != "-":
        sys.stdout.write(render_report(report))
    if args.json:
        text = json.dumps(report.to_dict(), indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(text + "\n")
    return 0 if report.passed else 1
