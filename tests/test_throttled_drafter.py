"""A drafter throttled by its requests' own kept drafts (``ThrottledDrafter``): a request whose drafts
fail drafts less, stops, and retries one draft after 16, 32, … 256 tokens; one whose drafts are kept
keeps drafting K; a stopped request's steps overlap again; the output is the target's either way."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine.drafters import ThrottledDrafter, may_draft_next
from runtime.engine.types import PLACEHOLDER
from tests.helpers import OracleDrafter, VerifyingExecutor
from tests.test_core_properties import build, configs, requests
from tests.test_speculative_core import PROMPTS, TARGET, engine, run
from tests.test_step_loop import run_loop, untimed
from traces.events import Step
from traces.params import SamplingParams
from traces.speculation import rounds

K = 4


@dataclass
class Status:
    done: bool = False


@dataclass
class FakeRequest:
    request_id: int
    token_ids: list[int] = field(default_factory=lambda: [7, 7, 7])
    status: Status = field(default_factory=Status)


class Fixed:
    """Proposes K drafts: the target's tokens (the request's next ones, ``truth``) or wrong ones."""

    num_tokens = K

    def __init__(self, right: bool) -> None:
        self.right, self.asked = right, 0

    def propose(self, requests, limits):
        self.asked += 1
        return [[truth(len(r.token_ids) + i) + (0 if self.right else 1) for i in range(n)]
                for r, n in zip(requests, limits)]


def truth(position: int) -> int:
    return 1000 + position


def decode(drafter, length: int, limit: int = K) -> list[int]:
    """Drive one request to ``length`` tokens, verifying each proposal as a greedy target would;
    returns the number of drafts proposed at each step."""
    req = FakeRequest(0)
    proposed = []
    while len(req.token_ids) < length:
        drafts = drafter.propose([req], [limit])[0]
        proposed.append(len(drafts))
        kept = 0
        while kept < len(drafts) and drafts[kept] == truth(len(req.token_ids) + kept):
            kept += 1
        req.token_ids += [truth(len(req.token_ids) + i) for i in range(kept + 1)]
    return proposed


def test_a_request_whose_drafts_fail_drafts_less_then_stops_and_retries_ever_more_rarely():
    inner = Fixed(right=False)
    proposed = decode(ThrottledDrafter(inner), 600)
    first_stop = proposed.index(0)
    assert proposed[0] == K and proposed[:first_stop] == sorted(proposed[:first_stop], reverse=True)
    assert first_stop <= 10  # a handful of failed rounds, then none
    retries = [i for i, n in enumerate(proposed) if n and i > first_stop]
    assert all(proposed[i] == 1 for i in retries)
    plain_between = [b - a - 1 for a, b in zip([first_stop - 1, *retries], retries)]  # a token each
    assert plain_between[:6] == [16, 32, 64, 128, 256, 256][:len(plain_between[:6])] and len(plain_between) >= 4
    assert inner.asked == first_stop + len(retries)  # the inner drafter is not asked for a stopped request


def test_a_request_whose_drafts_are_kept_drafts_k_every_step():
    assert set(decode(ThrottledDrafter(Fixed(right=True)), 300)) == {K}


def test_a_kept_retry_resumes_drafting():
    class Flips(Fixed):
        def propose(self, requests, limits):
            self.right = len(requests[0].token_ids) > 40  # wrong at first, right from token 40 on
            return super().propose(requests, limits)

    proposed = decode(ThrottledDrafter(Flips(right=False)), 300)
    assert 0 in proposed[:30] and proposed[-5:] == [K] * 5


def test_a_stopped_request_is_not_drafted_for_next_until_its_retry_is_due():
    drafter = ThrottledDrafter(Fixed(right=False))
    req = FakeRequest(0)
    assert drafter.drafts_next([req])  # a new request: it drafts
    for _ in range(200):
        drafts = drafter.propose([req], [K])[0]
        req.token_ids.append(truth(len(req.token_ids)) if drafts else 5)
        if not drafts and not drafter.drafts_next([req]):
            break
    else:
        pytest.fail("never stopped")
    while not drafter.drafts_next([req]):  # until the token before its retry
        assert drafter.propose([req], [K]) == [[]]
        req.token_ids.append(5)
    assert drafter.propose([req], [K]) == [[]]
    req.token_ids.append(5)
    assert len(drafter.propose([req], [K])[0]) == 1


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_throttled_speculation_commits_what_the_target_would_alone_and_verifies_only_what_pays(rate):
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    plain = run(engine(speculative=""), PROMPTS, params, None)
    events: list = []
    core = engine(events, ThrottledDrafter(OracleDrafter(TARGET, K, rate)), num_blocks=128, budget=64)
    assert run(core, PROMPTS, params, events) == plain
    spans = [(p, a) for e in events if isinstance(e, Step) for _, p, a in rounds(e)]
    if rate == 0.0:  # a few rounds each, then a retry now and then: far fewer than its 60 tokens
        assert 0 < len(spans) <= 12 * len(PROMPTS) and not any(a for _, a in spans)
    else:
        assert all(p == a for p, a in spans) and sum(p == K for p, _ in spans) >= len(spans) - len(PROMPTS)


def test_a_step_of_stopped_requests_overlaps_the_next_one():
    core = engine(None, ThrottledDrafter(OracleDrafter(TARGET, K, 0.0)), num_blocks=128, budget=64)
    for p in PROMPTS:
        core.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True), 0.0)
    overlaps = []
    while core.has_unfinished():
        plan = core.schedule(0.0)
        overlaps.append((bool(plan.drafts), core.overlappable(plan),
                         may_draft_next(core.drafter, plan, core.requests)))
        core.commit(plan, TARGET.execute(plan, core.requests), 0.0)
    assert not any(o for drafts, o, _ in overlaps if drafts)  # a verify step never overlaps
    assert sum(o for _, o, _ in overlaps) >= len(overlaps) // 2  # once the drafts stop, steps overlap
    assert all(o == (not may) for _, o, may in overlaps)


def test_a_retry_the_inner_drafter_has_nothing_for_waits_its_backoff_again():
    class Silent(Fixed):
        def propose(self, requests, limits):
            self.asked += 1
            if len(requests[0].token_ids) > 20:  # from token 20 on it has nothing to propose
                return [[] for _ in requests]
            return super().propose(requests, limits)

    inner = Silent(right=False)
    decode(ThrottledDrafter(inner), 400)
    assert inner.asked < 20  # not asked every step once its retry came back empty


class OverlappingVerifier(VerifyingExecutor):
    def launch(self, plan, requests):
        return self.execute(plan, requests)

    def collect(self, handle):
        return handle


class NoPlaceholders:
    """An inner drafter that fails if it is asked to draft for a request whose last token is not
    known yet (a step planned before the previous one's tokens landed)."""

    def __init__(self, inner) -> None:
        self.inner, self.num_tokens = inner, inner.num_tokens

    def propose(self, requests, limits):
        assert not any(PLACEHOLDER in r.token_ids for r, n in zip(requests, limits) if n)
        return self.inner.propose(requests, limits)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, reqs=requests, seed=st.integers(0, 5), rate=st.sampled_from([0.0, 0.2, 0.5]))
def test_throttled_speculation_overlapped_logs_what_a_sequential_run_logs(config, reqs, seed, rate):
    logs = []
    for overlap in (False, True):
        events: list = []
        core, _ = build(config, reqs, events)
        target = OverlappingVerifier(seed=seed, vocab=50, eos_id=0, eos_every=11)
        core.drafter = ThrottledDrafter(NoPlaceholders(OracleDrafter(target, K, rate)))
        run_loop(core, target, overlap)
        logs.append(untimed(events))
    assert logs[0] == logs[1]
