#!/usr/bin/env python3
"""Serving at several loads, chunked prefill on and off: the issue-11 table in one command.

    python scripts/serve_matrix.py WORKLOAD --limit 800 --loads 0.5,0.8,1.1 --chunked on,off \
        --out out/matrix -- --model random:qwen3-0.6b --tokenizer TOK --device cuda --dtype bfloat16

1. Capacity: ``minivllm bench live`` of the workload with every request arriving at once (rate
   ×1000, chunked on) — the engine's own request throughput on this request mix, no HTTP.
2. For each chunked mode × load L: ``bench serve --launch`` with the arrivals scaled so the offered
   rate is L × capacity (client TTFT/TPOT/ITL/goodput; the server's log), then ``bench live`` of the
   same arrivals in process (the same engine without HTTP: its step times are the offline reference;
   ``--no-live`` skips it).
3. ``summary.json`` and ``summary.md`` in --out: one row per run, step times from both logs.
The engine flags after ``--`` go to both the server and ``bench live``; chunked off adds
``--no-enable-chunked-prefill --max-num-batched-tokens MAX_MODEL_LEN`` (a whole prompt per step).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.bench.step_times import step_times  # noqa: E402
from traces.formats import load_workload  # noqa: E402


def _run(cmd: list[str]) -> None:
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _minivllm(*args: str) -> list[str]:
    return [sys.executable, "-m", "runtime", *args]


def _flag_value(flags: list[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def _steps(log: Path) -> dict:
    report = step_times(str(log))
    return {**report["by_kind"]["all"], "over_50ms": len(report["slow"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s WORKLOAD [options] -- ENGINE_FLAGS...")
    p.add_argument("workload")
    p.add_argument("--limit", type=int, default=800)
    p.add_argument("--loads", default="0.5,0.8,1.1", help="offered rate as a share of capacity")
    p.add_argument("--chunked", default="on,off")
    p.add_argument("--slo", default="ttft_ms=1000,tpot_ms=50")
    p.add_argument("--capacity", type=float, help="requests/s (default: measured with bench live)")
    p.add_argument("--client-processes", type=int, default=1, help="bench serve's sending processes")
    p.add_argument("--no-live", action="store_true", help="skip the in-process run beside each served one")
    p.add_argument("--out", type=Path, default=Path("out/matrix"))
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, flags = p.parse_args(argv[:cut]), argv[cut + 1:]  # after --: the engine flags
    args.out.mkdir(parents=True, exist_ok=True)
    wl = load_workload(args.workload).head(args.limit)
    base_rate = len(wl) / wl.duration  # requests/s of the file's own arrivals
    source = [args.workload, "--limit", str(args.limit), "--no-progress"]

    capacity = args.capacity
    if capacity is None:
        cap_json = args.out / "capacity.json"
        _run(_minivllm("bench", "live", *source, "--rate-scale", "1000", *flags, "--json", str(cap_json)))
        capacity = json.loads(cap_json.read_text())["summary"]["request_throughput_req_s"]
    print(f"capacity {capacity:.1f} req/s; the file's own rate {base_rate:.2f} req/s", flush=True)

    rows = []
    max_len = _flag_value(flags, "--max-model-len", "8192")
    for mode in args.chunked.split(","):
        mode_flags = flags + ([] if mode == "on" else ["--no-enable-chunked-prefill", "--max-num-batched-tokens",
                                                       max_len])
        for load in (float(x) for x in args.loads.split(",")):
            scale = load * capacity / base_rate
            tag = f"{mode}_{load:g}"
            served_log, live_log = args.out / f"serve_{tag}.jsonl", args.out / f"live_{tag}.jsonl"
            rate = ["--rate-scale", f"{scale:.4f}"]
            _run(_minivllm("bench", "serve", *source, *rate, "--slo", args.slo, "--client-processes",
                           str(args.client_processes), "--json",
                           str(args.out / f"serve_{tag}.json"), "--server-trace", str(served_log),
                           "--server-log", str(args.out / f"server_{tag}.log"), "--launch", *mode_flags,
                           ))
            serve = json.loads((args.out / f"serve_{tag}.json").read_text())["summary"]
            row = {"chunked": mode, "load": load, "rate_scale": scale, "offered_req_s": load * capacity,
                   "serve": serve, "served_steps": _steps(served_log)}
            if not args.no_live:
                _run(_minivllm("bench", "live", *source, *rate, *mode_flags, "--trace", str(live_log),
                               "--json", str(args.out / f"live_{tag}.json")))
                row["live"] = json.loads((args.out / f"live_{tag}.json").read_text())["summary"]
                row["live_steps"] = _steps(live_log)
            rows.append(row)
            (args.out / "summary.json").write_text(json.dumps({"capacity_req_s": capacity, "base_rate_req_s":
                                                               base_rate, "rows": rows}, indent=1))
    (args.out / "summary.md").write_text(render(rows, capacity))
    print(render(rows, capacity))


def render(rows: list[dict], capacity: float) -> str:
    head = ("| load | chunked | offered req/s | client TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p99 ms | "
            "E2E p50 ms | goodput req/s (share) | send lag p99 ms | served step mean / p99 / max ms, > 50 ms | "
            "in-process step mean / p99 / max ms | in-process TTFT p50 / p99, TPOT p50 |")
    lines = [f"capacity (in process, all arrivals at once): {capacity:.1f} req/s", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s, a = r["serve"], r["served_steps"]
        in_process = "— | —"
        if "live" in r:
            live, b = r["live"], r["live_steps"]
            in_process = (f"{b['mean']:.2f} / {b['p99']:.1f} / {b['max']:.1f} | {live['ttft_s']['p50'] * 1e3:.1f} / "
                          f"{live['ttft_s']['p99'] * 1e3:.1f}, {live['tpot_s']['p50'] * 1e3:.1f}")
        lines.append(
            f"| {r['load']:.0%} | {r['chunked']} | {r['offered_req_s']:.1f} | {s['ttft_ms']['p50']:.1f} / "
            f"{s['ttft_ms']['p99']:.1f} | {s['tpot_ms']['p50']:.1f} / {s['tpot_ms']['p99']:.1f} | "
            f"{s['itl_ms']['p99']:.1f} | {s['e2e_ms']['p50']:,.0f} | {s.get('goodput_req_s', 0):.1f} "
            f"({s.get('slo_attainment', 0):.0%}) | {s['send_lag_ms']['p99']:.1f} | {a['mean']:.2f} / "
            f"{a['p99']:.1f} / {a['max']:.1f}, {a['over_50ms']} | {in_process} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
