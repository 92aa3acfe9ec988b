"""What a simulation asks of a cost model, in one typed place.

A model prices a step (``step_time``) and may time the engine around it: host time before a
step (``host_gap`` of fitted host timing, or a recording's own ``gap_before``), the front door's
``intake_delay``, planning ahead (``plans_ahead``: the async engine) with an eager ``launch_time``,
and a run of plain decode steps priced in one call (``decode_durations``). The hooks a model
lacks are None here, once, so the replica's loop never asks again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator.model_base import TimedModel, for_step_budget
from traces.events import Span

# (n, context, longest, end, count, due) -> durations: TimedModel.decode_durations
DecodeDurations = Callable[[int, int, int, float, int, float], list[float]]


@dataclass(frozen=True, slots=True)
class EngineTiming:
    step_time: Callable[[int, list[Span]], float]
    host_gap: Callable[[int | None], float] | None  # engine time before a step (previous spans; None after idle)
    gap_before: Callable[[int], float] | None  # a recording's gap before step n
    intake_delay: float  # the front door: arrival stamp -> the engine sees the request
    plans_ahead: bool  # async scheduling: step k+1 planned as step k starts
    launch_time: Callable[[int], float] | None  # host time to launch a step with prefill (extra tokens)
    decode_durations: DecodeDurations | None  # a run of plain decode steps in one call
    note_decodes: Callable[[int, int, int, list[float]], None] | None  # a range tracker counts those

    @classmethod
    def of(cls, model: Any, max_num_batched_tokens: int) -> EngineTiming:
        """The timing of ``model`` for an engine of this step budget (a padded model pads to it)."""
        model = for_step_budget(model, max_num_batched_tokens)
        host_gap = getattr(model, "host_gap", None)
        gap_before = getattr(model, "gap_before", None)
        if isinstance(model, TimedModel) and model.host is None and gap_before is None:
            host_gap = None  # a fitted model without host timing: no gaps (not asked once a step)
        return cls(
            step_time=model.step_time,
            host_gap=host_gap,
            gap_before=gap_before,
            intake_delay=float(getattr(model, "intake_delay", 0.0) or 0.0),
            plans_ahead=bool(getattr(model, "plans_ahead", False)),
            launch_time=getattr(model, "launch_time", None),
            decode_durations=getattr(model, "decode_durations", None),
            note_decodes=getattr(model, "note_decodes", None),
        )
