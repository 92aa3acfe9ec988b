"""A fleet request's stream (``DataParallelEngine.submit``): its replica's ``RequestStream``, sent
again to a replica up when its replica died before taking it in.

A replica killed between two messages does not say so at once: its front end notices when the
connection ends. Requests routed to it meanwhile reach no engine; they have no log id and no
output, so nothing of them was logged or sent to the client. Such a request goes to the router
again (the dead replica is no longer routable), keeping its arrival time, as if it had gone there
first. A request the replica had taken in ends with the replica's error, as every in-flight one does:
its tokens may have reached the client, and its log holds it.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.serving.async_engine import EngineDead, RequestStream
from runtime.serving.outputs import OutputDelta
from traces.request_names import RequestName


class FleetStream:
    def __init__(self, stream: RequestStream, resend: Callable[[], RequestStream]) -> None:
        """``resend``: routes the request again and submits it (raises EngineDead when no replica is up)."""
        self._stream = stream
        self._resend = resend
        self._ended = False  # cancelled or failed here: never sent again

    def __aiter__(self) -> FleetStream:
        return self

    async def __anext__(self) -> OutputDelta:
        while True:
            try:
                return await self._stream.__anext__()
            except EngineDead as dead:
                self._again(dead)

    async def log_id(self) -> int:
        while True:
            try:
                return await self._stream.log_id()
            except EngineDead as dead:
                self._again(dead)

    async def name(self) -> RequestName:
        await self.log_id()
        return await self._stream.name()

    def cancel(self) -> None:
        self._ended = True
        self._stream.cancel()

    def fail(self, error: BaseException) -> None:
        self._ended = True
        self._stream.fail(error)

    def _again(self, dead: EngineDead) -> None:
        """Send the request again if its replica died before taking it in, else raise ``dead``."""
        if self._ended or self._stream.taken_in:
            raise dead
        self._stream = self._resend()
