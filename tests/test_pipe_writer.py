"""The pipes between front end and engine process (runtime/serving/pipe_writer.py): a writer never
waits on its reader, messages arrive whole and in order, and a reader's end is seen."""

from __future__ import annotations

import fcntl
import multiprocessing
import sys
import threading

import pytest

from runtime.serving.pipe_writer import GIL_SWITCH_S, PIPE_BYTES, PipeWriter, favour_pipe_threads, widen


def test_a_writer_does_not_wait_for_a_reader_that_is_not_reading():
    read_end, write_end = multiprocessing.Pipe(duplex=False)
    writer = PipeWriter(write_end, "test-writer")
    messages = [bytes([i]) * 300_000 for i in range(8)]  # 2.4 MB: far more than any pipe holds
    for m in messages:
        writer.send(m)  # returns although nothing reads yet (a plain send_bytes would block here)
    assert [read_end.recv_bytes() for _ in messages] == messages
    writer.close()
    with pytest.raises(EOFError):
        read_end.recv_bytes()


def test_a_message_the_pipe_has_room_for_is_in_it_when_send_returns():
    read_end, write_end = multiprocessing.Pipe(duplex=False)
    writer = PipeWriter(write_end, "test-writer")
    writer.send(b"token")  # written by the caller: no hand-over to the writer's thread
    assert read_end.poll(0) and read_end.recv_bytes() == b"token"
    writer.close()


def test_close_writes_what_is_queued_first():
    read_end, write_end = multiprocessing.Pipe(duplex=False)
    writer = PipeWriter(write_end, "test-writer")
    writer.send(b"x" * 500_000)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(read_end.recv_bytes()))
    reader.start()
    writer.close()
    reader.join(10)
    assert got == [b"x" * 500_000]


def test_the_readers_end_is_reported_and_later_sends_are_dropped():
    read_end, write_end = multiprocessing.Pipe(duplex=False)
    seen = threading.Event()
    writer = PipeWriter(write_end, "test-writer", on_gone=seen.set)
    read_end.close()
    writer.send(b"lost")
    assert seen.wait(10) and writer.gone
    writer.send(b"dropped")  # neither raises nor queues
    writer.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_SETPIPE_SZ is Linux's")
def test_widen_grows_the_pipe_where_the_system_allows():
    read_end, _ = multiprocessing.Pipe(duplex=False)
    before = fcntl.fcntl(read_end.fileno(), fcntl.F_GETPIPE_SZ)
    widen(read_end)
    with open("/proc/sys/fs/pipe-max-size") as f:
        allowed = int(f.read())
    after = fcntl.fcntl(read_end.fileno(), fcntl.F_GETPIPE_SZ)
    assert after == (PIPE_BYTES if allowed >= PIPE_BYTES else before)


def test_a_process_with_pipe_threads_hands_them_the_gil_promptly():
    before = sys.getswitchinterval()
    try:
        favour_pipe_threads()
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_S)
    finally:
        sys.setswitchinterval(before)
