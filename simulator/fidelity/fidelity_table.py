"""Fidelity of one cost model over several live runs, as one table (each cell against its goal, ``GOALS``).

``run_row(log, model)``: the run re-simulated under its own config; signed errors of TTFT, TPOT
and E2E at p50 and p90 and of the makespan. ``pair_row(on_log, off_log, model)``: the what-if —
``on_log``'s workload re-simulated under ``off_log``'s config (every field in which the two
Headers differ becomes an override; two runs under other arrivals, such as another load, are each
simulated from their own log: ``same_workload``), the errors against ``off_log``, and whether the
predicted difference (sim off vs sim on) has the sign of the live one (live off vs live on) per
metric and for the makespan. ``markdown`` renders the rows; ``within`` says which goals a row misses;
``kind_table`` gives each run's step-time error by kind of step (decode-only, with prefill).
``run_row(..., sensitivity_pct=p)`` adds each metric's elasticity to the step time
(``simulator.fidelity.fidelity.sensitivity``); ``sensitivity_table`` shows it with the step-time error each
run's latency errors amount to (error ÷ elasticity). ``repeat_spread(a_log, b_log)``: how far two
live runs of one config differ per metric; a live on → off difference within that spread can
change sign from one pair of runs to the next, so ``signs_beyond(row, spread)`` judges only the
others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator.cost.cost_model import CostModel
from simulator.fidelity.config_diff import flat
from simulator.fidelity.fidelity import CHECKED, arrivals_what_if, compare, fidelity, times_of_log
from simulator.fidelity.statistics import rel_error
from simulator.replay.replay import log_config
from traces.importers.log import read_log_workload
from traces.workload import Workload

COLUMNS = tuple((m, p) for m, ps in CHECKED.items() for p in ps)  # (ttft, p50), (ttft, p90), ...
ARRIVAL_SPAN_TOLERANCE = 0.05  # two runs of one workload: their arrival spans this close
# |error| % a cell may have, by kind of row and metric: a run re-simulated under its own config;
# a what-if (another run's config on this run's workload, or another run's arrivals: its errors are
# that run's, judged by the what-if's goals), whose live sign matters most
GOALS = {"run": {"ttft": 10.0, "tpot": 5.0, "e2e": 5.0, "makespan": 3.0},
         "fleet": {"ttft": 15.0, "tpot": 10.0, "e2e": 10.0, "makespan": 5.0},  # replicas sharing a device
         "what-if": {"ttft": 10.0, "tpot": 10.0, "e2e": 10.0, "makespan": 10.0}}


def _name(path: str | Path) -> str:
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def short_names(paths: list[str | Path]) -> dict[str, str]:
    """Each path's row name: its file name less the log suffixes, with as many parent folders as
    tell it from the other paths (``demo1/live`` and ``demo2/live``, not ``live`` twice); the whole
    path where nothing else does."""
    parents = {str(p): [part for part in Path(p).parent.parts if part != Path(p).anchor] for p in paths}
    depth = dict.fromkeys(parents, 0)

    def name(p: str) -> str:
        return "/".join([*parents[p][len(parents[p]) - depth[p]:], _name(p)])

    while True:
        by_name: dict[str, list[str]] = {}
        for p in depth:
            by_name.setdefault(name(p), []).append(p)
        clashes = [p for same in by_name.values() if len(same) > 1 for p in same]
        growing = [p for p in clashes if depth[p] < len(parents[p])]
        if not growing:
            return {p: p if p in clashes else name(p) for p in depth}
        for p in growing:
            depth[p] += 1


def _row_name(path: str | Path, names: dict[str, str] | None) -> str:
    return (names or {}).get(str(path)) or _name(path)


def overrides_between(base_log: str | Path, other_log: str | Path) -> list[str]:
    """FIELD=VALUE for every config field in which ``other_log``'s Header differs from ``base_log``'s."""
    _, a = log_config(base_log)
    _, b = log_config(other_log)
    fa, fb = flat(a), flat(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if key == "model_identity" or fa.get(key) == fb.get(key):
            continue
        value = fb.get(key)
        out.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def run_row(log: str | Path, model: CostModel, role: str = "", sensitivity_pct: float | None = None,
            workload: Workload | None = None, names: dict[str, str] | None = None) -> dict[str, Any]:
    """``workload``: the closed-loop workload the run replayed, simulated in place of its arrivals;
    ``names``: row names by path (``short_names``), else the file name."""
    report, _ = fidelity(log, model, replay=True, sensitivity_pct=sensitivity_pct, workload=workload)
    name = _row_name(log, names) + (" (closed loop)" if workload is not None else "")
    replay = report.get("replay")  # (none of a fleet log: its replicas replay one by one)
    row = {"kind": "run" if replay is not None else "fleet", "run": name, "role": role, "notes": report["notes"],
           "errors": {f"{m}_{p}": report["metrics"][m][p]["error_pct"] for m, p in COLUMNS},
           "makespan": report["makespan"]["error_pct"], "steps": report["steps"]}
    if replay is not None:
        row |= {"step_mape": replay["step_mape"],
                "step_time_by_kind": {k: v["error_pct"] for k, v in replay["by_kind"].items()}}
    sens = report.get("sensitivity")
    if sens is not None:
        row["elasticity"] = {f"{m}_{p}": sens[m][p] for m, p in COLUMNS} | {"makespan": sens["makespan"]}
    return row


def pair_row(on_log: str | Path, off_log: str | Path, model: CostModel, role: str = "",
             names: dict[str, str] | None = None) -> dict[str, Any]:
    overrides = overrides_between(on_log, off_log)
    replayed = bool(overrides) and same_workload(on_log, off_log)
    if replayed:
        report, _ = fidelity(on_log, model, overrides=overrides, what_if_live=off_log, replay=False)
        w = report["what_if"]
    else:  # other arrivals (another load): each run simulated from its own log
        report, w = arrivals_what_if(on_log, off_log, model)
    signs: dict[str, bool] = {}
    for m, p in COLUMNS:
        signs[f"{m}_{p}"] = bool(w["predicted_change"][m][p]["same_sign"])
    base_ms, live_on_ms = report["makespan"]["sim_s"], report["makespan"]["live_s"]
    predicted = rel_error(w["makespan"]["sim_s"], base_ms)
    actual = rel_error(w["makespan"]["live_s"], live_on_ms)
    signs["makespan"] = math.isfinite(predicted) and math.isfinite(actual) and (predicted > 0) == (actual > 0)
    return {"kind": "what-if", "run": f"{_row_name(on_log, names)} → {_row_name(off_log, names)}", "role": role,
            "overrides": overrides, "replayed": replayed,
            "notes": report["notes"],
            "errors": {f"{m}_{p}": w["vs_live"][m][p]["error_pct"] for m, p in COLUMNS},
            "makespan": w["makespan"]["error_pct"], "signs": signs,
            "live_change": {f"{m}_{p}": w["predicted_change"][m][p]["live_pct"] for m, p in COLUMNS}
            | {"makespan": actual},
            "predicted_change": {f"{m}_{p}": w["predicted_change"][m][p]["predicted_pct"] for m, p in COLUMNS}
            | {"makespan": predicted}}


def same_workload(a_log: str | Path, b_log: str | Path) -> bool:
    """Two live runs served one workload: the same prompt lengths, arriving over the same span
    within ``ARRIVAL_SPAN_TOLERANCE`` (the engine stamps a live arrival when it takes it in)."""
    a, b = read_log_workload(a_log).requests, read_log_workload(b_log).requests
    if sorted(r.num_prompt_tokens for r in a) != sorted(r.num_prompt_tokens for r in b):
        return False
    span_a, span_b = (rs[-1].arrival - rs[0].arrival if rs else 0.0 for rs in (a, b))
    return abs(span_b - span_a) <= ARRIVAL_SPAN_TOLERANCE * span_a


def repeat_spread(a_log: str | Path, b_log: str | Path) -> dict[str, float]:
    """|b / a − 1| in % per column and for the makespan: two live runs of one config, the noise
    a what-if's live difference must exceed before its sign says anything."""
    a, b = times_of_log(a_log), times_of_log(b_log)
    metrics = compare(a.values(), b.values())  # (b's "error" against a)
    spread = {f"{m}_{p}": abs(metrics[m][p]["error_pct"]) for m, p in COLUMNS}
    return spread | {"makespan": abs(rel_error(b.makespan, a.makespan))}


