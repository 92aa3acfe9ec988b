"""EngineCore: add_request / abort / step(now, executor) = schedule → execute → commit.

``commit`` = ``advance`` (what needs no token values) + ``complete`` (the values): StepLoop
(runtime/engine/step_loop.py) plans the next step between the two when the values can't change it.

No torch, no clock, no global state: ``now`` is passed in by the driver (wall clock when live,
``env.now`` in the simulator), ids come from a per-engine counter, and every decision is emitted
as a typed event to ``sink`` (a log writer, a list, or None; what it keeps of a prompt:
``trace_prompts``, runtime/engine/prompt_record.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.engine.admission import check_cache_salt, validate_request
from runtime.engine.block_manager import BlockManager, root_hash
from runtime.engine.config import EngineConfig
from runtime.engine.drafters import Drafter, make_drafter, may_draft_next, parse_speculative
from runtime.engine.prompt_record import PromptRecorder
from runtime.engine.request import Request, RequestStatus, TextStop
from runtime.engine.scheduler import Scheduler
from runtime.engine.types import PLACEHOLDER, EventSink, Executor, RequestDelta, StepOutput, StepPlan, StepResult
from traces.events import Aborted, Admitted, Arrived, Finished, Preempted, Rejected, Span, Step
from traces.params import InvalidRequest, SamplingParams
from traces.prompt import Prompt, PromptIds, materialize

_FINISHED = RequestStatus.FINISHED  # (an enum member read once: a class attribute lookup costs)


class EngineCore:
    def __init__(
        self, config: EngineConfig, *, eos_token_id: int | None = None, sink: EventSink | None = None,
        trace_prompts: str = "ids", drafter: Drafter | None = None,
    ) -> None:
        """``drafter``: who proposes speculative drafts, when ``config.speculative`` is on; the
        pure ones (``ngram``) are built from the config when none is given."""
        self.config = config
        self.eos_token_id = eos_token_id
        self.sink = sink
        cache = config.cache
        self.block_manager = BlockManager(cache.num_blocks, cache.block_size, cache.enable_prefix_caching,
                                          root_hash(config.model_identity, cache.hash_salt))
        self.prompts = PromptRecorder(trace_prompts, self.block_manager, config.scheduler.max_model_len)
        spec = parse_speculative(config.speculative)
        if drafter is None and spec is not None:
            drafter = make_drafter(spec)
        self.scheduler = Scheduler(config.scheduler, self.block_manager, drafter)
        self.requests: dict[int, Request] = {}  # unfinished requests
        self._watched = 0  # of those, how many a token value may matter to (``overlappable``)
        self._next_request_id = 0
        self._next_step = 0
        self._planned: dict[int, float] = {}  # steps planned, not yet completed: when they were planned
        # of those, the ones ``advance`` took: their block events, the requests it ended, the tokens it wrote
        self._advanced: dict[int, tuple[list, list[Request], list[list[int]] | None]] = {}

    @property
    def drafter(self) -> Drafter | None:
        """Who proposes speculative drafts (None: no speculation)."""
        return self.scheduler.drafter

    @drafter.setter
    def drafter(self, drafter: Drafter | None) -> None:
        """Between steps, with none in flight: a profile sweep speculates only in its verify cases."""
        self.scheduler.drafter = drafter

    # --- requests ------------------------------------------------------------------------------

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise InvalidRequest if a request could never be served by this engine."""
        validate_request(self.config, num_prompt_tokens, params)

    def add_request(
        self,
        prompt: Prompt | Sequence[int],
        params: SamplingParams,
        now: float,
        priority: int = 0,
        cache_salt: str | None = None,
        text_stop: TextStop | None = None,  # its stop strings' matcher, from a caller that owns its text
    ) -> int:
        record = prompt if isinstance(prompt, Prompt) else PromptIds(list(prompt))
        token_ids = materialize(record)
        try:
            self.validate(len(token_ids), params)
            if cache_salt is not None:
                check_cache_salt(cache_salt)
        except InvalidRequest as e:  # logged, so a report counts it instead of silently dropping it
            self._reject(record, len(token_ids), params, now, priority, str(e))
            raise
        rid = self._next_request_id
        req = Request(rid, token_ids, params, now, self.config.scheduler.max_model_len, priority,
                      self.eos_token_id, cache_salt, text_stop)
        if self.sink is not None:
            try:  # before the request joins: one its log refuses leaves the engine as it was
                self.sink(Arrived(time=now, request_id=rid, prompt=self.prompts.arrived(record, req), params=params,
                                  priority=priority, cache_salt=cache_salt))
            except BaseException:
                self.block_manager.forget(req)  # prompt hashes memoized under an id not handed out
                raise
        self._next_request_id += 1
        self.requests[rid] = req
        self._watched += req.token_may_matter
        self.scheduler.add(req)
        return rid

    def _reject(self, record: Prompt, num_tokens: int, params: SamplingParams, now: float, priority: int,
                reason: str) -> None:
        """Write the ``Rejected`` event of a refused request (no id is handed out for it)."""
        if self.sink is not None:
            self.sink(Rejected(time=now, num_prompt_tokens=num_tokens, params=params, reason=reason, priority=priority,
                               prompt=self.prompts.rejected(record, num_tokens)))

    def abort(self, request_id: int, now: float, reason: str = "abort") -> bool:
        """Abort an unfinished request at any status; False (no-op) if unknown or done."""
        return self._end(request_id, now, reason, RequestStatus.ABORTED)

    def finish(self, request_id: int, now: float, reason: str = "stop") -> bool:
        """Finish a request between steps, for a reason of the caller's (a stop string: ``text_stop``)."""
        return self._end(request_id, now, reason, RequestStatus.FINISHED)

    def _end(self, request_id: int, now: float, reason: str, status: RequestStatus) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self._watched -= req.token_may_matter
        self.scheduler.remove(req)
        req.status = status
        req.finish_reason = reason
        events = self.block_manager.drain_events()
        if self.sink is not None:
            if status is RequestStatus.ABORTED:
                self.sink(Aborted(time=now, request_id=request_id, reason=reason, block_events=events))
            else:
                self.sink(Finished(time=now, request_id=request_id, reason=reason,
                                   num_output_tokens=req.num_output_tokens, block_events=events))
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_requests_added(self) -> int:
        """Request ids handed out so far (ids are 0, 1, 2, ...)."""
        return self._next_request_id

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # --- the step ----------------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """Plan the next step. Its Admitted / Preempted events are written by ``complete``, just
        before its Step event, so a log reads the same whether or not steps overlap."""
        plan = self.scheduler.schedule(self._next_step)
        if not plan.spans:  # (``empty``, without a property call: this runs once a step)
            return plan
        self._next_step += 1
        self._planned[plan.step] = now
        return plan

    def overlappable(self, plan: StepPlan) -> bool:
        """True when no token this step samples can change the next schedule or the executor's
        next inputs (see ``Request.next_token_matters``): then the next step may be planned and
        launched before these tokens reach the host, and the log stays what a sequential run writes."""
        requests = self.requests
        if self.drafter is not None and plan.num_sampling and may_draft_next(self.drafter, plan, requests):
            return False  # the next drafts follow these tokens
        if not self._watched:  # no unfinished request's token values matter
            return True
        for s in plan.spans:
            if s.sample:
                req = requests[s.request_id]
                if req.token_may_matter and req.next_token_matters():
                    return False
        return True

    def commit(self, plan: StepPlan, result: StepResult, start: float, deltas: bool = True) -> list[RequestDelta]:
        """Apply the executor's result: ``advance`` then ``complete``, the one way a step is applied
        (a step overlapped with the next one's planning runs the two apart). ``deltas=False``: return
        none (a caller that reads only the log, like the simulator)."""
        self.advance(plan, result.token_ids)
        return self.complete(plan, result, start, deltas)

    def advance(self, plan: StepPlan, known: list[list[int]] | None = None) -> None:
        """Everything a step's commit does that doesn't need its token values: advance the spans,
        cache blocks that became full, reserve a placeholder for each sampled token and end the
        requests that reach their length limit (their KV is freed; ``complete`` reports them).

        ``known``: the step's tokens when they are known already (a simulator's), one each: written
        instead of the placeholders, so that ``complete``, given these tokens, need not visit the
        spans again while no token value can end a request (given others, it writes those)."""
        bm = self.block_manager
        bs = bm.block_size
        requests = self.requests
        finished: list[Request] = []
        if known is not None and not _one_token_each(known):
            known = None
        k = 0  # sampling spans so far
        drafts = plan.drafts
        for span in plan.spans:
            req = requests[span.request_id]
            n = span.num_tokens
            if drafts is not None and span.request_id in drafts:  # its last token's KV, the drafts' in complete
                n -= len(drafts[span.request_id])
            computed = req.num_computed_tokens = span.start + n
            if computed % bs < n:  # a block became full (its end is in the span): cache it
                bm.register_computed(req)
            if span.sample:
                token_ids = req.token_ids
                token_ids.append(PLACEHOLDER if known is None else known[k][0])
                k += 1
                if len(token_ids) >= req.max_total_tokens:
                    self._ended_in_step(req, finished)
        if known is not None and k != len(known):
            known = None  # not one token list per sampling span: complete checks them all
        self._advanced[plan.step] = (bm.drain_events(), finished, known)

    def complete(self, plan: StepPlan, result: StepResult, start: float, deltas: bool = True) -> list[RequestDelta]:
        """Write the sampled tokens over their placeholders, apply token stops, emit the step's events
        (``deltas=False``: return none, as ``commit``)."""
        end = start + result.duration
        requests = self.requests
        planned = self._planned.pop(plan.step)
        block_events, finished, known = self._advanced.pop(plan.step)
        drafts = plan.drafts
        if known is not None and not deltas and not self._watched and drafts is None and known == result.token_ids:
            # advance wrote these tokens, one each, and no token value ends a request: its length did
            # (most steps of a simulation)
            for req in finished:
                req.finish_reason = "length"
            self._retire(plan, planned, start, end, known, len(known), None, block_events, finished,
                         result.device_time)
            return []
        out: list[RequestDelta] = []
        token_ids_of = result.token_ids
        k = 0  # sampling spans so far
        cut: dict[int, list[int]] = {}  # k -> what is kept of a sampling span's tokens a stop cut short
        logprobs = result.logprobs if deltas else None
        stopped_by_value = speculated = False
        for span in plan.spans:
            if not span.sample:
                continue
            req = requests[span.request_id]
            new = token_ids_of[k]
            if not new:
                raise ValueError(f"the executor returned no token for request {span.request_id}'s sampling span")
            token_ids = req.token_ids
            if len(new) == 1 and not req.stops_on_token:  # what check_stop says of it: only its length
                token_ids[-1] = new[0]  # over the placeholder advance() reserved
                reason = "length" if len(token_ids) >= req.max_total_tokens else None
            else:
                slot = len(token_ids) - 1
                reason = None
                for i, token in enumerate(new):
                    if i == 0:
                        token_ids[slot] = token
                    else:
                        token_ids.append(token)
                    reason = req.check_stop(token)
                    if reason is not None:
                        if i + 1 < len(new):
                            new = cut[k] = new[: i + 1]
                        break
            if req.text_stop is not None and (kept := req.text_stop.add(new)) is not None:  # as a stop token
                reason = "stop"
                if kept < len(new):  # the round's tokens past the stop string's are cut
                    del token_ids[len(token_ids) - len(new) + kept:]
                    new = cut[k] = new[:kept]
            if drafts is not None and span.request_id in drafts:
                self._land_drafts(req, span, drafts[span.request_id], token_ids_of[k], reason)
                speculated = True
            if deltas:
                lps = logprobs[k] if logprobs is not None else None
                out.append(RequestDelta(span.request_id, new, reason, lps[: len(new)] if lps is not None else None))
            k += 1
            if reason is not None:
                req.finish_reason = reason
                if req.status is not _FINISHED:  # not ended by advance(): a token stop
                    stopped_by_value = True
                    self._ended_in_step(req, finished)
        if stopped_by_value and plan.step != self._next_step - 1:
            raise RuntimeError(f"step {plan.step} stopped a request on a token value, but a later step "
                               "was already planned: it should not have been overlapped")
        if stopped_by_value or speculated:
            block_events = block_events + self.block_manager.drain_events()
        self._retire(plan, planned, start, end, token_ids_of, k, cut, block_events, finished, result.device_time)
        return out

    def _land_drafts(self, req: Request, span: Span, drafts: list[int], new: list[int], reason: str | None) -> None:
        """A speculating span's commit beyond ``advance``'s: the accepted drafts' KV counts as
        computed (their full blocks cached), the blocks past the next token's slot are given back."""
        if len(new) > len(drafts) + 1 or new[:-1] != drafts[: len(new) - 1]:
            raise ValueError(f"the executor committed {new} for request {span.request_id}, whose drafts were "
                             f"{drafts}: it must commit a prefix of the drafts and at most one token more")
        if reason is not None:  # ended in this round: its KV is freed already
            return
        bm = self.block_manager
        req.num_computed_tokens = span.start + len(new)
        bm.register_computed(req)
        bm.trim(req, req.num_computed_tokens + 1)

    # --- steps applied elsewhere -------------------------------------------------------------------

    @property
    def tokens_matter(self) -> bool:
        """Whether any unfinished request's token values can change what is planned next (a stop on
        a value, penalties, drafts): while not, a run of decode steps is only lengths and blocks."""
        return bool(self._watched) or self.drafter is not None

    def landed(self, plan: StepPlan, num_steps: int) -> None:
        """``plan``, the last step planned, and the ``num_steps - 1`` decode steps after it were
        applied at once by a decode run (the simulator's, through the scheduler's and the block
        manager's own rules): the next step planned is the one after them."""
        if plan.step != self._next_step - 1:
            raise RuntimeError(f"a decode run from step {plan.step}, but step {self._next_step - 1} was planned")
        del self._planned[plan.step]  # (no Admitted or Preempted to write: when it was planned is not needed)
        self._next_step = plan.step + num_steps

    def _ended_in_step(self, req: Request, finished: list[Request]) -> None:
        """``req`` is done (its KV freed); the commit reports it."""
        self.scheduler.remove(req)
        req.status = _FINISHED
        finished.append(req)

    def _retire(self, plan: StepPlan, planned, start: float, end: float, token_ids_of: list[list[int]], k: int,
                cut: dict[int, list[int]] | None, block_events, finished: list[Request],
                device_time: float | None) -> None:
        """The end of a commit: forget the finished requests, emit the step with the tokens kept
        (most steps all of the executor's, no copy; ``cut``: spans a stop cut short; ``k``: the
        sampling spans)."""
        requests = self.requests
        for req in finished:
            del requests[req.request_id]
            self._watched -= req.token_may_matter
        if cut or k != len(token_ids_of):
            token_ids_of = [cut.get(i, t) for i, t in enumerate(token_ids_of[:k])] if cut else token_ids_of[:k]
        self._emit(plan, planned, start, end, token_ids_of, block_events, finished, device_time)

    def _emit(self, plan: StepPlan, planned: float, start: float, end: float, committed: list[list[int]],
              block_events: list, finished: list[Request], device_time: float | None) -> None:
        """Write a completed step's events: its preemptions and admissions (as of when it was planned),
        the Step, and the requests it finished."""
        sink = self.sink
        if sink is None:
            return
        for rid in plan.preempted:
            sink(Preempted(time=planned, step=plan.step, request_id=rid))
        for a in plan.admitted:
            sink(Admitted(time=planned, step=plan.step, request_id=a.request_id, num_cached_tokens=a.num_cached_tokens,
                          num_reserved_blocks=a.num_reserved_blocks))
        drafts = plan.drafts
        sink(Step(step=plan.step, start=start, end=end, spans=plan.spans, tokens=committed,
                  block_events=block_events,
                  drafts=[] if drafts is None else [drafts.get(s.request_id, []) for s in plan.spans if s.sample],
                  device_time=device_time))
        for req in finished:
            sink(Finished(time=end, request_id=req.request_id, reason=req.finish_reason,  # type: ignore[arg-type]
                          num_output_tokens=req.num_output_tokens))

    def step(self, now: float, executor: Executor) -> StepOutput:
        plan = self.schedule(now)
        if plan.empty:
            return StepOutput(plan, None, [])
        result = executor.execute(plan, self.requests)
        return StepOutput(plan, result, self.commit(plan, result, now))


def _one_token_each(token_lists: list[list[int]]) -> bool:
    """Whether there is at least one list and every list holds one token. (A simulator's lists are
    one list repeated: ``count`` says so at C speed, without building a set of lengths.)"""
    first = token_lists[0] if token_lists else None
    return first is not None and ((len(first) == 1 and token_lists.count(first) == len(token_lists))
                                  or set(map(len, token_lists)) == {1})

