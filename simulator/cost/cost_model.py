"""What the simulator asks of a cost model: the ``CostModel`` protocol, and the error a model raises.

Anything that prices a step is a cost model: a fitted one (linear_model.py, tree_model.py), a
recording's own durations (recorded_model.py), a range tracker around a model (ranges.py), a test's
hand-written one. The simulator's side names this protocol, never a model kind.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Protocol, runtime_checkable

from simulator.cost.engine_timing import EngineTiming
from traces.events import Span


class CostModelError(ValueError):
    """A cost model file is malformed or can't serve the step asked for."""


class CostModel(Protocol):
    """``step_time`` prices a step from its spans; ``timing`` is everything a simulation asks of the
    model (simulator/cost/engine_timing.py), for an engine of a step budget. A model that times only
    steps defines ``step_time`` alone and subclasses this for the default ``timing``."""

    def step_time(self, step: int, spans: Sequence[Span], verifying: Container[int] = ()) -> float:
        """Seconds that step ``step`` with these spans takes; the spans of the requests in
        ``verifying`` verify speculative drafts (simulator/cost/features.py)."""
        ...

    def timing(self, max_num_batched_tokens: int) -> EngineTiming:
        return EngineTiming(step_time=self.step_time)


@runtime_checkable
class ScalableCostModel(CostModel, Protocol):
    """A cost model that can price every step ``factor`` times as long: a new model, this one unchanged
    (fitted models; a recording's durations cannot)."""

    def scaled(self, factor: float) -> CostModel: ...
