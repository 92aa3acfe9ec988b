"""Matplotlib figures of one or several logs (A/B): latency CDFs and an engine timeline.

``*_figure`` builds the Figure (tests look into it); ``latency_cdfs`` / ``timeline`` save and close it.
Each run is at most ``MAX_POINTS`` points a series (analysis/downsample.py), so a million-step log
plots as fast as a short one. Runs share their axes (one scale to compare them on); one legend per
figure sits above the panels, off the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from analysis.downsample import MAX_POINTS, cdf_points, timeline_bins  # noqa: E402
from analysis.frames import LogFrames  # noqa: E402
from analysis.metrics import latencies  # noqa: E402

# one style per run, so runs with equal latencies (an A/B where B changed nothing) stay visible
# on top of each other: line style, marker and a little transparency all differ
STYLES = ("-", "--", "-.", ":")
TIMELINE_BINS = 800  # of a run's timeline: about two pixels each
MARKERS = ("o", "s", "^", "D", "v", "x")


def _cdf(ax, values: np.ndarray, scale: float, label: str, i: int, max_points: int) -> None:
    v, y = cdf_points(values, max_points)
    if len(v):
        ax.plot(v * scale, y, drawstyle="steps-post", label=label,
                linestyle=STYLES[i % len(STYLES)], marker=MARKERS[i % len(MARKERS)], markevery=max(1, len(v) // 8),
                markersize=5, markerfacecolor="none", lw=1.6, alpha=0.8)


def _plain(x: float, _pos=None) -> str:
    """A tick label as a reader writes the number: 0.02, 0.5, 2.5, 30, 1,000."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _log_ticks(ax) -> None:
    """Labelled ticks at 1, 2, 5 × 10^k over a short range, at 10^k only over a long one (no overlap)."""
    lo, hi = ax.get_xlim()
    decades = np.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 1.5 else (1.0, 3.0) if decades <= 3 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _unit(series: list[np.ndarray]) -> tuple[float, str]:
    """Seconds where the values are seconds (a median of 1 s or more), else milliseconds."""
    finite = [v[np.isfinite(v)] for v in series]
    pooled = np.concatenate(finite) if finite else np.array([])
    return (1.0, "s") if len(pooled) and np.median(pooled) >= 1.0 else (1e3, "ms")


def _figure_legend(fig, ax, ncols: int) -> None:
    """One legend for the figure, above its panels (matplotlib warns on an empty one: a run with no
    finished request has no line)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=max(1, min(ncols, 4)), frameon=False)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


CDF_TITLES = ("time to first token", "time per output token", "inter-token latency (every gap)",
              "end-to-end latency")


def latency_cdf_figure(runs: Sequence[tuple[str, LogFrames]], max_points: int = MAX_POINTS):
    """TTFT, TPOT, ITL and E2E CDFs, one line per run (a matplotlib Figure)."""
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4), sharey=True, layout="constrained")
    per_metric: list[list[np.ndarray]] = [[], [], [], []]
    for _, frames in runs:
        lat = latencies(frames.requests)
        for j, s in enumerate((lat["ttft"], lat["tpot"], frames.gaps["gap"], lat["e2e"])):
            per_metric[j].append(s.to_numpy(dtype=float))
    for j, (ax, title) in enumerate(zip(axes, CDF_TITLES)):
        scale, unit = _unit(per_metric[j])
        for i, (label, _) in enumerate(runs):
            _cdf(ax, per_metric[j][i], scale, label, i, max_points)
        ax.set_title(title)
        ax.set_xlabel(unit)
        ax.set_xscale("log")
        if ax.get_lines():
            _log_ticks(ax)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("fraction of requests (ITL: of gaps)")
    _figure_legend(fig, next((ax for ax in axes if ax.get_lines()), axes[0]), len(runs))
    return fig


def latency_cdfs(runs: Sequence[tuple[str, LogFrames]], path: Path) -> Path:
    return _save(latency_cdf_figure(runs), path)


def timeline(runs: Sequence[tuple[str, LogFrames]], path: Path) -> Path:
    return _save(timeline_figure(runs), path)


def timeline_figure(runs: Sequence[tuple[str, LogFrames]], max_points: int = TIMELINE_BINS):
    """Per run, on shared axes: tokens per second (prefill vs decode, stacked) and the mean
    sequences per step over time, in at most ``max_points`` time bins."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 2.6 * len(runs) + 0.6), squeeze=False, sharex=True,
                             sharey=True, layout="constrained")
    twins = []
    for (label, frames), ax in zip(runs, axes[:, 0]):
        b = timeline_bins(frames.steps, max_points)
        if len(b):
            t = np.append(b["start"].to_numpy(dtype=float), b["end"].iloc[-1])
            pre = np.append(b["prefill_tok_s"].to_numpy(dtype=float), 0.0)
            dec = np.append(b["decode_tok_s"].to_numpy(dtype=float), 0.0)
            ax.fill_between(t, 0, pre, step="post", alpha=0.5, lw=0, label="prefill tokens/s")
            ax.fill_between(t, pre, pre + dec, step="post", alpha=0.5, lw=0, label="decode tokens/s")
            ax2 = ax.twinx()
            if twins:
                ax2.sharey(twins[0])
            twins.append(ax2)
            seqs = np.append(b["seqs_per_step"].to_numpy(dtype=float), np.nan)
            ax2.plot(t, seqs, color="black", lw=0.8, alpha=0.7, drawstyle="steps-post",
                     label="sequences per step (mean)")
            ax2.set_ylabel("sequences per step")
        ax.set_title(label)
        ax.set_ylabel("tokens / s")
        ax.yaxis.set_major_formatter(FuncFormatter(_plain))
        ax.grid(alpha=0.3)
    if twins:  # one scale for every run (shared), from 0 to the highest of them all, set once all are drawn
        top = max((np.nanmax(line.get_ydata()) for ax2 in twins for line in ax2.get_lines()
                   if np.isfinite(line.get_ydata()).any()), default=1.0)
        twins[0].set_ylim(0, max(top, 1.0) * 1.05)
    axes[-1, 0].set_xlabel("time (s)")
    first = axes[0, 0]
    handles, labels = first.get_legend_handles_labels()
    if twins:
        h2, l2 = twins[0].get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=len(handles), frameon=False)
    return fig
