"""Non-finite numbers never reach a log: SamplingParams refuses them, and the writer refuses any
event holding one (JSON has no NaN or infinity; msgspec would write ``null`` and the whole log
would then be unreadable: "Expected `float`, got `null`")."""

from __future__ import annotations

import math

import msgspec
import pytest

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from traces.events import Arrived, Step
from traces.log import LogWriteError, LogWriter, read_log
from traces.params import _FLOAT_FIELDS, InvalidRequest, SamplingParams

NON_FINITE = [math.inf, -math.inf, math.nan]


def test_every_float_field_is_covered():
    assert set(_FLOAT_FIELDS) == {"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                  "repetition_penalty"}


@pytest.mark.parametrize("value", NON_FINITE, ids=str)
@pytest.mark.parametrize("name", _FLOAT_FIELDS)
def test_sampling_params_refuse_non_finite_floats_naming_the_field(name, value):
    with pytest.raises(InvalidRequest, match=rf"^{name} must be a finite number"):
        SamplingParams(**{name: value})
    # JSON that overflows to infinity (1e999) is refused the same way when decoded
    with pytest.raises(msgspec.ValidationError, match=name):
        msgspec.json.decode(f'{{"{name}": {"-" if value < 0 else ""}1e999}}', type=SamplingParams)


@pytest.mark.parametrize("kw", [{"temperature": "1"}, {"top_p": True}, {"stop": ("\ud800",)}])
def test_sampling_params_refuse_what_json_cannot_hold(kw):
    with pytest.raises(InvalidRequest, match=next(iter(kw))):
        SamplingParams(**kw)


def _engine(sink) -> EngineCore:
    cfg = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=16),
                       scheduler=SchedulerConfig(max_num_batched_tokens=32, max_model_len=64))
    return EngineCore(cfg, sink=sink)


def test_a_refused_arrival_leaves_the_engine_and_the_log_as_they_were(tmp_path):
    path = tmp_path / "live.jsonl"
    bad = SamplingParams()
    msgspec.structs.force_setattr(bad, "repetition_penalty", math.inf)  # e.g. built before the check existed
    with LogWriter(path) as w:
        core = _engine(w)
        with pytest.raises(LogWriteError, match=r"live\.jsonl: refusing to write an Arrived event.*repetition_penalty"):
            core.add_request([1, 2, 3], bad, 0.0)
        assert not core.has_unfinished() and core.num_requests_added == 0
        assert core.add_request([1, 2, 3], SamplingParams(max_tokens=1), 0.0) == 0
    assert [type(e) for e in read_log(path)] == [Arrived]


def test_a_non_finite_step_time_is_refused_not_written(tmp_path):
    path = tmp_path / "sim.jsonl"
    with LogWriter(path) as w:
        core = _engine(w)
        core.add_request([1, 2, 3], SamplingParams(max_tokens=2), 0.0)
        plan = core.schedule(0.0)
        with pytest.raises(LogWriteError, match="end is not a finite number"):
            core.commit(plan, StepResult([[5]], math.inf), 0.0)  # a cost model's runaway prediction
    assert all(not isinstance(e, Step) for e in read_log(path))
