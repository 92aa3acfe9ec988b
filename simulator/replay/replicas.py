"""The logs a replay reads: an engine log is its own; a fleet log (traces/fleet_log.py: the front
door's routing, no steps) stands for its replicas' logs, each an ordinary engine log replayed on
its own, with its own step times and its own executor."""

from __future__ import annotations

from pathlib import Path

from traces.fleet_log import FleetLog, is_fleet
from traces.log import read_header


def replica_logs(path: str | Path) -> tuple[bool, list[Path]]:
    """(whether ``path`` is a fleet log, the engine logs to replay). LogError when a replica log
    the fleet log names is missing."""
    if not is_fleet(read_header(path)):
        return False, [Path(path)]
    return True, FleetLog.read(path).replica_logs
