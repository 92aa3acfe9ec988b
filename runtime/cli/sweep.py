"""``minivllm sweep WORKLOAD --cost-model M --grid 'chunked=on,off budget=512,2048' --rate-scale 0.5,1,2,4``:
one simulation per grid point and load, on Ray (this machine's cores, or ``--address`` a cluster).

Writes into ``--out``: ``sweep.parquet`` and ``sweep.csv`` (a row per point: settings, every latency,
throughput and goodput figure, the ``command`` that re-runs the point alone), ``tasks.csv`` (how each
point ran: cached or simulated, attempts, seconds, worker), ``sweep.json`` (the run) and ``plots/``
(latency against load per configuration, goodput per replica, the Pareto front). Results are cached
by point (``OUT/cache``): a re-run, or the run of an interrupted sweep, simulates only what is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.cli.checks import check_number
from runtime.cli.errors import CLIError
from runtime.cli.planning_flags import (
    add_planning_args,
    build_plan,
    describe_run,
    make_cache,
    make_runner,
    progress_bar,
    slo_arg,
    write_table,
)

FRONT_SHOWN = 12  # rows of the Pareto front printed with their commands


def _rate_scales(text: str) -> tuple[float, ...]:
    try:
        values = tuple(dict.fromkeys(float(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise CLIError(f"--rate-scale: expected numbers like 0.5,1,2,4, got {text!r}") from None
    if not values:
        raise CLIError("--rate-scale: give at least one rate scale")
    for v in values:
        check_number("--rate-scale", v, above=0)
    return values


def _front_lines(table, slo) -> list[str]:
    from runtime.planning.pareto import pareto_front
    from runtime.planning.plots import serving_all, throughput_column

    ok = serving_all(table[table["status"] == "ok"])
    latency = slo.terms[0].column if slo is not None else "ttft_p99_ms"
    through = throughput_column(ok)
    front = pareto_front(ok, latency, through)
    lines = [f"Pareto front ({latency} against {through}), {len(front)} of the {len(ok)} points that refused no "
             "request:"]
    for _, r in front.head(FRONT_SHOWN).iterrows():
        meets = "" if slo is None else ("  meets the SLO" if r["meets_slo"] else f"  misses: {r['slo_violations']}")
        lines.append(f"  {r['point']}: {latency} {r[latency]:,.1f}, {through} {r[through]:,.2f}{meets}")
        lines.append(f"    {r['command']}")
    return lines


def _run(args: argparse.Namespace) -> int:
    import pandas as pd

    from runtime.cli.point_command import simulate_command
    from runtime.planning.plots import save_plots
    from runtime.planning.sweep import run_sweep

    slo = slo_arg(args.slo)
    plan, inputs = build_plan(args, _rate_scales(args.rate_scale))
    points = plan.points()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"sweep: {len(points):,} points ({len(plan.grid):,} configurations × {len(plan.rate_scales)} rate scales) "
          f"of {len(inputs.workload):,} requests → {out}", flush=True)
    runner = make_runner(args)
    with runner, progress_bar(args, len(points), "sweep") as bar:
        logs = str(Path(args.keep_logs).resolve()) if args.keep_logs else None  # a worker's cwd is its own
        table, results = run_sweep(plan, inputs, runner, make_cache(args), slo, logs, bar)
    table.insert(len(table.columns) - 3, "command", [
        simulate_command(args, plan.options, p, f"point-{key[:12]}.jsonl.gz") for p, key in zip(points, table["key"])])
    written = write_table(table, out, "sweep")
    pd.DataFrame(results.tasks).to_csv(out / "tasks.csv", index=False)
    stats = results.stats
    simulated = len(results.tasks) - results.cached
    lines = describe_run(stats, runner, results.cached, simulated)
    plots = save_plots(table, out / "plots", slo)
    (out / "sweep.json").write_text(json.dumps({
        "command": sys.argv, "workload": args.workload, "requests": len(inputs.workload),
        "cost_model": str(args.cost_model), "grid": args.grid, "rate_scales": list(plan.rate_scales),
        "slo": slo.text() if slo is not None else None, "points": len(points), "simulated": simulated,
        "cached": results.cached, "workers": stats.slots, "wall_s": stats.wall_s, "ray_startup_s": runner.startup_s,
        "mean_task_s": stats.mean_task_s, "overhead_per_task_s": stats.overhead_per_task_s,
        "retries": [vars(r) for r in stats.retries], "failed": [vars(r) for r in stats.failed]}, indent=1))
    print("\n".join(lines))
    if (table["status"] == "ok").any():
        print("\n".join(_front_lines(table, slo)))
    print(f"wrote {', '.join(str(p) for p in written)} (every row's command: column 'command'), "
          f"{out / 'tasks.csv'}, {', '.join(str(p) for p in plots)}")
    return 1 if stats.failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", conflict_handler="resolve",
                       help="simulate every point of a grid of engine, fleet and load settings (on Ray): one table",
                       description="One simulation per grid point and rate scale, as Ray tasks (or --in-process); "
                       "a table of every latency, throughput and goodput figure, plots, and per row the simulate "
                       "command that re-runs it.")
    add_planning_args(p, "out/sweep")
    p.add_argument("--rate-scale", default="1", metavar="LIST",
                   help="loads: multiples of the workload's arrival rate, comma-separated (default: %(default)s)")
    p.add_argument("--slo", metavar="TERMS", help="latency SLOs for goodput and meets_slo, e.g. "
                   "ttft_p99_ms=1000,tpot_p99_ms=50 (default: none)")
    p.set_defaults(func=_run)
