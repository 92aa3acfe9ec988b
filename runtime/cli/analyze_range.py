"""``analyze``: how much of a simulated log lies outside its cost model's profiled range.

``simulate`` prints that warning when it finishes; the log it wrote names the cost model
(``extra.cost_model`` of its Header) but not the result. So analyze loads the model named there
(its ranges as the file has them now), counts the log's steps above any of them
(simulator/cost/ranges.py: the quantities come from the steps' columns, analysis/frames.py) and words
the warning as the simulator does. A live log, or one whose cost model is not found here, has none.
"""

from __future__ import annotations

import numpy as np

from analysis.frames import LogFrames
from simulator.cost.ranges import FeatureRanges, RangeReport
from traces.events import Header

# quantity of simulator/cost/ranges.py -> its column of LogFrames.steps
COLUMNS = {"prefill_tokens": "prefill_tokens", "max_chunk": "max_chunk", "tokens": "num_tokens",
           "decode_seqs": "decode_seqs", "decode_context": "decode_context", "seqs": "num_spans",
           "prefill_attention": "prefill_attention"}


def model_ranges(header: Header | None) -> tuple[FeatureRanges | None, str | None]:
    """The profiled ranges of the cost model a simulated log names, or a note why there are none
    to check (None: nothing to say, e.g. a live log or a model without ranges)."""
    from simulator.cost.loading import load_cost_model

    spec = header.extra.get("cost_model") if header is not None and header.clock == "sim" else None
    if not isinstance(spec, str) or spec.startswith("recorded"):
        return None, None
    try:
        model = load_cost_model(spec)
    except (ValueError, OSError):
        return None, f"note: cost model {spec} (the log's) not found here: its profiled range is not checked"
    ranges = getattr(model, "ranges", None)
    return (ranges, None) if ranges is not None and ranges.hi else (None, None)


def range_report(steps, ranges: FeatureRanges) -> RangeReport:
    """The steps' count and time inside and outside ``ranges`` (a simulation's RangeTracker's sums)."""
    duration = steps["duration"].to_numpy(dtype=float)
    outside = np.zeros(len(steps), dtype=bool)
    seen: dict[str, float] = {}
    for k, hi in ranges.hi.items():
        col = steps[COLUMNS[k]].to_numpy(dtype=float)
        over = col > hi
        if over.any():
            seen[k] = float(col[over].max())
            outside |= over
    return RangeReport(steps=len(steps), time=float(duration.sum()), outside_steps=int(outside.sum()),
                       outside_time=float(duration[outside].sum()), seen_max=seen)


def range_warning(frames: LogFrames) -> str | None:
    """The simulator's out-of-range warning for this log, a note that it can't be checked, or None."""
    ranges, note = model_ranges(frames.header)
    if ranges is None or not len(frames.steps):
        return note
    return range_report(frames.steps, ranges).warning(ranges)
