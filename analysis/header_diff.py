"""Every Header field that differs between runs, so an A/B comparison says what it compares.

A chunked on/off comparison that also changed the token budget (or the device, the dtype, the
model) is a different experiment; the report lists each such difference before its table:

    scheduler.enable_chunked_prefill: on → off
    scheduler.max_num_batched_tokens: 2,048 → 123,000

Keys: the engine config's dotted fields (``scheduler.…``, ``cache.…``, ``seed``), then the
Header's own (``clock``, ``model``, ``eos_token_id``), ``extra.…`` (device, dtype, model path, KV
geometry, what a simulation used; not the run's name, ``extra.run_id``, which every run has its
own of) and ``versions.…``.

A field only some runs record (a live run's device and KV geometry, a simulation's cost model) is
not a row of "(absent)": the render names such fields once per set of runs that has them, a
group of them by its prefix (``extra.kv.*``), a single short value with it:

    only in live: extra.model_path, extra.device=cpu, extra.dtype=float32, extra.kv.* (5)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from traces.events import Header
from traces.request_names import RUN_ID_KEY

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
    # the run's name (traces/request_names.py) differs between any two runs: it is no difference of setup
    _flatten({k: v for k, v in header.extra.items() if k != RUN_ID_KEY}, "extra", out)
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


SHORT = 40  # a value longer than this is named, not shown, on an "only in" line


def render_header_differences(labels: Sequence[str], headers: Sequence[Header | None]) -> str:
    """Lines ``key: a → b [→ c …]`` under a title naming the runs in order ("" for one run), then
    one ``only in …`` line per set of runs that alone record some fields."""
    if len(headers) < 2:
        return ""
    diffs = header_differences(headers)
    order = " → ".join(labels)
    if not diffs:
        return f"same config in every run ({order}): no Header field differs\n"
    lines = [f"config differences ({order}):"]
    only: dict[tuple[bool, ...], list[tuple[str, Any]]] = {}
    for key, values in diffs:
        present = tuple(v is not ABSENT for v in values)
        kept = [v for v in values if v is not ABSENT]
        if all(present) or any(_same(v, kept[0]) is False for v in kept[1:]):
            lines.append(f"  {key}: " + " → ".join("–" if v is ABSENT else format_value(v) for v in values))
        else:  # the runs that record it agree: one mention
            only.setdefault(present, []).append((key, kept[0]))
    for present, fields in only.items():
        who = ", ".join(label for label, p in zip(labels, present) if p)
        lines.append(f"  only in {who}: " + ", ".join(_compact(fields)))
    return "\n".join(lines) + "\n"


def _compact(fields: list[tuple[str, Any]]) -> list[str]:
    """Keys sharing a nested parent (``extra.kv``, not ``extra``) become ``parent.* (n)``; a lone
    key shows a short value."""
    parents: dict[str, list[tuple[str, Any]]] = {}
    for key, value in fields:
        parent = key.rpartition(".")[0]
        parents.setdefault(parent if "." in parent else key, []).append((key, value))
    out = []
    for parent, group in parents.items():
        if len(group) > 1:
            out.append(f"{parent}.* ({len(group)})")
        else:
            key, value = group[0]
            text = format_value(value)
            out.append(f"{key}={text}" if len(text) <= SHORT else key)
    return out
