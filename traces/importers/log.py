"""Our own logs (and saved workloads) as workloads: their ``Arrived`` events."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from traces.events import Aborted, Arrived, Event, Finished, Header, Rejected
from traces.importers.rows import json_object
from traces.log import read_log
from traces.params import SamplingParams
from traces.workload import SESSIONS_KEY, WORKLOAD_CLOCK, RequestSpec, Workload, WorkloadError, synthetic_prompt


def detect(path: Path, first_line: str) -> bool:
    row = json_object(first_line)
    return row is not None and row.get("type") == "Header"


def fixed_length_params(params: SamplingParams, num_output_tokens: int) -> SamplingParams:
    """``params`` made to stop after exactly ``num_output_tokens`` tokens, whatever is sampled."""
    return msgspec.structs.replace(params, max_tokens=num_output_tokens,
                                   min_tokens=min(params.min_tokens, num_output_tokens),
                                   ignore_eos=True, stop_token_ids=(), stop=())


def read_log_workload(path: str | Path) -> Workload:
    """The requests of a recorded log (or a saved workload): their ``Arrived`` events.

    A request that finished gets its recorded output length (``Finished.num_output_tokens``)
    as a fixed length. Aborted requests (and any finished with no output) are left out and
    counted in ``meta["excluded"]``; unfinished ones keep their logged params. Requests the engine
    refused (``Rejected``) stay in, with their prompt or a synthetic one of its length, so a
    re-simulation refuses them too (``meta["rejected"]``). A log cut off mid-write gives the
    requests of its complete lines, and ``meta["dropped_bytes"]``.
    """
    reader = read_log(path)
    return log_workload(reader, path, lambda: reader.dropped_bytes if reader.truncated else None)


def log_workload(events: Iterable[Event], path: str | Path,
                 dropped_bytes: Callable[[], int | None] = lambda: None) -> Workload:
    """``read_log_workload`` of a log's events already read; ``dropped_bytes``: the bytes its reader
    dropped of a log cut off mid-write, None for a whole log (asked once the events are consumed)."""
    path = Path(path)
    header: Header | None = None
    arrived: dict[int, Arrived] = {}
    outputs: dict[int, int] = {}
    aborted: set[int] = set()
    rejected: list[Rejected] = []
    for event in events:
        if isinstance(event, Arrived):
            arrived[event.request_id] = event
        elif isinstance(event, Finished):
            outputs[event.request_id] = event.num_output_tokens
        elif isinstance(event, Aborted):
            aborted.add(event.request_id)
        elif isinstance(event, Rejected):
            rejected.append(event)
        elif isinstance(event, Header) and header is None:
            header = event
    if header is None:
        raise WorkloadError(f"{path}:1: the first line must be a Header event")
    requests: list[RequestSpec] = []
    excluded = {"aborted": 0, "no_output": 0}
    unfinished = 0
    for rid, ev in arrived.items():
        params = ev.params
        if rid in aborted:
            excluded["aborted"] += 1
            continue
        if rid in outputs:
            if outputs[rid] < 1:
                excluded["no_output"] += 1
                continue
            params = fixed_length_params(params, outputs[rid])
        else:
            unfinished += 1
        requests.append(RequestSpec(arrival=ev.time, prompt=ev.prompt, params=params, priority=ev.priority,
                                    cache_salt=ev.cache_salt))
    for i, ev in enumerate(rejected):
        prompt = ev.prompt or synthetic_prompt(ev.num_prompt_tokens, header.seed, unique_seed=(1 << 40) + i)
        requests.append(RequestSpec(arrival=ev.time, prompt=prompt, params=ev.params, priority=ev.priority))
    dropped = dropped_bytes()
    cut = {} if dropped is None else {"dropped_bytes": dropped}  # a log cut off mid-write
    if header.clock == WORKLOAD_CLOCK:
        info = dict(header.extra.get("workload", {}))
        source = info.pop("source", str(path))
        info.pop("num_requests", None)
        for i, session, think in info.pop(SESSIONS_KEY, []):
            requests[i] = msgspec.structs.replace(requests[i], session=session, think_time=think)
        return Workload(requests, seed=header.seed, source=source, meta={**info, **cut})
    meta: dict[str, Any] = {"format": "log", "clock": header.clock, **cut}
    if any(excluded.values()):
        meta["excluded"] = {k: v for k, v in excluded.items() if v}
    if unfinished:
        meta["unfinished"] = unfinished
    if rejected:
        meta["rejected"] = len(rejected)
    return Workload(requests, seed=header.seed, source=str(path), meta=meta)
