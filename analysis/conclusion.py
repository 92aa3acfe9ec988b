"""One line that says what the comparison found, run by run against the first:

    sim chunked off raises TTFT p90 by 38% and lowers TPOT p50 by 4.1% against live

Per family (TTFT, TPOT, E2E, output throughput) the statistic (p50 or p90) that moved most; the
line names the family that moved most, then the one that moved most the other way (the trade-off)
if any did by ``MATTERS_PCT`` or more, else the runner-up. A run no family of which moved by
``MATTERS_PCT`` "matches" the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.comparison import delta_pct

MATTERS_PCT = 1.0
FAMILIES = {"TTFT": "ttft_s", "TPOT": "tpot_s", "E2E": "e2e_s"}


def _moves(run: dict[str, Any], base: dict[str, Any]) -> list[tuple[str, float]]:
    """(name, Δ %) of each family's biggest mover, biggest first; undefined ones left out."""
    out = []
    for family, key in FAMILIES.items():
        stats = [(f"{family} {p}", delta_pct(run[key][p], base[key][p])) for p in ("p50", "p90")]
        stats = [s for s in stats if s[1] == s[1]]
        if stats:
            out.append(max(stats, key=lambda s: abs(s[1])))
    d = delta_pct(run["output_throughput_tok_s"], base["output_throughput_tok_s"])
    if d == d:
        out.append(("output throughput", d))
    return sorted(out, key=lambda s: -abs(s[1]))


def _pct(d: float) -> str:
    return f"{abs(d):.0f}%" if abs(d) >= 10 else f"{abs(d):.1f}%"


def _verb(name: str, d: float) -> str:
    return f"{'raises' if d > 0 else 'lowers'} {name} by {_pct(d)}"


def sentence(label: str, run: dict[str, Any], base_label: str, base: dict[str, Any]) -> str:
    moves = _moves(run, base)
    big = [m for m in moves if abs(m[1]) >= MATTERS_PCT]
    if not big:
        return f"{label} matches {base_label} within {MATTERS_PCT:g}% (TTFT, TPOT, E2E p50/p90, throughput)"
    first = big[0]
    other = next((m for m in big[1:] if (m[1] > 0) != (first[1] > 0)), big[1] if len(big) > 1 else None)
    said = _verb(*first) + (f" and {_verb(*other)}" if other else "")
    return f"{label} {said} against {base_label}"


def conclusion(labels: Sequence[str], summaries: Sequence[dict[str, Any]]) -> str:
    """The sentences of every run after the first, joined by "; " ("" for one run)."""
    return "; ".join(sentence(label, s, labels[0], summaries[0]) for label, s in zip(labels[1:], summaries[1:]))
