"""Every Header field that differs between runs, so an A/B comparison says what it compares.

A chunked on/off comparison that also changed the token budget (or the device, the dtype, the
model) is a different experiment; the report lists each such difference before its table:

    scheduler.enable_chunked_prefill: on → off
    scheduler.max_num_batched_tokens: 2,048 → 123,000

Keys: the engine config's dotted fields (``scheduler.…``, ``cache.…``, ``seed``), then the
Header's own (``clock``, ``model``, ``eos_token_id``), ``extra.…`` (device, dtype, model path, KV
geometry, what a simulation used) and ``versions.…``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from traces.events import Header

ABSENT = "(absent)"


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k in value:
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def header_fields(header: Header | None) -> dict[str, Any]:
    """A Header as flat ``dotted key -> value`` (the config's fields first)."""
    if header is None:
        return {}
    out: dict[str, Any] = {}
    _flatten(header.config, "", out)
    own = {"clock": header.clock, "schema_version": header.schema_version, "eos_token_id": header.eos_token_id}
    if header.model_identity != header.config.get("model_identity"):  # not the config's field again
        own["model"] = header.model_identity
    if header.config.get("cache", {}).get("num_blocks") != header.num_blocks:
        own["num_blocks"] = header.num_blocks
    if header.config.get("cache", {}).get("block_size") != header.block_size:
        own["block_size"] = header.block_size
    if header.config.get("seed") != header.seed:
        own["header_seed"] = header.seed
    out.update(own)
    _flatten(header.extra, "extra", out)
    _flatten(header.versions, "versions", out)
    return out


def header_differences(headers: Sequence[Header | None]) -> list[tuple[str, list[Any]]]:
    """``(key, [value per run])`` for every key whose value is not the same in all runs."""
    fields = [header_fields(h) for h in headers]
    keys: dict[str, None] = {}
    for f in fields:
        keys.update(dict.fromkeys(f))
    diffs = []
    for key in keys:
        values = [f.get(key, ABSENT) for f in fields]
        if any(_same(v, values[0]) is False for v in values[1:]):
            diffs.append((key, values))
    return diffs


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def format_value(value: Any) -> str:
    """on/off for a flag, thousands separators for a count, compact JSON for a list."""
    if value is ABSENT:
        return ABSENT
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,}"  # 1.0, not 1: an int and a float differ
    if value is None:
        return "none"
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def render_header_differences(labels: Sequence[str], headers: Sequence[Header | None]) -> str:
    """Lines ``key: a → b [→ c …]`` under a title naming the runs in order ("" for one run)."""
    if len(headers) < 2:
        return ""
    diffs = header_differences(headers)
    order = " → ".join(labels)
    if not diffs:
        return f"same config in every run ({order}): no Header field differs\n"
    lines = [f"config differences ({order}):"]
    lines += [f"  {key}: " + " → ".join(format_value(v) for v in values) for key, values in diffs]
    return "\n".join(lines) + "\n"
