"""What a simulation asks of a cost model, as one typed structure (``CostModel.timing``).

A model prices a step (``step_time``) and may time the engine around it: host time before a
step (``host_gap`` of fitted host timing, or a recording's own ``gap_before``), the front door's
``intake_delay``, planning ahead (``plans_ahead``: the async engine) with an eager ``launch_time``,
a run of plain decode steps priced in one call (``decode_durations``, counted by a range
tracker's ``note_decodes``), and how much slower a step runs behind another replica's work on a
shared device (``shared_slowdown``). What a model lacks is None, so a replica's loop never asks.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass

from traces.events import Span

# (n, context, longest, end, count, due) -> durations of up to ``count`` decode steps ending before ``due``
DecodeDurations = Callable[[int, int, int, float, int, float], list[float]]


@dataclass(frozen=True, slots=True)
class EngineTiming:
    step_time: Callable[[int, list[Span], Container[int]], float]  # (step, spans, requests verifying drafts)
    host_gap: Callable[[int | None, int], float] | None = None  # engine time before a step (previous spans
    # and drafts; None after idle)
    gap_before: Callable[[int], float] | None = None  # a recording's gap before step n
    intake_delay: float = 0.0  # the front door: arrival stamp -> the engine sees the request
    intake_service: float = 0.0  # the front door's worker: requests closer together than this queue
    intake_per_token: float = 0.0  # the front door's delay per prompt token (parsing, carrying it)
    plans_ahead: bool = False  # async scheduling: step k+1 planned as step k starts
    launch_time: Callable[[int], float] | None = None  # host time to launch a step with prefill (extra tokens)
    decode_durations: DecodeDurations | None = None  # a run of plain decode steps in one call
    note_decodes: Callable[[int, int, int, list[float]], None] | None = None  # a range tracker counts those
    shared_slowdown: float = 1.0  # device work queued behind another replica's on a shared device runs
    # this many times as long as alone (a co-located profile's fit: simulator/fitting/co_located.py)
