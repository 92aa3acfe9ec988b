"""The Step event carries the step's start time (regression: it once logged a span's start)."""

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from tests.helpers import SeededTokenExecutor
from traces.events import Step
from traces.params import SamplingParams


def test_step_event_start_is_the_step_time():
    events = []
    core = EngineCore(EngineConfig(cache=CacheConfig(num_blocks=64), scheduler=SchedulerConfig()),
                      sink=events.append)
    core.add_request(list(range(40)), SamplingParams(max_tokens=5, ignore_eos=True), now=0.0)
    ex = SeededTokenExecutor(duration=0.25)
    now = 1.0
    while core.has_unfinished():
        now += core.step(now, ex).result.duration
    steps = [e for e in events if isinstance(e, Step)]
    assert [(s.start, s.end) for s in steps] == [(1.0 + 0.25 * i, 1.25 + 0.25 * i) for i in range(5)]
