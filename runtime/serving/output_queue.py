"""A request's output queue: what ``asyncio.Queue`` offers one reader (``put_nowait``, ``get``,
``get_nowait``, ``empty``), bounded, without its general bookkeeping (getter and putter deques,
a wake-up chain, ``full()`` checks): a streamed token passes through one, so its cost is per token."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class OutputQueue:
    __slots__ = ("_items", "_maxsize", "_waiter")

    def __init__(self, maxsize: int) -> None:
        self._items: deque = deque()
        self._maxsize = maxsize
        self._waiter: asyncio.Future | None = None  # the reader, while it waits

    def put_nowait(self, item: Any) -> None:
        """From the event loop; raises ``asyncio.QueueFull`` past ``maxsize`` items."""
        if len(self._items) >= self._maxsize:
            raise asyncio.QueueFull
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()
