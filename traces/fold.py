"""``fold``: the block state and computed tokens rebuilt from a log alone.

Event sourcing taken literally: a small state machine of its own (tables, ref counts, free list,
LRU of evictable blocks, the set of cached blocks, reservations, computed tokens) applies each
block operation as the block manager did, so a test can hold it against the live engine after
every step. What a block operation leaves out, fold derives: allocating a cached, unreferenced
block evicts it; a free releases the request's whole table, tail first, and its reservation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from traces.block_runs import block_ids
from traces.events import (
    Aborted,
    Admitted,
    Arrived,
    BlockAllocated,
    BlockCached,
    BlockEvent,
    BlockFreed,
    BlockTrimmed,
    Event,
    Finished,
    Header,
    Preempted,
    PrefixHit,
    Reserved,
    Step,
)
from traces.log_errors import LogError
from traces.speculation import computed_ends

__all__ = ["BlockState", "FoldedState", "fold"]


@dataclass(frozen=True, slots=True)
class BlockState:
    """Comparable snapshot of the block manager (``fold`` builds the same from a log)."""

    tables: dict[int, tuple[int, ...]]
    ref_counts: tuple[int, ...]
    free: tuple[int, ...]
    evictable: tuple[int, ...]  # LRU first
    cached: frozenset[int]  # blocks in the prefix-cache index (in use or evictable)
    reserved: dict[int, int]


@dataclass
class FoldedState:
    num_blocks: int
    step: int = -1
    ref_counts: list[int] = field(default_factory=list)
    free: OrderedDict[int, None] = field(default_factory=OrderedDict)
    evictable: OrderedDict[int, None] = field(default_factory=OrderedDict)
    cached: set[int] = field(default_factory=set)
    tables: dict[int, list[int]] = field(default_factory=dict)
    reserved: dict[int, int] = field(default_factory=dict)
    computed: dict[int, int] = field(default_factory=dict)  # unfinished requests' computed tokens
    evictions: int = 0  # cached blocks taken for reuse so far

    def __post_init__(self) -> None:
        self.ref_counts = [0] * self.num_blocks
        self.free = OrderedDict.fromkeys(range(self.num_blocks))

    def apply_block_event(self, ev: BlockEvent) -> None:
        cls = ev.__class__
        refs = self.ref_counts
        if cls is BlockAllocated:
            rid = ev.request_id  # type: ignore[union-attr]
            blocks = block_ids(ev.runs)  # type: ignore[union-attr]
            free, evictable, cached = self.free, self.evictable, self.cached
            for b in blocks:
                if b in free:
                    del free[b]
                else:  # cached and unreferenced: evicted to be reused
                    del evictable[b]
                    cached.remove(b)
                    self.evictions += 1
                refs[b] = 1
            self.tables.setdefault(rid, []).extend(blocks)
            left = self.reserved.get(rid, 0)
            if left > len(blocks):
                self.reserved[rid] = left - len(blocks)
            elif left:
                del self.reserved[rid]
        elif cls is PrefixHit:
            blocks = block_ids(ev.runs)  # type: ignore[union-attr]
            for b in blocks:
                if refs[b] == 0:
                    del self.evictable[b]
                refs[b] += 1
            self.tables.setdefault(ev.request_id, []).extend(blocks)  # type: ignore[union-attr]
        elif cls is BlockFreed:
            rid = ev.request_id  # type: ignore[union-attr]
            table = self.tables.pop(rid, None)
            if table:
                cached = self.cached
                for b in reversed(table):
                    refs[b] -= 1
                    if refs[b] == 0:
                        (self.evictable if b in cached else self.free)[b] = None
            self.reserved.pop(rid, None)
        elif cls is BlockTrimmed:
            table = self.tables[ev.request_id]  # type: ignore[union-attr]
            keep = ev.num_blocks  # type: ignore[union-attr]
            for b in reversed(table[keep:]):
                refs[b] -= 1
                self.free[b] = None
            del table[keep:]
        elif cls is BlockCached:
            table = self.tables[ev.request_id]  # type: ignore[union-attr]
            self.cached.update(table[i] for i in block_ids(ev.runs))  # type: ignore[union-attr]
        elif cls is Reserved:
            if ev.num_blocks:  # type: ignore[union-attr]
                self.reserved[ev.request_id] = ev.num_blocks  # type: ignore[union-attr]
            else:
                self.reserved.pop(ev.request_id, None)  # type: ignore[union-attr]
        else:
            raise TypeError(f"not a block event: {ev!r}")

    def apply(self, event: Event) -> None:
        if isinstance(event, Step):
            for ev in event.block_events:
                self.apply_block_event(ev)
            for span, end in zip(event.spans, computed_ends(event)):
                self.computed[span.request_id] = end
            self.step = event.step
        elif isinstance(event, Arrived):
            self.computed[event.request_id] = 0
        elif isinstance(event, Admitted):
            self.computed[event.request_id] = event.num_cached_tokens
        elif isinstance(event, Preempted):
            self.computed[event.request_id] = 0
        elif isinstance(event, (Finished, Aborted)):
            for ev in event.block_events:
                self.apply_block_event(ev)
            self.computed.pop(event.request_id, None)

    def block_state(self) -> BlockState:
        return BlockState(
            tables={rid: tuple(t) for rid, t in self.tables.items() if t},
            ref_counts=tuple(self.ref_counts),
            free=tuple(self.free),
            evictable=tuple(self.evictable),
            cached=frozenset(self.cached),
            reserved=dict(self.reserved),
        )


def fold(events: Iterable[Event], upto_step: int | None = None) -> FoldedState:
    """Rebuild engine state from a log, through step ``upto_step`` (all steps when None)."""
    state: FoldedState | None = None
    for event in events:
        if isinstance(event, Header):
            state = FoldedState(event.num_blocks)
            continue
        if state is None:
            raise LogError("a log must start with a Header event")
        stepped = isinstance(event, (Step, Admitted, Preempted))
        if upto_step is not None and stepped and event.step > upto_step:
            break
        state.apply(event)
    if state is None:
        raise LogError("empty log")
    return state
