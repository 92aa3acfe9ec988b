"""``minivllm workload {convert,generate,sessions,info}``: import, slice, scale and generate workloads.

Also the workload-reading options shared with ``simulate`` (``add_workload_args`` /
``workload_from_args``).
"""

from __future__ import annotations

import argparse
import sys

from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError


def _window(text: str) -> tuple[float, float]:
    try:
        start, end = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--time-window must be START:END in seconds, got {text!r}") from None
    if not 0 <= start < end:
        raise CLIError(f"--time-window: need 0 <= START < END, got {text}")
    return start, end


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    from traces.formats import FORMATS

    g.add_argument("--format", dest="workload_format", default="auto", choices=["auto", *FORMATS],
                   help="input format (default: %(default)s, detected from the file)")
    g.add_argument("--limit", type=int, action=Bounded, at_least=1,
                   help="first N requests (after --time-window) (default: all)")
    g.add_argument("--time-window", type=_window, metavar="START:END",
                   help="requests arriving in [START, END) seconds; arrivals then count from START "
                        "(default: the whole file)")
    g.add_argument("--rate-scale", type=float, default=1.0, action=Bounded, above=0,
                   help="multiply the arrival rate (default: %(default)s)")
    g.add_argument("--input-scale", type=float, default=1.0, action=Bounded, above=0,
                   help="multiply prompt lengths (default: %(default)s)")
    g.add_argument("--output-scale", type=float, default=1.0, action=Bounded, above=0,
                   help="multiply output lengths (default: %(default)s)")
    g.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed rows (their count is printed) instead of stopping at the first")
    g.add_argument("--chain-sessions", action="store_true",
                   help="closed loop: a request whose prompt block ids extend an earlier one's is that "
                        "conversation's next turn, sent only after the previous answer (Mooncake traces)")
    g.add_argument("--think-time", type=float, default=0.0, action=Bounded, at_least=0,
                   help="with --chain-sessions: seconds from an answer to the next turn (default: %(default)s)")


def workload_from_args(args: argparse.Namespace, path: str, seed: int = 0):
    from traces.formats import load_workload

    wl = load_workload(path, fmt=args.workload_format, limit=args.limit, time_window=args.time_window,
                       rate_scale=args.rate_scale, input_scale=args.input_scale,
                       output_scale=args.output_scale, skip_bad_rows=args.skip_bad_rows, seed=seed)
    if args.chain_sessions:
        from traces.sessions import chain_sessions

        wl = chain_sessions(wl, args.think_time)
        print(f"{wl.meta['sessions']:,} conversations among {len(wl):,} requests (closed loop)", file=sys.stderr)
    # notices go to stderr: stdout stays the command's output (`workload info x.csv | head -1`)
    skipped = wl.meta.get("skipped_rows", 0)
    if skipped:
        reasons = wl.meta.get("skipped_reasons", [])
        print(f"skipped {skipped:,} bad rows" + (f" (first: {reasons[0]})" if reasons else ""), file=sys.stderr)
    excluded = wl.meta.get("excluded")
    if excluded:
        print("left out of the workload: " + ", ".join(f"{n:,} {why}" for why, n in excluded.items()),
              file=sys.stderr)
    return wl


def require_requests(wl, args: argparse.Namespace, path: str) -> None:
    """A workload to run or save must have requests; say which slicing flag emptied it."""
    if len(wl):
        return
    sliced = [flag for flag, given in (("--time-window", args.time_window), ("--limit", args.limit)) if given]
    raise CLIError(f"{path}: no requests" + (f" (after {' and '.join(sliced)})" if sliced else ""))


def describe(wl) -> str:
    import numpy as np

    n = len(wl)
    if not n:
        return f"{wl.source}: 0 requests"
    ins = np.array([r.num_prompt_tokens for r in wl])
    outs = np.array([r.num_output_tokens for r in wl])
    rate = (n - 1) / wl.duration if wl.duration > 0 else float("nan")
    q = lambda a: (f"mean {a.mean():,.0f}, p50 {np.percentile(a, 50):,.0f}, "
                   f"p99 {np.percentile(a, 99):,.0f}, max {a.max():,}")
    return "\n".join([
        f"{wl.source}: {n:,} requests over {wl.duration:,.1f} s ({rate:,.2f} req/s)",
        f"  prompt tokens: {q(ins)}",
        f"  output tokens: {q(outs)}",
    ])


