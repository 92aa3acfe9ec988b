"""`minivllm cost-model calibrate`: a fitted model brought to another machine by a live run of it, and the
intake delay fitted only where a log's TTFT shows the front door (not seconds of queueing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli import main
from simulator.cost.loading import load_cost_model
from simulator.cost.step_data import StepData
from simulator.fitting.intake import fit_intake_delay

H = Path(__file__).resolve().parent / "data" / "h200"
CONV, CODE = H / "heldout_conv_on_0.7.jsonl.gz", H / "heldout_code_on_0.7.jsonl.gz"


def test_intake_delay_is_not_fitted_on_a_log_whose_ttft_is_queueing():
    """The held-out H200 code run queues for seconds: its TTFT p50 moves with a 0.1 % step-time error more
    than with the front door, so only the conv run sets the delay; alone, it leaves the delay as it was."""
    model = load_cost_model("qwen3-0.6b-h200")
    before = model.intake_delay
    same, alone = fit_intake_delay(model, [CODE])
    assert alone["logs"] == [] and alone["left_out"] == [str(CODE)] and same.intake_delay == before
    _, both = fit_intake_delay(model, [CONV, CODE])
    assert both["logs"] == [str(CONV)] and both["left_out"] == [str(CODE)]
    assert both["sim_ttft_p50_s_after"][0] == pytest.approx(both["live_ttft_p50_s"][0], rel=0.1)


def test_calibrate_sets_the_level_and_host_timing_from_a_live_run(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["cost-model", "calibrate", "qwen3-0.6b-h200", str(CONV), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "calibrated on" in text and "intake delay" in text and str(out) in text
    model = load_cost_model(str(out))
    assert model.meta["calibrated_from"] == "qwen3-0.6b-h200" and model.meta["calibration"]["logs"] == [str(CONV)]
    assert abs(model.evaluate(StepData.from_logs([CONV]))["total_error"]) < 0.01  # the live total, to 0.01 %
    assert model.host.fitted_from["logs"] == [str(CONV)]


@pytest.mark.parametrize("argv, message", [
    (["recorded", str(CONV)], "'recorded' needs a recorded log"),
    (["qwen3-0.6b-h200", "missing.jsonl"], "missing.jsonl: no such log"),
    (["no-such-model", str(CONV)], "no-such-model"),
])
def test_calibrate_refuses_what_it_cannot_calibrate(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["cost-model", "calibrate", *argv, "--out", str(tmp_path / "m.json")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_calibrate_warns_when_the_log_is_another_model_or_far_off(tmp_path, capsys):
    """A calibration is for another machine of the same kind: a log of another model, or a level
    far from the model's, is said, not silently scaled into the model."""
    golden = Path(__file__).resolve().parent / "data" / "golden" / "burst_chunked_on.jsonl.gz"
    assert main(["cost-model", "calibrate", "qwen3-0.6b-h200", str(golden), "--out", str(tmp_path / "m.json")]) == 0
    err = capsys.readouterr().err
    assert "ran SmolLM2-135M" in err and "the cost model is for random:qwen3-0.6b" in err
    assert "another model, device or dtype?" in err
    main(["cost-model", "calibrate", "qwen3-0.6b-h200", str(CONV), "--out", str(tmp_path / "m2.json")])
    assert "warning" not in capsys.readouterr().err


def test_the_front_door_service_time_is_fitted_by_resimulation():
    """A service time from the grid, the intake delay refitted with it, both kept in the model's host
    timing and in what a simulation asks of it."""
    from simulator.fitting.intake import fit_intake_service

    model = load_cost_model("qwen3-0.6b-h200")
    model, out = fit_intake_service(model, [str(CONV)], grid=(0.0, 0.002), iterations=3)
    assert out["service_s"] in (0.0, 0.002) and set(out["ttft_p90_abs_relative_error"]) == {"0 ms", "2 ms"}
    timing = model.timing(2048)
    assert timing.intake_service == model.host.intake_service == out["service_s"]
    assert timing.intake_delay == model.host.intake_delay == out["intake_delay_s"]
