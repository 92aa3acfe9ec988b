"""Scheduling policies by name: each is a waiting queue that also names the preemption victim.

A policy decides two orders and nothing else: which waiting request is admitted next (``peek`` /
``pop``) and which running request gives its KV back when blocks run out (``victim``). The token
budget, chunking and KV accounting stay in the scheduler, the same for every policy.

A new policy is one ``WaitQueue`` subclass decorated with ``@register_policy``; its ``name`` is
then accepted by ``SchedulerConfig.policy`` and by ``--policy`` on serve, generate and simulate.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator, Mapping
from typing import ClassVar

from runtime.engine.request import Request

POLICIES: dict[str, type[WaitQueue]] = {}


def register_policy(cls: type[WaitQueue]) -> type[WaitQueue]:
    if cls.name in POLICIES:
        raise ValueError(f"scheduling policy {cls.name!r} is already registered")
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str) -> WaitQueue:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r} (known: {', '.join(POLICIES)})") from None


class WaitQueue(ABC):
    name: ClassVar[str]
    description: ClassVar[str]

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def push(self, req: Request, front: bool = False) -> None:
        """Queue ``req``; ``front`` for a preempted request going back (FCFS keeps its place)."""

    @abstractmethod
    def peek(self) -> Request: ...

    @abstractmethod
    def pop(self) -> Request: ...

    @abstractmethod
    def remove(self, req: Request) -> bool:
        """Take ``req`` out (abort); False if it wasn't queued."""

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The queue in admission order."""

    @abstractmethod
    def victim(self, running: Mapping[int, Request]) -> Request:
        """The running request to preempt (``running`` is in admission order)."""


@register_policy
class FcfsQueue(WaitQueue):
    name = "fcfs"
    description = "first come, first served; the last admitted request is preempted first"

    def __init__(self) -> None:
        self._fifo: deque[Request] = deque()

    def __len__(self) -> int:
        return len(self._fifo)

    def push(self, req: Request, front: bool = False) -> None:
        if front:
            self._fifo.appendleft(req)
        else:
            self._fifo.append(req)

    def peek(self) -> Request:
        return self._fifo[0]

    def pop(self) -> Request:
        return self._fifo.popleft()

    def remove(self, req: Request) -> bool:
        try:
            self._fifo.remove(req)
            return True
        except ValueError:
            return False

    def __iter__(self) -> Iterator[Request]:
        return iter(self._fifo)

    def victim(self, running: Mapping[int, Request]) -> Request:
        return running[next(reversed(running))]


@register_policy
class PriorityQueue(WaitQueue):
    name = "priority"
    description = ("lowest priority value first, then arrival; the running request with the highest value "
                   "(latest admitted among equals) is preempted first")

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, req: Request, front: bool = False) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, req.request_id, req))

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> bool:
        for i, item in enumerate(self._heap):
            if item[3] is req:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return True
        return False

    def __iter__(self) -> Iterator[Request]:
        return (item[3] for item in sorted(self._heap))

    def victim(self, running: Mapping[int, Request]) -> Request:
        return max(running.values(), key=lambda r: (r.priority, r.admit_seq))
