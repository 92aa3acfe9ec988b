"""The parts of a cost model that make re-simulation faithful: candidates chosen by held-out error,
trees exported without pickle, host timing, and the ranges a fit covered."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from runtime.cli import main
from simulator.cost.cost_model import CostModel
from simulator.cost.host_timing import HostData, HostTiming, fit_host_timing
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.loading import load_cost_model
from simulator.cost.ranges import FeatureRanges, RangeTracker
from simulator.cost.step_data import StepData
from simulator.cost.tree_model import TreeCostModel
from simulator.cost.trees import TreeEnsemble
from simulator.fitting.fit import CANDIDATES, EXTRAPOLATING, fit_candidate, fit_cost_model, select_model
from simulator.sim import simulate
from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, record_async_style, small_config
from traces.events import Header, Span, Step
from traces.log import LogWriter, read_log

TRUE = {"const": 2e-3, "prefill_tokens": 4e-6, "prefill_attention": 1e-9, "decode_seqs": 5e-6,
        "decode_context": 2e-8, "seqs": 1e-5, "prefill_step": 3e-3}


class Padded(CostModel):
    """A CPU-like step cost: linear, plus a jump at 8 sequences (GEMMs padded to 16 rows), plus
    noise that grows with the step (so relative and absolute weighting disagree)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def step_time(self, step, spans, verifying=()):
        t = LinearCostModel(TRUE).step_time(step, spans) + (4e-3 if len(spans) >= 8 else 0.0)
        return t * float(self.rng.lognormal(0, 0.15))


def _log(tmp_path, name, model, seed, n=150, **cfg):
    path = tmp_path / name
    with LogWriter(path) as w:
        simulate(mixed_workload(n, seed=seed, rate=80), small_config(**cfg), model, sink=w)
    return path


@pytest.fixture(scope="module")
def padded_logs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("padded")
    return ([_log(tmp, f"t{i}.jsonl", Padded(i), i) for i in range(2)],
            _log(tmp, "h.jsonl", Padded(9), 9, budget=128))


def test_exported_trees_predict_what_sklearn_predicts():
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, size=(300, 4))
    y = np.sin(X[:, 0]) + X[:, 1] ** 2 / 10 + (X[:, 2] > 5)
    for est in (GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=0),
                RandomForestRegressor(n_estimators=10, max_depth=6, random_state=0)):
        est.fit(X, y)
        ens = TreeEnsemble.from_sklearn(est)
        back = TreeEnsemble.from_dict(json.loads(json.dumps(ens.to_dict())))
        assert back.predict(X) == pytest.approx(est.predict(X), rel=1e-9, abs=1e-12)
        assert [back.predict_one(x) for x in X[:20]] == pytest.approx(est.predict(X[:20]).tolist(), rel=1e-9)


def test_absolute_weighting_keeps_the_total_time_relative_does_not(padded_logs):
    train, held = padded_logs
    data = StepData.from_logs(train)
    rel = fit_candidate("linear-relative", data).evaluate(data)
    ab = fit_candidate("linear-absolute", data).evaluate(data)
    assert abs(ab["total_error"]) < 1.0 < abs(rel["total_error"])  # least squares on durations: residuals sum to ~0
    assert rel["total_error"] < 0  # relative weighting underpredicts the long steps


def test_selection_keeps_the_lowest_held_out_score_and_trees_catch_the_jump(padded_logs):
    train, held = padded_logs
    sel = select_model(StepData.from_logs(train), StepData.from_logs([held]))
    assert set(sel.scores) == set(CANDIDATES)
    assert sel.scores[sel.best]["score"] == min(s["score"] for s in sel.scores.values())
    assert sel.best != "linear-relative"
    # a model with trees prices the 8-sequence jump that no linear combination expresses
    hybrid = fit_candidate("linear+gbm", StepData.from_logs(train))
    seven = [Span(i, 100, 1, True) for i in range(7)]
    eight = [Span(i, 100, 1, True) for i in range(8)]
    jump = hybrid.step_time(0, eight) - hybrid.step_time(0, seven)
    assert 2e-3 < jump < 6e-3


