"""Test helpers: a deterministic executor and a driver that checks state after every step."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from runtime.engine.core import EngineCore
from runtime.engine.request import Request
from runtime.engine.types import StepPlan, StepResult
from traces.log import FoldedState


class SeededTokenExecutor:
    """Token at position p of request r is a pure function of (seed, r, p).

    ``eos_every``: if set, roughly one token in ``eos_every`` is ``eos_id``.
    """

    def __init__(self, seed: int = 0, vocab: int = 1000, eos_id: int | None = None,
                 eos_every: int | None = None, duration: float = 0.01) -> None:
        self.seed, self.vocab, self.eos_id, self.eos_every, self.duration = (
            seed, vocab, eos_id, eos_every, duration)
        self.calls = 0

    def token(self, request_id: int, position: int) -> int:
        d = hashlib.blake2b(f"{self.seed}/{request_id}/{position}".encode(), digest_size=8).digest()
        x = int.from_bytes(d, "little")
        if self.eos_every and self.eos_id is not None and x % self.eos_every == 0:
            return self.eos_id
        return x % self.vocab

    def execute(self, plan: StepPlan, requests: Mapping[int, Request]) -> StepResult:
        self.calls += 1
        tokens = [[self.token(s.request_id, s.start + s.num_tokens)] for s in plan.spans if s.sample]
        return StepResult(tokens, self.duration)


def run_checked(core: EngineCore, executor, events: list, *, now: float = 0.0, max_steps: int = 100_000,
                on_step=None) -> float:
    """Step ``core`` until idle; after every step check invariants and fold(log) == live state."""
    folded: FoldedState | None = None
    seen = 0
    steps = 0
    while core.has_unfinished():
        out = core.step(now, executor)
        assert not out.plan.empty, f"engine stalled with {core.num_waiting} waiting"
        now += out.result.duration
        steps += 1
        assert steps <= max_steps, "no progress"
        bm = core.block_manager
        bm.check_invariants()
        assert out.plan.num_scheduled_tokens == sum(s.num_tokens for s in out.plan.spans) \
            <= core.config.scheduler.max_num_batched_tokens
        assert out.plan.num_sampling == sum(s.sample for s in out.plan.spans)
        for req in core.requests.values():
            assert req.num_computed_tokens <= req.num_tokens
        if events is not None:
            for ev in events[seen:]:
                if folded is None:
                    folded = FoldedState(bm.num_blocks)
                    if ev.__class__.__name__ == "Header":
                        continue
                folded.apply(ev)
            seen = len(events)
            assert folded.block_state() == bm.snapshot()
            assert folded.computed == {r.request_id: r.num_computed_tokens for r in core.requests.values()}
        if on_step is not None:
            on_step(out)
    return now


class VerifyingExecutor(SeededTokenExecutor):
    """``SeededTokenExecutor``'s target verifying speculative drafts as a greedy target would: the
    drafts are accepted while each is the target's token at its position; the first that is not is
    replaced by the target's, and after the last accepted one the target's next token follows."""

    def execute(self, plan: StepPlan, requests: Mapping[int, Request]) -> StepResult:
        self.calls += 1
        drafts = plan.drafts or {}
        tokens = []
        for s in plan.spans:
            if not s.sample:
                continue
            draft = drafts.get(s.request_id, [])
            first = s.start + s.num_tokens - len(draft)  # the position the decode's own token samples
            out = []
            for i, d in enumerate(draft):
                want = self.token(s.request_id, first + i)
                out.append(want)
                if d != want:
                    break
            else:
                out.append(self.token(s.request_id, first + len(draft)))
            tokens.append(out)
        return StepResult(tokens, self.duration)


class OracleDrafter:
    """Proposes ``num_tokens`` drafts: each the target's token (of ``target``, a SeededTokenExecutor)
    with probability ``rate`` and a wrong one otherwise, seeded by (seed, request, position)."""

    def __init__(self, target: SeededTokenExecutor, num_tokens: int, rate: float, seed: int = 0) -> None:
        self.target, self.num_tokens, self.rate, self.seed = target, num_tokens, rate, seed

    def propose(self, requests, limits):
        out = []
        for req, n in zip(requests, limits):
            first = len(req.token_ids)
            draft = []
            for i in range(n):
                t = self.target.token(req.request_id, first + i)
                h = hashlib.blake2b(f"{self.seed}/{req.request_id}/{first + i}".encode(), digest_size=8).digest()
                right = int.from_bytes(h, "little") / 2**64 < self.rate
                draft.append(t if right else (t + 1) % self.target.vocab)
            out.append(draft)
        return out
