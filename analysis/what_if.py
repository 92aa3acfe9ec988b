"""A what-if's conclusion weighed against the error of the model that simulated it.

Three runs: ``base`` and ``change`` simulated from one cost model (e.g. chunked prefill on and
off), and ``live``, the run ``base`` simulates. The model's error is measured where it can be:
``base`` against ``live``, statistic by statistic. A latency (TTFT, TPOT, E2E at p50 and p90)
counts as moved by the what-if only when its largest change exceeds both the model's largest
error on it and ``FLOOR_PCT`` (a few percent is noise on any machine); the headline names those
and sets the others' changes beside the error they fall within. Output throughput is left out of
the verdict (an open-loop run's makespan is its arrivals'). The model's error gets a line of its own.

A short run's change rests on its one draw of arrivals (the p90 of 24 requests is the third
largest), so two runs of one workload can disagree on it; given the change over many redrawings of
the arrivals (simulator/fidelity/draws.py, ``minivllm fidelity --draws``), the verdict weighs that,
pooled, and shows the range one run may land in.
"""

from __future__ import annotations

from typing import Any

from analysis.comparison import delta_pct

FLOOR_PCT = 5.0
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
        if draws is not None:
            cells = draws["metrics"][family.lower()]
            moves = [(name, cells[name]["pooled_pct"]) for name, _ in stats]
        else:
            moves = [(name, delta_pct(get(change), get(base))) for name, get in stats]
        errors = [abs(delta_pct(get(base), get(live))) for _, get in stats]
        moves = [m for m in moves if m[1] == m[1]]
        errors = [e for e in errors if e == e]
        if not moves or not errors:
            continue
        stat, effect = max(moves, key=lambda m: abs(m[1]))
        error = max(errors)
        row = {"family": family, "stat": stat, "effect_pct": effect, "error_pct": error,
               "beyond": abs(effect) > max(error, FLOOR_PCT)}
        if draws is not None:
            row["range_pct"] = (draws["metrics"][family.lower()][stat]["low_pct"],
                                draws["metrics"][family.lower()][stat]["high_pct"])
        out.append(row)
    return out


def _range(w: dict[str, Any]) -> str:
    """`` (one run: −17…+1.5%)``: the per-draw range of a change measured over draws."""
    if "range_pct" not in w:
        return ""
    low, high = w["range_pct"]
    return f" (one run: {_signed(low)}…{_signed(high)})"


def headline(change_label: str, base_label: str, weighed: list[dict[str, Any]], draws: int | None = None) -> str:
    """``sim off against sim on (both simulated from one model): lowers TTFT p50 by 41%, beyond the
    model's error on it (21%); TPOT (−9.0%, its error 14%), E2E (−9.9%, 12%) within the model's error``;
    with ``draws``, the changes are those over that many redrawings of the arrivals."""
    head = f"{change_label} against {base_label} (both simulated from one model"
    head += f", over {draws} draws of the arrivals)" if draws else ")"
    beyond = [w for w in weighed if w["beyond"]]
    within = [w for w in weighed if not w["beyond"]]
    said = [f"{'raises' if w['effect_pct'] > 0 else 'lowers'} {w['family']} {w['stat']} by {_pct(w['effect_pct'])}"
            f"{_range(w)}, beyond the model's error on it ({_pct(w['error_pct'])})" for w in beyond]
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
