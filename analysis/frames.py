"""Event log → pandas DataFrames: one row per request, one row per step.

``requests``: request_id, arrival, num_prompt_tokens, max_tokens, priority, admitted (first
admission time), num_cached_tokens (at first admission), first_token (end of the step that
sampled its first token), finish (Finished/Aborted time), num_output_tokens, finish_reason,
status (finished | aborted | unfinished), num_preemptions.

``steps``: step, start, end, duration, num_spans, prefill_tokens (Σ chunk over spans > 1
token), decode_seqs (spans of 1 token), num_tokens, num_sampled, max_chunk (longest prefill
chunk), decode_context (Σ start + 1 over decode spans), prefill_attention (query-key pairs of the
prefill chunks), num_admitted, num_preempted. The last three shape columns are what a cost
model's profiled range is stated in (simulator/cost/ranges.py).

``gaps``: one row per gap between two consecutive token deliveries of a request (a delivery =
the end of a step that sampled for it; several tokens of one span are one delivery): request_id,
step (the step that ended the gap), prev_step, start (the previous delivery), gap (seconds).
A preemption's recompute is inside a gap: the user waits through it.

``rejected``: one row per request the engine refused (``Rejected``; never served, no id): time,
num_prompt_tokens, max_tokens, priority, reason.

Built in one streaming pass (``FrameBuilder`` is also a log sink), so a multi-million-step log
needs memory for the columns only.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from traces.events import Aborted, Admitted, Arrived, Event, Finished, Header, Preempted, Rejected, Routed, Step
from traces.fleet_log import FleetLog, is_fleet
from traces.log import read_log

_NAN = math.nan


@dataclass
class LogFrames:
    header: Header | None
    requests: pd.DataFrame
    steps: pd.DataFrame
    gaps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(_GAP_COLUMNS)))
    rejected: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(_REJECTED_COLUMNS)))
    # a log cut off mid-write (a killed server): its complete lines were read, these bytes dropped
    truncated: bool = False
    dropped_bytes: int = 0


class FrameBuilder:
    """Consumes events (call it like a sink), then ``frames()``."""

    def __init__(self) -> None:
        self.header: Header | None = None
        self._req: dict[int, list] = {}
        self._first_token: dict[int, float] = {}
        self._cols: dict[str, list] = {k: [] for k in (
            "step", "start", "end", "num_spans", "prefill_tokens", "decode_seqs", "num_tokens", "num_sampled",
            "max_chunk", "decode_context", "prefill_attention")}
        self._admitted_per_step: dict[int, int] = {}
        self._preempted_per_step: dict[int, int] = {}
        self._last_token: dict[int, tuple[float, int]] = {}  # unfinished request -> (time, step) of its last delivery
        self._gaps = {"request_id": array("q"), "step": array("q"), "prev_step": array("q"), "start": array("d"),
                      "gap": array("d")}  # typed arrays: a long log has a gap per token
        self._rejected: list[tuple] = []

    # row layout of a request: see _REQ_COLUMNS
    def __call__(self, ev: Event) -> None:
        if isinstance(ev, Step):
            c = self._cols
            first = self._first_token
            last, g = self._last_token, self._gaps
            end = ev.end
            pt = ds = nt = sampled = mc = dc = pa = 0
            for s in ev.spans:
                n = s.num_tokens
                nt += n
                if n == 1:
                    ds += 1
                    dc += s.start + 1
                else:
                    pt += n
                    pa += n * s.start + n * (n + 1) // 2
                    if n > mc:
                        mc = n
                if s.sample:
                    sampled += 1
                    rid = s.request_id
                    prev = last.get(rid)
                    if prev is not None:
                        g["request_id"].append(rid)
                        g["step"].append(ev.step)
                        g["prev_step"].append(prev[1])
                        g["start"].append(prev[0])
                        g["gap"].append(end - prev[0])
                    elif rid not in first:
                        first[rid] = end
                    last[rid] = (end, ev.step)
            c["step"].append(ev.step)
            c["start"].append(ev.start)
            c["end"].append(end)
            c["num_spans"].append(len(ev.spans))
            c["prefill_tokens"].append(pt)
            c["decode_seqs"].append(ds)
            c["num_tokens"].append(nt)
            c["num_sampled"].append(sampled)
            c["max_chunk"].append(mc)
            c["decode_context"].append(dc)
            c["prefill_attention"].append(pa)
        elif isinstance(ev, Arrived):
            self._req[ev.request_id] = [ev.request_id, ev.time, ev.prompt.num_tokens, ev.params.max_tokens,
                                        ev.priority, _NAN, -1, _NAN, 0, None, "unfinished", 0]
        elif isinstance(ev, Admitted):
            row = self._req.get(ev.request_id)
            if row is not None and row[6] < 0:
                row[5], row[6] = ev.time, ev.num_cached_tokens
            self._admitted_per_step[ev.step] = self._admitted_per_step.get(ev.step, 0) + 1
        elif isinstance(ev, Preempted):
            row = self._req.get(ev.request_id)
            if row is not None:
                row[11] += 1
            self._preempted_per_step[ev.step] = self._preempted_per_step.get(ev.step, 0) + 1
        elif isinstance(ev, Finished | Aborted):
            self._last_token.pop(ev.request_id, None)
            row = self._req.get(ev.request_id)
            if row is not None:
                row[7] = ev.time
                row[9] = ev.reason
                if isinstance(ev, Finished):
                    row[8] = ev.num_output_tokens
                    row[10] = "finished"
                else:
                    row[10] = "aborted"
        elif isinstance(ev, Rejected):
            self._rejected.append((ev.time, ev.num_prompt_tokens, ev.params.max_tokens, ev.priority, ev.reason))
        elif isinstance(ev, Header) and self.header is None:
            self.header = ev

    write = __call__

    def frames(self) -> LogFrames:
        rows = list(self._req.values())
        requests = pd.DataFrame(rows, columns=list(_REQ_COLUMNS))
        requests.insert(7, "first_token", requests["request_id"].map(self._first_token).astype(float))
        requests["num_cached_tokens"] = requests["num_cached_tokens"].astype("Int64").mask(
            requests["num_cached_tokens"] < 0)
        steps = pd.DataFrame({k: np.asarray(v) for k, v in self._cols.items()})
        if len(steps):
            steps.insert(3, "duration", steps["end"] - steps["start"])
            steps["num_admitted"] = steps["step"].map(self._admitted_per_step).fillna(0).astype(np.int64)
            steps["num_preempted"] = steps["step"].map(self._preempted_per_step).fillna(0).astype(np.int64)
        else:
            steps = pd.DataFrame(columns=[*self._cols, "duration", "num_admitted", "num_preempted"])
        gaps = pd.DataFrame({k: np.frombuffer(v, dtype=np.int64 if v.typecode == "q" else np.float64).copy()
                             for k, v in self._gaps.items()})
        rejected = pd.DataFrame(self._rejected, columns=list(_REJECTED_COLUMNS))
        return LogFrames(self.header, requests, steps, gaps, rejected)


_REQ_COLUMNS = ("request_id", "arrival", "num_prompt_tokens", "max_tokens", "priority", "admitted",
                "num_cached_tokens", "finish", "num_output_tokens", "finish_reason", "status",
                "num_preemptions")

_GAP_COLUMNS = ("request_id", "step", "prev_step", "start", "gap")
_REJECTED_COLUMNS = ("time", "num_prompt_tokens", "max_tokens", "priority", "reason")


def frames_from_events(events: Iterable[Event]) -> LogFrames:
    builder = FrameBuilder()
    for ev in events:
        builder(ev)
    return builder.frames()


def load_frames(path: str | Path) -> LogFrames:
    """DataFrames of a log file (JSONL or .jsonl.gz); of its complete lines if it was cut off. A
    fleet log (traces/fleet_log.py) reads as one run: its replicas' frames, one after the other."""
    reader = read_log(path)
    frames = frames_from_events(reader)
    frames.truncated, frames.dropped_bytes = reader.truncated, reader.dropped_bytes
    if is_fleet(frames.header):
        return fleet_frames(FleetLog.read(path))
    return frames


