"""Hold a new log against a baseline: the same decisions, and latencies within tolerances.

Checks (each can be left out with ``ignore``):

- ``decisions``: step by step, the admissions, preemptions, spans, block events and request ends;
  the first step where they differ (and which of them differ), how many steps differ, and the
  counts (steps, admissions, preemptions, block events by kind, finished / aborted / rejected).
- ``tokens``: the sampled tokens of every step (a cost-model simulation has its own tokens: ignore).
- ``latency``: TTFT / TPOT / ITL / E2E percentiles and the makespan, each within a relative
  tolerance of the baseline. By default only a slowdown fails (``two_sided``: any change), and a
  change smaller than ``min_delta_s`` never does (noise on a shared machine).

The workload (requests, prompts, params) is compared and reported, never failed on its own: a
different workload shows up as different decisions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.decisions import DECISION_FIELDS, LogInventory, StepDecisions, step_decisions
from analysis.frames import load_frames
from analysis.header_diff import format_value, header_differences
from analysis.metrics import summarize
from analysis.tolerances import CHECKS, DEFAULT_TOLERANCE, METRICS, tolerance_for
from traces.log import read_log

SHOWN = 6  # items of a differing list shown in the text report


@dataclass
class Divergence:
    step: int  # the step index (-1: before any step)
    fields: list[str]  # which decisions differ, or ["missing in baseline" | "missing in new"]
    baseline: dict[str, Any]
    new: dict[str, Any]


@dataclass
class LatencyCheck:
    metric: str
    baseline: float
    new: float
    change: float  # (new - baseline) / baseline; NaN when undefined
    tolerance: float
    passed: bool
    note: str = ""


@dataclass
class RegressReport:
    baseline: str
    new: str
    checks: list[str]
    two_sided: bool = False
    min_delta_s: float = 0.0
    config_differences: list[tuple[str, list[Any]]] = field(default_factory=list)
    workload: dict[str, Any] = field(default_factory=dict)
    steps: tuple[int, int] = (0, 0)
    differing_steps: int = 0
    first_divergence: Divergence | None = None
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # every count, (baseline, new)
    token_steps_differing: int = 0
    first_token_divergence: dict[str, Any] | None = None
    latency: list[LatencyCheck] = field(default_factory=list)

    @property
    def decisions_ok(self) -> bool:
        return self.differing_steps == 0 and all(b == n for b, n in self.counts.values())

    @property
    def tokens_ok(self) -> bool:
        return self.token_steps_differing == 0

    @property
    def failures(self) -> list[str]:
        """What failed, one short phrase each (empty: passed)."""
        out = []
        if "decisions" in self.checks and not self.decisions_ok:
            out.append("decisions")
        if "tokens" in self.checks and not self.tokens_ok:
            out.append("tokens")
        if "latency" in self.checks:
            out += [f"latency {c.metric}" for c in self.latency if not c.passed]
        return out

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN → None): what a CI job reads."""
        d = asdict(self)
        d["config_differences"] = [{"field": k, "values": v} for k, v in self.config_differences]
        d["counts"] = {k: {"baseline": b, "new": n} for k, (b, n) in self.counts.items()}
        d.update(passed=self.passed, failures=self.failures, decisions_ok=self.decisions_ok, tokens_ok=self.tokens_ok)
        return _no_nan(d)


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


def regress(baseline: str | Path, new: str | Path, *, tolerances: dict[str, float] | None = None,
            default_tolerance: float = DEFAULT_TOLERANCE, two_sided: bool = False, min_delta_s: float = 0.0,
            ignore: tuple[str, ...] = (), stall_s: float | None = None) -> RegressReport:
    """Compare the log ``new`` with the log ``baseline`` (see the module docstring)."""
    report = RegressReport(str(baseline), str(new), [c for c in CHECKS if c not in ignore], two_sided, min_delta_s)
    inv_b, inv_n = LogInventory(), LogInventory()
    _compare_steps(report, step_decisions(read_log(baseline), inv_b), step_decisions(read_log(new), inv_n))
    report.config_differences = header_differences([inv_b.header, inv_n.header])
    report.workload = _compare_workload(inv_b, inv_n)
    keys = sorted(set(inv_b.counts) | set(inv_n.counts), key=_count_order)
    report.counts = {k: (inv_b.counts[k], inv_n.counts[k]) for k in keys}
    if "latency" in report.checks:
        kw = {} if stall_s is None else {"stall_s": stall_s}
        sb, sn = summarize(load_frames(baseline), **kw), summarize(load_frames(new), **kw)
        for metric, (key, stat) in METRICS.items():
            tol = tolerance_for(metric, tolerances or {}, default_tolerance)
            b, n = (sb[key][stat], sn[key][stat]) if stat else (sb[key], sn[key])
            report.latency.append(_latency_check(metric, b, n, tol, two_sided, min_delta_s))
    return report


