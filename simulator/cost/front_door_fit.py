"""The front door's delay from a front-door probe's log (runtime/bench/front_door_probe.py).

Requests that reach an idle engine show the door alone: from the arrival stamp to the start of the
request's first step nothing else happens (no queueing, no step in flight). The fit goes to a
model's host timing (``HostTiming.intake_delay`` and ``intake_per_token``). Each prompt length
counts by its shortest delay: the first prompt of a new size can wait seconds for a kernel compiled
or a graph captured for it (once, not a property of the door), and one such stall would otherwise
pull the line to hundreds of microseconds a token. A length none of whose requests went through
without a stall is left out (``STALL_RATIO``): on an H100 the probe's two 8,190-token prompts waited
36 ms and 2.5 s where the line through the shorter lengths says about 4 ms; kept, that one length
made the fit 3.5 µs a token and tripled the simulated intake of a 1,000-token prompt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from simulator.cost.nnls import nnls
from traces.events import Aborted, Arrived, Event, Finished, Step

STALL_RATIO = 3.0  # a length's shortest delay past this many times the shorter lengths' line: a stall


@dataclass(frozen=True)
class FrontDoorFit:
    """The front door's delay from a probe's log: ``intake_delay + intake_per_token · prompt tokens``."""

    intake_delay: float
    intake_per_token: float
    requests: int
    median_delay: float
    max_prompt: int
    left_out: tuple[int, ...] = ()  # prompt lengths every request of which stalled (``STALL_RATIO``)


def fit_front_door(events: Iterable[Event]) -> FrontDoorFit | None:
    """The front door of a served log (its events): the requests that reached an idle engine (every
    earlier request finished, no step running), the shortest delay of each prompt length fitted as
    ``const + per_token · prompt tokens`` (both >= 0, least squares). None: no such request."""
    arrived: dict[int, tuple[float, int]] = {}
    open_requests: set[int] = set()
    idle_at_arrival: set[int] = set()
    seen: set[int] = set()
    last_end = float("-inf")
    delays, tokens = [], []
    for ev in events:
        if isinstance(ev, Arrived):
            arrived[ev.request_id] = (ev.time, ev.prompt.num_tokens)
            if not open_requests and ev.time >= last_end:
                idle_at_arrival.add(ev.request_id)
            open_requests.add(ev.request_id)
        elif isinstance(ev, Step):
            for s in ev.spans:
                rid = s.request_id
                if rid not in seen:
                    seen.add(rid)
                    if rid in idle_at_arrival:
                        t, n = arrived[rid]
                        delays.append(ev.start - t)
                        tokens.append(n)
            last_end = ev.end
        elif isinstance(ev, Finished | Aborted):
            open_requests.discard(ev.request_id)
    if not delays:
        return None
    shortest: dict[int, float] = {}
    for n, d in zip(tokens, delays):
        shortest[n] = min(d, shortest.get(n, d))
    x = np.asarray(list(shortest), dtype=float)
    y = np.maximum(np.asarray(list(shortest.values())), 0.0)
    order = np.argsort(x)
    x, y = x[order], y[order]
    keep = _without_stalled_lengths(x, y)
    const, per_token = _line(x[keep], y[keep])
    return FrontDoorFit(float(const), float(per_token), len(delays), float(np.median(delays)), int(x.max()),
                        tuple(int(n) for n in x[~keep]))


def _line(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return nnls(np.column_stack([np.ones_like(x), x]), y)


def _without_stalled_lengths(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Which of the lengths ``x`` (ascending) to fit, as a mask. A length whose every request stalled
    (the probe sends the longest prompts only a few times, and a new size is where a stall comes)
    still stands out after taking its shortest delay, and, among the longest, would set the slope
    alone. So each length, shortest first, is judged against the line through the shorter lengths
    kept (no lower than their shortest delay): past ``STALL_RATIO`` times that, it is left out."""
    keep = np.zeros(len(x), dtype=bool)
    keep[:2] = True  # the shortest lengths are the door itself: nothing shorter to judge them by
    for i in range(2, len(x)):
        const, per_token = _line(x[keep], y[keep])
        expected = max(const + per_token * x[i], y[keep].min())
        keep[i] = y[i] <= STALL_RATIO * expected
    return keep
