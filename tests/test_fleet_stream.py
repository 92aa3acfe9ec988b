"""When a fleet request is sent again (runtime/serving/fleet_stream.py): only when its replica vanished
before taking it in, at most once per death, never once cancelled, and once for two waiters."""

from __future__ import annotations

import asyncio

import pytest

from runtime.serving.async_engine import EngineDead
from runtime.serving.fleet_stream import FleetStream


class FakeStream:
    """A replica's stream: raises ``error`` (after telling ``log_id`` when ``taken_in``), else yields
    ``items``."""

    def __init__(self, items=(), error: EngineDead | None = None, taken_in: bool = False, log_id: int = 7):
        self.items, self.error, self.taken_in, self.id = list(items), error, taken_in, log_id
        self.cancelled = False

    async def __anext__(self):
        await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    async def log_id(self) -> int:
        await asyncio.sleep(0)
        if self.error is not None and not self.taken_in:
            raise self.error
        return self.id

    def cancel(self) -> None:
        self.cancelled = True

    def fail(self, error: BaseException) -> None:
        self.error = error


def fleet_stream(first: FakeStream, *then: FakeStream, resends: int = 1) -> tuple[FleetStream, list[FakeStream]]:
    sent: list[FakeStream] = []
    queue = list(then)

    def resend() -> FakeStream:
        sent.append(queue.pop(0))
        return sent[-1]

    return FleetStream(first, resend, resends), sent  # type: ignore[arg-type]


async def drain(stream: FleetStream) -> list:
    return [item async for item in stream]


def test_a_request_its_replica_never_took_in_is_sent_again_and_served():
    s, sent = fleet_stream(FakeStream(error=EngineDead("gone")), FakeStream(["a", "b"], log_id=3))
    assert asyncio.run(s.log_id()) == 3 and len(sent) == 1
    assert asyncio.run(drain(s)) == ["a", "b"]


@pytest.mark.parametrize("first", [FakeStream(error=EngineDead("gone"), taken_in=True),  # its log holds it
                                   FakeStream(error=EngineDead("engine failed: boom", failed=True))])
def test_a_request_taken_in_or_of_a_failed_engine_ends_with_the_error(first):
    s, sent = fleet_stream(first, FakeStream(["a"]))
    with pytest.raises(EngineDead):
        asyncio.run(drain(s))
    assert sent == []


def test_a_cancelled_request_is_not_sent_again():
    s, sent = fleet_stream(FakeStream(error=EngineDead("gone")), FakeStream(["a"]))
    s.cancel()
    with pytest.raises(EngineDead):
        asyncio.run(drain(s))
    assert sent == []


def test_it_is_sent_again_at_most_resends_times():
    s, sent = fleet_stream(FakeStream(error=EngineDead("gone")), FakeStream(error=EngineDead("gone too")),
                           FakeStream(["a"]), resends=1)
    with pytest.raises(EngineDead, match="gone too"):
        asyncio.run(drain(s))
    assert len(sent) == 1


def test_two_waiters_send_it_again_once():
    s, sent = fleet_stream(FakeStream(error=EngineDead("gone")), FakeStream(["a"]), FakeStream(["b"]), resends=2)

    async def both():
        return await asyncio.gather(s.log_id(), s.__anext__())

    assert asyncio.run(both()) == [7, "a"]
    assert len(sent) == 1
