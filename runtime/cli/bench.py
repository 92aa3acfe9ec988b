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


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (side by side with peers where there are any)")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    core = kinds.add_parser("core", help="µs per engine step (scheduler + block manager + commit)")
    core.add_argument("--steps", type=int, default=300, help="measured steps per scenario")
    core.add_argument("--json", metavar="PATH", help="also write results as JSON")
    core.set_defaults(func=_core)
