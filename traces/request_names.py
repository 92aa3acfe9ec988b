"""The name a client sees for a request: the server's run, its replica in a data-parallel fleet,
and the id its log gives it (``Arrived.request_id``).

A run is one start of one engine, that is one log: a short random id (eight hex digits, drawn by
the engine that starts: runtime/serving/llm_engine.py) written in the log's Header
(``extra.run_id``). Request ids start at 0 again with every start, and a rotated log keeps the old
ones, so the run is what tells ``cmpl-3f2a9c1e-17`` of today's log from request 17 of yesterday's.
Each replica of a data-parallel fleet is an engine of its own (its own log, its own run; one
started again after a death writes a new log under a new run). A name is ``<run>-<request id>``
for one engine and ``<run>-<replica>-<request id>`` for a fleet's; the server puts its own prefix
before it (``cmpl-``, ``chatcmpl-``). A reader finds the request in the log whose Header has
that run (for a fleet, among replica ``<replica>``'s logs) by its ``Arrived.request_id``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

RUN_ID_KEY = "run_id"  # the Header's extra entry
_NAME = re.compile(r"(?:[A-Za-z]+-)?(?P<run>[0-9a-f]{8})-(?:(?P<replica>\d+)-)?(?P<request_id>\d+)")


def header_run_id(header: Any) -> str | None:
    """The run a log's Header names (None: a log written before runs were named, or a simulated one)."""
    if header is None:
        return None
    run = header.extra.get(RUN_ID_KEY)
    return str(run) if run is not None else None


class RequestName(NamedTuple):
    run_id: str
    replica: int | None  # None: one engine
    request_id: int  # the log's (its replica's log, for a fleet)

    def __str__(self) -> str:
        if self.replica is None:
            return f"{self.run_id}-{self.request_id}"
        return f"{self.run_id}-{self.replica}-{self.request_id}"


def parse_request_name(text: str | None) -> RequestName | None:
    """The name in a response id (``cmpl-<run>-[<replica>-]<request id>``); None for an id that
    names no logged request this way (another server's, say)."""
    m = _NAME.fullmatch(text or "")
    if m is None:
        return None
    replica = m.group("replica")
    return RequestName(m.group("run"), None if replica is None else int(replica), int(m.group("request_id")))
