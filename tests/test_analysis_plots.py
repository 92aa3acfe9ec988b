"""The figures: every run's CDF series is drawn and labelled, in a style of its own (two equal
runs stay visible on top of each other); the timeline's legend names the sequence line."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from analysis.frames import frames_from_events
from analysis.plots import latency_cdf_figure, timeline_figure
from tests.test_sim_analysis import _log


@pytest.fixture
def runs():
    frames = frames_from_events(_log())
    return [("A", frames), ("B", frames), ("C", frames)]  # identical runs: the lines coincide


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
            assert [t.get_text() for t in ax.get_legend().get_texts()] == ["A", "B", "C"]
    finally:
        plt.close(fig)


def test_timeline_legend_names_the_sequence_line(runs):
    fig = timeline_figure(runs[:2])
    try:
        left = [ax for ax in fig.axes if ax.get_legend() is not None]
        assert len(left) == 2
        for ax in left:
            assert [t.get_text() for t in ax.get_legend().get_texts()] == [
                "prefill tokens", "decode tokens", "sequences in step"]
    finally:
        plt.close(fig)
