"""The step shapes a model was fitted on, and how much of a simulation lies outside them.

A fitted model is trustworthy inside the shapes its training steps covered; beyond them a linear
model extrapolates and a tree model stays flat at its edge. A fit records, per quantity, the
smallest and largest value its steps had; a simulation (or a timing-replay) counts the steps, and
the simulated time, that exceed any maximum, so the report can say "31% of steps (62% of time)
lie outside the model's profiled range (prefill tokens per step up to 2,048; here up to 32,768)".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.cost.cost_model import CostModel
from simulator.cost.engine_timing import EngineTiming
from simulator.cost.features import EXT_FEATURES, decode_ext_features, ext_features
from traces.events import Span

# quantity (an EXT_FEATURES name) -> how the warning names it
RANGE_NAMES = {  # in the order a warning names them at equal excess
    "prefill_tokens": "prefill tokens per step",
    "max_chunk": "prefill chunk",
    "tokens": "tokens per step",
    "decode_seqs": "decode batch",
    "decode_context": "decode context sum",
    "seqs": "sequences per step",
    "prefill_attention": "prefill query-key pairs per step",
}
_INDEX = {name: EXT_FEATURES.index(name) for name in RANGE_NAMES}
MAX_NAMED = 3  # quantities a warning names, the furthest beyond their range first


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%" if share < 0.1 else f"{100 * share:.0f}%"


@dataclass
class FeatureRanges:
    lo: dict[str, float]
    hi: dict[str, float]

    @classmethod
    def from_ext(cls, ext: np.ndarray) -> FeatureRanges:
        """Ranges of the rows of an [steps, EXT_FEATURES] matrix."""
        if not len(ext):
            return cls({}, {})
        return cls({k: float(ext[:, i].min()) for k, i in _INDEX.items()},
                   {k: float(ext[:, i].max()) for k, i in _INDEX.items()})

    def outside(self, ext_row: Sequence[float]) -> list[str]:
        """Quantities of one step above the largest value seen in training."""
        return [k for k, hi in self.hi.items() if ext_row[_INDEX[k]] > hi]

    def to_dict(self) -> dict[str, list[float]]:
        return {k: [self.lo[k], self.hi[k]] for k in self.hi}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureRanges:
        unknown = set(d) - set(RANGE_NAMES)
        if unknown:
            raise ValueError(f"unknown range quantities {sorted(unknown)}")
        return cls({k: float(v[0]) for k, v in d.items()}, {k: float(v[1]) for k, v in d.items()})


@dataclass
class RangeReport:
    steps: int = 0
    time: float = 0.0
    outside_steps: int = 0
    outside_time: float = 0.0
    seen_max: dict[str, float] = field(default_factory=dict)  # of the steps outside, per quantity

    def add(self, ext_row: Sequence[float], duration: float, outside: list[str]) -> None:
        self.steps += 1
        self.time += duration
        if outside:
            self.outside_steps += 1
            self.outside_time += duration
            for k in outside:
                v = float(ext_row[_INDEX[k]])
                if v > self.seen_max.get(k, -1.0):
                    self.seen_max[k] = v

    def warning(self, ranges: FeatureRanges) -> str | None:
        """One line, or None when every step lay inside the ranges."""
        if not self.outside_steps:
            return None
        share = _pct(self.outside_steps / max(self.steps, 1))
        tshare = _pct(self.outside_time / self.time if self.time > 0 else 0.0)
        # the furthest out first; query-key pairs (quadratic in the chunk) only when nothing plainer is out
        plain = {k: v for k, v in self.seen_max.items() if k != "prefill_attention"} or self.seen_max
        order = [k for k in RANGE_NAMES if k in plain]
        worst = sorted(order, key=lambda k: -plain[k] / max(ranges.hi[k], 1))[:MAX_NAMED]
        parts = [f"{RANGE_NAMES[k]} up to {ranges.hi[k]:,.0f}; here up to {plain[k]:,.0f}" for k in worst]
        return (f"warning: {share} of steps ({tshare} of time) lie outside the model's profiled "
                f"range ({'; '.join(parts)})")

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "outside_steps": self.outside_steps,
                "outside_step_share": self.outside_steps / self.steps if self.steps else 0.0,
                "outside_time_share": self.outside_time / self.time if self.time > 0 else 0.0,
                "seen_max": self.seen_max}


class RangeTracker:
    """Wraps a cost model with ranges; counts the steps it times that lie outside them. Its timing
    is the model's, with every step counted, so the simulation runs exactly as with the bare model."""

    def __init__(self, model: CostModel, ranges: FeatureRanges, report: RangeReport | None = None) -> None:
        self.model = model
        self.ranges = ranges
        self.report = RangeReport() if report is None else report

    def timing(self, max_num_batched_tokens: int) -> EngineTiming:
        inner = self.model.timing(max_num_batched_tokens)
        priced, report, ranges = inner.step_time, self.report, self.ranges

        def step_time(step: int, spans: Sequence[Span], verifying: Container[int] = ()) -> float:
            t = priced(step, spans, verifying)
            row = ext_features(spans, verifying=verifying)
            report.add(row, t, ranges.outside(row))
            return t

        return dataclasses.replace(inner, step_time=step_time, note_decodes=self.note_decodes)

    def step_time(self, step: int, spans: Sequence[Span], verifying: Container[int] = ()) -> float:
        t = self.model.step_time(step, spans, verifying)
        row = ext_features(spans, verifying=verifying)
        self.report.add(row, t, self.ranges.outside(row))
        return t

    def note_decodes(self, n: int, context: int, longest: int, durations: list[float]) -> None:
        """Count the decode steps a simulator landed at once without ``step_time``: step i of ``n``
        spans, context sum ``context + n·i``, longest context ``longest + i``."""
        for i, t in enumerate(durations):
            row = decode_ext_features(n, context + n * i, longest + i)
            self.report.add(row, t, self.ranges.outside(row))

    def warning(self) -> str | None:
        return self.report.warning(self.ranges)


def track_ranges(model: CostModel) -> RangeTracker | None:
    """A tracker around ``model`` if it records ranges, else None."""
    ranges = getattr(model, "ranges", None)
    return RangeTracker(model, ranges) if ranges is not None and ranges.hi else None