def fleet_frames(fleet: FleetLog) -> LogFrames:
    """A fleet's frames: every replica's rows with a ``replica`` column; a request's ``request_id`` is
    its index at the front door (unique in the fleet), ``replica_request_id`` the replica's own id;
    steps keep their replica's numbers; the header is the fleet log's. A replica started again after
    it died has rows from each of its logs (``log``: which one)."""
    return combine_replicas(fleet.header, [load_frames(log) for log in fleet.replica_logs], fleet.routes,
                            fleet.log_replicas)


def combine_replicas(header: Header | None, parts: list[LogFrames], routes: Iterable[Routed],
                     replicas: list[int] | None = None) -> LogFrames:
    """The replicas' frames (``parts``, in replica order) as one fleet's (``fleet_frames``), the
    ``Routed`` events giving each request its front-door index (each one's ``replica``: its part):
    a fleet's frames built in memory. ``replicas``: the replica each part is of (default: part i is
    replica i; a restarted replica's later logs are parts of their own)."""
    index = {(r.replica, r.request_id): r.index for r in routes if r.request_id is not None}
    tables = {}
    for name in ("requests", "steps", "gaps", "rejected"):
        pieces = []
        for i, part in enumerate(parts):
            table = getattr(part, name).copy()
            table.insert(0, "replica", i if replicas is None else replicas[i])
            if replicas is not None and len(replicas) > len(set(replicas)):
                table.insert(1, "log", i)
            if "request_id" in table:  # one id per request across the fleet: its front-door index
                table["replica_request_id"] = table["request_id"]
                table["request_id"] = [index.get((i, rid), -1) for rid in table["request_id"]]
            pieces.append(table)
        tables[name] = pd.concat(pieces, ignore_index=True)
    return LogFrames(header, tables["requests"], tables["steps"], tables["gaps"], tables["rejected"],
                     any(p.truncated for p in parts), sum(p.dropped_bytes for p in parts))
