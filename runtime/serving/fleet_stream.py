"""A fleet request's stream (``DataParallelEngine.submit``): its replica's ``RequestStream``, sent
again to a replica up when its replica vanished before taking it in.

A replica killed between two messages does not say so at once: its front end notices when the
connection ends. A request routed to it meanwhile reached no engine: it has no log id and no
output, and no log holds it. It goes to the router again (the dead replica is no longer
routable) with its arrival time and its place in the fleet log's order, as if it had gone there
first. A request the replica had taken in ends with the replica's error, as every in-flight one
does (its tokens may have reached the client; its log holds it). So does every request of an
engine that failed on an error of its own (``EngineDead.failed``): sent again, the request that
broke it could break the next.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from runtime.serving.async_engine import EngineDead, RequestStream
from runtime.serving.outputs import OutputDelta
from traces.request_names import RequestName

T = TypeVar("T")


class FleetStream:
    def __init__(self, stream: RequestStream, resend: Callable[[], RequestStream], resends: int) -> None:
        """``resend``: routes the request again and submits it (raises EngineDead when no replica is
        up); at most ``resends`` times (one fewer than the replicas: each needs a death)."""
        self._stream = stream
        self._resend = resend
        self._resends = resends
        self._ended = False  # cancelled or failed here: never sent again

    def __aiter__(self) -> FleetStream:
        return self

    def __anext__(self) -> Awaitable[OutputDelta]:
        if self._stream.taken_in:  # nothing left to send again: the replica's stream as it is
            return self._stream.__anext__()
        return self._on_a_replica(lambda stream: stream.__anext__())

    async def log_id(self) -> int:
        return await self._on_a_replica(lambda stream: stream.log_id())

    async def _on_a_replica(self, call: Callable[[RequestStream], Awaitable[T]]) -> T:
        """``call`` on the request's stream, again on the next one each time it is sent again."""
        while True:
            stream = self._stream
            try:
                return await call(stream)
            except EngineDead as dead:
                self._again(stream, dead)

    async def name(self) -> RequestName:
        await self.log_id()
        return await self._stream.name()

    def cancel(self) -> None:
        self._ended = True
        self._stream.cancel()

    def fail(self, error: BaseException) -> None:
        self._ended = True
        self._stream.fail(error)

    def _again(self, stream: RequestStream, dead: EngineDead) -> None:
        """``stream`` ended with ``dead``: send the request again if its replica vanished before
        taking it in, else raise ``dead``."""
        if stream is not self._stream:  # another waiter on this request already sent it again
            return
        if self._ended or stream.taken_in or dead.failed or self._resends <= 0:
            raise dead
        self._resends -= 1
        self._stream = self._resend()
