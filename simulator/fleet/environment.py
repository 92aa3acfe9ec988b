"""The SimPy environment of a simulation, with events at absolute times.

A replica waits until a step's end, an arrival lands at its front-door time: both are absolute
virtual times computed from the cost model, and ``env.timeout(t - env.now)`` would land at
``now + (t - now)``, which floating point need not make ``t``. Equal times must stay equal, since
their order is defined (an arrival at t lands before a step that starts or ends at t), so events
are scheduled at the time itself. ``urgent``: before every ordinary event of the same time.
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.events import NORMAL, URGENT, Event


class SimEnvironment(simpy.Environment):
    def at(self, time: float, *, urgent: bool = False) -> Event:
        """An event that fires at virtual time ``time`` (not before now)."""
        if time < self._now:
            raise ValueError(f"an event at {time} is in the past (now {self._now})")
        event = Event(self)
        event._ok = True
        event._value = None
        heappush(self._queue, (time, URGENT if urgent else NORMAL, next(self._eid), event))
        return event