def _count_order(key: str) -> tuple[int, str]:
    first = ("steps", "scheduled_tokens", "arrived", "admissions", "preemptions", "finished", "aborted", "rejected")
    return (first.index(key), "") if key in first else (len(first), key)


def _compare_steps(report: RegressReport, base, new) -> None:
    nb = nn = 0
    for b, n in itertools.zip_longest(base, new):
        nb += b is not None
        nn += n is not None
        if b is None or n is None:
            report.differing_steps += 1
            if report.first_divergence is None:
                there = n if b is None else b
                report.first_divergence = Divergence(there.step, ["missing in baseline" if b is None else
                                                                  "missing in new"],
                                                     _fields(b, DECISION_FIELDS), _fields(n, DECISION_FIELDS))
            continue
        diff = b.differing(n) if b.step == n.step else ["step", *b.differing(n)]
        if diff:
            report.differing_steps += 1
            if report.first_divergence is None:
                report.first_divergence = Divergence(b.step, diff, _fields(b, diff), _fields(n, diff))
        if b.spans == n.spans and b.tokens != n.tokens:  # other spans sample other tokens: not news
            report.token_steps_differing += 1
            if report.first_token_divergence is None:
                report.first_token_divergence = _token_divergence(b, n)
    report.steps = (nb, nn)


def _fields(d: StepDecisions | None, names) -> dict[str, Any]:
    if d is None:
        return {}
    return {name: getattr(d, name) for name in names if name != "step"} | {"step": d.step}


def _token_divergence(b: StepDecisions, n: StepDecisions) -> dict[str, Any]:
    """The first sampling span whose tokens differ: request, baseline and new tokens."""
    sampled = [s[0] for s in b.spans if s[3]]
    for i, (tb, tn) in enumerate(itertools.zip_longest(b.tokens, n.tokens)):
        if tb != tn:
            rid = sampled[i] if i < len(sampled) else -1
            return {"step": b.step, "request_id": rid, "baseline": tb, "new": tn}
    return {"step": b.step, "request_id": -1, "baseline": None, "new": None}


def _compare_workload(b: LogInventory, n: LogInventory) -> dict[str, Any]:
    """Same requests (prompt, params, priority) under the same ids, and how far arrivals moved."""
    ids = sorted(set(b.requests) | set(n.requests))
    first = next((rid for rid in ids if b.requests.get(rid, (0, None))[1] != n.requests.get(rid, (0, None))[1]),
                 None)
    shifts = [abs(b.requests[r][0] - n.requests[r][0]) for r in ids if r in b.requests and r in n.requests]
    return {"requests": (len(b.requests), len(n.requests)), "same_requests": first is None,
            "first_different_request": first, "max_arrival_shift_s": max(shifts, default=0.0)}


def _latency_check(metric: str, b: float, n: float, tol: float, two_sided: bool, min_delta_s: float) -> LatencyCheck:
    if b != b and n != n:  # undefined in both (e.g. TPOT of one-token answers)
        return LatencyCheck(metric, b, n, math.nan, tol, True, "undefined in both")
    if b != b or n != n:
        return LatencyCheck(metric, b, n, math.nan, tol, False, "defined in one run only")
    delta = n - b
    change = delta / b if b else (0.0 if delta == 0 else math.copysign(math.inf, delta))
    over = abs(change) > tol if two_sided else change > tol
    if over and abs(delta) < min_delta_s:
        return LatencyCheck(metric, b, n, change, tol, True, "under --min-delta-ms")
    return LatencyCheck(metric, b, n, change, tol, not over)


