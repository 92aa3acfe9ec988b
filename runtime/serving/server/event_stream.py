"""The SSE response of a stream: sse-starlette's, less its per-event cost.

sse-starlette wraps every event's send in a timeout scope (``anyio.move_on_after``), even without
a timeout; a token's event is a few hundred bytes, and the scope costs about as much as writing
them. With no ``send_timeout`` (ours: a slow client is caught by its bounded queue,
runtime/serving/async_engine.py) an event is sent as it is.
"""

from __future__ import annotations

from sse_starlette.sse import EventSourceResponse
from starlette.types import Message, Send


class EventStream(EventSourceResponse):
    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)
