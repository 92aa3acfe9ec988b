"""The sweep's figures draw what the table holds: a line per configuration, the SLO's limits, and a
Pareto front of the points that refused no request."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.text import Text

from runtime.planning.plots import goodput_figure, label, latency_figure, pareto_figure, save_plots
from runtime.planning.slo import Slo

SLO = Slo.parse("ttft_p99_ms=100,tpot_p99_ms=10")


def table() -> pd.DataFrame:
    rows = []
    for config, replicas, base in (("a", 1, 20.0), ("b", 2, 10.0)):
        for rate in (1.0, 2.0, 4.0):
            rows.append({"config": config, "point": f"{config} {rate:g}", "replicas": replicas, "offered_req_s": rate,
                         "ttft_p99_ms": base * rate, "tpot_p99_ms": base * rate / 10, "rejected": 0,
                         "goodput_per_replica_req_s": rate / replicas, "status": "ok"})
    rows.append({**rows[0], "config": "c", "point": "c refuses", "ttft_p99_ms": 1.0, "rejected": 5,
                 "goodput_per_replica_req_s": 9.0})
    rows.append({**rows[0], "config": "d", "point": "d failed", "status": "failed"})
    return pd.DataFrame(rows)


def test_latency_against_load_has_a_line_per_configuration_and_the_limits():
    fig = latency_figure(table(), SLO)
    ttft, tpot = fig.axes[:2]
    lines = [line for line in ttft.get_lines() if line.get_label() in ("a", "b", "c")]
    assert sorted(line.get_label() for line in lines) == ["a", "b", "c"]  # the failed point is left out
    a = next(line for line in lines if line.get_label() == "a")
    assert list(a.get_xdata()) == [1.0, 2.0, 4.0] and list(a.get_ydata()) == [20.0, 40.0, 80.0]
    assert "SLO 100 ms" in ttft.get_title() and "SLO 10 ms" in tpot.get_title()
    plt.close(fig)


def test_the_pareto_front_leaves_out_the_refusing_points():
    fig = pareto_figure(table(), SLO)
    front = next(line for line in fig.axes[0].get_lines() if line.get_label() == "Pareto front")
    assert list(front.get_xdata()) == [10.0, 20.0, 40.0, 80.0]  # b 1, a 1 (1 req/s a replica), a 2, a 4
    names = {t.get_text() for t in fig.axes[0].texts}
    assert "c refuses" not in names and {"b 1", "a 4"} <= names
    plt.close(fig)


def test_goodput_is_per_replica_against_the_load_per_replica(tmp_path):
    fig = goodput_figure(table())
    b = next(line for line in fig.axes[0].get_lines() if line.get_label() == "b")
    assert list(b.get_xdata()) == [0.5, 1.0, 2.0]
    plt.close(fig)
    paths = save_plots(table(), tmp_path, SLO)
    assert [p.name for p in paths] == ["latency_vs_load.png", "goodput_per_replica.png", "pareto.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_labels_read_as_words():
    assert label("ttft_p99_ms") == "TTFT p99 (ms)"
    assert label("goodput_per_replica_req_s") == "goodput per replica (req/s)"


def test_the_front_names_never_overlap_however_close_the_points():
    rows = [{"config": "c", "point": f"chunked=on budget={b} replicas=1 rate={b}", "replicas": 1,
             "offered_req_s": 1.0, "ttft_p99_ms": 50.0 + i * 0.01, "tpot_p99_ms": 1.0, "rejected": 0,
             "goodput_per_replica_req_s": 1.0 + i * 0.001, "status": "ok"} for i, b in enumerate(range(29))]
    rows.append({**rows[0], "point": "far", "ttft_p99_ms": 5000.0, "goodput_per_replica_req_s": 100.0})
    fig = pareto_figure(pd.DataFrame(rows), SLO)  # 29 points a pixel apart at the scale the 30th sets
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = [Text.get_window_extent(t, renderer) for t in fig.axes[0].texts]  # the words, not their line
        assert len(boxes) == 30
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)
        legend = fig.axes[0].get_legend().get_window_extent(renderer)
        assert not any(legend.overlaps(b) for b in boxes)
    finally:
        plt.close(fig)


def test_names_stay_at_their_points_height_where_there_is_room():
    from runtime.planning.plots import spread

    assert spread([0.9, 0.5, 0.1], 0.05) == [0.9, 0.5, 0.1]
    close = spread([0.5, 0.5, 0.5, 0.0], 0.1)
    assert close[0] == 0.5 and all(a - b >= 0.1 - 1e-12 for a, b in zip(close, close[1:])) and close[-1] >= 0.05
