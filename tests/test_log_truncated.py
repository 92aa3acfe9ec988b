"""A log cut off mid-write (a killed server) reads as its complete lines, and says what it dropped.

Plain and gzip logs are cut at every kind of point (hypothesis picks the byte): inside a line,
just before or after a newline, inside gzip's header, a deflate block or its trailer. The reader
returns a prefix of the events written (every complete line), flags the cut and counts the
bytes after the last complete line, with a warning naming the file. A malformed line before the
end is still an error naming file and line.
"""

from __future__ import annotations

import gzip
import warnings
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.frames import load_frames
from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, record_live, small_config
from traces.events import Header
from traces.importers.log import read_log_workload
from traces.log import LogError, LogWriter, TruncatedLogWarning, read_header, read_log


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """A live-style log (preemptions, prefix hits): its events, and a folder for cut copies."""
    events = record_live(mixed_workload(12, seed=2), small_config(num_blocks=40, budget=128),
                         VaryingDurationExecutor(seed=2))
    folder = tmp_path_factory.mktemp("truncated")
    for suffix in (".jsonl", ".jsonl.gz"):
        with LogWriter(folder / f"full{suffix}") as w:
            for ev in events:
                w(ev)
    return events, folder


def recorded(logs, suffix: str) -> tuple[list, bytes]:
    events, folder = logs
    return events, (folder / f"full{suffix}").read_bytes()


def read_cut(logs, data: bytes, cut: int, suffix: str):
    path = logs[1] / f"cut{suffix}"
    path.write_bytes(data[:cut])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = read_log(path)
        events = list(reader)
    return path, reader, events, [w for w in caught if issubclass(w.category, TruncatedLogWarning)]


def expect(text: bytes, full: bytes) -> tuple[int, int]:
    """(lines read, bytes dropped) for the prefix ``text`` of a log's text ``full``: the complete
    lines, and the bytes after them unless they are a whole line that lacks only its newline."""
    tail = len(text) - (text.rfind(b"\n") + 1)
    whole = tail > 0 and full[len(text): len(text) + 1] == b"\n"
    return text.count(b"\n") + whole, 0 if whole else tail


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_plain_log_cut_anywhere_reads_as_its_complete_lines(logs, data):
    events, raw = recorded(logs, ".jsonl")
    newline = raw.index(b"\n")
    cut = data.draw(st.integers(0, len(raw)) | st.sampled_from([newline, newline + 1]))
    path, reader, got, warned = read_cut(logs, raw, cut, ".jsonl")
    lines, dropped = expect(raw[:cut], raw)
    assert got == events[:lines] and reader.dropped_bytes == dropped and reader.truncated == (dropped > 0)
    assert len(warned) == (dropped > 0)
    if warned:
        assert f"{path}: " in str(warned[0].message) and f"dropped the last {dropped:,} bytes" in str(warned[0].message)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_gzip_log_cut_anywhere_reads_as_its_complete_lines(logs, data):
    events, raw = recorded(logs, ".jsonl.gz")
    cut = data.draw(st.integers(0, len(raw)) | st.integers(0, 12) | st.integers(len(raw) - 10, len(raw)))
    path, reader, got, warned = read_cut(logs, raw, cut, ".jsonl.gz")
    text = zlib.decompressobj(31).decompress(raw[:cut])  # the oracle: one zlib call over the cut bytes
    lines, dropped = expect(text, gzip.decompress(raw))
    assert got == events[:lines] and reader.dropped_bytes == dropped
    assert reader.truncated == (0 < cut < len(raw))  # an empty file is no log, not a cut one
    assert len(warned) == reader.truncated
    if warned:
        assert f"{path}: its gzip stream ends early" in str(warned[0].message)


def test_the_uncut_logs_read_whole_without_a_warning(logs):
    for suffix in (".jsonl", ".jsonl.gz"):
        events, raw = recorded(logs, suffix)
        _, reader, got, warned = read_cut(logs, raw, len(raw), suffix)
        assert got == events and not reader.truncated and reader.dropped_bytes == 0 and not warned


def test_a_malformed_line_before_the_end_is_an_error_naming_file_and_line(logs, tmp_path):
    _, raw = recorded(logs, ".jsonl")
    lines = raw.split(b"\n")
    for bad in (b'{"type":"Step","step":', b"garbage", b'{"type":"Nope"}'):
        for where in (3, len(lines) - 2):  # the middle, and the last complete line
            path = tmp_path / "bad.jsonl"
            path.write_bytes(b"\n".join(lines[:where] + [bad] + lines[where + 1:]))
            with pytest.raises(LogError, match=rf"{path}:{where + 1}: "):
                list(read_log(path))
    whole = tmp_path / "whole.jsonl"  # a complete record, newline missing, that is no event: malformed
    whole.write_bytes(b"\n".join(lines[:3] + [b'{"type":"Step","step":"x"}']))
    with pytest.raises(LogError, match=rf"{whole}:4: "):
        list(read_log(whole))
    gz = tmp_path / "bad.jsonl.gz"
    zipped = bytearray(gzip.compress(raw))
    zipped[len(zipped) // 2] ^= 0xFF  # a flipped byte mid-stream: corrupt, not cut off
    gz.write_bytes(bytes(zipped))
    with pytest.raises(LogError, match=rf"{gz}:\d+: "):
        list(read_log(gz))


def test_consumers_read_the_complete_prefix_and_can_show_the_cut(logs, tmp_path):
    events, raw = recorded(logs, ".jsonl.gz")
    cut = tmp_path / "killed.jsonl.gz"
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.warns(TruncatedLogWarning, match="killed.jsonl.gz"):
        frames = load_frames(cut)  # analyze: no EOFError
    assert frames.truncated and frames.dropped_bytes > 0 and len(frames.steps) > 0
    with pytest.warns(TruncatedLogWarning):
        wl = read_log_workload(cut)
    assert wl.meta["dropped_bytes"] > 0 and 0 < len(wl) <= 12 + 2
    assert isinstance(read_header(cut), Header)  # the first line is whole
    first = tmp_path / "first.jsonl"
    first.write_bytes(gzip.decompress(raw)[:40])
    with pytest.warns(TruncatedLogWarning), pytest.raises(LogError, match="cut off inside its first line"):
        read_header(first)
