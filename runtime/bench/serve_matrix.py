"""Serving at several loads, chunked prefill on and off: the rows of ``minivllm bench matrix`` and
their markdown table.

Each run is a ``minivllm`` child process (``bench live`` for the capacity and the in-process
reference, ``bench serve --launch`` for the served runs), so every engine starts on a fresh
device; a row holds their JSON summaries and the step times of their logs.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path


class RunFailed(Exception):
    """A child run exited with an error; the message names the command and its status."""


def run(cmd: list[str]) -> None:
    print("+", shlex.join(cmd), flush=True)
    status = subprocess.run(cmd).returncode
    if status != 0:
        raise RunFailed(f"`{shlex.join(cmd[3:])}` exited with status {status}")


def minivllm(*args: str) -> list[str]:
    return [sys.executable, "-m", "runtime", *args]


def chunked_flags(mode: str) -> list[str]:
    """Chunked prefill off: the engine's default budget then holds a whole prompt (runtime/engine/config.py)."""
    return [] if mode == "on" else ["--no-enable-chunked-prefill"]


def steps(log: Path) -> dict:
    from runtime.bench.step_times import step_times

    report = step_times(str(log))
    return {**report["by_kind"]["all"], "over_50ms": len(report["slow"])}


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
