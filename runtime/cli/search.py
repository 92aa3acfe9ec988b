"""``minivllm search WORKLOAD --cost-model M --grid ... --slo ttft_p99_ms=1000,tpot_p99_ms=50``: per
configuration of the grid, the highest load (rate scale) that meets the SLO, by bisection; with
``--fewest-replicas --rate-scale R``, the fewest replicas that carry rate scale R.

Each answer comes three times: with the cost model as it is, and with every step ``--margin-pct``
slower and faster (default: the model's own held-out step error); the slower one holds even if the
model is that wrong on every step. ``--live MATRIX.json`` (``bench matrix``'s summary.json) sets
the capacity a live run measured at the same SLO beside the predicted one. Writes ``search.csv``,
``search.parquet`` and ``search.json`` into ``--out``; probes are cached as sweep points are.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from runtime.cli.checks import Bounded
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


def _margin(args: argparse.Namespace, model) -> tuple[float, str]:
    from runtime.planning.margin import measured_error_pct

    if args.margin_pct is not None:
        return args.margin_pct, "--margin-pct"
    measured = measured_error_pct(model)
    if measured is None:
        return 0.0, "none: the cost model records no held-out error (give --margin-pct)"
    return measured, "the cost model's held-out step error"


def _num(x, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _capacity_lines(table, margin: float) -> list[str]:
    lines = []
    for _, r in table.iterrows():
        head = f"{r['config']}: "
        if r["error"]:
            lines.append(head + f"failed ({r['error']})")
            continue
        if math.isnan(r["capacity_rate_scale"]):
            lines.append(head + "meets the SLO at no load tried (" + (r["limited_by"] or "-") + ")")
            continue
        bound = "" if r["bounded"] else "at least "
        text = f"capacity {bound}{_num(r['capacity_rate_scale'], '.3g')}× ({_num(r['capacity_req_s'], ',.1f')} req/s)"
        if margin > 0:
            lo, hi = r["capacity_if_slower_rate_scale"], r["capacity_if_faster_rate_scale"]
            text += (f"; {_num(lo, '.3g')}×–{_num(hi, '.3g')}× ({_num(r['capacity_if_slower_req_s'], ',.1f')}–"
                     f"{_num(r['capacity_if_faster_req_s'], ',.1f')} req/s) with every step {margin:.1f} % slower / "
                     "faster")
        if r["limited_by"]:
            text += f"; just above it: {r['limited_by']}"
        if not r["monotone"]:
            text += " (not monotone: a load above a failing one passed)"
        lines += [head + text, f"    {r['command']}"]
    return lines


def _replica_lines(table, margin: float) -> list[str]:
    import pandas as pd

    def count(n) -> str:
        return "more than the most tried" if pd.isna(n) else str(n)

    lines = []
    for _, r in table.iterrows():
        head = f"{r['config']}: "
        if r["error"]:
            lines.append(head + f"failed ({r['error']})")
            continue
        text = f"{count(r['replicas_needed'])} replica(s) carry {r['rate_scale']:g}× ({r['offered_req_s']:,.1f} req/s)"
        if margin > 0:
            text += (f"; {count(r['replicas_if_slower'])} if every step is {margin:.1f} % slower, "
                     f"{count(r['replicas_if_faster'])} if faster")
        if r["limited_by"]:
            text += f"; one fewer: {r['limited_by']}"
        lines += [head + text, f"    {r['command']}"]
    return lines


def _live_columns(table, matrix_path: str, slo) -> list[str]:
    """The measured capacity of each configuration beside the predicted one (columns added in place)."""
    from runtime.planning.live_capacity import measured_capacity

    try:
        matrix = json.loads(Path(matrix_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CLIError(f"--live: {matrix_path}: {e}") from None
    lines, measured, how, errors = [], [], [], []
    for _, r in table.iterrows():
        live = measured_capacity(matrix, slo, chunked=r["chunked"])
        measured.append(live.rate_scale)
        how.append(live.how)
        error = (r["capacity_rate_scale"] - live.rate_scale) / live.rate_scale * 100 if live.how == "interpolated" \
            else float("nan")
        errors.append(error)
        runs = ", ".join(f"{x['rate_scale']:.3g}× {'ok' if x['ok'] else 'over'}" for x in live.runs)
        lines.append(f"{r['config']}: live capacity {live.how} {_num(live.rate_scale, '.3g')}× "
                     f"(runs: {runs or 'none'}); predicted {_num(r['capacity_rate_scale'], '.3g')}×"
                     + (f", {error:+.1f} %" if not math.isnan(error) else ""))
    table["live_capacity_rate_scale"] = measured
    table["live_capacity_how"] = how
    table["capacity_error_pct"] = errors
    return lines


def _run(args: argparse.Namespace) -> int:
    from runtime.cli.point_command import simulate_command
    from runtime.planning.search import search_capacity, search_replicas

    slo = slo_arg(args.slo)
    if args.fewest_replicas:
        if any(term.startswith("replicas=") for term in args.grid.split()):
            raise CLIError("--fewest-replicas chooses the replicas: leave replicas out of --grid")
        if args.live:
            raise CLIError("--live compares a capacity: leave out --fewest-replicas")
    elif args.rate_scale != 1.0:
        raise CLIError("--rate-scale is the load --fewest-replicas must carry; the capacity search finds the load")
    plan, inputs = build_plan(args, (args.rate_scale,))
    margin, why = _margin(args, inputs.cost_model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    what = (f"the fewest replicas (at most {args.max_replicas}) at rate scale {args.rate_scale:g}"
            if args.fewest_replicas else "the highest rate scale")
    print(f"search: {what} meeting {slo.text()} for {len(plan.grid):,} configurations of {len(inputs.workload):,} "
          f"requests; margin {margin:.1f} % ({why})", flush=True)
    runner = make_runner(args)
    with runner, progress_bar(args, None, "search") as bar:
        if args.fewest_replicas:
            done = search_replicas(plan, inputs, runner, make_cache(args), slo, args.rate_scale, margin,
                                   args.max_replicas, bar)
        else:
            done = search_capacity(plan, inputs, runner, make_cache(args), slo, margin, args.start, args.tolerance,
                                   args.highest, bar)
    table = done.table
    commands = [simulate_command(args, plan.options, a, "answer.jsonl.gz") if a is not None else ""
                for a in done.answers]
    table["command"] = commands
    lines = (_replica_lines if args.fewest_replicas else _capacity_lines)(table, margin)
    if args.live:
        lines += _live_columns(table, args.live, slo)
    written = write_table(table, out, "search")
    stats = done.stats
    (out / "search.json").write_text(json.dumps({
        "command": sys.argv, "slo": slo.text(), "margin_pct": margin, "margin_from": why,
        "simulated": done.simulations, "cached": done.cached, "wall_s": stats.wall_s,
        "rows": json.loads(table.to_json(orient="records"))}, indent=1))
    print("\n".join(describe_run(stats, runner, done.cached, done.simulations, overhead=False)))
    print("\n".join(lines))
    print(f"wrote {', '.join(str(p) for p in written)}, {out / 'search.json'}")
    return 1 if table["error"].astype(bool).any() else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="per configuration, the highest load (or fewest replicas) that meets latency "
                       "SLOs, with a margin from the cost model's error", description=__doc__.split("\n\n")[0])
    add_planning_args(p, "out/search")
    p.add_argument("--slo", required=True, metavar="TERMS", help="e.g. ttft_p99_ms=1000,tpot_p99_ms=50: "
                   "METRIC_STAT_ms=LIMIT, METRIC ttft|tpot|e2e|queue|itl, STAT mean|p50|p90|p99|max")
    p.add_argument("--fewest-replicas", action="store_true",
                   help="search the fewest replicas that meet the SLO at --rate-scale (default: the highest load)")
    p.add_argument("--max-replicas", type=int, default=64, action=Bounded, at_least=1, metavar="N",
                   help="with --fewest-replicas: the most tried (default: %(default)s)")
    p.add_argument("--margin-pct", type=float, action=Bounded, at_least=0, below=100, metavar="PCT",
                   help="answer again with every step this much slower and faster (default: the cost model's "
                        "held-out step error, heldout.mape; 0: no margin)")
    p.add_argument("--start", type=float, default=1.0, action=Bounded, above=0, metavar="R",
                   help="the first rate scale tried (default: %(default)s)")
    p.add_argument("--tolerance", type=float, default=0.02, action=Bounded, above=0, metavar="FRACTION",
                   help="stop when the passing and failing loads are within this share (default: %(default)s)")
    p.add_argument("--highest", type=float, default=1024.0, action=Bounded, above=0, metavar="R",
                   help="the highest rate scale tried (default: %(default)s)")
    p.add_argument("--live", metavar="MATRIX_JSON", help="bench matrix's summary.json of the same workload slice: "
                   "the capacity the live runs measured at the SLO, beside the predicted one")
    p.set_defaults(func=_run)