def test_auto_keeps_a_model_that_extrapolates_even_when_trees_alone_score_best(padded_logs):
    train, held = padded_logs
    data, held_data = StepData.from_logs(train), StepData.from_logs([held])
    trees_only = select_model(data, held_data, ("gbm", "linear-relative"))
    assert trees_only.best == "gbm"  # inside the fitted shapes, trees alone win here
    kept = select_model(data, held_data, ("gbm", "linear-relative"), keep=EXTRAPOLATING)
    assert kept.best == "linear-relative" and set(kept.scores) == {"gbm", "linear-relative"}
    # twice the sequences, far past the fitted shapes: the line prices them, the trees barely move
    far = [Span(i, 100, 1, True) for i in range(200)]
    farther = [Span(i, 100, 1, True) for i in range(400)]
    assert kept.model.step_time(0, farther) > 1.5 * kept.model.step_time(0, far)
    assert trees_only.model.step_time(0, farther) < 1.05 * trees_only.model.step_time(0, far)


def test_tree_model_file_roundtrip_without_pickle(padded_logs, tmp_path):
    train, _ = padded_logs
    model = fit_cost_model([str(p) for p in train], kind="linear+gbm", meta={"hardware": "h"})
    path = tmp_path / "m.json"
    model.save(path)
    text = path.read_text()
    assert "pickle" not in text and json.loads(text)["kind"] == "trees"
    back = load_cost_model(path)
    assert isinstance(back, TreeCostModel) and back.meta["hardware"] == "h"
    steps = [[Span(0, 0, 64, True)], [Span(i, 300, 1, True) for i in range(12)], []]
    assert [back.step_time(0, s) for s in steps] == pytest.approx([model.step_time(0, s) for s in steps])
    assert back.ranges.hi == model.ranges.hi and back.host == model.host
    data = StepData.from_logs(train)
    assert back.predict_ext(data.ext) == pytest.approx([back.step_time(0, ev.spans) for p in train
                                                        for ev in read_log(p) if isinstance(ev, Step)])


def test_host_gaps_are_fitted_and_reproduce_the_makespan(tmp_path):
    """An AsyncLLMEngine-style run spends 2 ms of host time before each step: a fit finds it, and a
    simulation that charges it ends when the recording did; without it, far sooner."""
    path = tmp_path / "async.jsonl"
    wl = mixed_workload(60, seed=3, rate=60)
    with LogWriter(path) as w:
        for ev in record_async_style(wl, small_config(), VaryingDurationExecutor(seed=1), overhead=2e-3):
            w(ev)
    host = fit_host_timing([path])
    assert host.gap_const + 8 * host.gap_per_seq == pytest.approx(2e-3, rel=0.05) and not host.overlap
    steps = [ev for ev in read_log(path) if isinstance(ev, Step)]
    truth = LinearCostModel({"const": 0.002, "prefill_tokens": 1e-5, "decode_seqs": 1e-5, "seqs": 3e-4})
    bare = simulate(wl, small_config(), truth)
    truth = truth.with_host(host)
    timed = simulate(wl, small_config(), truth)
    assert timed.end_time == pytest.approx(steps[-1].end, rel=0.02)
    assert bare.end_time < 0.95 * steps[-1].end


def test_overlapped_steps_cost_max_of_host_and_device():
    m = LinearCostModel({"const": 1e-3})
    m = m.with_host(HostTiming(gap_const=3e-3, overlap=True, launch=1e-4))
    assert m.step_time(0, [Span(0, 5, 1, True)]) == pytest.approx(3.1e-3)  # host-bound
    assert m.host_gap(1) == 0.0  # overlapped steps tile the timeline
    m = m.with_host(HostTiming(gap_const=1e-4, overlap=True))
    assert m.step_time(0, [Span(0, 5, 1, True)]) == pytest.approx(1e-3)  # device-bound


def test_intake_delay_holds_requests_back_but_keeps_their_arrival_stamp():
    wl = mixed_workload(20, seed=1, rate=5)
    m = LinearCostModel({"const": 1e-3})
    events: list = []
    simulate(wl, small_config(), m, sink=events.append)
    m = m.with_host(HostTiming(intake_delay=0.05))
    delayed: list = []
    simulate(wl, small_config(), m, sink=delayed.append)
    first = lambda evs: next(e for e in evs if isinstance(e, Step)).start  # noqa: E731
    assert first(delayed) == pytest.approx(first(events) + 0.05)
    arrived = lambda evs: [e.time for e in evs if type(e).__name__ == "Arrived"]  # noqa: E731
    assert arrived(delayed) == arrived(events)


