"""A log read once, for every fit that needs it.

Fitting a model reads the same log for its steps (step_data.py), its host gaps (host_timing.py),
its requests' latencies and workload (simulator/fitting/intake.py). Each used to open and decode
the file again; a ``LoggedRun`` holds the decoded events so they all share one read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from traces.events import Event, Header
from traces.log import LogError, read_log

LogPath = str | Path


@dataclass(frozen=True, slots=True)
class LoggedRun:
    path: str
    events: tuple[Event, ...]
    dropped_bytes: int | None = None  # a log cut off mid-write: the bytes dropped of its last line

    @classmethod
    def read(cls, path: LogPath) -> LoggedRun:
        reader = read_log(path)
        events = tuple(reader)
        return cls(str(path), events, reader.dropped_bytes if reader.truncated else None)

    @property
    def header(self) -> Header:
        first = self.events[0] if self.events else None
        if not isinstance(first, Header):
            raise LogError(f"{self.path}:1: the first line must be a Header event")
        return first


def read_runs(logs: Sequence[LogPath | LoggedRun], cache: dict[str, LoggedRun] | None = None) -> list[LoggedRun]:
    """Each of ``logs`` read (a ``LoggedRun`` passes through); with ``cache``, a path read before
    (another role of the same log in one fit: training and calibration) is not read again."""
    out = []
    for log in logs:
        if isinstance(log, LoggedRun):
            run = log
        elif cache is not None and str(log) in cache:
            run = cache[str(log)]
        else:
            run = LoggedRun.read(log)
        if cache is not None:
            cache.setdefault(run.path, run)
        out.append(run)
    return out
