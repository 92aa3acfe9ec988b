"""LoggedPolicy: a recorded log's decisions played back as the StepPlans the live scheduler made.

For each ``Step`` event it yields the plan (same spans, same order, admissions and preemptions
of that step) with block tables rebuilt from the log's block events, fold-style: the tables an
executor reads are those after the step's scheduling, i.e. before the frees of requests that
finish in the step. Request objects are kept up to date from the log (prompt from ``Arrived``,
recorded tokens appended after each step — teacher forcing, so one wrong token does not derail
the rest), which is what an executor such as the ModelRunner reads. So the log must hold its
prompts' token ids: one recorded with ``--trace-prompts hashes|none`` is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from runtime.engine.request import Request, RequestStatus
from runtime.engine.types import Admission, StepPlan
from traces.events import (
    Aborted,
    Admitted,
    Arrived,
    BlockFreed,
    BlockTrimmed,
    Event,
    Finished,
    Header,
    Preempted,
    Step,
    recorded_prompts,
)
from traces.log import FoldedState, LogError
from traces.prompt import materialize
from traces.speculation import computed_ends


@dataclass(frozen=True)
class LoggedStep:
    plan: StepPlan
    event: Step  # the recorded step: times and committed tokens


class LoggedPolicy:
    def __init__(self, events: Iterable[Event]) -> None:
        self._events = iter(events)
        first = next(self._events, None)
        if not isinstance(first, Header):
            raise LogError("a log must start with a Header event")
        self.header: Header = first
        prompts = recorded_prompts(first)
        if prompts != "ids":  # an executor needs the very tokens the engine ran
            raise LogError(f"this log was recorded with --trace-prompts {prompts}: its prompts hold no token "
                           "ids, and replaying its steps on an executor needs them (record with "
                           "--trace-prompts ids)")
        self.max_model_len = int(first.config.get("scheduler", {}).get("max_model_len", 1 << 30))
        self.state = FoldedState(first.num_blocks)
        self.requests: dict[int, Request] = {}  # unfinished

    def steps(self) -> Iterator[LoggedStep]:
        admitted: list[Admission] = []
        preempted: list[int] = []
        for ev in self._events:
            if isinstance(ev, Step):
                tables = self._apply_step_blocks(ev)
                for s in ev.spans:  # as the live scheduler leaves them while the step executes
                    self._request(s.request_id, ev).num_computed_tokens = s.start
                drafts = None
                if ev.drafts:
                    sampling = [s for s in ev.spans if s.sample]
                    drafts = {s.request_id: d for s, d in zip(sampling, ev.drafts) if d} or None
                plan = StepPlan(ev.step, list(ev.spans), tables, admitted, preempted,
                                sum(s.num_tokens for s in ev.spans), sum(s.sample for s in ev.spans), drafts)
                yield LoggedStep(plan, ev)
                self._commit(ev)
                admitted, preempted = [], []
            elif isinstance(ev, Arrived):
                self.requests[ev.request_id] = Request(
                    ev.request_id, materialize(ev.prompt), ev.params, ev.time, self.max_model_len,
                    ev.priority, self.header.eos_token_id, ev.cache_salt)
            elif isinstance(ev, Admitted):
                req = self._request(ev.request_id, ev)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = req.num_cached_tokens = ev.num_cached_tokens
                admitted.append(Admission(ev.request_id, ev.num_cached_tokens, ev.num_reserved_blocks))
            elif isinstance(ev, Preempted):
                req = self._request(ev.request_id, ev)
                req.status = RequestStatus.WAITING
                req.num_computed_tokens = 0
                req.num_preemptions += 1
                preempted.append(ev.request_id)
            elif isinstance(ev, Finished | Aborted):
                self.state.apply(ev)
                req = self.requests.pop(ev.request_id, None)
                if req is not None:
                    req.status = RequestStatus.FINISHED if isinstance(ev, Finished) else RequestStatus.ABORTED
                    req.finish_reason = ev.reason

    def _request(self, rid: int, ev: Event) -> Request:
        try:
            return self.requests[rid]
        except KeyError:
            raise LogError(f"{type(ev).__name__} of request {rid} before its Arrived event") from None

    def _apply_step_blocks(self, ev: Step) -> list[list[int]]:
        """Apply the step's block events; return the span requests' tables as the executor saw them."""
        state = self.state
        in_step = {s.request_id for s in ev.spans}
        snapshot: dict[int, list[int]] | None = None
        for bev in ev.block_events:
            if snapshot is None and isinstance(bev, BlockFreed | BlockTrimmed) and bev.request_id in in_step:
                snapshot = {rid: list(state.tables.get(rid, ())) for rid in in_step}
            state.apply_block_event(bev)
        if snapshot is None:
            snapshot = {rid: list(state.tables.get(rid, ())) for rid in in_step}
        for s, end in zip(ev.spans, computed_ends(ev)):
            state.computed[s.request_id] = end
        state.step = ev.step
        return [snapshot[s.request_id] for s in ev.spans]

    def _commit(self, ev: Step) -> None:
        """Advance the requests as the live commit did, with the recorded tokens."""
        tokens = iter(ev.tokens)
        for s, end in zip(ev.spans, computed_ends(ev)):
            req = self.requests[s.request_id]
            req.num_computed_tokens = end
            if s.sample:
                req.token_ids.extend(next(tokens))
