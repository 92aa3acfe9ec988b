"""``minivllm bench matrix WORKLOAD --loads 0.5,0.8,1.1 --chunked on,off --launch ENGINE_FLAGS...``:
serving at several loads, chunked prefill on and off, in one command.

1. Capacity: ``bench live`` of the workload with every request arriving at once (rate ×1000,
   chunked on): the engine's own request throughput on this request mix, no HTTP (or ``--capacity``).
2. For each chunked mode × load L: ``bench serve --launch`` with the arrivals scaled so the offered
   rate is L × capacity (client TTFT/TPOT/ITL/goodput; the server's log), then ``bench live`` of the
   same arrivals in process (the same engine without HTTP: its step times are the offline
   reference; ``--no-live`` skips it).
3. ``summary.json`` and ``summary.md`` in ``--out``: one row per run, step times from both logs.

The engine flags after ``--launch`` go to the server and to ``bench live`` (less the server's own,
``serve.FRONT_END_FLAGS``: ``--api-server-count`` and the like); chunked off adds
``--no-enable-chunked-prefill`` (the default budget then holds a whole prompt).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime.cli.checks import Bounded, check_number
from runtime.cli.errors import CLIError
from runtime.cli.workload import require_file


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CLIError(f"--loads: expected shares of the capacity like 0.5,0.8,1.1, got {text!r}") from None
    for load in loads or [0.0]:
        check_number("--loads", load, above=0)
    return loads


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        raise CLIError(f"--chunked: expected on, off or on,off, got {text!r}")
    return modes


def _check(args: argparse.Namespace) -> tuple[list[float], list[str]]:
    """Every flag, before the first run."""
    from runtime.bench.serve_client import Slo

    loads, modes = _loads(args.loads), _modes(args.chunked)
    try:
        Slo.parse(args.slo)
    except ValueError as e:
        raise CLIError(f"--slo: {e}") from None
    require_file(args.workload, "workload file")
    return loads, modes


def _run(args: argparse.Namespace) -> int:
    from runtime.bench.serve_matrix import RunFailed, chunked_flags, minivllm, render, run, steps
    from runtime.cli.serve import engine_flags
    from traces.formats import load_workload

    loads, modes = _check(args)
    wl = load_workload(args.workload).head(args.limit)
    if len(wl) < 2 or wl.duration <= 0:
        raise CLIError(f"{args.workload}: needs two or more requests arriving over time (to scale their rate)")
    base_rate = len(wl) / wl.duration  # requests/s of the file's own arrivals
    source = [args.workload, "--limit", str(args.limit), "--no-progress"]
    out, flags = Path(args.out), list(args.launch or [])
    live_flags = engine_flags(flags)  # (no HTTP front end in process)
    out.mkdir(parents=True, exist_ok=True)
    try:
        capacity = args.capacity
        if capacity is None:
            cap_json = out / "capacity.json"
            run(minivllm("bench", "live", *source, "--rate-scale", "1000", *live_flags, "--json", str(cap_json)))
            capacity = json.loads(cap_json.read_text())["summary"]["request_throughput_req_s"]
        print(f"capacity {capacity:.1f} req/s; the file's own rate {base_rate:.2f} req/s", flush=True)
        rows = []
        for mode in modes:
            mode_flags = flags + chunked_flags(mode)
            for load in loads:
                scale = load * capacity / base_rate
                tag = f"{mode}_{load:g}"
                served_log, live_log = out / f"serve_{tag}.jsonl", out / f"live_{tag}.jsonl"
                rate = ["--rate-scale", f"{scale:.4f}"]
                run(minivllm("bench", "serve", *source, *rate, "--slo", args.slo, "--client-processes",
                             str(args.client_processes), "--json", str(out / f"serve_{tag}.json"),
                             "--server-trace", str(served_log), "--server-log", str(out / f"server_{tag}.log"),
                             "--launch", *mode_flags))
                row = {"chunked": mode, "load": load, "rate_scale": scale, "offered_req_s": load * capacity,
                       "serve": json.loads((out / f"serve_{tag}.json").read_text())["summary"],
                       "served_steps": steps(served_log)}
                if not args.no_live:
                    run(minivllm("bench", "live", *source, *rate, *live_flags, *chunked_flags(mode), "--trace",
                                 str(live_log), "--json", str(out / f"live_{tag}.json")))
                    row["live"] = json.loads((out / f"live_{tag}.json").read_text())["summary"]
                    row["live_steps"] = steps(live_log)
                rows.append(row)
                (out / "summary.json").write_text(json.dumps({"capacity_req_s": capacity, "base_rate_req_s":
                                                              base_rate, "rows": rows}, indent=1))
    except RunFailed as e:
        raise CLIError(f"bench matrix: {e}; the runs so far are in {out}") from None
    table = render(rows, capacity)
    (out / "summary.md").write_text(table)
    print(table)
    return 0


def add_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("matrix", help="serve at several loads, chunked prefill on and off: one table",
                         description="The engine's capacity in process (bench live, every request at once), "
                         "then for each chunked mode × load L bench serve --launch with the offered rate at L × "
                         "capacity and bench live of the same arrivals; summary.json and summary.md in --out. "
                         "The engine flags after --launch go to every run (the server's own, e.g. --api-server-count, "
                         "to the served runs only).")
    p.add_argument("workload", metavar="WORKLOAD", help="Azure CSV, Mooncake JSONL, a minivllm log or workload")
    p.add_argument("--limit", type=int, default=800, action=Bounded, at_least=2, metavar="N",
                   help="first N requests of WORKLOAD (default: %(default)s)")
    p.add_argument("--loads", default="0.5,0.8,1.1", metavar="LIST",
                   help="offered rates as shares of the capacity, comma-separated (default: %(default)s)")
    p.add_argument("--chunked", default="on,off", metavar="MODES", help="chunked prefill modes to run: on, off or both "
                   "(default: %(default)s)")
    p.add_argument("--slo", default="ttft_ms=1000,tpot_ms=50", metavar="TERMS",
                   help="bench serve's goodput SLO (default: %(default)s)")
    p.add_argument("--capacity", type=float, action=Bounded, above=0, metavar="REQ_S",
                   help="requests/s the loads are shares of (default: measured with bench live)")
    p.add_argument("--client-processes", type=int, default=1, action=Bounded, at_least=1, metavar="N",
                   help="bench serve's sending processes (default: %(default)s)")
    p.add_argument("--no-live", action="store_true", help="skip the in-process run beside each served one")
    p.add_argument("--out", default="out/matrix", metavar="DIR", help="where the runs and summary.{json,md} go "
                   "(default: %(default)s)")
    p.add_argument("--launch", nargs=argparse.REMAINDER, metavar="ENGINE_FLAGS",
                   help="the engine flags of every run (`minivllm serve` and `bench live`); must come last "
                        "(default: none: the default model and engine)")
    p.set_defaults(func=_run)
