"""Which engine request served which client request: ``bench serve``'s records joined to the
server's event log.

Our server names each request in its responses' ids: the run its log's Header names, the replica
of a fleet and the log's request id (traces/request_names.py). A client record whose response id
names a request of this log is paired with it (``join_names``), exactly.

A record without such an id (another server's ids, or no chunk came) is paired by what travels
from the client to the log unchanged, the prompt: the token ids the client sent (the ``Arrived``
event keeps them), or, with ``--text-prompts``, the text those ids decode to. Each side's prompt is
reduced to one digest (``prompt_key``); requests of equal digests are paired in order, the client's
by send time against the engine's by arrival. A request the engine never saw (refused at the door,
never sent) pairs with nothing; an engine request no client record claims (another client's) stays
out of the comparison.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from traces.events import Arrived, Header, recorded_prompts
from traces.fleet_log import FleetLog, is_fleet
from traces.log import read_log
from traces.prompt import PromptIds
from traces.request_names import RequestName, header_run_id, parse_request_name

# client errors of a request that never reached the engine (refused at the door or never sent)
NEVER_ARRIVED = ("not sent", "connect")


class NoPromptIds(ValueError):
    """The server's log keeps no prompt ids (``serve --trace-prompts hashes|none``)."""


def prompt_key(prompt: Sequence[int] | str) -> bytes:
    """One digest of a prompt as sent: its token ids, or its text."""
    if isinstance(prompt, str):
        data = b"text:" + prompt.encode("utf-8", "surrogatepass")
    else:
        data = b"ids:" + np.asarray(prompt, dtype=np.int64).tobytes()
    return hashlib.blake2b(data, digest_size=16).digest()


def _arrivals(path: Path) -> tuple[Header | None, list[Arrived]]:
    header, arrived = None, []
    for ev in read_log(path):
        if isinstance(ev, Header):
            header = ev
        elif isinstance(ev, Arrived):
            arrived.append(ev)
    return header, arrived


class _Part(NamedTuple):
    """One engine log of the server: a fleet's log number (how its routes name it) and replica."""

    log: int | None  # None: the log of one engine
    replica: int | None
    header: Header | None
    arrived: list[Arrived]


def _parts(log: str | Path) -> tuple[list[_Part], dict[tuple[int, int], int]]:
    """The log's parts (a fleet log: every replica's logs, restarts' too) and a fleet's (log number,
    request id) -> front-door index (empty for one engine's log)."""
    header, arrived = _arrivals(Path(log))
    if not is_fleet(header):
        return [_Part(None, None, header, arrived)], {}
    fleet = FleetLog.read(log)
    parts = [_Part(k, fleet.log_replicas[k], *_arrivals(p)) for k, p in enumerate(fleet.replica_logs)]
    return parts, {(r.replica, r.request_id): r.index for r in fleet.routes if r.request_id is not None}


def _frame_id(part: _Part, ev: Arrived, index: dict[tuple[int, int], int]) -> int:
    """The request's id as ``analysis.frames.load_frames`` numbers it (a fleet's: its front-door index)."""
    return ev.request_id if part.log is None else index.get((part.log, ev.request_id), -1)


def engine_names(log: str | Path) -> dict[RequestName, int]:
    """Each logged request's name -> its id as ``analysis.frames.load_frames`` numbers it; none for
    a log whose Header names no run."""
    parts, index = _parts(log)
    out = {}
    for part in parts:
        run = header_run_id(part.header)
        if run is not None:
            for ev in part.arrived:
                out[RequestName(run, part.replica, ev.request_id)] = _frame_id(part, ev, index)
    return out


def join_names(client: Sequence[tuple[int, str | None]], names: dict[RequestName, int]) -> dict[int, int]:
    """Client (index, response id) against the log's names: client index -> engine request id, for
    the ids that name a request of this log."""
    pairs = {}
    for index, response_id in client:
        name = parse_request_name(response_id)
        if name is not None and name in names:
            pairs[index] = names[name]
    return pairs


def engine_prompts(log: str | Path,
                   decode: Callable[[list[int]], str] | None = None) -> list[tuple[int, float, bytes]]:
    """(request id as ``analysis.frames.load_frames`` numbers it, arrival, prompt digest) of every
    request in the log; ``decode``: the client sent text, so the digest is of the text the
    engine's ids decode to. A fleet log: every replica's requests, by their front-door index."""
    parts, index = _parts(log)
    out = []
    for part in parts:
        head = part.header
        if head is not None and recorded_prompts(head) != "ids":
            raise NoPromptIds(f"the server's log keeps prompts as {recorded_prompts(head)}, not token ids "
                              "(serve --trace-prompts ids)")
        for ev in part.arrived:
            if not isinstance(ev.prompt, PromptIds):
                raise NoPromptIds("the server's log holds synthetic prompts, not the ids it was sent")
            ids = ev.prompt.token_ids
            out.append((_frame_id(part, ev, index), ev.time, prompt_key(decode(ids) if decode else ids)))
    return out


def join(client: Sequence[tuple[int, float, bytes]], engine: Sequence[tuple[int, float, bytes]]) -> dict[int, int]:
    """Client (index, send time, digest) against engine (request id, arrival, digest): client index ->
    engine request id, equal digests paired in time order."""
    waiting: dict[bytes, list[int]] = defaultdict(list)
    for rid, _, key in sorted(engine, key=lambda e: (e[1], e[0])):
        waiting[key].append(rid)
    taken: dict[bytes, int] = defaultdict(int)
    pairs = {}
    for index, _, key in sorted(client, key=lambda c: (c[1], c[0])):
        queue = waiting.get(key)
        if queue and taken[key] < len(queue):
            pairs[index] = queue[taken[key]]
            taken[key] += 1
    return pairs
