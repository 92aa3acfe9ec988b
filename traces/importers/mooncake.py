"""Mooncake trace JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from traces.importers.rows import Skips, json_object
from traces.workload import RequestSpec, Workload, synthetic_prompt, trace_params

BLOCK_TOKENS = 512  # tokens per Mooncake hash id


def detect(path: Path, first_line: str) -> bool:
    row = json_object(first_line)
    return row is not None and "input_length" in row


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
    skips = Skips(skip_bad_rows)
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
    skips.require_rows(path, len(rows))
    origin = min((r[0] for r in rows), default=0.0)
    requests = [
        RequestSpec(arrival=(ts - origin) / 1000.0,
                    prompt=synthetic_prompt(row.input_length, seed, unique_seed=lineno,
                                            segment_ids=row.hash_ids, segment_len=BLOCK_TOKENS),
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
    blocks = -(-row.input_length // BLOCK_TOKENS)
    if len(row.hash_ids) > blocks:
        return (f"field hash_ids: {len(row.hash_ids)} ids for input_length {row.input_length} "
                f"(at most {blocks} blocks of {BLOCK_TOKENS} tokens)")
    if any(h < 0 for h in row.hash_ids):
        return "field hash_ids: ids must be non-negative"
    return None
