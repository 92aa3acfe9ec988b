"""``minivllm simulate WORKLOAD --cost-model M --out LOG``: a workload through the simulated engine,
or a fleet of them (``--replicas N --router R``: LOG is then the fleet log, the replicas' logs beside it).

WORKLOAD is a workload JSONL, a recorded log (its requests are re-simulated, by default under
the log's own engine config), an Azure CSV or a Mooncake JSONL. Engine flags override the
config; the summary table comes from the written log (analysis.frames / analysis.metrics).

Speculative decoding (``--speculative ngram:K``, or a speculative log's own config) draws its
drafts and their acceptance from ``--acceptance LOG|RATE`` (runtime/cli/acceptance_flags.py); a
speculative log re-simulated takes its own rates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

from runtime.cli import cost_models
from runtime.cli.acceptance_flags import add_acceptance_args, report_speculation, speculation_from_args
from runtime.cli.config_flags import add_config_flags, config_options
from runtime.cli.errors import CLIError
from runtime.cli.fleet_flags import add_fleet_args, placement, replica_models, replica_overrides
from runtime.cli.workload import add_workload_args, require_file, require_requests, workload_from_args

# KV pool for trace workloads when neither the log nor --num-blocks says: 512k tokens at block
# size 16, the order of an H200's pool for a sub-1B model.
DEFAULT_NUM_BLOCKS = 32768


def add_engine_args(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, ("cache", "scheduler", ""), title="engine (default: the log's config for a log, "
                     "else the engine defaults)", defaults={
                         "cache.num_blocks": f"{DEFAULT_NUM_BLOCKS} for a trace",
                         "scheduler.max_model_len": "long enough for the workload's longest request",
                         "seed": "0; it also seeds synthetic trace prompts"})


def engine_config(args: argparse.Namespace, workload, base=None, model_identity: str = ""):
    """The engine config: ``base`` (a log's) or defaults, then the flags. A budget the flags don't
    give follows chunked prefill (``SchedulerConfig.replace``): ``--chunked off`` alone gives the
    budget of a whole prompt."""
    from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig

    if base is None:
        base = EngineConfig(cache=CacheConfig(num_blocks=DEFAULT_NUM_BLOCKS),
                            scheduler=SchedulerConfig(max_model_len=max(4096, workload.max_request_tokens())),
                            model_identity=model_identity or "unknown")
    return base.replace(**config_options(args))


def print_config_changes(base, config, what: str) -> list[str]:
    """Every field ``config`` changes from ``base`` (the A/B states its difference)."""
    from simulator.fidelity.config_diff import config_changes

    lines = config_changes(base, config)
    if lines:
        print(f"config changes from {what}: " + "; ".join(lines))
    return lines


def _no_flags(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with no engine flag given: the defaults a trace simulates under."""
    from runtime.cli.config_flags import PREFIX

    return argparse.Namespace(**{k: None if k.startswith(PREFIX) else v for k, v in vars(args).items()})


def _replica_config(config, override):
    from runtime.engine.config import ConfigError

    if override is None or not override.options:
        return config
    try:
        return config.replace(**override.options)
    except ConfigError as e:
        raise CLIError(f"--replica: {e}") from None


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from analysis.frames import load_frames
    from analysis.metrics import render_summary, summarize
    from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
    from simulator.fleet.replica import SimResult
    from simulator.replay.replay import log_config
    from traces.events import make_header
    from traces.fleet_log import fleet_extra, replica_log_path
    from traces.formats import detect_format
    from traces.log import LogWriter

    require_file(args.workload, "workload file")
    is_log = (args.workload_format == "log"
              or (args.workload_format == "auto" and detect_format(args.workload) == "log"))
    base = None
    if is_log:
        header, base = log_config(args.workload)
        if header.clock == "workload":
            base = None  # a saved workload carries no engine config
    wl = workload_from_args(args, args.workload, seed=config_options(args).get("seed", 0))
    require_requests(wl, args, args.workload)
    from simulator.cost.ranges import track_ranges

    cost_model = cost_models.load(args.cost_model, log=args.workload if is_log else None)
    identity = getattr(cost_model, "meta", {}).get("model_identity", "")
    config = engine_config(args, wl, base, identity)
    changes = print_config_changes(engine_config(_no_flags(args), wl, base, identity) if base is None else base,
                                   config, "the log's config" if base is not None else "the defaults")

    overrides = replica_overrides(args)
    devices = placement(args) or [None] * args.replicas
    fleet = args.replicas > 1
    configs = [_replica_config(config, overrides.get(i)) for i in range(args.replicas)]
    speculation = speculation_from_args(args, configs, args.workload if base is not None else None, config.seed)
    print(f"simulating {len(wl):,} requests ({wl.duration:,.1f} s of arrivals) → {args.out}"
          + (f" ({args.replicas} replicas, {args.router})" if fleet else ""))
    trackers = [track_ranges(m) for m in replica_models(args, cost_model, overrides)]
    models = [t or m for t, m in zip(trackers, replica_models(args, cost_model, overrides))]
    report_speculation(speculation, configs)
    logs = [replica_log_path(args.out, i) for i in range(args.replicas)] if fleet else [Path(args.out)]
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(LogWriter(p)) for p in logs]
        route_sink = None
        if fleet:
            route_sink = stack.enter_context(LogWriter(args.out))
            placed = {"devices": devices} if devices[0] is not None else {}
            route_sink(make_header(config, clock="sim", extra={**fleet_extra(args.router, logs, args.out, **placed),
                                                               **({"point": args.point} if args.point else {})}))
        bar = stack.enter_context(tqdm(total=len(wl), unit="req", desc="simulate", disable=args.no_progress,
                                       mininterval=0.5))
        results = simulate_fleet(wl, [ReplicaSpec(c, m, w, d) for c, m, w, d in zip(configs, models, writers, devices)],
                                 args.router, route_sink=route_sink, progress=bar, speculation=speculation,
                                 header_extra={"cost_model": str(args.cost_model),
                                               **({"point": args.point} if args.point else {})})
    wall = time.perf_counter() - t0
    result = results[0] if not fleet else SimResult(
        sum(r.num_requests for r in results), sum(r.num_steps for r in results), max(r.end_time for r in results),
        sorted(x for r in results for x in r.rejected))
    tracker = trackers[0]
    for i, t in enumerate(trackers):
        if t is not None and t.warning():
            print((f"replica {i}: " if fleet else "") + t.warning())
    if result.rejected:
        print(f"rejected {len(result.rejected):,} requests the engine can't serve "
              f"(first: request {result.rejected[0][0]}: {result.rejected[0][1]})")
    speed = result.end_time / wall if wall > 0 else float("inf")
    print(f"{result.num_steps:,} steps, {result.end_time:,.1f} s simulated in {wall:,.1f} s wall "
          f"({speed:,.0f}× real time)")
    summary = summarize(load_frames(args.out))
    summary["wall_s"] = wall
    summary["rejected"] = len(result.rejected)
    summary["config_changes"] = changes
    if tracker is not None:
        summary["outside_model_range"] = tracker.report.to_dict()
    print(render_summary(summary, title=f"simulate {Path(args.workload).name}"))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"config": config.to_dict(), "summary": summary}, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a workload on the engine with a step-time cost model")
    p.add_argument("workload", help="workload JSONL, recorded log, Azure CSV or Mooncake JSONL")
    p.add_argument("--cost-model", required=True, metavar="M",
                   help="cost-model JSON, a shipped name (e.g. qwen3-0.6b-h200), or 'recorded' "
                        "(the durations of WORKLOAD, a log)")
    p.add_argument("--out", required=True, metavar="LOG", help="event log to write (.jsonl or .jsonl.gz)")
    p.add_argument("--json", metavar="PATH", help="also write config + summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--point", metavar="TEXT", help="the sweep point this run re-runs (minivllm sweep's command "
                   "column), kept in the log's Header as extra.point")
    add_engine_args(p)
    add_acceptance_args(p)
    add_fleet_args(p)
    add_workload_args(p)
    p.set_defaults(func=_run)
