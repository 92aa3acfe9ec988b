"""The front door and the open-loop arrivals through it.

A request is stamped with its arrival when the server receives it (the log's arrival time), and
the engine sees it a little later: the front door's ``latency`` (tokenizing, templating, the hop to
the engine process; the cost model's ``intake_delay``) and ``per_token`` for each prompt token
(parsing and carrying a long prompt: ``intake_per_token``), plus queueing when requests come faster
than one ``service`` time apart (one front-door worker: FIFO). With ``service`` 0 the door is a
pure delay, which is what a model fitted without a service time gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simulator.fleet.environment import SimEnvironment
from traces.workload import RequestSpec

Dispatch = Callable[[RequestSpec, int], None]  # (request, its index in arrival order) -> routed and handed in


@dataclass(frozen=True, slots=True)
class FrontDoor:
    latency: float = 0.0
    service: float = 0.0
    per_token: float = 0.0

    def delay(self, spec: RequestSpec) -> float:
        """The front door's latency for this request (queueing apart)."""
        return self.latency + self.per_token * spec.num_prompt_tokens if self.per_token else self.latency

    def exits(self, specs: Sequence[RequestSpec]) -> list[float]:
        """When the engine side sees each request (in arrival order)."""
        if not self.per_token and not self.service:  # a pure delay, the same for every request
            return [s.arrival + self.latency for s in specs]
        out, free, service = [], -math.inf, self.service
        for s in specs:
            free = max(s.arrival + self.delay(s), free + service)
            out.append(free)
        return out


class OpenLoopArrivals:
    """A workload's requests at their own arrival times, through the front door, to ``dispatch``
    (an urgent event each: at equal times an arrival lands before any step starts or ends)."""

    def __init__(self, env: SimEnvironment, specs: Sequence[RequestSpec], door: FrontDoor, dispatch: Dispatch,
                 on_done: Callable[[], None]) -> None:
        self.env, self.specs, self.dispatch, self.on_done = env, specs, dispatch, on_done
        self.exits = door.exits(specs)
        self.next = 0  # index of the next request to hand in

    def next_time(self) -> float:
        """When the next request is handed in (inf: none is left)."""
        i = self.next
        return self.exits[i] if i < len(self.exits) else math.inf

    def run(self):
        env, exits, specs, dispatch = self.env, self.exits, self.specs, self.dispatch
        for i, spec in enumerate(specs):
            t = exits[i]
            if t > env.now:
                yield env.at(t, urgent=True)
            self.next = i + 1
            dispatch(spec, i)
        self.on_done()
