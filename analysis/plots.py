"""Matplotlib figures of one or several logs (A/B): latency CDFs and an engine timeline.

``*_figure`` builds the Figure (tests look into it); ``latency_cdfs`` / ``timeline`` save and close it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.frames import LogFrames  # noqa: E402
from analysis.metrics import latencies  # noqa: E402

# one style per run, so runs with equal latencies (an A/B where B changed nothing) stay visible
# on top of each other: line style, marker and a little transparency all differ
STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x")


def _cdf(ax, values, label: str, i: int) -> None:
    v = np.sort(values[~np.isnan(values)])
    if len(v):
        ax.plot(v * 1e3, np.arange(1, len(v) + 1) / len(v), drawstyle="steps-post", label=label,
                linestyle=STYLES[i % len(STYLES)], marker=MARKERS[i % len(MARKERS)], markevery=max(1, len(v) // 8),
                markersize=5, markerfacecolor="none", lw=1.6, alpha=0.8)


def _legend(ax, **kwargs) -> None:
    """A legend where there is something to label (matplotlib warns on an empty one: a run with no
    finished request has no E2E line)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_cdf_figure(runs: Sequence[tuple[str, LogFrames]]):
    """TTFT, TPOT, ITL and E2E CDFs, one line per run (a matplotlib Figure)."""
    fig, axes = plt.subplots(1, 4, figsize=(19, 4), constrained_layout=True)
    for i, (label, frames) in enumerate(runs):
        lat = latencies(frames.requests)
        series = (lat["ttft"], lat["tpot"], frames.gaps["gap"], lat["e2e"])
        for ax, values in zip(axes, series):
            _cdf(ax, values.to_numpy(dtype=float), label, i)
    titles = ("time to first token", "time per output token", "inter-token latency (every gap)",
              "end-to-end latency")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of gaps" if "gap" in title else "fraction of requests")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        _legend(ax)
    return fig


def latency_cdfs(runs: Sequence[tuple[str, LogFrames]], path: Path) -> Path:
    return _save(latency_cdf_figure(runs), path)


def timeline(runs: Sequence[tuple[str, LogFrames]], path: Path) -> Path:
    return _save(timeline_figure(runs), path)


def timeline_figure(runs: Sequence[tuple[str, LogFrames]]):
    """Per run: tokens per step (prefill vs decode) and running sequences over time."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 3 * len(runs)), squeeze=False, constrained_layout=True)
    for (label, frames), ax in zip(runs, axes[:, 0]):
        s = frames.steps
        extra = ([], [])  # the sequence line lives on the twin axis: its legend entry joins the left one's
        if len(s):
            t = s["start"].to_numpy(dtype=float)
            ax.fill_between(t, 0, s["prefill_tokens"], step="post", alpha=0.5, label="prefill tokens")
            ax.fill_between(t, s["prefill_tokens"], s["prefill_tokens"] + s["decode_seqs"], step="post",
                            alpha=0.5, label="decode tokens")
            ax2 = ax.twinx()
            ax2.plot(t, s["num_spans"], color="black", lw=0.8, drawstyle="steps-post", label="sequences in step")
            ax2.set_ylabel("sequences")
            extra = ax2.get_legend_handles_labels()
        ax.set_title(label)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("tokens per step")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles + extra[0], labels + extra[1], loc="upper left")
        ax.grid(alpha=0.3)
    return fig
