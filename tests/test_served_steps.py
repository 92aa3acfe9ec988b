"""Served steps against the engine alone (simulator/fitting/served_steps.py): the front-door probe's
streamed decode steps, priced by the profile's model, give a factor the fit reports (not applied)."""

from __future__ import annotations

import pytest

from simulator.cost.linear_model import LinearCostModel
from simulator.cost.logged_run import LoggedRun
from simulator.fitting.fit import fit_cost_model
from simulator.fitting.served_steps import MIN_STEPS, fit_served_steps
from tests.test_front_door import CONFIG, _probe_log
from traces.events import Header, Span, Step, make_header
from traces.log import LogWriter

STEP = 0.01


def _decodes(n: int, factor: float) -> LoggedRun:
    """A served log of ``n`` decode steps of 4 sequences, each ``factor`` × STEP long."""
    events: list = [Header(clock="wall")]
    t = 0.0
    for k in range(n):
        events.append(Step(step=k, start=t, end=t + factor * STEP, spans=[Span(r, 64 + k, 1, True) for r in range(4)],
                           tokens=[[0]] * 4))
        t += factor * STEP
    return LoggedRun("probe", tuple(events))


def test_the_factor_is_the_served_steps_against_the_engine_alone():
    model = LinearCostModel({"const": STEP})
    served = fit_served_steps(_decodes(60, 1.09), model)
    assert served.factor == pytest.approx(1.09) and served.steps == 60
    assert fit_served_steps(_decodes(MIN_STEPS - 1, 1.09), model) is None  # too few to say


def test_a_fit_with_a_probe_that_streamed_reports_the_served_steps(tmp_path):
    """The sweep's steps take STEP; the probe's streamed decode steps 1.2 × STEP: the fit says so and
    prices the sweep's steps as the sweep ran them."""
    sweep = tmp_path / "sweep.jsonl"
    with LogWriter(sweep) as writer:
        writer(make_header(CONFIG, clock="wall"))
        t = 0.0
        for k in range(200):
            writer(Step(step=k, start=t, end=t + STEP, spans=[Span(r, 64 + k, 1, True) for r in range(4)],
                        tokens=[[0]] * 4))
            t += STEP + 0.001
    probe = tmp_path / "probe.jsonl"
    _probe_log(probe, [16, 128, 1024])
    plain = fit_cost_model([sweep], kind="linear-absolute", front_door=probe)
    assert "served_steps" not in plain.meta  # that probe streamed nothing
    streamed = LoggedRun(str(probe), (*LoggedRun.read(probe).events, *_decodes(40, 1.2).events[1:]))
    served = fit_cost_model([sweep], kind="linear-absolute", front_door=streamed)
    assert served.meta["served_steps"]["factor"] == pytest.approx(1.2, rel=0.01)
    spans = [Span(r, 100, 1, True) for r in range(4)]
    assert served.step_time(0, spans) == pytest.approx(plain.step_time(0, spans))
