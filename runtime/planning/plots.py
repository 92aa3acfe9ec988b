"""Figures of a sweep table: latency against load per configuration, goodput per replica against
load, and the Pareto front of latency and goodput per replica. ``*_figure`` builds a Figure (the
tests look into it); ``save_plots`` writes the three as PNG."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from runtime.planning.pareto import pareto_front  # noqa: E402
from runtime.planning.slo import Slo  # noqa: E402

MAX_LEGEND = 24  # configurations named in a legend; more are drawn unnamed
DEFAULT_LATENCIES = ("ttft_p99_ms", "tpot_p99_ms")


STYLES = ("-", "--", ":", "-.")


def _ok(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["status"] == "ok"] if "status" in table else table


def serving_all(table: pd.DataFrame) -> pd.DataFrame:
    """The points whose engine refused no request: the only ones a front compares (a refusing
    configuration's latencies are those of the requests it chose to serve)."""
    return table[table["rejected"] == 0]


def label(column: str) -> str:
    """``ttft_p99_ms`` → ``TTFT p99 (ms)``, ``goodput_per_replica_req_s`` → ``goodput per replica (req/s)``."""
    for unit, shown in (("_req_s", "req/s"), ("_tok_s", "tok/s"), ("_ms", "ms")):
        if column.endswith(unit):
            head = column[: -len(unit)].split("_")
            if head[0] in ("ttft", "tpot", "e2e", "itl"):
                head[0] = head[0].upper()
            return f"{' '.join(head)} ({shown})"
    return column.replace("_", " ")


def _style(n: int) -> dict:
    """Line n's colour and dash: 20 colours × 4 dashes before a pair repeats."""
    return {"color": plt.get_cmap("tab20")(n % 20), "linestyle": STYLES[(n // 20) % len(STYLES)]}


def _latency_columns(slo: Slo | None) -> list[str]:
    return list(dict.fromkeys(t.column for t in slo.terms)) if slo is not None else list(DEFAULT_LATENCIES)


def throughput_column(table: pd.DataFrame) -> str:
    """Goodput per replica where the sweep had an SLO, else output tokens per replica."""
    goodput = "goodput_per_replica_req_s"
    return goodput if goodput in table else "output_throughput_per_replica_tok_s"


def _legend(fig, ax, n: int) -> None:
    if n:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def latency_figure(table: pd.DataFrame, slo: Slo | None = None):
    """One panel per latency the SLO bounds (TTFT and TPOT p99 without one): the latency against the
    offered load, a line per configuration; the SLO's limit dashed."""
    rows = _ok(table)
    columns = _latency_columns(slo)
    fig, axes = plt.subplots(1, len(columns), figsize=(6.5 * len(columns) + 3, 4.5), squeeze=False)
    for ax, column in zip(axes[0], columns):
        for n, (config, group) in enumerate(rows.groupby("config", sort=False)):
            g = group.sort_values("offered_req_s")
            ax.plot(g["offered_req_s"], g[column], marker="o", ms=3, lw=1.2,
                    label=config if n < MAX_LEGEND else None, **_style(n))
        limits = [t.limit_ms for t in (slo.terms if slo is not None else ()) if t.column == column]
        for limit in limits:
            ax.axhline(limit, color="k", ls="--", lw=1)
        ax.set_title(label(column) + (f", SLO {limits[0]:g} ms (dashed)" if limits else ""), fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(label(column))
        ax.grid(alpha=0.3)
    _legend(fig, axes[0][-1], rows["config"].nunique())
    fig.suptitle("latency against load, per configuration")
    fig.tight_layout()
    return fig


def goodput_figure(table: pd.DataFrame):
    """Goodput (or output throughput) per replica against the offered load per replica, a line per
    configuration; with an SLO, the diagonal is every request good."""
    rows = _ok(table)
    y = throughput_column(rows)
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    per_replica = rows["offered_req_s"] / rows["replicas"]
    for n, (config, group) in enumerate(rows.assign(load=per_replica).groupby("config", sort=False)):
        g = group.sort_values("load")
        ax.plot(g["load"], g[y], marker="o", ms=3, lw=1.2, label=config if n < MAX_LEGEND else None, **_style(n))
    if y == "goodput_per_replica_req_s" and len(rows):
        top = float(per_replica.max())
        ax.plot([0, top], [0, top], color="k", ls="--", lw=1, label="every request within the SLO")
    ax.set_xlabel("offered load per replica (req/s)")
    ax.set_ylabel(label(y))
    ax.grid(alpha=0.3)
    _legend(fig, ax, rows["config"].nunique())
    fig.suptitle("goodput per replica against load" if y.startswith("goodput") else "throughput per replica")
    fig.tight_layout()
    return fig


def spread(wanted: list[float], gap: float) -> list[float]:
    """Positions in [0, 1] as near ``wanted`` (sorted high to low) as ``gap`` apart allows."""
    out: list[float] = []
    for w in wanted:  # down from the top: each at least a gap below the one above
        out.append(min(w, 1.0 - gap / 2, out[-1] - gap) if out else min(w, 1.0 - gap / 2))
    for i in range(len(out) - 1, -1, -1):  # up from the bottom: none below the axes
        floor = gap / 2 if i == len(out) - 1 else out[i + 1] + gap
        out[i] = max(out[i], floor)
    return out


def _name_front(ax, front: pd.DataFrame, x: str, y: str) -> None:
    """Each front point's name in a column right of the axes, at its point's height where the names
    above leave room, else just below them (names never overlap however close the points), a thin
    line from each name to its point."""
    ordered = front.sort_values([y, x], ascending=[False, True])
    n = len(ordered)
    if not n:
        return
    low, high = ax.get_ylim()
    wanted = [(float(v) - low) / (high - low) if high > low else 0.5 for v in ordered[y]]
    heights = spread(wanted, min(1.0 / n, 0.045))
    for (_, r), h in zip(ordered.iterrows(), heights):
        ax.annotate(r["point"], (r[x], r[y]), xytext=(1.02, h), textcoords="axes fraction",
                    fontsize=6, va="center", ha="left", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.6", "shrinkA": 0, "shrinkB": 3})


def pareto_figure(table: pd.DataFrame, slo: Slo | None = None):
    """Every point: its first SLO latency (TTFT p99 without an SLO) against its goodput per replica;
    the Pareto front of the points that refused no request joined and named."""
    rows = _ok(table)
    x, y = _latency_columns(slo)[0], throughput_column(rows)
    serving = serving_all(rows)
    front = pareto_front(serving, x, y)
    refusing = rows.drop(serving.index)
    fig, ax = plt.subplots(figsize=(9.5, max(5.5, 0.16 * len(front) + 1.5)))
    ax.scatter(serving[x], serving[y], s=12, color="0.5", label="points")
    if len(refusing):
        ax.scatter(refusing[x], refusing[y], s=12, marker="x", color="0.8", label="points that refused requests")
    ax.plot(front[x], front[y], color="C3", marker="o", ms=5, lw=1.5, label="Pareto front")
    if slo is not None:
        for t in slo.terms:
            if t.column == x:
                ax.axvline(t.limit_ms, color="k", ls="--", lw=1, label=f"SLO {t.limit_ms:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel(label(x))
    ax.set_ylabel(label(y))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _name_front(ax, front, x, y)  # once the axes' limits are known
    fig.suptitle("Pareto front: latency against goodput per replica")
    fig.tight_layout()
    return fig


def save_plots(table: pd.DataFrame, out_dir: str | Path, slo: Slo | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in (("latency_vs_load.png", latency_figure(table, slo)), ("goodput_per_replica.png",
                      goodput_figure(table)), ("pareto.png", pareto_figure(table, slo))):
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(out / name)
    return paths
