"""The figures: every run's CDF series is drawn and labelled, in a style of its own (two equal
runs stay visible on top of each other); one legend per figure, above the panels; runs share
their axes; tick labels are plain numbers that don't overlap, in seconds where the values are
seconds; a long log is drawn in a bounded number of points."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from analysis.downsample import MAX_POINTS, cdf_points, timeline_bins
from analysis.frames import LogFrames, frames_from_events
from analysis.plots import TIMELINE_BINS, latency_cdf_figure, timeline_figure
from tests.test_sim_analysis import _log


@pytest.fixture
def runs():
    frames = frames_from_events(_log())
    return [("A", frames), ("B", frames), ("C", frames)]  # identical runs: the lines coincide


def _legend_texts(fig) -> list[str]:
    (legend,) = fig.legends
    return [t.get_text() for t in legend.get_texts()]


def test_each_cdf_series_is_drawn_labelled_and_distinguishable(runs):
    fig = latency_cdf_figure(runs)
    try:
        titles = [ax.get_title() for ax in fig.axes]
        assert titles == ["time to first token", "time per output token", "inter-token latency (every gap)",
                          "end-to-end latency"]
        for ax in fig.axes:
            lines = ax.get_lines()
            assert [line.get_label() for line in lines] == ["A", "B", "C"]
            assert all(len(line.get_xdata()) for line in lines)
            styles = {(line.get_linestyle(), line.get_marker()) for line in lines}
            assert len(styles) == 3, "overlapping series must not look alike"
            assert all(line.get_alpha() < 1 for line in lines)
            assert ax.get_legend() is None  # on no panel's data
        assert _legend_texts(fig) == ["A", "B", "C"]
        assert all(ax.get_shared_y_axes().joined(fig.axes[0], ax) for ax in fig.axes)
        assert [ax.get_xlabel() for ax in fig.axes] == ["s", "ms", "ms", "s"]  # _log: TTFT 2 s, TPOT 0.5 s
    finally:
        plt.close(fig)


def test_timeline_runs_share_axes_and_one_legend_names_every_series(runs):
    fig = timeline_figure(runs[:2])
    try:
        assert _legend_texts(fig) == ["prefill tokens/s", "decode tokens/s", "sequences per step (mean)"]
        assert not any(ax.get_legend() for ax in fig.axes)
        left = [ax for ax in fig.axes if ax.get_ylabel() == "tokens / s"]
        right = [ax for ax in fig.axes if ax.get_ylabel() == "sequences per step"]
        assert len(left) == len(right) == 2
        for axes in (left, right):
            assert axes[0].get_ylim() == axes[1].get_ylim()
            assert axes[0].get_shared_y_axes().joined(axes[0], axes[1])
        assert left[0].get_shared_x_axes().joined(left[0], left[1])
    finally:
        plt.close(fig)


def _long_run(n_steps: int = 200_000, seed: int = 0) -> LogFrames:
    """A million-step-like run without a log: 2 ms steps, a few thousand requests, a gap a step."""
    rng = np.random.default_rng(seed)
    start = np.arange(n_steps) * 2e-3
    steps = pd.DataFrame({"step": np.arange(n_steps), "start": start, "end": start + 2e-3,
                          "duration": np.full(n_steps, 2e-3), "num_spans": rng.integers(1, 9, n_steps),
                          "prefill_tokens": rng.integers(0, 64, n_steps), "decode_seqs": rng.integers(0, 8, n_steps)})
    n = 5_000
    arrival = np.sort(rng.uniform(0, start[-1], n))
    first = arrival + rng.exponential(0.02, n)
    requests = pd.DataFrame({"request_id": np.arange(n), "arrival": arrival, "admitted": arrival, "first_token": first,
                             "finish": first + rng.exponential(1.0, n), "num_output_tokens": rng.integers(2, 400, n),
                             "status": "finished"})
    gaps = pd.DataFrame({"request_id": rng.integers(0, n, n_steps), "gap": rng.exponential(2e-3, n_steps)})
    return LogFrames(None, requests, steps, gaps)


def test_a_long_run_is_drawn_in_a_bounded_number_of_points():
    long = [("a", _long_run()), ("b", _long_run(seed=1))]
    fig = latency_cdf_figure(long)
    try:
        for ax in fig.axes:
            assert all(len(line.get_xdata()) <= MAX_POINTS for line in ax.get_lines())
    finally:
        plt.close(fig)
    fig = timeline_figure(long)
    try:
        for ax in fig.axes:
            assert all(len(line.get_xdata()) <= TIMELINE_BINS + 1 for line in ax.get_lines())
            for fill in ax.collections:
                assert len(fill.get_paths()[0].vertices) <= 4 * (TIMELINE_BINS + 2)
    finally:
        plt.close(fig)


def test_cdf_points_keep_the_ends_and_the_shape():
    values = np.random.default_rng(0).exponential(1.0, 100_000)
    v, y = cdf_points(np.append(values, np.nan), max_points=500)
    assert len(v) <= 500 and v[0] == values.min() and v[-1] == values.max() and y[-1] == 1.0
    assert np.all(np.diff(v) >= 0)
    assert np.interp(np.median(values), v, y) == pytest.approx(0.5, abs=0.01)


def test_timeline_bins_spread_each_step_over_its_duration_and_keep_every_token():
    """A 10 s step of 1,000 prefill tokens is 100 tok/s in each of the bins it covers, not a spike
    in the bin it started in; a bin with no step running has no sequence count."""
    steps = pd.DataFrame({"start": [0.0, 10.0, 15.0], "end": [10.0, 12.0, 20.0], "duration": [10.0, 2.0, 5.0],
                          "prefill_tokens": [1000, 0, 0], "decode_seqs": [0, 4, 4], "num_spans": [1, 4, 4]})
    b = timeline_bins(steps, max_points=20)
    width = b["end"] - b["start"]
    assert len(b) == 20 and width.iloc[0] == pytest.approx(1.0)
    assert (b["prefill_tok_s"] * width).sum() == pytest.approx(1000)
    assert (b["decode_tok_s"] * width).sum() == pytest.approx(8)
    assert b["prefill_tok_s"].iloc[:10].tolist() == pytest.approx([100.0] * 10)
    assert b["seqs_per_step"].iloc[:10].tolist() == pytest.approx([1.0] * 10)
    assert np.isnan(b["seqs_per_step"].iloc[13])  # 13-14 s: idle
    assert len(timeline_bins(_long_run().steps, max_points=300)) == 300


def test_log_axis_tick_labels_are_plain_and_do_not_overlap():
    long = [("a", _long_run())]
    fig = latency_cdf_figure(long)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            ticks = [t for t, x in zip(ax.get_xticklabels(), ax.get_xticks()) if t.get_text() and lo <= x <= hi]
            assert len(ticks) >= 2
            assert not any("10^" in t.get_text() or "$" in t.get_text() for t in ticks)
            boxes = sorted((t.get_window_extent(renderer) for t in ticks), key=lambda b: b.x0)
            assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in ticks]
    finally:
        plt.close(fig)


def _steps_run(seqs: int, n_steps: int = 400) -> LogFrames:
    start = np.arange(n_steps) * 1e-2
    steps = pd.DataFrame({"step": np.arange(n_steps), "start": start, "end": start + 1e-2,
                          "duration": np.full(n_steps, 1e-2), "num_spans": np.full(n_steps, seqs),
                          "prefill_tokens": np.full(n_steps, 8), "decode_seqs": np.full(n_steps, seqs - 1)})
    return LogFrames(None, pd.DataFrame(), steps)


def test_every_timeline_line_stays_inside_its_axes():
    """The sequence lines share one scale: the run with the most sequences a step sets it, drawn last."""
    fig = timeline_figure([("few", _steps_run(2)), ("many", _steps_run(40))])
    try:
        fig.canvas.draw()
        for ax in fig.axes:
            bottom, top = ax.get_ylim()
            for line in ax.get_lines():
                y = np.asarray(line.get_ydata(), dtype=float)
                y = y[np.isfinite(y)]
                assert len(y) and bottom <= y.min() and y.max() <= top, (ax.get_ylabel(), y.max(), top)
        right = [ax for ax in fig.axes if ax.get_ylabel() == "sequences per step"]
        assert right[0].get_ylim()[0] == 0
    finally:
        plt.close(fig)
