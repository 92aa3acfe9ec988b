"""Event log: streaming JSON Lines writer/reader (gzip when the path ends in .gz); ``fold``.

The writer never writes a line its reader would reject (``LogWriteError`` instead), never
replaces an older log unless told to (``if_exists``), and the reader reads the complete lines of
a log cut off mid-write (a killed server), saying how much it dropped.

A log is schema 2 (``SCHEMA_VERSION``): each ``Step`` is written as a ``StepLine`` that leaves out
what the events before it say (traces/step_codec.py), block operations as runs of ids
(traces/events.py). The reader hands out the same events whatever the schema of the file: a
schema-1 log (one block event per block) is converted as it is read (traces/events_v1.py), its
Header then says schema 2 and ``LogReader.file_schema_version`` says 1.

``fold`` (traces/fold.py, re-exported here) rebuilds the block state from the events.
"""

from __future__ import annotations

import errno
import gzip
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import msgspec

from traces.events import (
    READ_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    Aborted,
    Admitted,
    Arrived,
    Event,
    Finished,
    Header,
    Preempted,
    Rejected,
    ReplicaDown,
    ReplicaUp,
    Routed,
    Span,
    Step,
)
from traces.events_v1 import EventV1, Upgrader
from traces.fold import BlockState, FoldedState, fold
from traces.log_check import non_finite
from traces.log_errors import LogError
from traces.log_files import IF_EXISTS, open_mode
from traces.log_lines import LogLines
from traces.step_codec import StepCodec, StepLine

__all__ = ["IF_EXISTS", "BlockState", "FoldedState", "LogError", "LogReader", "LogWriteError", "LogWriter",
           "TruncatedLogWarning", "encode", "fold", "read_header", "read_log"]


class LogWriteError(ValueError):
    """An event the reader would reject (e.g. a NaN: JSON has none); nothing was written."""


class TruncatedLogWarning(UserWarning):
    """A log ends inside a line (its writer was killed): only its complete lines were read."""


# what a line of a schema-2 log decodes to: the events, a Step as its StepLine
LineV2 = (Header | Arrived | Admitted | Preempted | StepLine | Finished | Aborted | Rejected | Routed | ReplicaDown
          | ReplicaUp)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(LineV2)
