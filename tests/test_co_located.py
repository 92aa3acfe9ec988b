"""What sharing a device costs a step: the co-located profile (runtime/bench/co_located.py), its fit
(simulator/fitting/co_located.py) and the simulated device that applies it (simulator/fleet/device.py)."""

from __future__ import annotations

import heapq
import json

import numpy as np
import pytest

from runtime.cli import main
from simulator.cost.cost_model import CostModelError
from simulator.cost.features import FEATURES
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.loading import load_cost_model
from simulator.cost.logged_run import LoggedRun
from simulator.cost.shared_device import SharedDevice
from simulator.fitting.co_located import fit_shared_device
from simulator.fleet.device import Device
from tests.model_helpers import make_tiny, one_thread
from tests.test_devices import _decoders, _steps
from traces.events import Header, Span, Step
from traces.log import read_log

SEQS = FEATURES.index("seqs")


def test_work_behind_another_replicas_runs_slowdown_times_as_long():
    d = Device(0, 2)
    assert d.run(0.0, 1.0, slowdown=1.5) == 1.0  # an idle device: as alone
    assert d.run(0.5, 1.0, slowdown=1.5) == 2.5  # behind the first: waits, then 1.5 × as long
    assert d.run(3.0, 1.0, slowdown=1.5) == 4.0  # idle again


def test_the_models_slowdown_stretches_a_shared_devices_steps():
    """Two replicas of 20 steps of 10 ms on one device: with a slowdown of 2 the device is busy
    for the first step alone and then 39 steps twice as long."""
    model = LinearCostModel({"const": 0.01})
    shared = model.with_shared_device(SharedDevice(2.0, 2, 40, 0.0, 0.0))
    plain = max(s.end for steps in _steps([0, 0], _decoders(2, 20), model) for s in steps)
    slow = max(s.end for steps in _steps([0, 0], _decoders(2, 20), shared) for s in steps)
    assert plain == pytest.approx(0.4)
    assert slow == pytest.approx(0.01 + 39 * 0.02)
    # on devices of their own nothing changes
    assert max(s.end for steps in _steps([0, 1], _decoders(2, 20), shared) for s in steps) == pytest.approx(0.2)


class _PerSeq:
    """A fitted model's stand-in: a step costs 1 ms a sequence."""

    def predict_steps(self, data):
        return data.features[:, SEQS] * 1e-3


def _member_logs(batches: list[list[int]], slowdown: float, gap: float) -> list[LoggedRun]:
    """Engines whose steps of these batch sizes ran on one device of that slowdown (each launching its
    next step ``gap`` after its last one ended), logged as the engines would measure them."""
    device = Device(0, len(batches))
    launches = [(0.0, i, 0) for i in range(len(batches))]
    events: list[list] = [[Header(clock="wall")] for _ in batches]
    while launches:
        t, i, k = heapq.heappop(launches)
        n = batches[i][k]
        end = device.run(t, n * 1e-3, slowdown)
        events[i].append(Step(step=k, start=t, end=end, spans=[Span(r, 100, 1, True) for r in range(n)],
                              tokens=[[0]] * n))
        if k + 1 < len(batches[i]):
            heapq.heappush(launches, (end + gap, i, k + 1))
    return [LoggedRun(f"member{i}", tuple(e)) for i, e in enumerate(events)]


@pytest.mark.parametrize("slowdown", [1.0, 1.3, 2.2])
def test_the_fit_recovers_the_slowdown_the_engines_ran_at(slowdown):
    rng = np.random.default_rng(7)
    batches = [list(rng.integers(1, 64, 200)) for _ in range(2)]
    shared = fit_shared_device(_member_logs(batches, slowdown, gap=2e-4), _PerSeq())
    assert shared.slowdown == pytest.approx(slowdown, rel=0.02)
    assert shared.replicas == 2 and shared.steps > 300
    assert shared.error_unshared_pct < -30  # each engine alone is far faster than sharing


class _Cheap(_PerSeq):
    def predict_steps(self, data):
        return super().predict_steps(data) / 100


def test_logs_no_shared_device_explains_are_refused():
    with pytest.raises(CostModelError, match="2 or more engines"):
        fit_shared_device(_member_logs([[4] * 50], 1.0, gap=0.0), _PerSeq())
    # steps 100 × what the model prices them: no slowdown in range explains them
    with pytest.raises(CostModelError, match="not a profile of engines sharing it"):
        fit_shared_device(_member_logs([[4] * 50] * 2, 1.0, gap=0.0), _Cheap())


@pytest.mark.usefixtures(one_thread.__name__)
def test_profile_co_located_runs_the_engines_together_and_fits_the_slowdown(tmp_path):
    tiny = make_tiny("llama", tmp_path / "model")
    log, model_path = tmp_path / "p.jsonl", tmp_path / "m.json"
    assert main(["profile", "--model", str(tiny.folder), "--device", "cpu", "--quick", "--co-located", "2",
                 "--co-located-time", "3", "--out", str(log), "--fit", str(model_path), "--no-progress"]) == 0
    members = [tmp_path / f"p.co_located{i}.jsonl" for i in range(2)]
    for member in members:  # each a sweep of the same engine, logged as a profile is
        events = list(read_log(member))
        assert isinstance(events[0], Header) and events[0].extra["profile"]["quick"]
        assert sum(isinstance(e, Step) for e in events) >= 2
    doc = json.loads(model_path.read_text())
    assert doc["shared_device"]["replicas"] == 2 and doc["shared_device"]["slowdown"] > 0
    model = load_cost_model(str(model_path))
    assert model.timing(2048).shared_slowdown == doc["shared_device"]["slowdown"]
    # the same fit from the logs afterwards
    refit = tmp_path / "r.json"
    assert main(["cost-model", "fit", str(log), "--co-located", *map(str, members), "--out", str(refit)]) == 0
    assert json.loads(refit.read_text())["shared_device"] == doc["shared_device"]


def test_a_models_shared_device_is_a_part_of_its_file_not_metadata(tmp_path):
    """Saved, loaded and taken away again: the file then has none (it is not carried as metadata)."""
    model = LinearCostModel({"const": 0.01}).with_shared_device(SharedDevice(1.5, 2, 10, -40.0, -2.0))
    model.save(tmp_path / "a.json")
    loaded = load_cost_model(str(tmp_path / "a.json"))
    assert loaded.shared_device == model.shared_device and "shared_device" not in loaded.meta
    loaded.with_shared_device(None).save(tmp_path / "b.json")
    assert "shared_device" not in json.loads((tmp_path / "b.json").read_text())
    assert load_cost_model(str(tmp_path / "b.json")).timing(2048).shared_slowdown == 1.0