def signs_beyond(row: dict[str, Any], spread: dict[str, float]) -> dict[str, bool]:
    """The what-if ``row``'s signs of the live differences larger than ``spread`` (a metric the
    spread does not name, or names as NaN, is judged)."""
    return {k: ok for k, ok in row["signs"].items()
            if not abs(row["live_change"][k]) <= spread.get(k, math.nan)}


def within(row: dict[str, Any]) -> list[str]:
    """The goals ``row`` misses (``GOALS``: a run's TTFT within 10 %, TPOT and E2E within 5 %,
    makespan within 3 %; a what-if's within 10 %), and any wrong sign of an on/off difference."""
    goal = GOALS[row["kind"]]
    bad = [f"{k} {v:+.1f}%" for k, v in row["errors"].items()
           if not (math.isfinite(v) and abs(v) <= goal[k.split("_")[0]])]
    if not (math.isfinite(row["makespan"]) and abs(row["makespan"]) <= goal["makespan"]):
        bad.append(f"makespan {row['makespan']:+.1f}%")
    bad += [f"sign of {k}" for k, ok in row.get("signs", {}).items() if not ok]
    return bad


def _pct(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{v:+.1f}%"


def markdown(rows: list[dict[str, Any]], fmt: Callable[[float], str] = _pct) -> str:
    """One line per row: the signed errors, the makespan error, the signs (what-if rows) and the
    goals missed."""
    head = ["run", "role", *(f"{m.upper()} {p}" for m, p in COLUMNS), "makespan", "on/off signs", "goal"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(COLUMNS) + 1) + "---|---|"]
    for r in rows:
        signs = r.get("signs")
        sign = "" if signs is None else f"{sum(signs.values())}/{len(signs)}"
        if signs and not all(signs.values()):
            sign += " (wrong: " + ", ".join(k for k, ok in signs.items() if not ok) + ")"
        bad = within(r)
        cells = [r["run"], r["role"], *(fmt(r["errors"][f"{m}_{p}"]) for m, p in COLUMNS), fmt(r["makespan"]), sign,
                 "met" if not bad else f"{len(bad)} missed"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def kind_table(rows: list[dict[str, Any]]) -> str:
    """Per run: the timing replay's summed step-time error, decode-only steps and steps with prefill."""
    lines = ["| run | decode-only steps | steps with prefill |", "|---|---:|---:|"]
    for r in rows:
        if "step_time_by_kind" in r:
            k = r["step_time_by_kind"]
            lines.append(f"| {r['run']} | {_pct(k['decode'])} | {_pct(k['prefill'])} |")
    return "\n".join(lines)


def sign_table(rows: list[dict[str, Any]]) -> str:
    """Per what-if row: the predicted and the live on → off difference per metric."""
    keys = [f"{m}_{p}" for m, p in COLUMNS] + ["makespan"]
    head = ["pair", *(k.replace("_", " ").upper().replace("MAKESPAN", "makespan") for k in keys)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(keys)]
    for r in rows:
        if r["kind"] != "what-if":
            continue
        cells = [f"{_pct(r['predicted_change'][k])} / {_pct(r['live_change'][k])}"
                 + ("" if r["signs"][k] else " ✗") for k in keys]
        lines.append("| " + " | ".join([r["run"], *cells]) + " |")
    return "\n".join(lines)


def sensitivity_table(rows: list[dict[str, Any]]) -> str:
    """Per run with an elasticity: the elasticity and the step-time error its latency error amounts
    to (error ÷ elasticity), as ``elasticity / implied %`` per metric."""
    keys = [f"{m}_{p}" for m, p in COLUMNS] + ["makespan"]
    head = ["run", *(k.replace("_", " ").upper().replace("MAKESPAN", "makespan") for k in keys)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(keys)]
    for r in rows:
        if "elasticity" not in r:
            continue
        cells = []
        for k in keys:
            e, err = r["elasticity"][k], r["makespan"] if k == "makespan" else r["errors"][k]
            implied = err / e if math.isfinite(e) and e else math.nan
            cells.append(f"{e:.2f} / {_pct(implied)}" if math.isfinite(e) else "—")
        lines.append("| " + " | ".join([r["run"], *cells]) + " |")
    return "\n".join(lines)
