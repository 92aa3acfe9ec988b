"""What the front end adds: the engine's latencies, from the server's event log, beside the ones
the load client measured, and the gap (client minus engine) at each percentile.

The engine's TTFT runs from the arrival the server stamped (before it read the body) to the end
of the step that sampled the first token, so the gap is the HTTP and SSE work around it: the
request's trip in, the token's trip out, and the client's own parsing. ITL is per token gap on
both sides (a client that falls behind sees fewer, merged chunks: more gap); the engine's median
decode step is the floor of both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.frames import load_frames
from analysis.metrics import summarize
from analysis.stalls import median_decode_step

METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))
COLUMNS = ("p50", "p90", "p99")


def engine_side(log: str | Path) -> dict[str, Any]:
    """The engine's latency percentiles (ms) and median decode step (ms) from its log."""
    frames = load_frames(log)
    s = summarize(frames)
    out: dict[str, Any] = {key: {c: s[f"{key}_s"][c] * 1e3 for c in COLUMNS} for key, _ in METRICS}
    out["decode_step_ms"] = median_decode_step(frames.steps) * 1e3
    return out


def compare(client: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    """client summary (runtime/bench/serve_client.summarize) vs ``engine_side``: per metric and
    percentile, client, engine and gap in ms."""
    rows = {}
    for key, _ in METRICS:
        c, e = client[f"{key}_ms"], engine[key]
        rows[key] = {p: {"client": c[p], "engine": e[p],
                         "gap": None if c[p] is None or e[p] != e[p] else c[p] - e[p]} for p in COLUMNS}
    return {"metrics": rows, "decode_step_ms": engine["decode_step_ms"]}


def render(gap: dict[str, Any]) -> str:
    head = f"{'ms':<6}" + "".join(f"{p + ' ' + side:>11}" for p in COLUMNS for side in ("client", "engine", "gap"))
    lines = ["client vs engine (the server's log): what HTTP, SSE and the client add", head]
    for key, label in METRICS:
        cells = ""
        for p in COLUMNS:
            for side in ("client", "engine", "gap"):
                v = gap["metrics"][key][p][side]
                cells += f"{v:>11.1f}" if v is not None and v == v else f"{'-':>11}"
        lines.append(f"{label:<6}{cells}")
    lines.append(f"engine median decode step: {gap['decode_step_ms']:.1f} ms")
    return "\n".join(lines)
