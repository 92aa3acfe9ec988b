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
        """Take a request out of the queues and free its KV (abort or finish)."""
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

    def _fit(self, req: Request, n: int, spans: list[Span], preempted: list[int], budget: int,
             drafted: bool = False) -> int:
        """Allocate blocks for ``n`` more tokens of ``req``, preempting while they don't fit; on
        success schedule it (append its span; ``drafted``: a decode and its drafts, which samples).
        A victim's span leaves the step. Returns the budget left: what the step's spans leave of it."""
        preempting = False
        while not self.bm.allocate(req, req.num_computed_tokens + n):
            victim = self.waiting.victim(self.running)
            self._preempt(victim)
            preempted.append(victim.request_id)
            preempting = True
            spans[:] = [s for s in spans if s.request_id != victim.request_id]  # (rare: a scan will do)
            if victim is req:
                break
        else:
            start = req.num_computed_tokens
            spans.append(Span(req.request_id, start, n, drafted or start + n == len(req.token_ids)))
            if not preempting:
                return budget - n
        return self.config.max_num_batched_tokens - sum(s.num_tokens for s in spans)

    # --- the step ----------------------------------------------------------------------------------

    def schedule(self, step: int) -> StepPlan:
        cfg = self.config
        bm = self.bm
        budget = cfg.max_num_batched_tokens  # what is left of it: the step's tokens are the rest
        spans: list[Span] = []
        preempted: list[int] = []
        status = _RUNNING
        tables = bm.tables
        bs = bm.block_size
        running = self.running
        decodes: list[Request] = []  # a running request with one token left, in admission order
        prefills: list[Request] = []
        for req in running.values():
            (decodes if len(req.token_ids) - req.num_computed_tokens == 1 else prefills).append(req)
        drafter = self.drafter
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
                    budget = self._fit(req, 1 + len(draft), spans, preempted, budget, drafted=True)
                    continue
                del drafts[req.request_id]
            if computed < len(tables[req.request_id]) * bs:  # its block already exists
                spans.append(Span(req.request_id, computed, 1, True))
                budget -= 1
            else:
                budget = self._fit(req, 1, spans, preempted, budget)
        if prefills:  # continuing prefills (a snapshot: _fit may preempt)
            chunked = cfg.enable_chunked_prefill
            for req in prefills:
                if budget <= 0:
                    break
                if req.status is not status:
                    continue
                remaining = len(req.token_ids) - req.num_computed_tokens
                if remaining <= budget:
                    budget = self._fit(req, remaining, spans, preempted, budget)
                elif chunked:
                    budget = self._fit(req, budget, spans, preempted, budget)

        admitted: list[Admission] = []
        if preempted:  # no admission in a step that preempted (victims left with their spans)
            gone = set(preempted)
            if drafts:
                drafts = {rid: d for rid, d in drafts.items() if rid not in gone}
        elif budget > 0 and len(running) < cfg.max_num_seqs and len(self.waiting):
            budget = self._admit(budget, spans, admitted)
        block_tables = [tables[s.request_id] for s in spans]
        # without prefills or admissions every span decodes, so samples (the count most steps take)
        sampling = len(spans) if not prefills and not admitted else sum(s.sample for s in spans)
        return StepPlan(step, spans, block_tables, admitted, preempted, cfg.max_num_batched_tokens - budget,
                        sampling, drafts or None)

    def decode_run(self, plan: StepPlan) -> int:
        """How many steps, ``plan`` (the last planned) the first, this scheduler would plan as plain
        decodes of exactly its requests if nothing arrived and no token value mattered: ``plan``
        decodes every running request one token and nothing waits; the run ends before the step
        that would end a request by its length or find no block for one (a preemption). 0 if
        ``plan`` is not such a step. (A simulator lands such runs at once.)"""
        spans, running = plan.spans, self.running
        if (self.drafter is not None or len(self.waiting) or plan.admitted or plan.preempted
                or len(spans) != len(running)):
            return 0
        run = 1 << 30
        for s in spans:
            if s.num_tokens != 1 or not s.sample:
                return 0
            req = running[s.request_id]
            run = min(run, req.max_total_tokens - len(req.token_ids) - 1)  # the step that ends it ends the run
        return self.bm.decode_steps_that_fit([(s.request_id, s.start) for s in spans], run)

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
