"""Grids, SLOs, searches and the Pareto front of capacity planning, on their own (no simulation)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from runtime.planning.bisection import FewestPassing, HighestPassing
from runtime.planning.grid import (
    Grid,
    GridError,
    acceptance_setting,
    engine_options,
    fleet_settings,
    number_text,
    settings_text,
)
from runtime.planning.pareto import pareto_front
from runtime.planning.slo import Slo, SloError


def test_a_grid_is_the_product_of_its_axes_in_the_order_given():
    grid = Grid.parse("chunked=on,off budget=512,2048 router=least-loaded")
    points = list(grid.points())
    assert len(grid) == len(points) == 4
    assert [settings_text(p) for p in points] == [
        "chunked=on budget=512 router=least-loaded", "chunked=on budget=2048 router=least-loaded",
        "chunked=off budget=512 router=least-loaded", "chunked=off budget=2048 router=least-loaded"]
    assert engine_options(points[2]) == {"scheduler.enable_chunked_prefill": False,
                                         "scheduler.max_num_batched_tokens": 512}
    assert fleet_settings(points[0], 3, "round-robin") == (3, "least-loaded")


def test_speculative_decoding_is_an_engine_axis_and_its_acceptance_a_point_setting():
    grid = Grid.parse("speculative=off,ngram:4,ngram:04,model:/d/m:2 acceptance=0.5,1")
    assert grid.axes == (("speculative", ("", "ngram:4", "model:/d/m:2")), ("acceptance", (0.5, 1.0)))
    points = list(grid.points())
    assert settings_text(points[0]) == "speculative=off acceptance=0.5"
    assert settings_text(points[3]) == "speculative=ngram:4 acceptance=1"
    assert engine_options(points[3]) == {"speculative": "ngram:4"}  # the acceptance is no config field
    assert acceptance_setting(points[3], 0.2) == 1.0 and acceptance_setting((), 0.2) == 0.2


def test_an_empty_grid_is_one_point_with_no_setting():
    assert list(Grid.parse("").points()) == [()]
    assert settings_text(()) == "-"


@pytest.mark.parametrize("spec, words", [
    ("chunked", "expected AXIS=V1"), ("speed=1,2", "unknown axis 'speed'"), ("budget=0", "positive integer"),
    ("chunked=maybe", "on or off"), ("router=random", "round-robin"), ("budget=1 budget=2", "given twice"),
    ("speculative=ngram:0", "'speculative=ngram:0'.*K must be an integer"),
    ("speculative=off,eagle:2", "unknown method 'eagle'"),
    ("acceptance=0.5,1.5", r"'1.5': a rate must lie in \[0, 1\]"),
    ("acceptance=high", "'acceptance=high'"),
])
def test_a_bad_grid_term_is_named(spec, words):
    with pytest.raises(GridError, match=words):
        Grid.parse(spec)


def test_numbers_read_back_exactly():
    for x in (2.0, 0.5, math.sqrt(8 * 16), 1 / 3):
        assert float(number_text(x)) == x
    assert number_text(12.0) == "12"


def test_an_slo_bounds_statistics_of_latencies():
    slo = Slo.parse("ttft_p99_ms=1000, tpot_p99_ms=50,itl_max_ms=200")
    assert slo.text() == "ttft_p99_ms=1000,tpot_p99_ms=50,itl_max_ms=200"
    ok = {"ttft_p99_ms": 900.0, "tpot_p99_ms": 50.0, "itl_max_ms": 10.0, "rejected": 0}
    assert slo.violations(ok) == []
    assert slo.violations({**ok, "ttft_p99_ms": 1200.0}) == ["ttft_p99_ms 1,200.0 > 1000"]
    assert slo.violations({**ok, "tpot_p99_ms": float("nan")}) == ["tpot_p99_ms nan > 50"]
    assert slo.violations({**ok, "rejected": 3}) == ["3 rejected"]
    assert slo.request_limits_s() == {"ttft": 1.0, "tpot": 0.05}  # ITL has no value per request


def test_goodput_counts_the_finished_requests_within_every_limit():
    slo = Slo.parse("ttft_p99_ms=100,tpot_p90_ms=10")
    lat = pd.DataFrame({"ttft": [0.05, 0.2, 0.05, 0.05, float("nan")],
                        "tpot": [0.005, 0.005, 0.02, float("nan"), float("nan")]})
    finished = pd.Series([True, True, True, True, False])
    # the 4th has one output token (no TPOT), the 5th never finished
    assert slo.good_requests(lat, finished) == 2


@pytest.mark.parametrize("spec", ["", "ttft_ms=1", "ttft_p95_ms=1", "ttft_p99_s=1", "ttft_p99_ms=x",
                                  "ttft_p99_ms=-1", "ttft_p99_ms=1,ttft_p99_ms=2"])
def test_a_bad_slo_is_refused(spec):
    with pytest.raises(SloError):
        Slo.parse(spec)


def run_search(search, passes) -> list:
    while (x := search.next_probe()) is not None:
        search.record(x, passes(x))
    return [x for x, _ in search.probes]


@pytest.mark.parametrize("threshold", [0.003, 0.7, 2.5, 11.0, 700.0])
def test_the_highest_passing_load_is_found_within_the_tolerance(threshold):
    search = HighestPassing(start=1.0, tolerance=0.01)
    probes = run_search(search, lambda x: x <= threshold)
    assert search.bounded and search.monotone
    assert threshold / 1.01 <= search.answer <= threshold
    assert len(probes) == len(set(probes)) < 25


def test_a_load_that_always_passes_or_never_is_said_so():
    always = HighestPassing(highest=64.0)
    run_search(always, lambda x: True)
    assert always.answer == 64.0 and not always.bounded
    never = HighestPassing()
    run_search(never, lambda x: False)
    assert never.answer is None


@pytest.mark.parametrize("needed", [1, 2, 3, 5, 8, 13, 64])
def test_the_fewest_passing_count_is_exact(needed):
    search = FewestPassing(most=64)
    run_search(search, lambda n: n >= needed)
    assert search.answer == needed


def test_more_than_the_most_is_no_answer():
    search = FewestPassing(most=10)
    probes = run_search(search, lambda n: n >= 11)
    assert search.answer is None and max(probes) == 10


def test_the_pareto_front_keeps_the_points_nothing_beats():
    t = pd.DataFrame({"lat": [10, 20, 30, 15, 25, float("nan")], "good": [1.0, 3.0, 3.0, 0.5, 4.0, 9.0],
                      "name": list("abcdef")})
    assert pareto_front(t, "lat", "good")["name"].tolist() == ["a", "b", "e"]
