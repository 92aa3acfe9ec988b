"""A what-if over redrawn arrivals (simulator/fidelity/draws.py, ``fidelity --draws``, ``analyze
--draws``): the recorded requests keep their order and contents, their arrivals are redrawn at the
recorded rate, the same seeds give the same answer, and the conclusion weighs the pooled change."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis.what_if import headline, weigh
from runtime.cli import main
from simulator.cost.linear_model import LinearCostModel
from simulator.fidelity.draws import redraw_arrivals, what_if_over_draws
from simulator.fidelity.fidelity import fidelity
from simulator.replay.replay import log_config
from tests.sim_helpers import VARYING_TRUTH, mixed_workload, record_on_off, small_config
from tests.test_what_if import _summary
from traces.importers.log import read_log_workload
from traces.workload import Workload

CHUNKED_OFF = "scheduler.enable_chunked_prefill=false"


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return record_on_off(tmp_path_factory.mktemp("draws"))


def test_a_redraw_keeps_the_requests_and_their_order_and_the_mean_rate():
    workload = mixed_workload(60, rate=40.0)
    gaps = []
    for seed in range(1, 41):
        drawn = redraw_arrivals(workload, seed)
        assert [(r.prompt, r.params) for r in drawn] == [(r.prompt, r.params) for r in workload]
        assert drawn.requests[0].arrival == workload.requests[0].arrival
        assert all(b.arrival >= a.arrival for a, b in zip(drawn.requests, drawn.requests[1:]))
        gaps.append(np.diff([r.arrival for r in drawn]))
        assert drawn.requests == redraw_arrivals(workload, seed).requests  # seeded
    assert redraw_arrivals(workload, 1).requests != redraw_arrivals(workload, 2).requests
    recorded_rate = (len(workload) - 1) / workload.duration
    assert 1 / np.concatenate(gaps).mean() == pytest.approx(recorded_rate, rel=0.05)


def test_nothing_to_redraw_is_said():
    workload = mixed_workload(4)
    at_once = Workload([r.__class__(arrival=0.0, prompt=r.prompt, params=r.params) for r in workload])
    with pytest.raises(ValueError, match="arrive at once"):
        redraw_arrivals(at_once, 1)
    with pytest.raises(ValueError, match="at once"):
        redraw_arrivals(Workload(workload.requests[:1]), 1)


def test_no_change_moves_nothing_and_a_change_moves_the_same_way_on_every_run(logs):
    on, _ = logs
    _, config = log_config(on)
    model = LinearCostModel(VARYING_TRUTH)
    workload = read_log_workload(on)
    same = what_if_over_draws(workload, model, config, config, 5)
    for cells in same["metrics"].values():
        for cell in cells.values():
            assert math.isnan(cell["pooled_pct"]) or cell["pooled_pct"] == 0
    off = small_config(chunked=False)
    first = what_if_over_draws(workload, model, config, off, 6)
    assert first == what_if_over_draws(workload, model, config, off, 6)  # (no clock, no unseeded draw)
    ttft = first["metrics"]["ttft"]["p50"]
    assert ttft["low_pct"] <= ttft["high_pct"] and 0 <= ttft["same_sign"] <= 1 and first["draws"] == 6


def test_fidelity_reports_the_what_if_over_draws(logs, tmp_path, capsys):
    on, _ = logs
    report, _ = fidelity(on, LinearCostModel(VARYING_TRUTH), overrides=[CHUNKED_OFF], draws=4)
    assert report["what_if"]["draws"]["draws"] == 4
    js = tmp_path / "f.json"
    model = tmp_path / "m.json"
    LinearCostModel(VARYING_TRUTH).save(model)
    assert main(["fidelity", str(on), "--cost-model", str(model), "--what-if", CHUNKED_OFF, "--draws", "4",
                 "--json", str(js), "--plot", str(tmp_path / "p.png"), "--no-replay"]) == 0
    out = capsys.readouterr().out
    assert "4 draws Δ" in out and "their arrivals redrawn 4 times" in out
    assert json.loads(js.read_text())["what_if"]["draws"]["metrics"]["e2e"]["p90"].keys() == {
        "pooled_pct", "low_pct", "high_pct", "same_sign"}
    assert main(["analyze", str(on), str(on), str(on), "--what-if", "--draws", str(js)]) == 0
    assert "(both simulated from one model, over 4 draws of the arrivals)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["fidelity", str(on), "--cost-model", str(model), "--draws", "4"])
    assert "--draws: needs --what-if" in capsys.readouterr().err


def _draws(ttft_p90: float, same_sign: float = 0.9) -> dict:
    cell = lambda v, agree=0.9: {"pooled_pct": v, "low_pct": v - 10, "high_pct": v + 10,  # noqa: E731
                                 "same_sign": agree}
    flat = {"p50": cell(0.0), "p90": cell(0.0)}
    return {"draws": 32, "metrics": {"ttft": {"p50": cell(0.0), "p90": cell(ttft_p90, same_sign)},
                                     "tpot": flat, "e2e": flat}}


def test_over_draws_a_latency_moves_past_the_floor_the_same_way_on_most_draws():
    on, live = _summary(), _summary(ttft=(1.0, 1.08))  # the model's error on TTFT: 7.4 %
    one_draw = _summary(ttft=(1.0, 0.98))  # −2 % on the recorded arrivals: the draws' change counts
    weighed = weigh(on, one_draw, live, _draws(-20.0))
    assert [w["beyond"] for w in weighed] == [True, False, False]
    line = headline("off", "on", weighed, 32)
    assert line == ("off against on (both simulated from one model, over 32 draws of the arrivals): lowers TTFT p90 "
                    "by 20% (one run: −30%…−10%; the model's error on it 7.4%); TPOT (+0.0%), E2E (+0.0%) move less "
                    "than 5%, or not the same way on 75% of the draws")
    # the model's error (its own run against the live one) stands beside the change, it does not gate it
    assert weigh(on, one_draw, live, _draws(-6.0))[0]["beyond"]
    assert not weigh(on, one_draw, live, _draws(-4.0))[0]["beyond"]  # under the floor
    assert not weigh(on, one_draw, live, _draws(-20.0, same_sign=0.6))[0]["beyond"]  # draws disagree
    assert headline("off", "on", weigh(on, one_draw, live, _draws(-4.0)), 32).endswith(
        "no latency moves: TTFT (−4.0%), TPOT (+0.0%), E2E (+0.0%) move less than 5%, or not the same way on 75% "
        "of the draws")


def test_analyze_draws_errors_name_the_flag(logs, tmp_path, capsys):
    on, off = logs
    three = [str(on), str(off), str(on), "--what-if", "--draws"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"what_if": {}}')
    other = tmp_path / "other.json"  # the draws of another run
    other.write_text(json.dumps({"live_log": str(off), "what_if": {"draws": _draws(-20.0)}}))
    for path, says in ((tmp_path / "none.json", "no such file"), (bad, "no what_if.draws in it"),
                       (other, f"measured the what-if on {off}, not on {on}, the LIVE log given")):
        with pytest.raises(SystemExit):
            main(["analyze", *three, str(path)])
        assert f"--draws: {path}: {says}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["analyze", str(on), "--draws", str(bad)])
    assert "--draws: needs --what-if" in capsys.readouterr().err


def test_a_family_moves_by_the_largest_of_its_changes_that_the_draws_agree_on():
    on = _summary()
    draws = _draws(-20.0, same_sign=0.6)  # TTFT p90: large, but the draws disagree
    draws["metrics"]["ttft"]["p50"] = {"pooled_pct": -8.0, "low_pct": -12.0, "high_pct": -3.0, "same_sign": 0.9}
    ttft = weigh(on, on, on, draws)[0]
    assert (ttft["beyond"], ttft["stat"], ttft["effect_pct"]) == (True, "p50", -8.0)
