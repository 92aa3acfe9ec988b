"""Event log: streaming JSON Lines writer/reader (gzip when the path ends in .gz) and ``fold``.

``fold(events)`` is event sourcing taken literally: it rebuilds the block state (tables, ref
counts, free list, LRU, cache index, reservations) and the computed tokens of every request
from the log alone, with its own small state machine, so a test can hold it against the live
engine after every step.
"""

from __future__ import annotations

import gzip
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import msgspec

from traces.events import (
    SCHEMA_VERSION,
    Aborted,
    Admitted,
    Arrived,
    BlockAllocated,
    BlockCached,
    BlockEvent,
    BlockEvicted,
    BlockFreed,
    Event,
    Finished,
    Header,
    Preempted,
    PrefixHit,
    Reserved,
    Step,
)


@dataclass(frozen=True, slots=True)
class BlockState:
    """Comparable snapshot of the block manager (``fold`` builds the same from a log)."""

    tables: dict[int, tuple[int, ...]]
    ref_counts: tuple[int, ...]
    free: tuple[int, ...]
    evictable: tuple[int, ...]
    cache: dict[int, int]
    reserved: dict[int, int]


class LogError(ValueError):
    """A log file is malformed; the message names the file and line."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def _open(path: str | Path, mode: str) -> IO[bytes]:
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, mode + "b", compresslevel=4)  # type: ignore[return-value]
    return open(path, mode + "b")


class LogWriter:
    """Append events as JSON lines. Use as ``sink``: ``EngineCore(..., sink=writer)``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = _open(self.path, "w")
        self._buf = bytearray()  # encode_into appends here: no per-event bytes object
        self.count = 0

    def __call__(self, event: Event) -> None:
        _encoder.encode_into(event, self._buf, -1)
        self._buf.extend(b"\n")
        self.count += 1
        if len(self._buf) > 1 << 16:
            self.flush()

    write = __call__

    def flush(self) -> None:
        if self._buf:
            self._file.write(self._buf)
            self._buf.clear()
        self._file.flush()

    def close(self) -> None:
        if self._file.closed:
            return
        self.flush()
        self._file.close()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_log(path: str | Path) -> Iterator[Event]:
    """Stream events from a log; a bad line raises LogError naming file and line."""
    with _open(path, "r") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                event = _decoder.decode(line)
            except msgspec.DecodeError as e:  # includes ValidationError
                raise LogError(f"{path}:{lineno}: {e}") from None
            if lineno == 1 and isinstance(event, Header) and event.schema_version != SCHEMA_VERSION:
                raise LogError(f"{path}:1: schema version {event.schema_version}, "
                               f"this minivllm reads {SCHEMA_VERSION}")
            yield event


def read_header(path: str | Path) -> Header:
    first = next(iter(read_log(path)), None)
    if not isinstance(first, Header):
        raise LogError(f"{path}:1: the first line must be a Header event")
    return first


# --- fold ------------------------------------------------------------------------------------------


@dataclass
class FoldedState:
    num_blocks: int
    step: int = -1
    ref_counts: list[int] = field(default_factory=list)
    free: OrderedDict[int, None] = field(default_factory=OrderedDict)
    evictable: OrderedDict[int, None] = field(default_factory=OrderedDict)
    cache: dict[int, int] = field(default_factory=dict)  # hash -> block
    block_hash: dict[int, int] = field(default_factory=dict)  # block -> hash
    tables: dict[int, list[int]] = field(default_factory=dict)
    reserved: dict[int, int] = field(default_factory=dict)
    computed: dict[int, int] = field(default_factory=dict)  # unfinished requests' computed tokens

    def __post_init__(self) -> None:
        self.ref_counts = [0] * self.num_blocks
        self.free = OrderedDict.fromkeys(range(self.num_blocks))

    def apply_block_event(self, ev: BlockEvent) -> None:
        if isinstance(ev, BlockAllocated):
            del self.free[ev.block]  # an evicted block was moved to free by its BlockEvicted
            self._take(ev.request_id, ev.block)
            left = self.reserved.get(ev.request_id, 0)
            if left > 1:
                self.reserved[ev.request_id] = left - 1
            elif left == 1:
                del self.reserved[ev.request_id]
        elif isinstance(ev, PrefixHit):
            if self.ref_counts[ev.block] == 0:
                del self.evictable[ev.block]
            self._take(ev.request_id, ev.block)
        elif isinstance(ev, BlockFreed):
            table = self.tables[ev.request_id]
            table.reverse()
            table.remove(ev.block)  # frees run tail first: the last occurrence
            table.reverse()
            if not table:
                del self.tables[ev.request_id]
            self.ref_counts[ev.block] -= 1
            if self.ref_counts[ev.block] == 0:
                if ev.block in self.block_hash:
                    self.evictable[ev.block] = None
                else:
                    self.free[ev.block] = None
        elif isinstance(ev, BlockCached):
            self.cache[ev.hash] = ev.block
            self.block_hash[ev.block] = ev.hash
        elif isinstance(ev, BlockEvicted):
            del self.evictable[ev.block]
            del self.cache[ev.hash]
            del self.block_hash[ev.block]
            # the allocation that follows takes it; park it at the head of the free list
            self.free[ev.block] = None
            self.free.move_to_end(ev.block, last=False)
        elif isinstance(ev, Reserved):
            if ev.num_blocks:
                self.reserved[ev.request_id] = ev.num_blocks
            else:
                self.reserved.pop(ev.request_id, None)

    def _take(self, request_id: int, block: int) -> None:
        self.ref_counts[block] += 1
        self.tables.setdefault(request_id, []).append(block)

    def apply(self, event: Event) -> None:
        if isinstance(event, Step):
            for ev in event.block_events:
                self.apply_block_event(ev)
            for span in event.spans:
                self.computed[span.request_id] = span.start + span.num_tokens
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
            cache=dict(self.cache),
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
