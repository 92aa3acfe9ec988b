"""A simulated fleet's replica outages, as a live fleet has them (``serve --data-parallel-size``):
replica ``replica`` dies at ``start`` (its process stops: the step in flight never ends, its
requests in flight fail, their clients move on) and the router skips it until ``end``, when a fresh
replica (an empty core, a log of its own) takes its place; ``end`` None: it stays down.

``outages_of(fleet)`` reads them from a fleet log's ``ReplicaDown`` / ``ReplicaUp`` events, so a
fleet log with an outage re-simulates with the same one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from traces.fleet_log import FleetLog


@dataclass(frozen=True)
class SimOutage:
    replica: int
    start: float
    end: float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.start) or (self.end is not None and not self.end >= self.start):
            raise ValueError(f"an outage of replica {self.replica} needs a finite start and an end after it "
                             f"(got {self.start} to {self.end})")


def outages_of(fleet: FleetLog) -> list[SimOutage]:
    return [SimOutage(o.replica, o.down, o.up) for o in fleet.outages]


def check_outages(outages: Sequence[SimOutage], replicas: int) -> None:
    """One clear error for an outage of a replica the fleet lacks, or two of one replica at once."""
    for o in outages:
        if not 0 <= o.replica < replicas:
            raise ValueError(f"an outage of replica {o.replica}: the fleet has replicas 0..{replicas - 1}")
    for r in range(replicas):
        mine = sorted((o for o in outages if o.replica == r), key=lambda o: o.start)
        for a, b in zip(mine, mine[1:]):
            if a.end is None or b.start < a.end:
                raise ValueError(f"replica {r}'s outages overlap (one from {a.start} s, one from {b.start} s)")


def edges(outages: Sequence[SimOutage]) -> list[float]:
    """Every time an outage starts or ends, in order (a landed run of decode steps never crosses one)."""
    return sorted({t for o in outages for t in (o.start, o.end) if t is not None})