def _convert(args: argparse.Namespace) -> int:
    wl = workload_from_args(args, args.source, seed=args.seed)
    require_requests(wl, args, args.source)
    wl.save(args.out)
    print(describe(wl))
    print(f"wrote {args.out}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from traces.generators import LengthDist, generate

    dists = {}
    for flag, spec in (("--input-len", args.input_len), ("--output-len", args.output_len)):
        try:
            dists[flag] = LengthDist.parse(spec, seed=args.seed)
        except (ValueError, OSError) as e:  # a malformed spec, or trace:PATH unreadable
            raise CLIError(f"{flag}: {e}") from None
    wl = generate(args.num_requests, rate=args.rate, cv=args.cv, input_len=dists["--input-len"],
                  output_len=dists["--output-len"], shared_prefix=args.shared_prefix, seed=args.seed)
    wl.save(args.out)
    print(describe(wl))
    print(f"wrote {args.out}")
    return 0


def _sessions(args: argparse.Namespace) -> int:
    from traces.generators import LengthDist
    from traces.sessions import generate_sessions

    dists = {}
    for flag, spec in (("--turns", args.turns), ("--first-len", args.first_len), ("--message-len", args.message_len),
                       ("--output-len", args.output_len)):
        try:
            dists[flag] = LengthDist.parse(spec, seed=args.seed)
        except (ValueError, OSError) as e:
            raise CLIError(f"{flag}: {e}") from None
    wl = generate_sessions(args.num_sessions, rate=args.rate, turns=dists["--turns"], think_time=args.think_time,
                           first_len=dists["--first-len"], message_len=dists["--message-len"],
                           output_len=dists["--output-len"], cv=args.cv, seed=args.seed)
    wl.save(args.out)
    print(describe(wl))
    print(f"wrote {args.out} ({args.num_sessions:,} conversations, closed loop)")
    return 0


def _info(args: argparse.Namespace) -> int:
    print(describe(workload_from_args(args, args.source, seed=args.seed)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workload", help="import, slice, scale or generate a workload (JSONL)")
    kinds = p.add_subparsers(dest="workload_command", required=True, metavar="ACTION")

    c = kinds.add_parser("convert", help="read a trace or log, slice/scale it, save as workload JSONL")
    c.add_argument("source", help="Azure CSV, Mooncake JSONL, a minivllm log or workload")
    c.add_argument("--out", required=True, help="workload JSONL to write")
    c.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompt tokens (default: %(default)s)")
    add_workload_args(c)
    c.set_defaults(func=_convert)

    i = kinds.add_parser("info", help="request count, rate and length statistics")
    i.add_argument("source", help="Azure CSV, Mooncake JSONL, a minivllm log or workload")
    i.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompt tokens (default: %(default)s)")
    add_workload_args(i)
    i.set_defaults(func=_info)

    g = kinds.add_parser("generate", help="synthetic arrivals and lengths")
    g.add_argument("--num-requests", "-n", type=int, required=True, action=Bounded, at_least=1,
                   help="how many requests")
    g.add_argument("--rate", type=float, required=True, action=Bounded, above=0, help="mean arrivals per second")
    g.add_argument("--cv", type=float, default=1.0, action=Bounded, at_least=0,
                   help="burstiness: coefficient of variation of inter-arrival gaps (1 = Poisson; "
                        "default: %(default)s)")
    g.add_argument("--input-len", default="uniform:32:256",
                   help="fixed:N | uniform:LO:HI | lognormal:MEAN:CV[:MAX] | trace:PATH:input|output "
                        "(default: %(default)s)")
    g.add_argument("--output-len", default="uniform:16:256", help="as --input-len (default: %(default)s)")
    g.add_argument("--shared-prefix", type=int, default=0, action=Bounded, at_least=0,
                   help="tokens of a prefix common to all prompts (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed of arrivals, lengths and prompt tokens "
                   "(default: %(default)s)")
    g.add_argument("--out", required=True, help="workload JSONL to write")
    g.set_defaults(func=_generate)

    s = kinds.add_parser("sessions", help="synthetic conversations: each turn waits for the last answer (closed loop)")
    s.add_argument("--num-sessions", "-n", type=int, required=True, action=Bounded, at_least=1,
                   help="how many conversations")
    s.add_argument("--rate", type=float, required=True, action=Bounded, above=0,
                   help="mean conversation starts per second")
    s.add_argument("--cv", type=float, default=1.0, action=Bounded, at_least=0,
                   help="burstiness of the starts (default: %(default)s)")
    s.add_argument("--turns", default="uniform:2:6",
                   help="turns per conversation, as --input-len (default: %(default)s)")
    s.add_argument("--think-time", type=float, default=5.0, action=Bounded, at_least=0,
                   help="mean seconds from an answer to the next message, exponential (default: %(default)s)")
    s.add_argument("--first-len", default="uniform:64:512", help="first message tokens (default: %(default)s)")
    s.add_argument("--message-len", default="uniform:16:128", help="later message tokens (default: %(default)s)")
    s.add_argument("--output-len", default="uniform:16:256", help="answer tokens (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
    s.add_argument("--out", required=True, help="workload JSONL to write")
    s.set_defaults(func=_sessions)


def require_file(path: str, what: str) -> None:
    from pathlib import Path

    if not Path(path).exists():
        raise CLIError(f"{path}: no such {what}")