def render_report(r: RegressReport) -> str:
    """The text report: config, workload, decisions, tokens, latency, verdict."""
    lines = [f"minivllm regress: baseline {r.baseline}", f"                  new      {r.new}"]
    if r.config_differences:
        lines.append("config differences (baseline → new):")
        lines += [f"  {k}: " + " → ".join(format_value(v) for v in vals) for k, vals in r.config_differences]
    else:
        lines.append("config: the same Header fields")
    w = r.workload
    nb, nn = w["requests"]
    same = ("the same requests" if w["same_requests"]
            else f"different requests (first: request {w['first_different_request']})")
    lines.append(f"workload: {nb:,} → {nn:,} requests, {same}; arrivals moved by at most "
                 f"{w['max_arrival_shift_s'] * 1e3:,.3f} ms")
    lines += _render_decisions(r) + _render_tokens(r) + _render_latency(r)
    lines.append("RESULT: PASS" if r.passed else "RESULT: FAIL (" + ", ".join(r.failures) + ")")
    return "\n".join(lines) + "\n"


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > SHOWN:
        return repr(value[:SHOWN])[:-1] + f", … {len(value) - SHOWN} more]"
    return repr(value)


def _from_first_difference(b: Any, n: Any) -> tuple[Any, Any, int]:
    """Two lists from their first differing item (and how many equal items were skipped)."""
    if not (isinstance(b, list) and isinstance(n, list)):
        return b, n, 0
    i = next((k for k, (x, y) in enumerate(zip(b, n)) if x != y), min(len(b), len(n)))
    return b[i:], n[i:], i


def _status(check: str, ok: bool, r: RegressReport) -> str:
    return "ignored" if check not in r.checks else ("ok" if ok else "FAIL")


def _render_decisions(r: RegressReport) -> list[str]:
    sb, sn = r.steps
    lines = [f"decisions: {_status('decisions', r.decisions_ok, r)}: {sb:,} → {sn:,} steps, "
             f"{r.differing_steps:,} differ"]
    d = r.first_divergence
    if d is not None:
        lines.append(f"  first divergent step {d.step}: {', '.join(d.fields)}")
        for name in d.fields:
            if name in DECISION_FIELDS:
                b, n, skipped = _from_first_difference(d.baseline.get(name), d.new.get(name))
                where = f" (from item {skipped}; the ones before are equal)" if skipped else ""
                lines.append(f"    {name}{where}: baseline {_short(b)}")
                lines.append(f"    {' ' * len(name + where)}  new      {_short(n)}")
    changed = [f"{k} {b:,} → {n:,}" for k, (b, n) in r.counts.items() if b != n]
    if changed:
        lines.append("  counts that differ: " + "; ".join(changed))
    return lines


def _render_tokens(r: RegressReport) -> list[str]:
    line = (f"tokens: {_status('tokens', r.tokens_ok, r)}: {r.token_steps_differing:,} steps sampled other tokens "
            "(of those with equal spans)")
    t = r.first_token_divergence
    if t is not None:
        line += (f"; first at step {t['step']}, request {t['request_id']}: baseline {_short(t['baseline'])}, "
                 f"new {_short(t['new'])}")
    return [line]


def _render_latency(r: RegressReport) -> list[str]:
    if "latency" not in r.checks:
        return ["latency: ignored"]
    bad = [c for c in r.latency if not c.passed]
    lines = [f"latency: {'ok' if not bad else 'FAIL'} (relative tolerance; fails when "
             f"{'it changes' if r.two_sided else 'slower'} by more)",
             f"  {'metric':<10} {'baseline':>12} {'new':>12} {'change':>9} {'tolerance':>9}"]
    for c in r.latency:
        change = "-" if c.change != c.change else f"{c.change:+.1%}"
        lines.append(f"  {c.metric:<10} {_ms(c.baseline):>12} {_ms(c.new):>12} {change:>9} {c.tolerance:>9.0%}  "
                     + ("ok" if c.passed else "FAIL") + (f" ({c.note})" if c.note else ""))
    return lines


def _ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1e3:,.1f} ms"
