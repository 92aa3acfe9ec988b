"""A log's decisions, step by step: what ``minivllm regress`` holds two logs against.

One ``StepDecisions`` per Step event: the admissions and preemptions planned for it (logged just
before it), its spans and block events, its tokens (kept apart: they depend on the model, the
schedule does not), and the requests that ended after it, before the next step (``ended``:
finishes at the step's end, stop strings and aborts between steps, with their block events).
Streamed: two multi-gigabyte logs are compared a step at a time.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import msgspec

from traces.events import Aborted, Admitted, Arrived, Event, Finished, Header, Preempted, Rejected, Step

# the parts of a step that are decisions, in the order a report names the first that differs
DECISION_FIELDS = ("admitted", "preempted", "spans", "block_events", "ended")


@dataclass(slots=True)
class StepDecisions:
    step: int
    admitted: list[tuple[int, int, int]] = field(default_factory=list)  # request, cached tokens, reserved blocks
    preempted: list[int] = field(default_factory=list)
    spans: list[tuple[int, int, int, bool]] = field(default_factory=list)  # request, start, tokens, samples
    block_events: list[tuple] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    ended: list[tuple] = field(default_factory=list)  # (kind, request, reason, output tokens, block events)

    def differing(self, other: StepDecisions) -> list[str]:
        """The decision fields (``DECISION_FIELDS``) whose values differ from ``other``'s."""
        return [f for f in DECISION_FIELDS if getattr(self, f) != getattr(other, f)]


def _blocks(events: Iterable) -> list[tuple]:
    return [(type(e).__name__, *msgspec.structs.astuple(e)) for e in events]


@dataclass
class LogInventory:
    """What a pass over a log counted besides its steps: requests offered, lifecycle and block event
    counts, and one digest per arrived request (its prompt, params and priority) in id order."""

    header: Header | None = None
    counts: Counter = field(default_factory=Counter)
    requests: dict[int, tuple[float, str]] = field(default_factory=dict)  # id -> (arrival, digest)


def step_decisions(events: Iterable[Event], inventory: LogInventory | None = None) -> Iterator[StepDecisions]:
    """The decisions of each step of ``events``, in order; fills ``inventory`` on the way."""
    inv = inventory if inventory is not None else LogInventory()
    counts = inv.counts
    upcoming = StepDecisions(-1)  # admissions / preemptions of the next Step
    current: StepDecisions | None = None
    for ev in events:
        if isinstance(ev, Step):
            if current is not None:
                yield current
            current, upcoming = upcoming, StepDecisions(-1)
            current.step = ev.step
            current.spans = [(s.request_id, s.start, s.num_tokens, s.sample) for s in ev.spans]
            current.block_events = _blocks(ev.block_events)
            current.tokens = ev.tokens
            counts["steps"] += 1
            counts["scheduled_tokens"] += sum(s.num_tokens for s in ev.spans)
            counts.update(f"block {type(b).__name__}" for b in ev.block_events)
        elif isinstance(ev, Admitted):
            upcoming.admitted.append((ev.request_id, ev.num_cached_tokens, ev.num_reserved_blocks))
            counts["admissions"] += 1
        elif isinstance(ev, Preempted):
            upcoming.preempted.append(ev.request_id)
            counts["preemptions"] += 1
        elif isinstance(ev, Finished | Aborted):
            kind = "finished" if isinstance(ev, Finished) else "aborted"
            n = ev.num_output_tokens if isinstance(ev, Finished) else -1
            ended = (kind, ev.request_id, ev.reason, n, _blocks(ev.block_events))
            (current if current is not None else upcoming).ended.append(ended)
            counts[kind] += 1
            counts.update(f"block {type(b).__name__}" for b in ev.block_events)
        elif isinstance(ev, Arrived):
            inv.requests[ev.request_id] = (ev.time, _digest(ev))
            counts["arrived"] += 1
        elif isinstance(ev, Rejected):
            counts["rejected"] += 1
        elif isinstance(ev, Header) and inv.header is None:
            inv.header = ev
    if current is not None:
        yield current
    elif upcoming.ended or upcoming.admitted:  # a log without a step that still decided something
        yield upcoming


def _digest(ev: Arrived) -> str:
    """The request as offered (not when): equal digests, equal requests."""
    body = msgspec.json.encode((ev.prompt, ev.params, ev.priority, ev.cache_salt))
    return hashlib.blake2b(body, digest_size=12).hexdigest()
