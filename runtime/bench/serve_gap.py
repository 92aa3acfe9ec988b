"""What the front end adds: each request as the load client measured it beside the same request
in the server's event log (runtime/bench/serve_join.py pairs them), and the gap, client minus
engine.

The engine's TTFT runs from the arrival the server stamped (before it read the body) to the end
of the step that sampled the first token; the client's from its send to the first chunk read,
around it. Their difference per request is the HTTP and SSE work: the request's trip in, the
token's trip out, and the client's own parsing. TTFT, TPOT and E2E gaps are percentiles of those
per-request differences, over the requests both sides completed. ITL cannot be paired token by
token (a client that falls behind reads merged chunks), so its gap is the client's percentile
minus the engine's over the same requests; the engine's median decode step is the floor of both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.frames import load_frames
from analysis.metrics import latencies
from analysis.stalls import median_decode_step
from runtime.bench.serve_client import RequestRecord
from runtime.bench.serve_join import NEVER_ARRIVED, engine_names, engine_prompts, join, join_names

METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))
COLUMNS = ("p50", "p90", "p99")


def _pct(values: Sequence[float]) -> dict[str, float | None]:
    a = np.asarray([v for v in values if v is not None and v == v], dtype=float) * 1e3
    return {p: float(np.percentile(a, int(p[1:]))) if len(a) else None for p in COLUMNS}


def _reached(r: RequestRecord) -> bool:
    return r.error not in NEVER_ARRIVED and not (r.error or "").startswith("http ")


def pair(records: Sequence[RequestRecord], log: str | Path,
         decode: Callable[[list[int]], str] | None = None) -> tuple[dict[int, int], int]:
    """(client index -> engine request id, how many of them the response id paired): by the id
    where the server gave one that names a request of ``log``, by the prompt for the rest (which
    raises serve_join.NoPromptIds when the log keeps no prompt ids)."""
    reached = [r for r in records if _reached(r)]
    pairs = join_names([(r.index, r.response_id) for r in reached], engine_names(log))
    by_id = len(pairs)
    rest = [(r.index, r.sent, bytes.fromhex(r.prompt_key)) for r in reached
            if r.index not in pairs and r.prompt_key is not None]
    if rest:
        taken = set(pairs.values())
        pairs.update(join(rest, [e for e in engine_prompts(log, decode) if e[0] not in taken]))
    return pairs, by_id


def compare(records: Sequence[RequestRecord], log: str | Path,
            decode: Callable[[list[int]], str] | None = None) -> dict[str, Any]:
    """The client's ``records`` against the server's ``log``: per metric and percentile, client,
    engine and gap in ms over the requests both completed; how many were paired; the engine's
    queueing (arrival to first admission) of the paired requests. Raises serve_join.NoPromptIds
    when a request must be paired by its prompt and the log keeps no prompt ids."""
    frames = load_frames(log)
    known = frames.requests[frames.requests["request_id"] >= 0]  # (a fleet's request no route names: -1)
    lat = latencies(known).set_index("request_id")
    req = known.set_index("request_id")
    pairs, by_id = pair(records, log, decode)
    by_index = {r.index: r for r in records}
    both = [(by_index[i], rid) for i, rid in sorted(pairs.items())
            if by_index[i].ok and rid in lat.index and req.at[rid, "status"] == "finished"]
    rows: dict[str, dict[str, dict[str, float | None]]] = {}
    for key in ("ttft", "tpot", "e2e"):
        c = [getattr(r, key) for r, _ in both]
        e = [float(lat.at[rid, key]) for _, rid in both]
        diff = [None if a is None or b != b else a - b for a, b in zip(c, e)]
        cp, ep, dp = _pct(c), _pct(e), _pct(diff)
        rows[key] = {p: {"client": cp[p], "engine": ep[p], "gap": dp[p]} for p in COLUMNS}
    ids = {rid for _, rid in both}
    gaps = frames.gaps
    cp = _pct([g for r, _ in both for g in r.itl])
    ep = _pct((gaps["gap"][gaps["request_id"].isin(ids)]).tolist())
    rows["itl"] = {p: {"client": cp[p], "engine": ep[p],
                       "gap": None if cp[p] is None or ep[p] is None else cp[p] - ep[p]} for p in COLUMNS}
    return {"metrics": rows, "decode_step_ms": median_decode_step(frames.steps) * 1e3,
            "client_requests": sum(map(_reached, records)), "paired": len(pairs), "paired_by_id": by_id,
            "compared": len(both),
            "engine_requests": len(frames.requests),
            "engine_queue_ms": _pct(_queue(req, frames.steps, [pairs[i] for i in sorted(pairs)]))}


def _queue(req: pd.DataFrame, steps: pd.DataFrame, ids: list[int]) -> list[float]:
    """Arrival to first admission of each request (one never admitted: to its abort, or to the
    log's last step if it is still waiting there), seconds."""
    end = float(steps["end"].max()) if len(steps) else float("nan")
    out = []
    for rid in ids:
        if rid not in req.index:
            continue
        row = req.loc[rid]
        until = row["admitted"] if row["admitted"] == row["admitted"] else (
            row["finish"] if row["finish"] == row["finish"] else end)
        out.append(max(0.0, float(until) - float(row["arrival"])))
    return out


def render(gap: dict[str, Any]) -> str:
    head = f"{'ms':<6}" + "".join(f"{p + ' ' + side:>11}" for p in COLUMNS for side in ("client", "engine", "gap"))
    lines = [f"client vs engine (the server's log), request by request: {gap['compared']:,} answered on both sides "
             f"({gap['paired']:,} of the client's {gap['client_requests']:,} sent requests found among the "
             f"engine's {gap['engine_requests']:,}, {gap['paired_by_id']:,} by the response id, the rest "
             "by the prompt)", head]
    for key, label in METRICS:
        cells = ""
        for p in COLUMNS:
            for side in ("client", "engine", "gap"):
                v = gap["metrics"][key][p][side]
                cells += f"{v:>11.1f}" if v is not None and v == v else f"{'-':>11}"
        lines.append(f"{label:<6}{cells}")
    lines.append("gap: per request, client minus engine (ITL: the client's percentile minus the engine's); "
                 f"engine median decode step: {gap['decode_step_ms']:.1f} ms")
    return "\n".join(lines)
