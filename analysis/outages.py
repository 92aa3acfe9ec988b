"""A fleet's outages, one line each: which replica was down, when and for how long, why, and how
many of its requests it took down (those its log leaves unfinished)."""

from __future__ import annotations

from pathlib import Path

from traces.fleet_log import FleetLog, Outage, is_fleet
from traces.log import read_header


def outage_lines(path: str | Path) -> list[str]:
    """Nothing for a log that is not a fleet's, or a fleet that lost no replica."""
    if not is_fleet(read_header(path)):
        return []
    fleet = FleetLog.read(path)
    return [describe(o, fleet) for o in fleet.outages]


def describe(outage: Outage, fleet: FleetLog) -> str:
    from analysis.frames import load_frames

    requests = load_frames(fleet.replica_logs[outage.log]).requests
    cut = int((requests["status"] == "unfinished").sum()) if len(requests) else 0
    back = (f"for {outage.up - outage.down:.2f} s, back with {fleet.replica_logs[outage.next_log].name}"
            if outage.up is not None and outage.next_log is not None
            else f"for {outage.up - outage.down:.2f} s" if outage.up is not None else "and not back")
    return (f"outage: replica {outage.replica} down at {outage.down:.2f} s {back}; {cut} request"
            f"{'' if cut == 1 else 's'} in flight failed ({outage.reason})")
