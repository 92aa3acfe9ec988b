"""Event log: streaming JSON Lines writer/reader (gzip when the path ends in .gz) and ``fold``.

The writer never writes a line its reader would reject (``LogWriteError`` instead), never
replaces an older log unless told to (``if_exists``), and the reader reads the complete lines of
a log cut off mid-write (a killed server), saying how much it dropped.

``fold(events)`` is event sourcing taken literally: it rebuilds the block state (tables, ref
counts, free list, LRU, cache index, reservations) and the computed tokens of every request
from the log alone, with its own small state machine, so a test can hold it against the live
engine after every step.
"""

from __future__ import annotations

import errno
import gzip
import warnings
import zlib
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
from traces.log_check import non_finite
from traces.log_files import IF_EXISTS, open_mode
from traces.log_lines import LogLines

__all__ = ["IF_EXISTS", "BlockState", "FoldedState", "LogError", "LogReader", "LogWriteError", "LogWriter",
           "TruncatedLogWarning", "encode", "fold", "read_header", "read_log"]


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


class LogWriteError(ValueError):
    """An event the reader would reject (e.g. a NaN: JSON has none); nothing was written."""


class TruncatedLogWarning(UserWarning):
    """A log ends inside a line (its writer was killed): only its complete lines were read."""


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
    """Append events as JSON lines. Use as ``sink``: ``EngineCore(..., sink=writer)``.

    ``if_exists`` says what happens to a file already at ``path``: ``"overwrite"`` it (the
    default, for outputs a command regenerates), ``"rotate"`` it to ``live.1.jsonl``, ... first
    (``rotated_to`` says where), or raise FileExistsError (``"error"``). See ``IF_EXISTS``.
    """

    def __init__(self, path: str | Path, *, if_exists: str = "overwrite") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rotated_to: Path | None = None
        self._file = self._open_new(if_exists)
        self._buf = bytearray()  # encode_into appends here: no per-event bytes object
        self.count = 0

    def _open_new(self, if_exists: str) -> IO[bytes]:
        for _ in range(100):  # rotate: a file another writer creates after our rotation is rotated too
            mode, rotated = open_mode(self.path, if_exists)
            self.rotated_to = rotated or self.rotated_to
            try:
                return _open(self.path, mode)
            except FileExistsError:
                if if_exists != "rotate":
                    raise FileExistsError(errno.EEXIST, "a log is already there (if_exists='error'; 'rotate' "
                                          "would keep it under a numbered name)", str(self.path)) from None
        raise FileExistsError(errno.EEXIST, "could not move the file there out of the way", str(self.path))

    def __call__(self, event: Event) -> None:
        bad = non_finite(event)
        if bad is not None:
            raise self._refused(event, f"{bad} is not a finite number (JSON has no NaN or infinity)")
        buf = self._buf
        start = len(buf)
        try:
            _encoder.encode_into(event, buf, -1)
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as e:  # e.g. a lone surrogate
            del buf[start:]
            raise self._refused(event, str(e)) from None
        if event.__class__ is Header:  # once per log: read it back in full (its config and extra are Any)
            self._check_header(event, bytes(buf[start:]), start)
        buf.extend(b"\n")
        self.count += 1
        if len(buf) > 1 << 16:
            self.flush()

    write = __call__

    def _refused(self, event: Event, why: str) -> LogWriteError:
        name = type(event).__name__
        return LogWriteError(f"{self.path}: refusing to write {'an' if name[0] in 'AEIOU' else 'a'} {name} event "
                             f"its reader would reject: {why}")

    def _check_header(self, header: Header, line: bytes, start: int) -> None:
        why = None
        if header.schema_version != SCHEMA_VERSION:
            why = f"schema_version {header.schema_version!r}; this minivllm reads {SCHEMA_VERSION}"
        else:
            try:
                back = _decoder.decode(line)
            except msgspec.DecodeError as e:
                why = str(e)
            else:  # JSON-equal: a tuple reads back as a list, an int key as a string
                if msgspec.to_builtins(back, str_keys=True) != msgspec.to_builtins(header, str_keys=True):
                    why = "it reads back as a different value"
        if why is not None:
            del self._buf[start:]
            raise self._refused(header, why)

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


class LogReader:
    """The events of a log file, streamed (an iterator: ``read_log`` returns one).

    A log cut off mid-line (its writer was killed) yields its complete lines; at the end of the
    iteration ``truncated`` is True, ``dropped_bytes`` counts the bytes after its last complete
    line (decompressed, for gzip) and a ``TruncatedLogWarning`` naming the file goes to stderr.
    A malformed line before the end raises LogError naming file and line.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.truncated = False
        self.dropped_bytes = 0
        self.num_lines = 0  # complete lines read so far
        self._events = self._read()

    def __iter__(self) -> LogReader:
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def _read(self) -> Iterator[Event]:
        lines = LogLines(self.path)
        try:
            for line in lines:
                self.num_lines += 1
                if line.strip():
                    yield self._decode(line, self.num_lines)
        except zlib.error as e:
            raise LogError(f"{self.path}:{self.num_lines + 1}: corrupt gzip data ({e})") from None
        tail = lines.tail
        if tail.strip():
            try:  # a whole last line that lacks only its newline is still a line
                event = _decoder.decode(tail)
            except msgspec.DecodeError as e:
                if _is_json(tail):  # whole, but not an event: malformed, not cut off
                    raise LogError(f"{self.path}:{self.num_lines + 1}: {e}") from None
                self.truncated, self.dropped_bytes = True, len(tail)
            else:
                self.num_lines += 1
                yield self._checked(event, self.num_lines)
        if lines.stream_cut:
            self.truncated = True
        if self.truncated:
            cut = "its gzip stream ends early" if lines.stream_cut else "it ends inside a line"
            warnings.warn(f"{self.path}: {cut} (was its writer killed?): read its {self.num_lines:,} complete "
                          f"lines, dropped the last {self.dropped_bytes:,} bytes", TruncatedLogWarning, stacklevel=3)

    def _decode(self, line: bytes, lineno: int) -> Event:
        try:
            event = _decoder.decode(line)
        except msgspec.DecodeError as e:  # includes ValidationError
            raise LogError(f"{self.path}:{lineno}: {e}") from None
        return self._checked(event, lineno)

    def _checked(self, event: Event, lineno: int) -> Event:
        if lineno == 1 and isinstance(event, Header) and event.schema_version != SCHEMA_VERSION:
            raise LogError(f"{self.path}:1: schema version {event.schema_version}, "
                           f"this minivllm reads {SCHEMA_VERSION}")
        return event


def _is_json(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return True


def read_log(path: str | Path) -> LogReader:
    """Stream events from a log; a bad line raises LogError naming file and line, a cut-off end
    is dropped with a warning (see ``LogReader``)."""
    return LogReader(path)


def read_header(path: str | Path) -> Header:
    reader = read_log(path)
    first = next(reader, None)
    if not isinstance(first, Header):
        if first is None and reader.truncated:
            raise LogError(f"{path}:1: the log was cut off inside its first line")
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
