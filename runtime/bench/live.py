"""The real engine on wall-clock arrivals, in process (no HTTP): what serving costs without the server.

Each workload request is added when its arrival time (seconds after the start) has passed, stamped
with that arrival time; otherwise the engine steps, or sleeps until the next arrival. The event log
is what ``analyze`` reads; set beside a ``bench serve`` run of the same workload it tells the
engine's share of the latency from the HTTP front end's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runtime.bench.serve_client import prompt_ids
from traces.workload import Workload


def replay_live(engine: Any, workload: Workload, *, vocab: int | None = None,
                on_finish: Callable[[int], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Replay ``workload`` on ``engine`` (an ``LLMEngine``) in real time; returns the steps run.
    ``vocab``: fold prompt ids into it (``serve_client.prompt_ids``); ``on_finish(n)``: called
    with the number of requests that finished in a step."""
    specs = workload.requests
    base = specs[0].arrival if specs else 0.0
    t0 = engine.now()
    i, steps = 0, 0
    while i < len(specs) or engine.busy:
        now = engine.now() - t0
        while i < len(specs) and specs[i].arrival - base <= now:
            spec = specs[i]
            engine.add_request(prompt_ids(spec, vocab), spec.params, priority=spec.priority,
                               arrival_time=t0 + spec.arrival - base)
            i += 1
        if engine.busy:
            finished = sum(d.finished for d in engine.step())
            steps += 1
            if finished and on_finish is not None:
                on_finish(finished)
        elif i < len(specs):
            sleep(max(0.0, specs[i].arrival - base - (engine.now() - t0)))
    return steps