def test_host_data_separates_busy_gaps_from_wakes(tmp_path):
    path = tmp_path / "async.jsonl"
    with LogWriter(path) as w:
        for ev in record_async_style(mixed_workload(30, seed=2, rate=3), small_config(),
                                     VaryingDurationExecutor(seed=1), overhead=1e-3):
            w(ev)
    data = HostData.from_log(path)
    assert data.wakes and data.busy_gaps and data.live_logs == 1
    assert np.median(data.busy_gaps) == pytest.approx(1e-3, rel=1e-6)
    assert np.median(data.wakes) == pytest.approx(1e-3, rel=1e-6)


def test_ranges_warn_with_the_share_of_steps_and_time_outside():
    # rows in EXT_FEATURES order: the linear features (padded_tokens last), tokens, prefill spans, largest chunk
    ranges = FeatureRanges.from_ext(np.array([[1, 64, 2080, 0, 0, 1, 1, 0, 0, 64, 1, 64],
                                              [1, 0, 0, 8, 800, 8, 0, 100, 0, 8, 0, 0]], dtype=float))
    tracker = RangeTracker(LinearCostModel({"const": 1e-3, "prefill_tokens": 1e-5}), ranges)
    for _ in range(3):
        tracker.step_time(0, [Span(0, 10, 1, True)])
    tracker.step_time(0, [Span(0, 0, 2048, True)])
    text = tracker.warning()
    assert text.startswith("warning: 25% of steps (")
    assert "(prefill tokens per step up to 64; here up to 2,048; prefill chunk up to 64; here up to 2,048; " in text
    assert "of time) lie outside" in text and "query-key" not in text
    assert RangeTracker(LinearCostModel({"const": 1e-3}), ranges).warning() is None


def test_the_range_tracker_simulates_as_its_model_does():
    """Its timing is its model's: an overlapped model's tracker plans ahead, with its intake delay."""
    from simulator.cost.host_timing import HostTiming

    model = LinearCostModel({"const": 1e-3})
    model = model.with_host(HostTiming(intake_delay=0.002, overlap=True))
    ranges = FeatureRanges.from_ext(np.array([[1, 0, 0, 8, 800, 8, 0, 100, 0, 8, 0, 0]], dtype=float))
    tracker = RangeTracker(model, ranges)
    timing, bare = tracker.timing(2048), model.timing(2048)
    assert timing.plans_ahead and bare.plans_ahead and timing.intake_delay == bare.intake_delay == 0.002
    assert timing.host_gap(3) == bare.host_gap(3) and timing.decode_durations == bare.decode_durations
    assert timing.note_decodes is not None and bare.note_decodes is None


