"""Continuous-batching scheduler: one token budget per step.

Order of a step
1. decode: every running request with one token left gets it (allocating a block when it
   crosses a block boundary); when blocks run out the policy's victim (FCFS: the most recently
   admitted request) is preempted by recompute. With a drafter (speculative decoding,
   runtime/engine/drafters.py) each decode also verifies the drafts proposed for it: its span is
   1 + len(drafts) tokens of the budget (drafts cut to what the budget has left);
2. continuing prefill chunks of running requests;
3. admission of waiting requests (in the order of the policy, runtime/engine/policies.py) while
   budget, sequence slots and KV capacity allow. With chunked prefill off, a prompt's whole
   uncached remainder must fit the remaining budget or it stays waiting (head of line). No
   admission in a step that preempted.
"""

from __future__ import annotations

from runtime.engine.block_manager import BlockManager
from runtime.engine.config import SchedulerConfig
from runtime.engine.drafters import Drafter
from runtime.engine.policies import make_policy
from runtime.engine.request import Request, RequestStatus
from runtime.engine.types import Admission, StepPlan
from traces.events import Span

_RUNNING = RequestStatus.RUNNING  # (an enum member read once: a class attribute lookup costs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, drafter: Drafter | None = None) -> None:
        self.config = config
        self.bm = block_manager
        self.drafter = drafter
        self.waiting = make_policy(config.policy)
        self.running: dict[int, Request] = {}  # admission order
        self._admit_counter = 0

    def add(self, req: Request) -> None:
        self.waiting.push(req)

    def remove(self, req: Request) -> None:
        """Take a request out of the queues and release its KV (abort or finish)."""
        if self.running.pop(req.request_id, None) is None:
            self.waiting.remove(req)
        self.bm.free(req)
        self.bm.forget(req)

    # --- preemption ------------------------------------------------------------------------------

    def _preempt(self, req: Request) -> None:
        del self.running[req.request_id]
        self.bm.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.push(req, front=True)

    def _fit(self, req: Request, n: int, spans: list[Span], preempted: list[int], drafted: bool = False) -> int:
        """Allocate blocks for ``n`` more tokens of ``req``, preempting while they don't fit; on
        success schedule it (append its span; ``drafted``: a decode and its drafts, which samples).

        Returns the net budget used: ``n`` if scheduled, minus what un-scheduled victims gave back
        (their spans are dropped by ``schedule``).
        """
        used = 0
        while not self.bm.allocate(req, req.num_computed_tokens + n):
            victim = self.waiting.victim(self.running)
            self._preempt(victim)
            vid = victim.request_id
            preempted.append(vid)
            used -= next((s.num_tokens for s in spans if s.request_id == vid), 0)  # (rare: a scan will do)
            if victim is req:
                return used
        start = req.num_computed_tokens
        spans.append(Span(req.request_id, start, n, drafted or start + n == len(req.token_ids)))
        return used + n

    # --- the step ----------------------------------------------------------------------------------

    def schedule(self, step: int) -> StepPlan:
        cfg = self.config
        bm = self.bm
        budget = cfg.max_num_batched_tokens  # what is left of it: the step's tokens are the rest
        spans: list[Span] = []
        block_tables: list[list[int]] = []  # of the spans, while only the fast path adds them
        preempted: list[int] = []
        status = _RUNNING
        tables = bm.tables
        bs = bm.block_size
        running = self.running
        # decodes (a running request with one token left), in admission order: the fast path right
        # here (its block exists); from the first that needs a block on, in order in the loop below
        decodes: list[Request] = []
        prefills: list[Request] = []
        drafter = self.drafter
        for req in running.values():
            computed = req.num_computed_tokens
            if len(req.token_ids) - computed != 1:
                prefills.append(req)
            elif decodes or budget <= 0 or drafter or computed >= len(table := tables[req.request_id]) * bs:
                decodes.append(req)
            else:
                spans.append(Span(req.request_id, computed, 1, True))
                block_tables.append(table)
                budget -= 1

        drafts: dict[int, list[int]] | None = None
        if drafter is not None and decodes:
            drafts = self._drafts(drafter, decodes, budget)
        for req in decodes:
            if budget <= 0:
                break
            if req.status is not status:  # preempted earlier in this step
                continue
            computed = req.num_computed_tokens
            if drafts and (draft := drafts.get(req.request_id)):
                if len(draft) >= budget:  # the budget holds the decode and what is left of the drafts
                    draft = drafts[req.request_id] = draft[: budget - 1]
                if draft:
                    budget -= self._fit(req, 1 + len(draft), spans, preempted, drafted=True)
                    continue
                del drafts[req.request_id]
            if computed < len(tables[req.request_id]) * bs:  # its block already exists
                spans.append(Span(req.request_id, computed, 1, True))
                budget -= 1
            else:
                budget -= self._fit(req, 1, spans, preempted)
        if prefills:  # continuing prefills (a snapshot: _fit may preempt)
            chunked = cfg.enable_chunked_prefill
            for req in prefills:
                if budget <= 0:
                    break
                if req.status is not status:
                    continue
                remaining = len(req.token_ids) - req.num_computed_tokens
                if remaining <= budget:
                    budget -= self._fit(req, remaining, spans, preempted)
                elif chunked:
                    budget -= self._fit(req, budget, spans, preempted)

        admitted: list[Admission] = []
        if preempted:  # no admission in a step that preempted; victims lose their spans
            gone = set(preempted)
            spans = [s for s in spans if s.request_id not in gone]
            if drafts:
                drafts = {rid: d for rid, d in drafts.items() if rid not in gone}
        elif budget > 0 and len(running) < cfg.max_num_seqs and len(self.waiting):
            budget = self._admit(budget, spans, admitted)
        if len(block_tables) != len(spans) or preempted:
            block_tables = [tables[s.request_id] for s in spans]
        # without prefills or admissions every span decodes, so samples (the count most steps take)
        sampling = len(spans) if not prefills and not admitted else sum(s.sample for s in spans)
        return StepPlan(step, spans, block_tables, admitted, preempted, cfg.max_num_batched_tokens - budget,
                        sampling, drafts or None)

    @staticmethod
    def _drafts(drafter: Drafter, decodes: list[Request], budget: int) -> dict[int, list[int]]:
        """The drafter's proposals for the decodes (request id -> drafts; none empty), each at most
        what its length limit leaves after the decode's own token and what the budget could hold."""
        k = drafter.num_tokens
        cap = budget - len(decodes)  # drafts that could fit beside every decode's own token
        limits = [max(0, min(k, cap, req.max_total_tokens - len(req.token_ids) - 1)) for req in decodes]
        if not any(limits):
            return {}
        proposed = drafter.propose(decodes, limits)
        return {req.request_id: list(d[:n]) for req, d, n in zip(decodes, proposed, limits) if n and d}

    def _admit(self, budget: int, spans: list[Span], admitted: list[Admission]) -> int:
        """Admit waiting requests (policy order) while budget, sequence slots and KV capacity allow;
        returns the budget left."""
        cfg = self.config
        bm = self.bm
        waiting = self.waiting
        chunked = cfg.enable_chunked_prefill
        while len(waiting) and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting.peek()
            hits = bm.probe(req)
            cached = len(hits) * bm.block_size
            remaining = req.num_tokens - cached
            if remaining <= budget:
                n = remaining
            elif chunked:
                n = budget
            else:
                break
            reserved = bm.admit(req, hits, n, cfg.reserve_full_prompt)
            if reserved is None:
                break
            waiting.pop()
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = cached
            req.num_cached_tokens = cached
            req.admit_seq = self._admit_counter
            self._admit_counter += 1
            self.running[req.request_id] = req
            ok = bm.allocate(req, cached + n)
            assert ok, "admission reserved the blocks of its first chunk"
            spans.append(Span(req.request_id, cached, n, cached + n == len(req.token_ids)))
            admitted.append(Admission(req.request_id, cached, reserved))
            budget -= n
        return budget
