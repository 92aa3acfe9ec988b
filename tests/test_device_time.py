"""Steps timed on the device as well as by the host: the log keeps each step's time on the device; a fit
that models the launch (``eager_launch``) on such a log prices steps by what the device took, and
the launch of a prefill step that held the decode step before it back is fitted from those times
(simulator/cost/launch.py)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import StepResult
from simulator.cost.launch import launch_bound
from simulator.cost.step_data import StepData
from simulator.fitting.fit import fit_cost_model
from traces.events import Span, Step, make_header
from traces.log import LogWriter, read_log
from traces.params import SamplingParams

DECODE_LAUNCH, PREFILL_LAUNCH = 0.0005, 0.010  # host seconds to launch a step (prefill: eager kernels)
DECODE_DEVICE, PREFILL_DEVICE = 0.004, 0.006  # device seconds of a step


class _Gpu:
    """An overlapping executor on a virtual clock. Launching a step costs the host its launch time;
    the device runs it once free and once launched; collecting waits for it. Each result carries the
    device's time for the step as CUDA events measure it: from when the device was free of the step
    before (or the launch began) to the step's end. ``as_launched``: a prefill's kernels run as they
    are launched (its work shorter than its launch), so it ends as its launch does."""

    def __init__(self, clock: list[float], as_launched: bool = False) -> None:
        self.clock, self.free, self.as_launched = clock, 0.0, as_launched

    def launch(self, plan, requests):
        began = self.clock[0]
        prefill = plan.num_scheduled_tokens > len(plan.spans)
        self.clock[0] += PREFILL_LAUNCH if prefill else DECODE_LAUNCH
        free = max(self.free, began)
        if prefill and self.as_launched:
            self.free = max(free + PREFILL_DEVICE, self.clock[0])
        else:
            self.free = max(self.free, self.clock[0]) + (PREFILL_DEVICE if prefill else DECODE_DEVICE)
        return plan, began, self.free, self.free - free

    def collect(self, handle):
        plan, began, ready, device = handle
        self.clock[0] = max(self.clock[0], ready)
        return StepResult([[7] for s in plan.spans if s.sample], ready - began, device_time=device)


def _run(path, timed: bool, as_launched: bool = False) -> None:
    config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=4096),
                          scheduler=SchedulerConfig(max_model_len=2048, max_num_batched_tokens=512, max_num_seqs=64))
    clock = [0.0]
    with LogWriter(path) as writer:
        writer(make_header(config, clock="wall", extra={"overlap": True}))
        sink = writer if timed else (lambda e: writer(msgspec.structs.replace(e, device_time=None)
                                                      if isinstance(e, Step) else e))
        core = EngineCore(config, sink=sink)
        loop = StepLoop(core, _Gpu(clock, as_launched), lambda: clock[0], overlap=True, deltas=False)
        for i in range(120):  # a request every ~30 ms into a batch decoding: decode steps, then a prefill
            core.add_request([1 + i] * (32 + 16 * (i % 8)), SamplingParams(max_tokens=40 + i % 13, ignore_eos=True),
                             clock[0])
            target = clock[0] + 0.03
            while clock[0] < target and (core.has_unfinished() or loop.busy):
                loop.step()
        while core.has_unfinished() or loop.busy:
            loop.step()


def test_a_step_keeps_its_device_time_through_the_log(tmp_path):
    _run(tmp_path / "gpu.jsonl", timed=True)
    steps = [e for e in read_log(tmp_path / "gpu.jsonl") if isinstance(e, Step)]
    assert all(s.device_time is not None for s in steps)
    decode = [s for s in steps if all(sp.num_tokens == 1 for sp in s.spans)]
    assert {round(s.device_time, 9) for s in decode} >= {DECODE_DEVICE}
    held = [a for a, b in zip(steps, steps[1:]) if a in decode and b not in decode and b.start == a.end]
    assert held and all(a.end - a.start > 2 * a.device_time for a in held)  # the prefill's launch held them


def test_a_fit_prices_steps_by_the_device_and_the_launch_apart(tmp_path):
    _run(tmp_path / "timed.jsonl", timed=True)
    _run(tmp_path / "untimed.jsonl", timed=False)
    timed = fit_cost_model([tmp_path / "timed.jsonl"], kind="linear-absolute")  # the launch modelled by default
    untimed = fit_cost_model([tmp_path / "untimed.jsonl"], kind="linear-absolute")
    assert untimed.launch_time is None  # (no times on the device: off by default)
    wall = fit_cost_model([tmp_path / "timed.jsonl"], kind="linear-absolute", eager_launch=False)
    assert "device_timed" not in wall.meta and wall.launch_time is None
    batch = [Span(i, 200, 1, True) for i in range(8)]
    assert timed.meta["device_timed"] and "device_timed" not in untimed.meta
    assert timed.step_time(0, batch) == pytest.approx(DECODE_DEVICE, rel=0.05)
    assert untimed.step_time(0, batch) > 1.1 * DECODE_DEVICE  # the held-back steps averaged in
    assert timed.host.eager_launch == pytest.approx(PREFILL_LAUNCH, rel=0.1)


def test_cost_model_fit_models_the_launch_by_default_on_device_timed_steps(tmp_path, capsys):
    """The CLI: on a log whose steps carry their times on the device the launch is fitted unless
    ``--no-eager-launch``; on one without, only with ``--eager-launch``."""
    from runtime.cli import main
    from simulator.cost.loading import load_cost_model

    _run(tmp_path / "timed.jsonl", timed=True)
    _run(tmp_path / "untimed.jsonl", timed=False)
    out = tmp_path / "m.json"
    fit = ["cost-model", "fit", "--kind", "linear-absolute", "--out", str(out)]
    assert main([*fit, str(tmp_path / "timed.jsonl")]) == 0
    assert "eager launch:" in capsys.readouterr().out
    assert load_cost_model(out).host.eager_launch == pytest.approx(PREFILL_LAUNCH, rel=0.1)
    assert main([*fit, str(tmp_path / "timed.jsonl"), "--no-eager-launch"]) == 0
    assert "eager launch:" not in capsys.readouterr().out and load_cost_model(out).launch_time is None
    assert main([*fit, str(tmp_path / "untimed.jsonl")]) == 0
    assert load_cost_model(out).launch_time is None


def test_prefill_steps_that_ran_as_launched_are_left_out_of_the_step_model(tmp_path):
    """A prefill whose launch outlasts its work ends on the device as its launch does: its device
    time is the launch's span, not its work, and the fit leaves it out (every such step after a
    held-back decode step); one whose work outlasts the launch stays."""
    _run(tmp_path / "as_launched.jsonl", timed=True, as_launched=True)
    _run(tmp_path / "timed.jsonl", timed=True)
    steps = [e for e in read_log(tmp_path / "as_launched.jsonl") if isinstance(e, Step)]
    prefill = [any(s.num_tokens > 1 for s in st.spans) for st in steps]
    after_held = [i + 1 for i, (a, b, p, q) in enumerate(zip(steps, steps[1:], prefill, prefill[1:]))
                  if q and not p and a.end == b.start]
    assert len(after_held) > 20
    assert np.flatnonzero(launch_bound(StepData.from_logs([tmp_path / "as_launched.jsonl"]))).tolist() == after_held
    fitted = fit_cost_model([tmp_path / "as_launched.jsonl"], kind="linear-absolute")
    assert fitted.meta["launch_bound_prefills"] == len(after_held)
    assert fitted.meta["training"]["steps"] == len(steps) - len(after_held)  # left out, the rest all learned
    assert fit_cost_model([tmp_path / "timed.jsonl"], kind="linear-absolute").meta["launch_bound_prefills"] == 0
