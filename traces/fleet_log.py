"""A fleet's logs: one event log per replica plus a fleet log of the routing decisions.

The fleet log is a log like any other: a ``Header`` (clock, the first replica's config) whose
``extra["fleet"]`` names the router and the replicas' logs (paths relative to the fleet log), then
one ``Routed`` event per request the front door handed in, in order. A replica's log is an
ordinary engine log (its own request ids). ``analyze``, ``fold`` and ``regress`` read the set as
one run: the fleet log stands for it.

A replica that dies is a ``ReplicaDown`` event; started again, a ``ReplicaUp`` naming its new log
(its request ids start afresh), which the ``Routed`` events after it for that replica refer to.
The reader numbers every log of the fleet, the replicas' first logs first, then each restart's in
the order they came up, and gives each route the number of the log holding its request.

    run.jsonl.gz                   the fleet log
    run.replica0.jsonl.gz          the logs of replica 0, 1, ...
    run.replica1.restart1.jsonl.gz replica 1's log after its first restart
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from traces.events import Header, ReplicaDown, ReplicaUp, Routed
from traces.log import LogError, read_log
from traces.log_files import beside

FLEET_KEY = "fleet"


def replica_log_path(fleet_log: str | Path, replica: int) -> Path:
    """Where replica ``replica``'s log of a fleet log goes: ``run.jsonl.gz`` → ``run.replica0.jsonl.gz``."""
    return beside(fleet_log, f"replica{replica}")


def restart_log_path(fleet_log: str | Path, replica: int, restart: int) -> Path:
    """Replica ``replica``'s log after its ``restart``-th restart: ``run.replica1.restart2.jsonl.gz``
    (not a number alone: those are the names rotation gives an earlier run's logs)."""
    return beside(replica_log_path(fleet_log, replica), f"restart{restart}")


def relative_log(path: str | Path, fleet_log: str | Path) -> str:
    """How the fleet log names a replica's log: relative to its own folder where it can be."""
    base = Path(fleet_log).parent
    return str(Path(path).relative_to(base)) if Path(path).is_relative_to(base) else str(path)


def fleet_extra(router: str, logs: list[Path], fleet_log: str | Path, **more: Any) -> dict[str, Any]:
    """The fleet log Header's ``extra["fleet"]``."""
    return {FLEET_KEY: {"router": router, "replicas": len(logs),
                        "logs": [relative_log(p, fleet_log) for p in logs], **more}}


def is_fleet(header: Header | None) -> bool:
    return header is not None and isinstance(header.extra.get(FLEET_KEY), dict)


@dataclass(frozen=True)
class Outage:
    """A replica down from ``down`` until ``up`` (None: it never came back); ``log`` is the number of
    the log it died writing, ``next_log`` its log once back (None: not back or not recorded)."""

    replica: int
    down: float
    reason: str
    log: int
    up: float | None = None
    next_log: int | None = None


@dataclass(frozen=True)
class FleetLog:
    """``replica_logs``: every log of the fleet (the replicas' first ones in replica order, then one
    per restart); ``log_replicas``: the replica each of those is of; ``routes``: the ``Routed``
    events, each one's ``replica`` the number of the log that holds its request (the replica itself
    when none restarted)."""

    path: Path
    header: Header
    router: str
    replica_logs: list[Path]
    routes: list[Routed]
    log_replicas: list[int]
    outages: list[Outage]

    @property
    def replicas(self) -> int:
        return int(self.header.extra[FLEET_KEY].get("replicas", len(self.log_replicas)))

    @classmethod
    def read(cls, path: str | Path) -> FleetLog:
        path = Path(path)
        events = read_log(path)
        header = next(events, None)
        if not is_fleet(header):
            raise LogError(f"{path}: not a fleet log (its Header has no extra.{FLEET_KEY})")
        info = header.extra[FLEET_KEY]
        logs = [path.parent / p for p in info.get("logs", [])]
        owners = list(range(len(logs)))
        current = list(range(len(logs)))  # replica -> the number of its log now
        routes: list[Routed] = []
        outages: list[Outage] = []
        open_outage: dict[int, int] = {}  # replica -> its outage now
        for e in events:
            if isinstance(e, Routed):
                routes.append(msgspec.structs.replace(e, replica=_log_of(current, e.replica, path)))
            elif isinstance(e, ReplicaDown):
                open_outage[e.replica] = len(outages)
                outages.append(Outage(e.replica, e.time, e.reason, _log_of(current, e.replica, path)))
            elif isinstance(e, ReplicaUp):
                _log_of(current, e.replica, path)
                next_log = None
                if e.log is not None:
                    logs.append(path.parent / e.log)
                    owners.append(e.replica)
                    current[e.replica] = next_log = len(logs) - 1
                if (k := open_outage.pop(e.replica, None)) is not None:
                    outages[k] = Outage(**{**outages[k].__dict__, "up": e.time, "next_log": next_log})
        missing = [str(p) for p in logs if not p.exists()]
        if missing:
            raise LogError(f"{path}: the replica logs it names are missing: {', '.join(missing)}")
        return cls(path, header, str(info.get("router", "")), logs, routes, owners, outages)


def _log_of(current: list[int], replica: int, path: Path) -> int:
    if not 0 <= replica < len(current):
        raise LogError(f"{path}: an event names replica {replica}; the fleet has {len(current)}")
    return current[replica]
