"""``minivllm bench {core,...}``: benchmarks; each prints a table and can write JSON for plotting."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path


def _write_json(path: str | None, name: str, rows: list[dict], extra: dict | None = None) -> None:
    if not path:
        return
    doc = {
        "benchmark": name,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "processor": platform.processor(),
                 "python": sys.version.split()[0]},
        "results": rows,
        **(extra or {}),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2))
    print(f"wrote {path}")


def _core(args: argparse.Namespace) -> int:
    from runtime.bench import core_bench

    results = core_bench.run(steps=args.steps)
    print(core_bench.report(results))
    _write_json(args.json, "core", core_bench.as_json(results))
    return 0


def _sim(args: argparse.Namespace) -> int:
    from simulator import bench as sim_bench

    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.chunked]
    results = sim_bench.run(trace=args.trace, cost_model=args.cost_model, modes=modes, limit=args.limit,
                            out_dir=args.out_dir, progress=not args.no_progress)
    print(sim_bench.report(results))
    _write_json(args.json, "sim", sim_bench.as_json(results),
                {"trace": args.trace or sim_bench.DEFAULT_TRACE, "cost_model": args.cost_model})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (side by side with peers where there are any)")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    core = kinds.add_parser("core", help="µs per engine step (scheduler + block manager + commit)")
    core.add_argument("--steps", type=int, default=300, help="measured steps per scenario")
    core.add_argument("--json", metavar="PATH", help="also write results as JSON")
    core.set_defaults(func=_core)
    sim = kinds.add_parser("sim", help="a whole trace through the simulator (chunked on/off): × real time")
    sim.add_argument("--trace", help="workload or trace file (default: ../shared/traces/<the Azure conv trace>)")
    sim.add_argument("--cost-model", default="qwen3-0.6b-h200", help="cost model (default: the shipped H200 one)")
    sim.add_argument("--chunked", choices=["both", "on", "off"], default="both")
    sim.add_argument("--limit", type=int, help="first N requests only")
    sim.add_argument("--out-dir", default="out/bench_sim", help="where the event logs go")
    sim.add_argument("--no-progress", action="store_true")
    sim.add_argument("--json", metavar="PATH", help="also write results as JSON")
    sim.set_defaults(func=_sim)