_decoder_v1 = msgspec.json.Decoder(EventV1)


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
        self._codec = StepCodec()  # what a Step line may leave out
        self._run: StepLine | None = None  # plain steps not written yet (one line when the run ends)
        self._line_start = 0
        self.count = 0  # events taken

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
        cls = event.__class__
        if cls is Step:
            a, b = event.start, event.end  # type: ignore[union-attr]
            # all a Step has to check: two finite floats (NaN or ±inf makes the sum NaN)
            if not (a.__class__ is float and b.__class__ is float and (a - a) + (b - b) == 0.0):
                self._check_finite(event)
            codec = self._codec
            tokens = codec.carried(event)  # type: ignore[arg-type]
            if tokens is not None:
                blocks = event.block_events  # type: ignore[union-attr]
                if not blocks:  # plain: held, the next plain step with the same tokens joins its line
                    self._hold(event.end, tokens)  # type: ignore[union-attr]
                    self.count += 1
                    return
                try:
                    self._encode(event, StepLine(end=event.end, tokens=tokens, block_events=blocks))  # type: ignore[union-attr]
                except LogWriteError:
                    codec.uncarry()
                    raise
            else:
                if event.device_time is not None:  # type: ignore[union-attr]
                    self._check_finite(event)
                try:
                    line = codec.line(event)  # type: ignore[arg-type]
                except (TypeError, ValueError, AttributeError) as e:
                    raise self._refused(event, str(e)) from None
                self._encode(event, line)
                codec.stepped(event)  # type: ignore[arg-type]
        else:
            self._check_finite(event)
            self._encode(event, event)
            if cls is Header:  # once per log: read it back in full (its config and extra are Any)
                self._check_header(event, bytes(self._buf[self._line_start:-1]), self._line_start)  # type: ignore[arg-type]
            else:
                self._codec.observe(event)
        self.count += 1
        self._spill()

    def _hold(self, end: float, tokens: int | list) -> None:
        """A plain step: it joins the held run when that drew the same tokens, else starts one."""
        run = self._run
        if run is not None and run.tokens == tokens and run.tokens.__class__ is tokens.__class__:
            run.end.append(end)  # type: ignore[union-attr]
        else:
            if run is not None:
                self._write_run()
            self._run = StepLine(end=[end], tokens=tokens)

    def _spill(self) -> None:
        if len(self._buf) > 1 << 16:
            self._file.write(self._buf)
            self._buf.clear()

    def decode_steps(self, ends: list[float], blocks: dict[int, list], before_last: list[Span],
                     last: list[Span], token: int) -> bool:
        """Take ``len(ends)`` steps after the last one, which left out its spans (``StepCodec.carried``),
        each decoding the same requests one token further right after the one before, each drawing
        ``token``; step i's block events ``blocks.get(i)`` (simulator/fleet/decode_run.py: the spans
        of the last two given). Plain ones join the held run, the others are a line each, as ``carried``
        steps. False, taking nothing, when the last step did not leave out its spans."""
        codec = self._codec
        if codec._pending is None or not all(e.__class__ is float and e - e == 0.0 for e in (ends[0], ends[-1])):
            return False
        for i, end in enumerate(ends):
            events = blocks.get(i)
            if events:
                line = StepLine(end=end, tokens=token, block_events=events)
                self._encode(line, line)  # (the held run first)
            else:
                self._hold(end, token)
        codec.carried_more(ends, before_last, last)
        self.count += len(ends)
        self._spill()
        return True

    def _check_finite(self, event: Event) -> None:
        bad = non_finite(event)
        if bad is not None:
            raise self._refused(event, f"{bad} is not a finite number (JSON has no NaN or infinity)")

    def _encode(self, event: Event, line: object) -> None:
        """Append ``line`` (the held run first), or refuse ``event`` leaving the buffer as it was."""
        if self._run is not None:
            self._write_run()
        buf = self._buf
        start = self._line_start = len(buf)
        try:
            _encoder.encode_into(line, buf, -1)
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as e:  # e.g. a lone surrogate
            del buf[start:]
            raise self._refused(event, str(e)) from None
        buf.extend(b"\n")

    def _write_run(self) -> None:
        run, self._run = self._run, None
        if len(run.end) == 1:  # type: ignore[union-attr,arg-type]
            run.end = run.end[0]  # type: ignore[union-attr,index]
        _encoder.encode_into(run, self._buf, -1)
        self._buf.extend(b"\n")

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
        """Write everything taken so far (a run of plain steps ends here: the next step starts a line)."""
        if self._run is not None:
            self._write_run()
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

    Today's events whatever the file's schema (``file_schema_version``; see the module docstring).
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
        self.file_schema_version = SCHEMA_VERSION  # what the Header says (a log without one: today's)
        self._line_decoder = _decoder
        self._codec = StepCodec()
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
                    event = self._decode(line, self.num_lines)
                    if event.__class__ is list:  # a run of plain steps
                        yield from event  # type: ignore[misc]
                    else:
                        yield event
        except zlib.error as e:
            raise LogError(f"{self.path}:{self.num_lines + 1}: corrupt gzip data ({e})") from None
        tail = lines.tail
        if tail.strip():
            try:  # a whole last line that lacks only its newline is still a line
                event = self._line_decoder.decode(tail)
            except msgspec.DecodeError as e:
                if _is_json(tail):  # whole, but not an event: malformed, not cut off
                    raise LogError(f"{self.path}:{self.num_lines + 1}: {e}") from None
                self.truncated, self.dropped_bytes = True, len(tail)
            else:
                self.num_lines += 1
                event = self._checked(event, self.num_lines)
                if event.__class__ is list:
                    yield from event  # type: ignore[misc]
                else:
                    yield event
        if lines.stream_cut:
            self.truncated = True
        if self.truncated:
            cut = "its gzip stream ends early" if lines.stream_cut else "it ends inside a line"
            warnings.warn(f"{self.path}: {cut} (was its writer killed?): read its {self.num_lines:,} complete "
                          f"lines, dropped the last {self.dropped_bytes:,} bytes", TruncatedLogWarning, stacklevel=3)

    def _decode(self, line: bytes, lineno: int) -> Event | list[Step]:
        try:
            event = self._line_decoder.decode(line)
        except msgspec.DecodeError as e:  # includes ValidationError
            raise LogError(f"{self.path}:{lineno}: {e}") from None
        return self._checked(event, lineno)

    def _checked(self, event: object, lineno: int) -> Event | list[Step]:
        """The event a decoded line stands for (a list of Steps: a run)."""
        cls = event.__class__
        if cls is StepLine:
            try:
                if event.end.__class__ is list:  # type: ignore[attr-defined]
                    return self._codec.steps(event)  # type: ignore[arg-type]
                return self._codec.step(event, event.end)  # type: ignore[arg-type,attr-defined]
            except LogError as e:
                raise LogError(f"{self.path}:{lineno}: {e}") from None
        if cls is Header and lineno == 1:
            return self._header(event)  # type: ignore[arg-type]
        if self.file_schema_version == 1:
            return self._upgrade(event)  # type: ignore[arg-type]
        self._codec.observe(event)  # type: ignore[arg-type]
        return event  # type: ignore[return-value]

    def _header(self, header: Header) -> Header:
        version = header.schema_version
        if version not in READ_SCHEMA_VERSIONS:
            raise LogError(f"{self.path}:1: schema version {version}, this minivllm reads "
                           f"{' and '.join(map(str, READ_SCHEMA_VERSIONS))}")
        self.file_schema_version = version
        if version == SCHEMA_VERSION:
            return header
        self._line_decoder = _decoder_v1  # type: ignore[assignment]
        self._upgrade = Upgrader()
        return msgspec.structs.replace(header, schema_version=SCHEMA_VERSION)


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


