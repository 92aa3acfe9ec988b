"""Replicas placed on devices (simulator/fleet/device.py): replicas on one device run their steps'
device work one after another; a replica on a device of its own is simulated as before."""

from __future__ import annotations

import pytest

from simulator.cost.host_timing import HostTiming
from simulator.cost.linear_model import LinearCostModel
from simulator.fleet.device import Device, devices_for, place, placement_of
from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
from tests.sim_helpers import mixed_workload, small_config
from traces.events import Step
from traces.log import encode
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic
from traces.workload import RequestSpec, Workload

STEP = 0.01


def _decoders(n: int, tokens: int) -> Workload:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    return Workload([RequestSpec(arrival=0.0, prompt=PromptSynthetic(num_tokens=8, seed=0, unique_seed=i + 1,
                                                                     vocab_size=100), params=params)
                     for i in range(n)])


def _steps(placement, workload, model, router="round-robin"):
    sinks = [[] for _ in placement]
    specs = [ReplicaSpec(small_config(), model, s.append, device=d) for s, d in zip(sinks, placement)]
    simulate_fleet(workload, specs, router)
    return [[e for e in s if isinstance(e, Step)] for s in sinks]


@pytest.mark.parametrize("overlap", [False, True])
def test_two_replicas_on_one_device_take_turns(overlap):
    """Each of two replicas runs one request of 20 steps of 10 ms: on devices of their own both end
    at 200 ms; on one device their steps alternate and each ends near 400 ms, every step logged
    as long as it waited for the other's."""
    model = LinearCostModel({"const": STEP})
    if overlap:
        model = model.with_host(HostTiming(overlap=True))
    apart = _steps([0, 1], _decoders(2, 20), model)
    shared = _steps([0, 0], _decoders(2, 20), model)
    for steps in apart:
        assert len(steps) == 20 and steps[-1].end == pytest.approx(20 * STEP)
    # the device does one step at a time, back to back: 40 steps end 10 ms apart, the last at 400 ms
    # (a replica planning ahead has two steps queued at once, so the two may end two steps apart)
    ends = sorted(s.end for steps in shared for s in steps)
    assert ends == pytest.approx([(i + 1) * STEP for i in range(40)])
    assert min(steps[-1].end for steps in shared) >= 38 * STEP - 1e-9
    # each step logged from when it could start to when the device finished it
    assert all(s.end - s.start >= STEP - 1e-9 for steps in shared for s in steps)
    assert max(s.end - s.start for steps in shared for s in steps) > 1.5 * STEP


def test_a_device_of_its_own_changes_nothing():
    """Placed explicitly one per device, or not placed at all: the same bytes."""
    wl = mixed_workload(40, seed=3)
    model = LinearCostModel({"const": 0.002, "prefill_tokens": 1e-5, "decode_context": 2e-8, "seqs": 3e-4})
    placed = _steps([0, 1, 2], wl, model, "least-loaded")
    unplaced = _steps([None, None, None], wl, model, "least-loaded")
    assert [[encode(s) for s in r] for r in placed] == [[encode(s) for s in r] for r in unplaced]


def test_placement_rules():
    assert place(4) == [0, 1, 2, 3] and place(4, 2) == [0, 1, 0, 1] and place(3, 1) == [0, 0, 0]
    with pytest.raises(ValueError, match="devices must be 1 to 2"):
        place(2, 3)
    devices = devices_for([0, 1, 0])
    assert devices[0] is devices[2] and devices[0].shared and not devices[1].shared
    assert placement_of(["cuda", "cuda:0"]) == [0, 0] and placement_of(["cuda:0", "cuda:1"]) == [0, 1]
    assert placement_of(["cpu", None]) is None
    d = Device(0, 2)
    assert d.run(1.0, 0.5) == 1.5 and d.run(1.2, 0.5) == 2.0 and d.run(3.0, 0.1) == pytest.approx(3.1)


