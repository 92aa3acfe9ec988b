"""The WaitQueue contract, checked for every registered policy (a new one gets these for free):
what runtime/engine/policies.py documents for ``push`` / ``peek`` / ``pop`` / ``remove`` /
``__iter__``, and that a name can't be registered twice. Written against surviving mutants
(docs/MUTATION.md); tests/test_policies.py covers what the engine does with a policy."""

from __future__ import annotations

from array import array

import pytest

from runtime.engine.policies import POLICIES, FcfsQueue, make_policy, register_policy
from runtime.engine.request import Request
from traces.params import SamplingParams


def _requests(n: int) -> list[Request]:
    # priorities and arrivals not in id order, so each policy has an order of its own
    return [Request(i, array("i", [1, 2]), SamplingParams(), arrival_time=float((3 * i) % n), max_model_len=64,
                    priority=(i * 5) % 3) for i in range(n)]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_iteration_is_the_admission_order(name):
    queue = make_policy(name)
    for req in _requests(7):
        queue.push(req)
    listed = [r.request_id for r in queue]
    assert len(queue) == 7 and [r.request_id for r in queue] == listed  # iterating doesn't consume
    popped = []
    while len(queue):
        head = queue.peek()
        assert queue.pop() is head  # peek names what pop takes
        popped.append(head.request_id)
    assert listed == popped and sorted(listed) == list(range(7))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_remove_says_whether_the_request_was_queued(name):
    queue = make_policy(name)
    reqs = _requests(5)
    for req in reqs[:4]:
        queue.push(req)
    assert queue.remove(reqs[2]) is True
    assert queue.remove(reqs[2]) is False  # already gone
    assert queue.remove(reqs[4]) is False  # never queued
    assert len(queue) == 3 and reqs[2] not in list(queue)
    assert sorted(queue.pop().request_id for _ in range(3)) == [0, 1, 3]


def test_a_policy_name_cannot_be_registered_twice():
    with pytest.raises(ValueError) as err:

        @register_policy
        class Again(FcfsQueue):
            name = "fcfs"
            description = "a second fcfs"

    assert str(err.value) == "scheduling policy 'fcfs' is already registered"
    assert POLICIES["fcfs"] is FcfsQueue
