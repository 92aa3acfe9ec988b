"""A fleet's logs: one event log per replica plus a fleet log of the routing decisions.

The fleet log is a log like any other: a ``Header`` (clock, the first replica's config) whose
``extra["fleet"]`` names the router and the replicas' logs (paths relative to the fleet log), then
one ``Routed`` event per request the front door handed in, in order. A replica's log is an
ordinary engine log (its own request ids). ``analyze``, ``fold`` and ``regress`` read the set as
one run: the fleet log stands for it.

    run.jsonl.gz          the fleet log
    run.replica0.jsonl.gz the logs of replica 0, 1, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traces.events import Header, Routed
from traces.log import LogError, read_log
from traces.log_files import beside

FLEET_KEY = "fleet"


def replica_log_path(fleet_log: str | Path, replica: int) -> Path:
    """Where replica ``replica``'s log of a fleet log goes: ``run.jsonl.gz`` → ``run.replica0.jsonl.gz``."""
    return beside(fleet_log, f"replica{replica}")


def fleet_extra(router: str, logs: list[Path], fleet_log: str | Path, **more: Any) -> dict[str, Any]:
    """The fleet log Header's ``extra["fleet"]``."""
    base = Path(fleet_log).parent
    return {FLEET_KEY: {"router": router, "replicas": len(logs),
                        "logs": [str(Path(p).relative_to(base)) if Path(p).is_relative_to(base) else str(p)
                                 for p in logs], **more}}


def is_fleet(header: Header | None) -> bool:
    return header is not None and isinstance(header.extra.get(FLEET_KEY), dict)


@dataclass(frozen=True)
class FleetLog:
    path: Path
    header: Header
    router: str
    replica_logs: list[Path]
    routes: list[Routed]

    @classmethod
    def read(cls, path: str | Path) -> FleetLog:
        path = Path(path)
        events = read_log(path)
        header = next(events, None)
        if not is_fleet(header):
            raise LogError(f"{path}: not a fleet log (its Header has no extra.{FLEET_KEY})")
        info = header.extra[FLEET_KEY]
        logs = [path.parent / p for p in info.get("logs", [])]
        missing = [str(p) for p in logs if not p.exists()]
        if missing:
            raise LogError(f"{path}: the replica logs it names are missing: {', '.join(missing)}")
        routes = [e for e in events if isinstance(e, Routed)]
        return cls(path, header, str(info.get("router", "")), logs, routes)
