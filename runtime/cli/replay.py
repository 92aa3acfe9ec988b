"""``minivllm replay LOG``: timing-replay (``--cost-model M``) or execute-replay (``--execute``).

Timing-replay re-times the recorded steps with a cost model and reports its error per step and
per request (TTFT, E2E). Execute-replay runs the recorded batches on the real model runtime and
compares the tokens with the log, printing the first divergent step with its context.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime.cli.config_flags import add_config_flags, engine_options
from runtime.cli.errors import CLIError
from runtime.cli.workload import require_file


def _timing(args: argparse.Namespace) -> int:
    from simulator.cost_model import RecordedCostModel, load_cost_model
    from simulator.replay import render_timing_replay, timing_replay

    model = RecordedCostModel.from_log(args.log) if args.cost_model == "recorded" else load_cost_model(args.cost_model)
    report = timing_replay(args.log, model)
    print(f"timing-replay of {args.log} with {args.cost_model}")
    print(render_timing_replay(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.summary, indent=2))
    if args.steps_csv:
        report.steps.to_csv(args.steps_csv, index=False)
    return 0


def _execute(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from runtime.executor.setup import replay_executor_factory
    from simulator.execute import execute_replay, render_execute_report
    from traces.log import read_header

    header = read_header(args.log)
    steps = header.extra.get("num_steps")
    with tqdm(total=steps, unit="step", desc="execute-replay", disable=args.no_progress) as bar:
        try:
            report = execute_replay(args.log, replay_executor_factory(args.model, **engine_options(args)),
                                    stop_at_first=not args.keep_going, progress=bar)
        except RuntimeError as e:
            raise CLIError(str(e)) from None
    print(render_execute_report(report))
    return 0 if report.ok else 1


def _run(args: argparse.Namespace) -> int:
    require_file(args.log, "log")
    if args.execute == bool(args.cost_model):
        raise CLIError("replay needs exactly one of --cost-model M (timing-replay) or --execute")
    return _execute(args) if args.execute else _timing(args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="timing-replay a log with a cost model, or execute-replay it on the model")
    p.add_argument("log", help="a recorded event log")
    p.add_argument("--cost-model", metavar="M",
                   help="timing-replay: cost-model JSON, a shipped name, or 'recorded' (the log's own durations)")
    p.add_argument("--json", metavar="PATH", help="timing-replay: write the summary as JSON")
    p.add_argument("--steps-csv", metavar="PATH", help="timing-replay: write per-step recorded/predicted times")
    p.add_argument("--execute", action="store_true", help="execute-replay on the real model runtime")
    p.add_argument("--model", help="execute-replay: model folder or .gguf (default: the log's model)")
    add_config_flags(p, ("runner",), title="execute-replay runtime (default: as recorded where the log says)",
                     defaults={"runner.dtype": "the log's"})
    p.add_argument("--keep-going", action="store_true", help="execute-replay: count every mismatching step")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_run)
