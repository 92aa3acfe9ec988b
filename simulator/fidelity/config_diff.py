"""What-if configs and the differences they make, stated rather than implied.

An A/B between two simulated runs is only as honest as the list of what differs between them:
turning chunked prefill off also changes a step budget that isn't given, to one that holds a whole
prompt (``SchedulerConfig.replace``, runtime/engine/config.py) — that is a second change, and
``config_changes`` names it with its reason.
"""

from __future__ import annotations

from typing import Any

from runtime.engine.config import EngineConfig

BUDGET = "scheduler.max_num_batched_tokens"
CHUNKED = "scheduler.enable_chunked_prefill"


def flat(config: EngineConfig) -> dict[str, Any]:
    """Dotted field name -> value."""
    out: dict[str, Any] = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    out.setdefault("speculative", config.speculative)  # (a plain config's dict leaves it out; a what-if turns it on)
    return out


def _fmt(value: Any) -> str:
    if value == "":  # (speculative decoding off)
        return "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def config_changes(base: EngineConfig, new: EngineConfig) -> list[str]:
    """One line per field that differs, e.g. "chunked prefill off: max_num_batched_tokens 2,048 →
    16,384 so a whole prompt fits a step"."""
    a, b = flat(base), flat(new)
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key) or key == "model_identity" or {a.get(key), b.get(key)} <= {"", "off"}:
            continue
        line = f"{key.split('.')[-1]} {_fmt(a.get(key))} → {_fmt(b.get(key))}"
        if key == BUDGET and not new.scheduler.enable_chunked_prefill and b[key] >= new.scheduler.max_model_len:
            line = f"chunked prefill off: {line} so a whole prompt fits a step"
        lines.append(line)
    return lines


def parse_override(text: str, config: EngineConfig) -> tuple[str, Any]:
    """``scheduler.enable_chunked_prefill=false`` -> (dotted name, typed value)."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    fields = flat(config)
    if not sep or key not in fields:
        names = ", ".join(k for k in fields if k != "model_identity")
        raise ValueError(f"--what-if {text!r}: expected FIELD=VALUE with FIELD one of {names}")
    current = fields[key]
    raw = raw.strip()
    if isinstance(current, bool):
        if raw.lower() not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
            raise ValueError(f"--what-if {key}: expected true or false, got {raw!r}")
        return key, raw.lower() in ("true", "on", "1", "yes")
    if isinstance(current, int):
        try:
            return key, int(raw.replace(",", "").replace("_", ""))
        except ValueError:
            raise ValueError(f"--what-if {key}: expected an integer, got {raw!r}") from None
    if isinstance(current, float):
        return key, float(raw)
    return key, raw


def what_if(config: EngineConfig, overrides: list[str]) -> EngineConfig:
    """``config`` with ``overrides`` (FIELD=VALUE) applied; a budget they don't give follows chunked
    prefill (``SchedulerConfig.replace``)."""
    changes = dict(parse_override(o, config) for o in overrides)
    try:
        return config.replace(**changes)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--what-if: {e}") from None

