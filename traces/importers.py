"""Workload importers: Azure LLM inference trace CSV, Mooncake JSONL, and our own logs.

The trace files are read as published (../shared/traces/SOURCES.md). Every row becomes one
request, or an error naming file, line and field; with ``skip_bad_rows`` a bad row is skipped
and counted in ``workload.meta["skipped_rows"]`` (the first few reasons are kept too) — never
dropped without a trace.
"""

from __future__ import annotations

import gzip
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from runtime.request import SamplingParams
from traces.events import Aborted, Arrived, Finished, Header
from traces.log import read_log
from traces.workload import (
    WORKLOAD_CLOCK,
    RequestSpec,
    Workload,
    WorkloadError,
    synthetic_prompt,
    trace_params,
)

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_BLOCK = 512  # tokens per Mooncake hash id
_KEEP_REASONS = 10


class _Skips:
    """Bad rows: raise at the first, or count them (and keep a few reasons) when skipping."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip
        self.count = 0
        self.reasons: list[str] = []

    def bad(self, message: str) -> None:
        if not self.skip:
            raise WorkloadError(message)
        self.count += 1
        if len(self.reasons) < _KEEP_REASONS:
            self.reasons.append(message)

    def meta(self) -> dict[str, Any]:
        return {"skipped_rows": self.count, "skipped_reasons": self.reasons} if self.count else {}


def _positive_int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


# --- format detection -------------------------------------------------------------------------------


def _first_line(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.readline().strip()


def detect_format(path: str | Path) -> str:
    """``azure`` (CSV with the Azure columns), ``mooncake`` (JSONL rows) or ``log`` (our JSONL)."""
    path = Path(path)
    first = _first_line(path)
    if not first:
        raise WorkloadError(f"{path}:1: empty file")
    if path.suffix == ".csv" or first.startswith("TIMESTAMP"):
        return "azure"
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        raise WorkloadError(f"{path}:1: not a CSV with columns {','.join(AZURE_COLUMNS)} "
                            "nor a JSON line") from None
    if isinstance(row, dict) and row.get("type") == "Header":
        return "log"
    if isinstance(row, dict) and "input_length" in row:
        return "mooncake"
    raise WorkloadError(f"{path}:1: unrecognized JSON line: expected a minivllm Header "
                        "(log or workload) or a Mooncake row with 'input_length'")


# --- Azure LLM inference trace ------------------------------------------------------------------------


def read_azure_csv(path: str | Path, *, seed: int = 0, skip_bad_rows: bool = False) -> Workload:
    """Azure LLM inference trace (2023): one request per row; arrival = seconds since the first row.

    Prompts are synthetic (no prefix information in the trace: every prompt token is unique).
    """
    path = Path(path)
    skips = _Skips(skip_bad_rows)
    rows: list[tuple[datetime, int, int, int]] = []
    with open(path, encoding="utf-8", newline="") as f:
        header = f.readline().strip().split(",")
        try:
            cols = [header.index(c) for c in AZURE_COLUMNS]
        except ValueError:
            raise WorkloadError(f"{path}:1: header must name the columns {', '.join(AZURE_COLUMNS)}; "
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
            n_in = _positive_int(ctx)
            if n_in is None:
                skips.bad(f"{path}:{lineno}: field ContextTokens: must be a positive integer, got {ctx!r}")
                continue
            n_out = _positive_int(gen)
            if n_out is None:
                skips.bad(f"{path}:{lineno}: field GeneratedTokens: must be a positive integer, got {gen!r}")
                continue
            rows.append((when, n_in, n_out, lineno))
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


# --- Mooncake ------------------------------------------------------------------------------------------


class _MooncakeRow(msgspec.Struct):
    timestamp: float  # ms
    input_length: int
    output_length: int
    hash_ids: list[int] = []


_mooncake_decoder = msgspec.json.Decoder(_MooncakeRow)


def read_mooncake_jsonl(path: str | Path, *, seed: int = 0, skip_bad_rows: bool = False) -> Workload:
    """Mooncake trace: each hash id names one 512-token prompt block; equal ids → equal tokens.

    Prompt i is synthetic with ``segment_ids = hash_ids``, so requests sharing leading hash ids
    share token-identical prefix blocks and prefix caching behaves as in the trace.
    """
    path = Path(path)
    skips = _Skips(skip_bad_rows)
    rows: list[tuple[float, _MooncakeRow, int]] = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = _mooncake_decoder.decode(line)
            except msgspec.ValidationError as e:  # names the field, e.g. "at `$.input_length`"
                skips.bad(f"{path}:{lineno}: {e}")
                continue
            except msgspec.DecodeError as e:
                skips.bad(f"{path}:{lineno}: not a JSON object: {e}")
                continue
            problem = _mooncake_problem(row)
            if problem:
                skips.bad(f"{path}:{lineno}: {problem}")
                continue
            rows.append((row.timestamp, row, lineno))
    origin = min((r[0] for r in rows), default=0.0)
    requests = [
        RequestSpec(arrival=(ts - origin) / 1000.0,
                    prompt=synthetic_prompt(row.input_length, seed, unique_seed=lineno,
                                            segment_ids=row.hash_ids, segment_len=MOONCAKE_BLOCK),
                    params=trace_params(row.output_length))
        for ts, row, lineno in rows
    ]
    return Workload(requests, seed=seed, source=str(path), meta={"format": "mooncake", **skips.meta()})


def _mooncake_problem(row: _MooncakeRow) -> str | None:
    if not math.isfinite(row.timestamp) or row.timestamp < 0:
        return f"field timestamp: must be a non-negative number of ms, got {row.timestamp!r}"
    if row.input_length < 1:
        return f"field input_length: must be >= 1, got {row.input_length}"
    if row.output_length < 1:
        return f"field output_length: must be >= 1, got {row.output_length}"
    blocks = -(-row.input_length // MOONCAKE_BLOCK)
    if len(row.hash_ids) > blocks:
        return (f"field hash_ids: {len(row.hash_ids)} ids for input_length {row.input_length} "
                f"(at most {blocks} blocks of {MOONCAKE_BLOCK} tokens)")
    if any(h < 0 for h in row.hash_ids):
        return "field hash_ids: ids must be non-negative"
    return None


# --- our own logs ----------------------------------------------------------------------------------------


def fixed_length_params(params: SamplingParams, num_output_tokens: int) -> SamplingParams:
    """``params`` made to stop after exactly ``num_output_tokens`` tokens, whatever is sampled."""
    return msgspec.structs.replace(params, max_tokens=num_output_tokens,
                                   min_tokens=min(params.min_tokens, num_output_tokens),
                                   ignore_eos=True, stop_token_ids=(), stop=())


def read_log_workload(path: str | Path) -> Workload:
    """The requests of a recorded log (or a saved workload): their ``Arrived`` events.

    A request that finished gets its recorded output length (``Finished.num_output_tokens``)
    as a fixed length. Aborted requests (and any finished with no output) are left out and
    counted in ``meta["excluded"]``; unfinished ones keep their logged params.
    """
    path = Path(path)
    header: Header | None = None
    arrived: dict[int, Arrived] = {}
    outputs: dict[int, int] = {}
    aborted: set[int] = set()
    for event in read_log(path):
        if isinstance(event, Arrived):
            arrived[event.request_id] = event
        elif isinstance(event, Finished):
            outputs[event.request_id] = event.num_output_tokens
        elif isinstance(event, Aborted):
            aborted.add(event.request_id)
        elif isinstance(event, Header) and header is None:
            header = event
    if header is None:
        raise WorkloadError(f"{path}:1: the first line must be a Header event")
    requests: list[RequestSpec] = []
    excluded = {"aborted": 0, "no_output": 0}
    unfinished = 0
    for rid, ev in arrived.items():
        params = ev.params
        if rid in aborted:
            excluded["aborted"] += 1
            continue
        if rid in outputs:
            if outputs[rid] < 1:
                excluded["no_output"] += 1
                continue
            params = fixed_length_params(params, outputs[rid])
        else:
            unfinished += 1
        requests.append(RequestSpec(arrival=ev.time, prompt=ev.prompt, params=params, priority=ev.priority))
    if header.clock == WORKLOAD_CLOCK:
        info = dict(header.extra.get("workload", {}))
        source = info.pop("source", str(path))
        info.pop("num_requests", None)
        return Workload(requests, seed=header.seed, source=source, meta=info)
    meta: dict[str, Any] = {"format": "log", "clock": header.clock}
    if any(excluded.values()):
        meta["excluded"] = {k: v for k, v in excluded.items() if v}
    if unfinished:
        meta["unfinished"] = unfinished
    return Workload(requests, seed=header.seed, source=str(path), meta=meta)
