"""Closed-loop arrivals: conversations whose next turn waits for the last answer.

A first turn is sent at its arrival time; a later turn (traces/sessions.py) when the turn before it
has finished: at ``max(its arrival, that finish + think_time)``. It then goes through the front
door, which serves requests in the order they are sent (one worker, FIFO, as open-loop arrivals
are served): a turn released now but sent after a long think time queues behind nothing sent
before it. A refused turn counts as finished when refused. Sends and hand-ins are urgent events at
their absolute times, as the open-loop arrivals' are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from heapq import heappop, heappush

import msgspec

from simulator.fleet.environment import SimEnvironment
from simulator.fleet.front_door import Dispatch, FrontDoor
from traces.workload import RequestSpec


class SessionArrivals:
    def __init__(self, env: SimEnvironment, specs: Sequence[RequestSpec], door: FrontDoor, dispatch: Dispatch,
                 on_done: Callable[[], None]) -> None:
        self.env, self.specs, self.door, self.dispatch, self.on_done = env, specs, door, dispatch, on_done
        self.next_turn: dict[int, int] = {}  # index -> index of its session's next turn
        last: dict[int, int] = {}
        firsts = []
        for i, spec in enumerate(specs):
            if spec.session is not None and spec.session in last:
                self.next_turn[last[spec.session]] = i
            else:
                firsts.append(i)
            if spec.session is not None:
                last[spec.session] = i
        self.left = len(specs)
        self._pending: list[tuple[float, int]] = []  # (front-door time, index) scheduled, not handed in
        self._handed: set[int] = set()
        self._free = -math.inf  # when the front door's worker is free (with a service time)
        for i in firsts:
            self._release(i, specs[i].arrival)

    def next_time(self) -> float:
        """When the next request known so far is handed in (inf: none is scheduled)."""
        pending, handed = self._pending, self._handed
        while pending and pending[0][1] in handed:
            heappop(pending)
        return pending[0][0] if pending else math.inf

    def run(self):
        """(A process with nothing of its own to do: hand-ins are events scheduled as turns are released.)"""
        if not self.left:
            self.on_done()
        return
        yield

    def finished(self, index: int, time: float) -> None:
        """Request ``index`` finished (or was refused) at ``time``: let its session's next turn go."""
        nxt = self.next_turn.get(index)
        if nxt is not None:
            spec = self.specs[nxt]
            self._release(nxt, max(spec.arrival, time + spec.think_time))

    def _release(self, index: int, sent: float) -> None:
        """Request ``index`` will be sent at ``sent``: known to come (``next_time``) from now on."""
        if not self.door.service:  # a pure delay: no queue to join in order
            self._enter(index, sent)
            return
        heappush(self._pending, (sent + self.door.delay(self.specs[index]), index))  # (the earliest it can leave)
        self.env.at(max(sent, self.env.now), urgent=True).callbacks.append(lambda _event: self._enter(index, sent))

    def _enter(self, index: int, sent: float) -> None:
        """Request ``index`` reaches the front door (sent now): it leaves once served after those sent before it."""
        door = self.door
        exit_time = sent + door.delay(self.specs[index])
        if door.service:
            exit_time = max(exit_time, self._free + door.service)
            self._free = exit_time
        exit_time = max(exit_time, self.env.now)
        heappush(self._pending, (exit_time, index))
        self.env.at(exit_time, urgent=True).callbacks.append(lambda _event: self._hand_in(index, sent))

    def _hand_in(self, index: int, sent: float) -> None:
        """Hand request ``index`` in, stamped with when its client sent it."""
        self._handed.add(index)
        spec = self.specs[index]
        self.dispatch(spec if spec.arrival == sent else msgspec.structs.replace(spec, arrival=sent), index)
        self.left -= 1
        if not self.left:
            self.on_done()
