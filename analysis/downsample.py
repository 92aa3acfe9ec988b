"""What a plot draws of a long log: at most ``MAX_POINTS`` points a run, whatever its length.

A full-trace simulation has a million steps and millions of token gaps; drawn point by point the
timeline is solid ink and the figure takes minutes. ``cdf_points`` keeps an empirical CDF at evenly
spaced ranks (the smallest and largest value always); ``timeline_bins`` spreads each step's tokens
over its duration and sums them into equal time bins: tokens per second (prefill, decode) and the
mean sequences per step in each.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MAX_POINTS = 2000


def cdf_points(values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Sorted finite ``values`` and their CDF (fraction ≤ each), at most ``max_points`` of them."""
    v = np.sort(values[np.isfinite(values)])
    y = np.arange(1, len(v) + 1) / max(len(v), 1)
    if len(v) > max_points:
        idx = np.unique(np.linspace(0, len(v) - 1, max_points).round().astype(np.int64))
        v, y = v[idx], y[idx]
    return v, y


TIMELINE_COLUMNS = ("start", "end", "prefill_tok_s", "decode_tok_s", "seqs_per_step")


def _cumulative(steps: pd.DataFrame, weights: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Σ ``weights`` done by each time of ``at``, a step's share spread evenly over its duration."""
    start = steps["start"].to_numpy(dtype=float)
    end = np.maximum(steps["end"].to_numpy(dtype=float), start)
    done = np.cumsum(weights)
    x = np.maximum.accumulate(np.column_stack([start, end]).ravel())  # overlapping steps: never back in time
    y = np.column_stack([done - weights, done]).ravel()
    return np.interp(at, x, y)


def timeline_bins(steps: pd.DataFrame, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """The run in ``max_points`` equal time bins, each step's tokens spread over its duration: each
    bin's start and end (s), prefill and decode tokens per second, and the mean sequences per step
    while the engine ran (NaN in a bin where it was idle)."""
    if not len(steps):
        return pd.DataFrame(columns=list(TIMELINE_COLUMNS))
    lo, hi = float(steps["start"].min()), float(steps["end"].max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, max(1, max_points) + 1)
    width = np.diff(edges)
    duration = np.maximum(steps["duration"].to_numpy(dtype=float), 0.0)

    def per_bin(weights) -> np.ndarray:
        return np.diff(_cumulative(steps, np.asarray(weights, dtype=float), edges))

    busy = per_bin(duration)
    with np.errstate(invalid="ignore", divide="ignore"):
        seqs = np.where(busy > 0, per_bin(steps["num_spans"].to_numpy(dtype=float) * duration) / busy, np.nan)
    return pd.DataFrame({"start": edges[:-1], "end": edges[1:],
                         "prefill_tok_s": per_bin(steps["prefill_tokens"]) / width,
                         "decode_tok_s": per_bin(steps["decode_seqs"]) / width, "seqs_per_step": seqs})
