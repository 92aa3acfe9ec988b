"""Matplotlib figures of one or several logs (A/B): latency CDFs and an engine timeline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.frames import LogFrames  # noqa: E402
from analysis.metrics import latencies  # noqa: E402


def _cdf(ax, values, label: str) -> None:
    v = np.sort(values[~np.isnan(values)])
    if len(v):
        ax.step(v * 1e3, np.arange(1, len(v) + 1) / len(v), where="post", label=label)


def _legend(ax, **kwargs) -> None:
    """A legend where there is something to label (matplotlib warns on an empty one: a run with no
    finished request has no E2E line)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def latency_cdfs(runs: Sequence[tuple[str, LogFrames]], path: Path) -> Path:
    """TTFT, TPOT and E2E CDFs, one line per run."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    for label, frames in runs:
        lat = latencies(frames.requests)
        for ax, col in zip(axes, ("ttft", "tpot", "e2e")):
            _cdf(ax, lat[col].to_numpy(dtype=float), label)
    for ax, title in zip(axes, ("time to first token", "time per output token", "end-to-end latency")):
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline(runs: Sequence[tuple[str, LogFrames]], path: Path) -> Path:
    """Per run: tokens per step (prefill vs decode) and running sequences over time."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 3 * len(runs)), squeeze=False, constrained_layout=True)
    for (label, frames), ax in zip(runs, axes[:, 0]):
        s = frames.steps
        if len(s):
            t = s["start"].to_numpy(dtype=float)
            ax.fill_between(t, 0, s["prefill_tokens"], step="post", alpha=0.5, label="prefill tokens")
            ax.fill_between(t, s["prefill_tokens"], s["prefill_tokens"] + s["decode_seqs"], step="post",
                            alpha=0.5, label="decode tokens")
            ax2 = ax.twinx()
            ax2.plot(t, s["num_spans"], color="black", lw=0.8, label="sequences in step")
            ax2.set_ylabel("sequences")
        ax.set_title(label)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("tokens per step")
        _legend(ax, loc="upper left")
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
