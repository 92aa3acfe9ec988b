"""A what-if's conclusion weighed against the error of the model that simulated it.

Three runs: ``base`` and ``change`` simulated from one cost model (e.g. chunked prefill on and
off), and ``live``, the run ``base`` simulates. The model's error is measured where it can be:
``base`` against ``live``, statistic by statistic. A latency (TTFT, TPOT, E2E at p50 and p90)
counts as moved by the what-if only when its largest change exceeds both the model's largest
error on it and ``FLOOR_PCT`` (a few percent is noise on any machine); the headline names those
and sets the others' changes beside the error they fall within. Output throughput is left out of
the verdict (an open-loop run's makespan is its arrivals'). The model's error gets a line of its own.

A short run's change rests on its one draw of arrivals (the p90 of 48 requests is the fifth
largest), so two runs of one workload can disagree on it. Given the change over many redrawings of
the arrivals (simulator/fidelity/draws.py, ``minivllm fidelity --draws``), the change is measured
with its own spread: a latency moves when the pooled change passes ``FLOOR_PCT`` and at least
``AGREEING_DRAWS`` of the draws change it the same way; the range one run lands in and the model's
error on it stand beside it. The model's error is no gate there: both runs are simulated from the
one model, whose error against the live run (a run of its own, on a machine that may be busy) is
largely the same in both, and a gate on it turned one workload's conclusion with the machine's load.
"""

from __future__ import annotations

from typing import Any

from analysis.comparison import delta_pct

FLOOR_PCT = 5.0
AGREEING_DRAWS = 0.75  # share of the draws that must change a latency the pooled change's way
FAMILIES: dict[str, tuple[tuple[str, Any], ...]] = {
    "TTFT": (("p50", lambda s: s["ttft_s"]["p50"]), ("p90", lambda s: s["ttft_s"]["p90"])),
    "TPOT": (("p50", lambda s: s["tpot_s"]["p50"]), ("p90", lambda s: s["tpot_s"]["p90"])),
    "E2E": (("p50", lambda s: s["e2e_s"]["p50"]), ("p90", lambda s: s["e2e_s"]["p90"])),
}
THROUGHPUT = {"output throughput": (("", lambda s: s["output_throughput_tok_s"]),)}


def _pct(d: float) -> str:
    return f"{abs(d):.0f}%" if abs(d) >= 10 else f"{abs(d):.1f}%"


def _signed(d: float) -> str:
    return ("+" if d >= 0 else "−") + _pct(d)


def weigh(base: dict[str, Any], change: dict[str, Any], live: dict[str, Any],
          draws: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per family: its largest change (statistic, Δ % of ``change`` against ``base``), the model's
    largest error on it (``base`` against ``live``, |Δ| %) and whether the change exceeds it (and
    ``FLOOR_PCT``). ``draws`` (``minivllm fidelity --what-if ... --draws N``'s ``what_if.draws``):
    the change is the one over the redrawn arrivals, pooled, with its per-draw range beside it."""
    out = []
    for family, stats in FAMILIES.items():
        cells = draws["metrics"][family.lower()] if draws is not None else None
        if cells is not None:
            moves = [(name, cells[name]["pooled_pct"]) for name, _ in stats]
        else:
            moves = [(name, delta_pct(get(change), get(base))) for name, get in stats]
        errors = [abs(delta_pct(get(base), get(live))) for _, get in stats]
        moves = [m for m in moves if m[1] == m[1]]
        errors = [e for e in errors if e == e]
        if not moves or not errors:
            continue
        if cells is not None:  # the largest change that moves (past the floor, most draws agreeing), else the largest
            moving = [m for m in moves if abs(m[1]) > FLOOR_PCT and cells[m[0]]["same_sign"] >= AGREEING_DRAWS]
            stat, effect = max(moving or moves, key=lambda m: abs(m[1]))
            out.append({"family": family, "stat": stat, "effect_pct": effect, "error_pct": max(errors),
                        "beyond": bool(moving), "range_pct": (cells[stat]["low_pct"], cells[stat]["high_pct"])})
            continue
        stat, effect = max(moves, key=lambda m: abs(m[1]))
        error = max(errors)
        out.append({"family": family, "stat": stat, "effect_pct": effect, "error_pct": error,
                    "beyond": abs(effect) > max(error, FLOOR_PCT)})
    return out


def _moves(w: dict[str, Any]) -> str:
    return f"{'raises' if w['effect_pct'] > 0 else 'lowers'} {w['family']} {w['stat']} by {_pct(w['effect_pct'])}"


def headline(change_label: str, base_label: str, weighed: list[dict[str, Any]], draws: int | None = None) -> str:
    """``sim off against sim on (both simulated from one model): lowers TTFT p50 by 41%, beyond the
    model's error on it (21%); TPOT (−9.0%, its error 14%), E2E (−9.9%, 12%) within the model's error``;
    with ``draws``, the changes over that many redrawings of the arrivals: ``lowers TTFT p90 by 28%
    (one run: −50%…−3.4%; the model's error on it 24%); TPOT (−2.0%) moves less than 5%``."""
    head = f"{change_label} against {base_label} (both simulated from one model"
    head += f", over {draws} draws of the arrivals)" if draws else ")"
    beyond = [w for w in weighed if w["beyond"]]
    within = [w for w in weighed if not w["beyond"]]
    if draws:
        said = [f"{_moves(w)} (one run: {_signed(w['range_pct'][0])}…{_signed(w['range_pct'][1])}; the model's "
                f"error on it {_pct(w['error_pct'])})" for w in beyond]
        rest = ", ".join(f"{w['family']} ({_signed(w['effect_pct'])})" for w in within)
        unmoved = f"less than {FLOOR_PCT:g}%, or not the same way on {AGREEING_DRAWS:.0%} of the draws"
        if not beyond:
            return f"{head}: no latency moves: {rest} move {unmoved}"
        return f"{head}: " + " and ".join(said) + (f"; {rest} move {unmoved}" if within else "")
    said = [f"{_moves(w)}, beyond the model's error on it ({_pct(w['error_pct'])})" for w in beyond]
    rest = ", ".join(f"{w['family']} ({_signed(w['effect_pct'])}, its error {_pct(w['error_pct'])})" for w in within)
    if not beyond:
        return f"{head}: no latency moves beyond the model's error: {rest}"
    return f"{head}: " + " and ".join(said) + (f"; {rest} within the model's error" if within else "")


def error_line(live_label: str, base: dict[str, Any], live: dict[str, Any]) -> str:
    """``the model's error against live (chunked on), simulation minus live: TTFT p50 −21%, p90 −6.0%; ...``."""
    parts = []
    for family, stats in {**FAMILIES, **THROUGHPUT}.items():
        cells = [f"{(name + ' ') if name else ''}{_signed(d)}" for name, get in stats
                 if (d := delta_pct(get(base), get(live))) == d]
        if cells:
            parts.append(f"{family} {', '.join(cells)}")
    return f"the model's error against {live_label}, simulation minus live: " + "; ".join(parts)
