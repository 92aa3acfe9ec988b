"""Scheduling policies are registered queue classes: the config, the flags and the HTTP priority
field reach them by name."""

from __future__ import annotations

import pytest

from runtime.engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.policies import POLICIES, FcfsQueue, WaitQueue, make_policy, register_policy
from tests.helpers import SeededTokenExecutor
from traces.params import SamplingParams


def engine(policy: str, num_blocks: int = 64, budget: int = 8, seqs: int = 256) -> EngineCore:
    return EngineCore(EngineConfig(cache=CacheConfig(block_size=4, num_blocks=num_blocks),
                                   scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs,
                                                             max_model_len=64, policy=policy)))


def admitted_order(core: EngineCore) -> list[int]:
    order = []
    while core.has_unfinished():
        out = core.step(0.0, SeededTokenExecutor())
        order += [s.request_id for s in out.plan.spans if s.start == 0]
    return order


def test_builtin_policies_are_registered():
    assert set(POLICIES) >= {"fcfs", "priority"}
    assert isinstance(make_policy("fcfs"), FcfsQueue)
    with pytest.raises(ValueError, match="known: fcfs, priority"):
        make_policy("lifo")
    with pytest.raises(ConfigError, match="scheduler.policy"):
        SchedulerConfig(policy="lifo")


@pytest.mark.parametrize(("policy", "expected"), [("fcfs", [0, 1, 2, 3]), ("priority", [3, 1, 2, 0])])
def test_admission_order_follows_the_policy(policy, expected):
    core = engine(policy, budget=4, seqs=1)  # one request at a time: admission order is the order served
    for rid, priority in enumerate([5, 1, 1, 0]):
        core.add_request([1, 2, 3, 4], SamplingParams(max_tokens=2), now=float(rid), priority=priority)
    assert admitted_order(core) == expected


def test_priority_preempts_the_least_important_running_request():
    # 4 blocks of 4 tokens: two requests of 5 prompt tokens hold 2 blocks each; the one that must
    # grow a block preempts whichever the policy names
    for policy in ("fcfs", "priority"):
        core = engine(policy, num_blocks=4, budget=16)
        low = core.add_request([1] * 5, SamplingParams(max_tokens=8), 0.0, priority=9)
        high = core.add_request([2] * 5, SamplingParams(max_tokens=8), 0.0, priority=0)
        preempted = []
        while core.has_unfinished() and not preempted:
            preempted = core.step(0.0, SeededTokenExecutor()).plan.preempted
        expected = {"fcfs": high, "priority": low}[policy]  # fcfs: the last admitted
        assert preempted == [expected], policy


def test_a_registered_policy_is_accepted_by_name():
    @register_policy
    class Lifo(FcfsQueue):
        name = "lifo-test"
        description = "last come, first served"

        def push(self, req, front=False):
            super().push(req, front=not front)

    try:
        core = engine("lifo-test", budget=4, seqs=1)
        for rid in range(3):
            core.add_request([1, 2, 3, 4], SamplingParams(max_tokens=1), now=float(rid))
        assert admitted_order(core) == [2, 1, 0]
    finally:
        del POLICIES["lifo-test"]
    assert issubclass(Lifo, WaitQueue)