def test_cli_fit_reports_every_candidate_and_simulate_warns_outside_the_range(padded_logs, tmp_path, capsys):
    train, held = padded_logs
    out = tmp_path / "m.json"
    assert main(["cost-model", "fit", *map(str, train), "--holdout", str(held), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in CANDIDATES) and "← kept" in text and "host: gap" in text
    doc = json.loads(out.read_text())
    assert doc["selection"]["chosen"] == doc["candidate"] and "ranges" in doc and "host" in doc
    assert doc["candidate"] in EXTRAPOLATING and text.count("(trees alone: not kept by auto)") == 2
    assert main(["cost-model", "eval", str(out), str(held)]) == 0
    assert "total step time" in capsys.readouterr().out
    # a chunked-off simulation of longer prompts leaves the fitted range, and says so
    wl = tmp_path / "long.jsonl"
    assert main(["workload", "generate", "-n", "20", "--rate", "50", "--input-len", "uniform:600:900",
                 "--output-len", "fixed:4", "--out", str(wl)]) == 0
    assert main(["simulate", str(wl), "--cost-model", str(out), "--chunked", "off", "--max-model-len", "1024",
                 "--num-blocks", "4096", "--no-progress", "--out", str(tmp_path / "s.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "chunked prefill off: max_num_batched_tokens 2,048 → 1,024" not in text  # not raised: 2,048 holds it
    assert "lie outside the model's profiled range" in text and "prefill chunk up to" in text


class Slower(CostModel):
    """The same engine under another load: every step 1.6× as long."""

    def __init__(self, seed: int) -> None:
        self.inner = Padded(seed)

    def step_time(self, step, spans, verifying=()):
        return 1.6 * self.inner.step_time(step, spans)


@pytest.mark.parametrize("kind", ["linear-absolute", "linear+gbm"])
def test_calibration_takes_the_shape_from_the_profile_and_the_level_from_live_runs(padded_logs, tmp_path, kind):
    train, _ = padded_logs
    live = _log(tmp_path, "live.jsonl", Slower(5), 5)
    model = fit_cost_model([str(p) for p in train], kind=kind, calibrate_on=[str(live)])
    cal = model.meta["calibration"]
    assert cal["factor"] == pytest.approx(1.6, rel=0.08) and cal["total_error_before"] < -30
    assert abs(model.evaluate(StepData.from_logs([live]))["total_error"]) < 1e-6
    path = tmp_path / "m.json"
    model.save(path)
    back = load_cost_model(path)
    spans = [Span(i, 100, 1, True) for i in range(8)]
    assert back.step_time(0, spans) == pytest.approx(model.step_time(0, spans))


def test_the_range_tracker_of_a_padded_model_counts_its_budget_view_into_one_report():
    """A simulation of another step budget prices with a view of the model (padded to that budget);
    the tracker's view counts every step into the tracker the caller holds."""
    from simulator.sim import simulate
    from tests.sim_helpers import mixed_workload, small_config
    from traces.step_padding import StepPadding

    model = LinearCostModel({"const": 1e-3, "prefill_tokens": 1e-5, "padded_tokens": 1e-6})
    model = model.with_step_padding(StepPadding(256))
    ranges = FeatureRanges.from_ext(np.array([[1, 64, 2080, 0, 0, 1, 1, 0, 0, 64, 1, 64]], dtype=float))
    tracker = RangeTracker(model, ranges)
    step = [Span(0, 0, 300, False)]
    assert tracker.timing(512).step_time(0, step) == model.with_step_budget(512).step_time(0, step)
    assert tracker.report.steps == 1  # counted into the tracker the caller holds
    assert model.padding == StepPadding(256)
    result = simulate(mixed_workload(30, seed=4), small_config(budget=512), tracker)
    assert tracker.report.steps == 1 + result.num_steps > 1 and tracker.warning() is not None


def test_a_weighted_log_counts_its_training_steps_that_many_times(padded_logs, tmp_path, capsys):
    from simulator.cost.step_data import StepData

    train, _ = padded_logs
    data = StepData.from_logs(train)
    heavy = data.weighted({1: 3})
    ones = int((data.log_index == 1).sum())
    assert len(heavy.durations) == len(data.durations) + 2 * ones
    assert (heavy.log_index == 1).sum() == 3 * ones and (heavy.log_index == 0).sum() == (data.log_index == 0).sum()
    assert np.array_equal(heavy.features[len(data.durations):], np.vstack([data.features[data.log_index == 1]] * 2))
    out = tmp_path / "w.json"
    assert main(["cost-model", "fit", *map(str, train), "--kind", "linear-absolute", "--weight", f"{train[1]}=3",
                 "--out", str(out)]) == 0
    plain = tmp_path / "p.json"
    assert main(["cost-model", "fit", *map(str, train), "--kind", "linear-absolute", "--out", str(plain)]) == 0
    doc, base = json.loads(out.read_text()), json.loads(plain.read_text())
    assert doc["training"]["weights"] == {str(train[1]): 3}
    extra = doc["training"]["steps"] - base["training"]["steps"]  # twice the weighted log's training rows
    assert extra > 0 and extra % 2 == 0 and doc["heldout"]["steps"] == base["heldout"]["steps"]  # held out once
    capsys.readouterr()
    for bad, why in ((f"{train[0]}x=2", "is not one of the logs being fitted"), (f"{train[0]}=0", "whole number")):
        with pytest.raises(SystemExit):
            main(["cost-model", "fit", *map(str, train), "--weight", bad, "--out", str(out)])
        err = capsys.readouterr().err
        assert f"--weight {bad}" in err and why in err


def test_a_profile_sweeps_gaps_leave_out_its_own_request_additions(tmp_path):
    """In a profile sweep's log (Header extra ``profile``) the sweep adds requests itself, making a
    prompt each time: a busy gap a request arrived in is its time, not the engine's, and is left out."""
    events = record_async_style(mixed_workload(60, seed=2, rate=200), small_config(), VaryingDurationExecutor(seed=1),
                                overhead=5e-3)
    live, sweep = tmp_path / "live.jsonl", tmp_path / "sweep.jsonl"
    for path, extra in ((live, {}), (sweep, {"profile": {"quick": True}})):
        with LogWriter(path) as w:
            for ev in events:
                w(msgspec.structs.replace(ev, extra={**ev.extra, **extra}) if isinstance(ev, Header) else ev)
    all_gaps, sweep_gaps = HostData.from_log(live).busy_gaps, HostData.from_log(sweep).busy_gaps
    assert 0 < len(sweep_gaps) < len(all_gaps)
