"""``minivllm replay LOG``: timing-replay (``--cost-model M``) or execute-replay (``--execute``).
A fleet log is replayed replica by replica (each replica's own log, step times and executor); a
replay that compared no step is an error.

Timing-replay re-times the recorded steps with a cost model and reports its error per step and
per request (TTFT, E2E). Execute-replay runs the recorded batches on the real model runtime and
compares the tokens with the log, printing the first divergent step with its context.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime.cli import cost_models
from runtime.cli.config_flags import add_config_flags, announce_load, engine_options
from runtime.cli.errors import CLIError
from runtime.cli.workload import require_file


def _logs(path: str):
    """(fleet log or not, the engine logs to replay): a fleet log's replicas, one after another."""
    from simulator.replay.replicas import replica_logs
    from traces.log import LogError

    try:
        return replica_logs(path)
    except LogError as e:
        raise CLIError(str(e)) from None


def _nothing_compared(args: argparse.Namespace, fleet: bool) -> CLIError:
    where = "its replicas' logs hold" if fleet else "it holds"
    return CLIError(f"{args.log}: nothing compared: {where} no steps")


def _timing(args: argparse.Namespace) -> int:
    import pandas as pd

    from simulator.replay.replay import render_timing_replay, timing_replay

    model = None if args.cost_model == "recorded" else cost_models.load(args.cost_model)
    fleet, logs = _logs(args.log)
    reports = []
    for i, log in enumerate(logs):
        report = timing_replay(log, model or cost_models.load(args.cost_model, log=str(log)))
        print(f"timing-replay of {log} with {args.cost_model}" + (f" (replica {i} of {args.log})" if fleet else ""))
        print(render_timing_replay(report) if report.summary["steps"] else "no steps (no request reached it)")
        reports.append(report)
    if not sum(r.summary["steps"] for r in reports):
        raise _nothing_compared(args, fleet)
    if args.json:
        doc = ({"fleet_log": args.log, "replicas": [{"log": str(log), **r.summary} for log, r in zip(logs, reports)]}
               if fleet else reports[0].summary)
        Path(args.json).write_text(json.dumps(doc, indent=2))
    if args.steps_csv:
        tables = [r.steps.assign(replica=i) if fleet else r.steps for i, r in enumerate(reports)]
        pd.concat(tables, ignore_index=True).to_csv(args.steps_csv, index=False)
    return 0


def count_steps(path: str) -> int:
    """The Step events of a log, counted without decoding them (a line starts with its ``"type"``),
    so execute-replay's progress bar knows its total: a second or two per GB."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    count = 0
    try:
        with opener(path, "rb") as f:
            for line in f:
                count += line.startswith(b'{"type":"Step"')
    except EOFError:  # a gzip log cut off mid-write (a killed server): the steps before the cut
        pass
    return count


def _execute(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from runtime.executor.setup import replay_executor_factory
    from simulator.replay.execute import execute_replay, render_execute_report
    from traces.log import read_header

    fleet, logs = _logs(args.log)
    ok, steps = True, 0
    for i, log in enumerate(logs):
        header = read_header(log)
        total = header.extra.get("num_steps")
        if total is None and not args.no_progress:
            total = count_steps(str(log))
        if i == 0:
            announce_load(args.model or header.extra.get("model_path"))
        if fleet:
            print(f"execute-replay of {log} (replica {i} of {args.log})")
        with tqdm(total=total, unit="step", desc="execute-replay", disable=args.no_progress) as bar:
            try:
                report = execute_replay(log, replay_executor_factory(args.model, **engine_options(args)),
                                        stop_at_first=not args.keep_going, progress=bar)
            except RuntimeError as e:
                raise CLIError(str(e)) from None
        print(render_execute_report(report) if report.steps else "no steps (no request reached it)")
        ok, steps = ok and report.ok, steps + report.steps
    if not steps:
        raise _nothing_compared(args, fleet)
    return 0 if ok else 1


def _run(args: argparse.Namespace) -> int:
    require_file(args.log, "log")
    if args.execute == bool(args.cost_model):
        raise CLIError("replay needs exactly one of --cost-model M (timing-replay) or --execute")
    return _execute(args) if args.execute else _timing(args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="timing-replay a log with a cost model, or execute-replay it on the model")
    p.add_argument("log", help="a recorded event log, or a fleet log (each of its replicas' logs is replayed)")
    p.add_argument("--cost-model", metavar="M",
                   help="timing-replay: cost-model JSON, a shipped name (e.g. qwen3-0.6b-h200), or 'recorded' "
                        "(the log's own durations)")
    p.add_argument("--json", metavar="PATH", help="timing-replay: write the summary as JSON")
    p.add_argument("--steps-csv", metavar="PATH", help="timing-replay: write per-step recorded/predicted times")
    p.add_argument("--execute", action="store_true", help="execute-replay on the real model runtime")
    p.add_argument("--model", help="execute-replay: model folder or .gguf (default: the log's model)")
    add_config_flags(p, ("runner",), title="execute-replay runtime (default: as recorded where the log says)",
                     defaults={"runner.dtype": "the log's"})
    p.add_argument("--keep-going", action="store_true", help="execute-replay: count every mismatching step")
    p.add_argument("--no-progress", action="store_true", help="execute-replay: no progress bar on stderr")
    p.set_defaults(func=_run)
