"""What ``sweep`` and ``search`` share: the workload, cost model, engine and fleet flags (as
``simulate`` reads them), the acceptance rates of speculative points (``--acceptance``, as
``simulate`` reads it), the grid, the SLO, where the points run (Ray or this process) and the
cache. A point's engine config is ``simulate``'s for the same flags: the flags and the point's own
settings go over the same base in one replace.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from runtime.cli import cost_models
from runtime.cli.acceptance_flags import add_acceptance_args, is_speculative, report_speculation, speculation_from_args
from runtime.cli.checks import Bounded
from runtime.cli.config_flags import config_options, flag_names
from runtime.cli.errors import CLIError
from runtime.cli.simulate import DEFAULT_NUM_BLOCKS, add_engine_args
from runtime.cli.workload import add_workload_args, require_file, require_requests, workload_from_args
from runtime.engine.routers import ROUTERS


def add_planning_args(p: argparse.ArgumentParser, out_default: str) -> None:
    p.add_argument("workload", help="workload JSONL, recorded log, Azure CSV or Mooncake JSONL")
    p.add_argument("--cost-model", required=True, metavar="M", help="cost-model JSON or a shipped name "
                   "(e.g. qwen3-0.6b-h200)")
    p.add_argument("--grid", default="", metavar="AXES",
                   help="settings to vary, e.g. 'chunked=on,off budget=512,2048,8192 replicas=1,2,4 "
                        "router=round-robin,least-loaded'; axes: chunked, budget, max_seqs, block_size, kv_blocks, "
                        "policy, prefix_caching, speculative (off, ngram:K), acceptance (a constant per-token "
                        "rate in [0, 1], over --acceptance), replicas, router (default: none, the flags' "
                        "configuration)")
    p.add_argument("--out", default=out_default, metavar="DIR", help="where the tables, plots and cache go "
                   "(default: %(default)s)")
    g = p.add_argument_group("where the points run")
    g.add_argument("--workers", type=int, action=Bounded, at_least=1, metavar="N",
                   help="simulations at once (default: every core here; with --address every CPU of the cluster)")
    g.add_argument("--address", metavar="ADDR", help="join this Ray cluster (e.g. ray://head:10001 or auto) "
                   "instead of starting Ray on this machine")
    g.add_argument("--in-process", action="store_true", help="run the points here, one after another, without Ray")
    g.add_argument("--retries", type=int, default=2, action=Bounded, at_least=0, metavar="N",
                   help="attempts more for a point whose task failed or whose worker died (default: %(default)s)")
    g.add_argument("--cache", metavar="DIR", help="results by point, reused by a re-run (default: OUT/cache)")
    g.add_argument("--no-cache", action="store_true", help="simulate every point again; keep no results")
    g.add_argument("--keep-logs", metavar="DIR", help="each simulated point's event log, written there by its "
                   "worker (default: none; the metrics alone travel)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    f = p.add_argument_group("fleet (for points the grid doesn't set them)")
    f.add_argument("--replicas", type=int, action=Bounded, at_least=1, help="engine replicas (default: 1)")
    f.add_argument("--router", choices=list(ROUTERS), help="which replica takes a request (default: round-robin)")
    add_engine_args(p)
    add_acceptance_args(p)
    add_workload_args(p)


def slo_arg(text: str | None, flag: str = "--slo"):
    from runtime.planning.slo import Slo, SloError

    if text is None:
        return None
    try:
        return Slo.parse(text)
    except SloError as e:
        raise CLIError(f"{flag}: {e}") from None


def _base_config(args: argparse.Namespace, wl, identity: str):
    """``simulate``'s base: a log's own config, else the engine defaults with room for the workload;
    and the log whose acceptance rates are the default (the workload, when it is a run's log)."""
    from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from simulator.replay.replay import log_config
    from traces.formats import detect_format

    if args.workload_format == "log" or (args.workload_format == "auto" and detect_format(args.workload) == "log"):
        header, base = log_config(args.workload)
        if header.clock != "workload":
            return base, args.workload
    return EngineConfig(cache=CacheConfig(num_blocks=DEFAULT_NUM_BLOCKS),
                        scheduler=SchedulerConfig(max_model_len=max(4096, wl.max_request_tokens())),
                        model_identity=identity or "unknown"), None


def _shared_rates(args: argparse.Namespace, plan, points, own_log: str | None):
    """The rates speculative points draw from (acceptance_flags' rule, a CLIError where there are
    none), reported as ``simulate`` reports them; None with the grid's acceptance axis (every point
    its own constant rate)."""
    from runtime.planning.grid import number_text

    configs = [p.config for p in points]
    if "acceptance" not in plan.grid.names:
        speculation = speculation_from_args(args, configs, own_log, plan.config(()).seed)
        report_speculation(speculation, configs)
        return speculation
    if args.acceptance_per is not None:
        raise CLIError("--acceptance-per: the grid's acceptance axis gives every point a constant rate: leave it out")
    if any(is_speculative(c) for c in configs):
        rates = dict(plan.grid.axes)["acceptance"]
        print("speculative decoding: drafts and acceptance from each point's constant rate (the grid's acceptance "
              f"axis: {', '.join(number_text(r) for r in rates)}), every decode drafting K tokens")
    return None


def build_plan(args: argparse.Namespace, rate_scales: tuple[float, ...]):
    """(plan, shared inputs): the workload read and sliced (its rate scale left to the points), the
    cost model, the grid checked point by point."""
    from runtime.engine.config import ConfigError
    from runtime.planning.grid import AXES, Grid, GridError
    from runtime.planning.job import SharedInputs
    from runtime.planning.sweep import Plan

    try:
        grid = Grid.parse(args.grid)
    except GridError as e:
        raise CLIError(f"--grid: {e}") from None
    options = config_options(args)
    flags = flag_names()
    for name in grid.names:
        field = AXES[name].field
        if field is not None and field in options:
            raise CLIError(f"--grid {name} and {flags[field]} set the same thing: give one")
        if field is None and getattr(args, name) is not None:
            raise CLIError(f"--grid {name} and --{name} set the same thing: give one")
    require_file(args.workload, "workload file")
    one = argparse.Namespace(**{**vars(args), "rate_scale": 1.0})
    wl = workload_from_args(one, args.workload, seed=options.get("seed", 0))
    require_requests(wl, args, args.workload)
    if len(wl) < 2 or wl.duration <= 0:
        raise CLIError(f"{args.workload}: needs two or more requests arriving over time (to scale their rate)")
    model = cost_models.load(args.cost_model)
    identity = getattr(model, "meta", {}).get("model_identity", "")
    base, own_log = _base_config(args, wl, identity)
    plan = Plan(grid, rate_scales, base, options, args.replicas or 1, args.router or "round-robin")
    try:
        points = plan.points()  # every point's config checked before the first simulation
    except ConfigError as e:
        raise CLIError(f"--grid: {e}") from None
    speculation = _shared_rates(args, plan, points, own_log)
    if speculation is not None and speculation.constant_rate is not None:  # --acceptance RATE: each point's rate
        plan = dataclasses.replace(plan, acceptance=speculation.constant_rate)
    return plan, SharedInputs(wl, model, str(args.cost_model), speculation)


def make_runner(args: argparse.Namespace):
    from runtime.planning.runner import LocalRunner

    if args.in_process:
        if args.address or args.workers:
            raise CLIError("--in-process runs here, one point at a time: leave out --address and --workers")
        return LocalRunner(args.retries)
    try:
        from runtime.planning.ray_runner import RayRunner
    except ImportError:
        raise CLIError("Ray is not installed (pip install 'minivllm[plan]'), or run with --in-process") from None
    return RayRunner(args.workers, args.address, args.retries)


def make_cache(args: argparse.Namespace):
    from runtime.planning.cache import ResultCache

    if args.no_cache:
        return ResultCache(None)
    return ResultCache(args.cache or Path(args.out) / "cache")


def progress_bar(args: argparse.Namespace, total: int | None, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="sim", desc=desc, disable=args.no_progress, mininterval=0.5, file=sys.stderr)


def write_table(table, out: Path, name: str) -> list[Path]:
    """``name``.csv, and ``name``.parquet where pyarrow is installed (minivllm[plan])."""
    paths = [out / f"{name}.csv"]
    table.to_csv(paths[0], index=False)
    try:
        table.to_parquet(out / f"{name}.parquet", index=False)
    except ImportError:
        print(f"(no {name}.parquet: pyarrow is not installed; pip install 'minivllm[plan]')", file=sys.stderr)
    else:
        paths.append(out / f"{name}.parquet")
    return paths


def describe_run(stats, runner, cached: int, simulated: int, overhead: bool = True) -> list[str]:
    """How the points ran: where, how long, (``overhead``) the runner's share, retries and failures."""
    lines = []
    where = "in process" if runner.__class__.__name__ == "LocalRunner" else f"on Ray, {stats.slots} at once"
    if runner.startup_s:
        where += f" (Ray and its workers started in {runner.startup_s:.1f} s)"
    lines.append(f"{simulated:,} simulations {where}, {cached:,} points from the cache; {stats.wall_s:,.1f} s wall")
    if overhead and simulated and stats.mean_task_s > 0:
        over = stats.overhead_per_task_s
        lines.append(f"a simulation {stats.mean_task_s:.2f} s on average; beyond that, {over * 1e3:,.0f} ms per task "
                     f"({over / stats.mean_task_s:.1%} of a task) went to handing out and collecting")
    for r in stats.retries:
        lines.append(f"retried: {r.label} (attempt {r.attempt}: {r.error})")
    for r in stats.failed:
        lines.append(f"FAILED after {r.attempt} attempts: {r.label}: {r.error}")
    return lines
