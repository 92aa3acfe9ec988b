"""Schema 1 of the log, read and converted to today's events (``upgrade``).

Schema 1 wrote one block event per block, hashes included: ``["alloc", rid, block]``,
``["free", rid, block]`` (tail first), ``["cache", block, hash]``, ``["evict", block, hash]``,
``["hit", rid, block]``, ``["reserve", rid, n]`` (0 at a free). Every other event is the same in
both schemas. An ``Upgrader``, fed a log's events in order, turns the per-block events of each Step
(or Finished, Aborted) into the operations today's block manager emits for the same calls:
consecutive allocations (hits) of one request → one ``alloc`` (``hit``) with runs, consecutive
registrations of one request's blocks → one ``cache`` with runs of their positions in its table
(it remembers where each allocated block went), a request's frees and the freeing of its
reservation → one ``free``; evictions and hashes are left out (``fold`` derives the first; the
second is a function of the tokens). ``fold`` of the result equals schema 1's ``fold`` of the
original, block for block.
"""

from __future__ import annotations

import msgspec

from traces import events as v2
from traces.block_runs import extend_runs
from traces.events import Admitted, Arrived, Header, Preempted, Rejected, Span

__all__ = ["EventV1", "Upgrader"]


class _BlockEvent(msgspec.Struct, array_like=True, tag_field="type", frozen=True):
    pass


class BlockAllocated(_BlockEvent, tag="alloc"):
    request_id: int
    block: int


class BlockFreed(_BlockEvent, tag="free"):
    request_id: int
    block: int


class BlockCached(_BlockEvent, tag="cache"):
    block: int
    hash: int


class BlockEvicted(_BlockEvent, tag="evict"):
    block: int
    hash: int


class PrefixHit(_BlockEvent, tag="hit"):
    request_id: int
    block: int


class Reserved(_BlockEvent, tag="reserve"):
    request_id: int
    num_blocks: int


BlockEventV1 = BlockAllocated | BlockFreed | BlockCached | BlockEvicted | PrefixHit | Reserved


class _Event(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    pass


class Step(_Event, tag="Step"):
    step: int
    start: float
    end: float
    spans: list[Span]
    tokens: list[list[int]]
    block_events: list[BlockEventV1] = []


class Finished(_Event, tag="Finished"):
    time: float
    request_id: int
    reason: str
    num_output_tokens: int
    block_events: list[BlockEventV1] = []


class Aborted(_Event, tag="Aborted"):
    time: float
    request_id: int
    reason: str
    block_events: list[BlockEventV1] = []


EventV1 = Header | Arrived | Admitted | Preempted | Step | Finished | Aborted | Rejected


class Upgrader:
    """Schema-1 events → today's, in log order (see the module docstring). It remembers where each
    allocated block sits in its request's table: a schema-1 ``cache`` names the block, today's the
    request and the position."""

    def __init__(self) -> None:
        self._where: dict[int, tuple[int, int]] = {}  # allocated block -> (request, position)
        self._length: dict[int, int] = {}  # request -> blocks in its table

    def block_events(self, events: list[BlockEventV1]) -> list[v2.BlockEvent]:
        ops: list[v2.BlockEvent] = []
        where, length = self._where, self._length
        for ev in events:
            last = ops[-1] if ops else None
            cls = type(ev)
            if cls is BlockAllocated or cls is PrefixHit:
                rid = ev.request_id  # type: ignore[union-attr]
                n = length.get(rid, 0)
                length[rid] = n + 1
                if cls is BlockAllocated:
                    where[ev.block] = (rid, n)
                kind = v2.BlockAllocated if cls is BlockAllocated else v2.PrefixHit
                if type(last) is kind and last.request_id == rid:  # type: ignore[union-attr]
                    extend_runs(last.runs, (ev.block,))  # type: ignore[union-attr]
                else:
                    ops.append(kind(rid, [ev.block, 1]))
            elif cls is BlockCached:
                rid, position = where[ev.block]
                if type(last) is v2.BlockCached and last.request_id == rid:  # type: ignore[union-attr]
                    extend_runs(last.runs, (position,))  # type: ignore[union-attr]
                else:
                    ops.append(v2.BlockCached(rid, [position, 1]))
            elif cls is BlockFreed or (cls is Reserved and ev.num_blocks == 0):
                rid = ev.request_id  # type: ignore[union-attr]
                length.pop(rid, None)
                if not (type(last) is v2.BlockFreed and last.request_id == rid):  # type: ignore[union-attr]
                    ops.append(v2.BlockFreed(rid))
            elif cls is Reserved:
                ops.append(v2.Reserved(ev.request_id, ev.num_blocks))
            # BlockEvicted: the allocation of that block that follows it says as much
        return ops

    def __call__(self, event: EventV1) -> v2.Event:
        """A schema-1 event as today's event (the same object when nothing changed)."""
        cls = type(event)
        if cls is Step:
            return v2.Step(step=event.step, start=event.start, end=event.end, spans=event.spans,
                           tokens=event.tokens, block_events=self.block_events(event.block_events))
        if cls is Finished:
            return v2.Finished(time=event.time, request_id=event.request_id, reason=event.reason,
                               num_output_tokens=event.num_output_tokens,
                               block_events=self.block_events(event.block_events))
        if cls is Aborted:
            return v2.Aborted(time=event.time, request_id=event.request_id, reason=event.reason,
                              block_events=self.block_events(event.block_events))
        return event  # type: ignore[return-value]
