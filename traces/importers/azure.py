"""Azure LLM inference trace (2023) CSV: TIMESTAMP, ContextTokens, GeneratedTokens per request."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from traces.importers.rows import Skips, positive_int
from traces.workload import RequestSpec, Workload, WorkloadError, synthetic_prompt, trace_params

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def detect(path: Path, first_line: str) -> bool:
    return path.suffix == ".csv" or first_line.startswith("TIMESTAMP")


def read_azure_csv(path: str | Path, *, seed: int = 0, skip_bad_rows: bool = False) -> Workload:
    """Azure LLM inference trace (2023): one request per row; arrival = seconds since the first row.

    Prompts are synthetic (no prefix information in the trace: every prompt token is unique).
    """
    path = Path(path)
    skips = Skips(skip_bad_rows)
    rows: list[tuple[datetime, int, int, int]] = []
    with open(path, encoding="utf-8", newline="") as f:
        header = f.readline().strip().split(",")
        try:
            cols = [header.index(c) for c in COLUMNS]
        except ValueError:
            raise WorkloadError(f"{path}:1: header must name the columns {', '.join(COLUMNS)}; "
                                f"got {','.join(header)}") from None
        width = len(header)
        for lineno, line in enumerate(f, 2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue  # blank line: no row
            fields = line.split(",")
            if len(fields) != width:
                skips.bad(f"{path}:{lineno}: expected {width} fields, got {len(fields)}")
                continue
            stamp, ctx, gen = (fields[i].strip() for i in cols)
            try:
                when = datetime.fromisoformat(stamp)
            except ValueError:
                skips.bad(f"{path}:{lineno}: field TIMESTAMP: not a timestamp: {stamp!r}")
                continue
            n_in = positive_int(ctx)
            if n_in is None:
                skips.bad(f"{path}:{lineno}: field ContextTokens: must be a positive integer, got {ctx!r}")
                continue
            n_out = positive_int(gen)
            if n_out is None:
                skips.bad(f"{path}:{lineno}: field GeneratedTokens: must be a positive integer, got {gen!r}")
                continue
            rows.append((when, n_in, n_out, lineno))
    skips.require_rows(path, len(rows))
    origin = min((r[0] for r in rows), default=None)
    requests = [
        RequestSpec(arrival=(when - origin).total_seconds(),
                    prompt=synthetic_prompt(n_in, seed, unique_seed=lineno),
                    params=trace_params(n_out))
        for when, n_in, n_out, lineno in rows
    ]
    meta: dict[str, Any] = {"format": "azure", **skips.meta()}
    if origin is not None:
        meta["origin"] = origin.isoformat()
    return Workload(requests, seed=seed, source=str(path), meta=meta)
