"""``advance`` then ``complete`` is ``commit`` in two halves: for any step (no later one planned),
whatever tokens the executor returns (one or several per span, stop tokens, eos, min_tokens, length
limits), with or without deltas, and with or without the tokens handed to ``advance`` beforehand
(the simulator's, or stale ones that the result then overrides), the two give the same deltas, the
same events and the same request state."""

from __future__ import annotations

import contextlib
import hashlib

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from tests.test_core_properties import configs
from traces.params import InvalidRequest, SamplingParams


class SeveralTokens:
    """1 to ``most`` tokens per sampling span, each a pure function of (seed, request, position),
    with a logprob each; about one token in ``eos_every`` is 0 (eos)."""

    def __init__(self, seed: int, most: int, eos_every: int = 9) -> None:
        self.seed, self.most, self.eos_every = seed, most, eos_every

    def _draw(self, *key: int) -> int:
        digest = hashlib.blake2b("/".join(map(str, (self.seed, *key))).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def execute(self, plan, requests) -> StepResult:
        tokens = []
        for s in plan.spans:
            if s.sample:
                at = s.start + s.num_tokens
                count = 1 + self._draw(s.request_id, at, -1) % self.most
                draws = [self._draw(s.request_id, at + i) for i in range(count)]
                tokens.append([0 if x % self.eos_every == 0 else x % 40 + 1 for x in draws])
        return StepResult(tokens, 0.25, [[{t: -0.1 * t} for t in ts] for ts in tokens])


stopping = st.lists(
    st.tuples(st.integers(1, 30), st.integers(1, 16), st.integers(0, 5), st.sets(st.integers(1, 40), max_size=3),
              st.booleans()),  # prompt length, max_tokens, min_tokens, stop token ids, ignore eos
    min_size=1, max_size=10)


def _core(config, reqs, events, watched: bool) -> EngineCore:
    """``watched=False``: no request stops on a token (no stop ids, eos ignored), so none is watched
    and ``complete`` may take the simulator's shortcut."""
    core = EngineCore(config, eos_token_id=0, sink=events.append)
    for i, (n, max_tokens, min_tokens, stop_ids, ignore_eos) in enumerate(reqs):
        if not watched:
            stop_ids, ignore_eos = (), True
        params = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens),
                                stop_token_ids=tuple(sorted(stop_ids)), ignore_eos=ignore_eos)
        with contextlib.suppress(InvalidRequest):  # too big for this pool / budget
            core.add_request([100 + 7 * i + j for j in range(n)], params, now=0.0)
    return core


def _state(core: EngineCore) -> list:
    return sorted((r.request_id, list(r.token_ids), r.finish_reason, r.num_computed_tokens)
                  for r in core.requests.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, reqs=stopping, seed=st.integers(0, 9), most=st.sampled_from([1, 1, 2, 3]),
       deltas=st.booleans(), known=st.sampled_from(["none", "result", "stale"]), watched=st.booleans())
def test_advance_then_complete_is_commit(config, reqs, seed, most, deltas, known, watched):
    executor = SeveralTokens(seed, most)
    events_a: list = []
    events_b: list = []
    a, b = _core(config, reqs, events_a, watched), _core(config, reqs, events_b, watched)
    for step in range(3000):
        if not a.has_unfinished():
            break
        plan_a, plan_b = a.schedule(float(step)), b.schedule(float(step))
        assert plan_a == plan_b
        if plan_a.empty:
            break
        result = executor.execute(plan_a, a.requests)
        out_a = a.commit(plan_a, result, float(step), deltas)
        if known == "none":
            b.advance(plan_b)
        elif known == "result":  # the simulator's: the very list the result holds
            b.advance(plan_b, result.token_ids)
        else:  # tokens that turn out otherwise: the result's win
            b.advance(plan_b, [[t + 1 for t in ts[:1]] for ts in result.token_ids])
        out_b = b.complete(plan_b, result, float(step), deltas)
        assert out_a == out_b
        assert (out_a != []) == (deltas and any(s.sample for s in plan_a.spans))
        assert _state(a) == _state(b)
        b.block_manager.check_invariants()
    assert not a.has_unfinished() and not b.has_unfinished()
    assert msgspec.json.encode(events_a) == msgspec.json.encode(events_b)