def test_fidelity_resimulates_a_fleet_on_the_devices_it_ran_on(tmp_path, capsys):
    """A fleet simulated with two replicas on one device and re-simulated from its log: the placement
    comes from the log (every error 0); on a device each (--devices 2) it comes out faster."""
    import json

    from runtime.cli import main

    wl, log = tmp_path / "w.jsonl", tmp_path / "fleet.jsonl"
    assert main(["workload", "generate", "-n", "60", "--rate", "40", "--input-len", "uniform:32:256",
                 "--output-len", "uniform:16:64", "--out", str(wl)]) == 0
    assert main(["simulate", str(wl), "--cost-model", "qwen3-0.6b-h200", "--replicas", "2", "--devices", "1",
                 "--out", str(log), "--no-progress"]) == 0
    errors = {}
    for devices in (None, 2):
        out = tmp_path / f"f{devices}.json"
        assert main(["fidelity", str(log), "--cost-model", "qwen3-0.6b-h200", "--no-replay", "--json", str(out),
                     "--plot", str(tmp_path / "f.png"), *(["--devices", str(devices)] if devices else [])]) == 0
        errors[devices] = json.loads(out.read_text())["metrics"]["tpot"]["p50"]["error_pct"]
    assert errors[None] == pytest.approx(0.0, abs=1e-9) and errors[2] < -20
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fidelity", str(log), "--cost-model", "qwen3-0.6b-h200", "--devices", "3"])
    assert "--devices: devices must be 1 to 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a closed loop is re-simulated on one replica's log
        main(["fidelity", str(log), "--cost-model", "qwen3-0.6b-h200", "--closed-loop", str(wl)])
    err = capsys.readouterr().err
    assert err.startswith("minivllm: error: --closed-loop: ") and "is a fleet log" in err
    # a row of the fidelity table, judged by a fleet's goals (15 / 10 / 10 / 5 %)
    table = tmp_path / "t.json"
    assert main(["fidelity-table", "--cost-model", "qwen3-0.6b-h200", "--run", f"held-out:{log}",
                 "--repeat", f"{log}:{log}", "--json", str(table)]) == 0
    row = json.loads(table.read_text())["rows"][0]
    assert row["kind"] == "fleet" and row["errors"]["tpot_p50"] == pytest.approx(0.0, abs=1e-9)
    assert "| met |" in capsys.readouterr().out


def test_a_served_fleets_placement_is_the_device_each_replica_header_names(tmp_path):
    """`serve --data-parallel-size 2` on one GPU: both replicas' Headers say cuda:0 (or cuda), and
    the re-simulation puts them on one device; on a GPU each, cuda:0 and cuda:1."""
    import msgspec

    from runtime.cli import main
    from simulator.fidelity.fidelity import fleet_placement
    from traces.events import Header
    from traces.fleet_log import FleetLog
    from traces.log import LogWriter, read_log

    wl, log = tmp_path / "w.jsonl", tmp_path / "fleet.jsonl"
    assert main(["workload", "generate", "-n", "10", "--rate", "40", "--out", str(wl)]) == 0
    assert main(["simulate", str(wl), "--cost-model", "qwen3-0.6b-h200", "--replicas", "2", "--out", str(log),
                 "--no-progress"]) == 0
    fleet = FleetLog.read(log)
    assert fleet_placement(fleet) is None and fleet_placement(fleet, 1) == [0, 0]

    def name_devices(names):
        for path, name in zip(fleet.replica_logs, names):
            events = list(read_log(path))
            header = events[0]
            assert isinstance(header, Header)
            with LogWriter(path, if_exists="overwrite") as writer:
                writer(msgspec.structs.replace(header, extra={**header.extra, "device": name}))
                for e in events[1:]:
                    writer(e)
        return fleet_placement(FleetLog.read(log))

    assert name_devices(["cuda:0", "cuda"]) == [0, 0]
    assert name_devices(["cuda:0", "cuda:1"]) == [0, 1]
