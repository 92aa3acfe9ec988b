"""The per-token pieces of the front end: the output queue behaves as the asyncio.Queue it stands
for, and the bulk histogram exports what prometheus_client's Histogram does for the same values."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from runtime.serving.output_queue import OutputQueue
from runtime.serving.server.bulk_histogram import BulkHistogram

BUCKETS = (0.01, 0.025, 0.05, 0.1, 1.0)
VALUES = [0.0, 0.01, 0.0100001, 0.02, 0.05, 0.07, 0.1, 0.5, 1.0, 3.0, 1e9]  # on and around the bounds


def _lines(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if not line.startswith("#") and "_created" not in line]


def test_bulk_histogram_exports_what_a_histogram_does():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("x_seconds", "doc", BUCKETS, ["model_name"], ["m"])
    ours.register(bulk)
    ref = Histogram("x_seconds", "doc", ["model_name"], buckets=BUCKETS, registry=theirs).labels("m")
    bulk.observe_many(VALUES[:4])
    bulk.observe_many([])
    bulk.observe_many(VALUES[4:])
    for v in VALUES:
        ref.observe(v)
    assert _lines(ours) == _lines(theirs)


def test_output_queue_is_a_bounded_fifo_with_one_waiting_reader():
    async def main():
        q = OutputQueue(2)
        assert q.empty()
        q.put_nowait(1)
        q.put_nowait(2)
        with pytest.raises(asyncio.QueueFull):
            q.put_nowait(3)
        assert [await q.get(), q.get_nowait()] == [1, 2] and q.empty()
        with pytest.raises(asyncio.QueueEmpty):
            q.get_nowait()
        reader = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        assert not reader.done()
        q.put_nowait("woken")
        assert await reader == "woken"
        cancelled = asyncio.ensure_future(q.get())  # a reader that gives up leaves the queue as it was
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        q.put_nowait("next")
        assert await q.get() == "next"

    asyncio.run(main())
