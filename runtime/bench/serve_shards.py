"""The load generator in several processes: one asyncio process parsing ~15k SSE events a second
falls behind its own schedule (sends late, reads late), and then measures itself, not the server.

Request i goes to process i mod N (a closed loop's turn: its session mod N, so that a turn is
released in the process that saw the turn before it end); every process waits for one common start
(an epoch time set once all are ready), sends its requests at their arrival offsets from it, and
returns its records. The parent merges them in request order and forwards each finished request to
``progress``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from runtime.bench.serve_client import RequestRecord, replay, run_loop

_START_MARGIN_S = 0.2  # between "all ready" and the common start: every process is waiting by then


def _shard(base_url: str, bodies: Sequence[dict], records: list[RequestRecord], api_key: str | None,
           timeout: float, max_connections: int, time_limit: float | None, ready: Any, start: Any,
           out: Any) -> None:
    ready.put(None)
    start_epoch = start.get()

    def progress(record: RequestRecord) -> None:
        out.put(("done", record))

    async def main() -> float:
        await asyncio.sleep(max(0.0, start_epoch - time.time()))
        return await replay(base_url, bodies, records, api_key, timeout, max_connections, progress, time_limit)

    wall = run_loop(main())
    out.put(("records", records, wall))


def run_sharded(processes: int, base_url: str, bodies: Sequence[dict], records: list[RequestRecord],
                api_key: str | None, timeout: float, max_connections: int, time_limit: float | None,
                progress: Callable[[RequestRecord], None] | None) -> tuple[list[RequestRecord], float]:
    """As ``serve_client.replay`` over ``processes`` spawned processes; (records in order, wall seconds)."""
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    starts = [ctx.Queue() for _ in range(processes)]
    shard_of = [(r.index if r.session is None else r.session) % processes for r in records]
    procs = [ctx.Process(target=_shard, daemon=True,
                         args=(base_url, [b for b, s in zip(bodies, shard_of) if s == k],
                               [r for r, s in zip(records, shard_of) if s == k], api_key, timeout,
                               max(1, max_connections // processes), time_limit, ready, starts[k], out))
             for k in range(processes)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        start_epoch = time.time() + _START_MARGIN_S
        for q in starts:
            q.put(start_epoch)
        merged: list[RequestRecord] = []
        wall, finished = 0.0, 0
        while finished < processes:
            try:
                msg = out.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a client process failed (exit status {dead[0]})") from None
                continue
            if msg[0] == "done":
                if progress is not None:
                    progress(msg[1])
            else:
                merged.extend(msg[1])
                wall, finished = max(wall, msg[2]), finished + 1
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return sorted(merged, key=lambda r: r.index), wall
