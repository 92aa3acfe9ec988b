"""How much longer a served engine's steps run than the profile's engine alone: a check of the model.

The profile sweeps the engine by itself. A served engine shares the machine with its own front end
(HTTP, streaming, detokenizing) and its clients, which on a CPU take cores from the model's threads.
The front-door probe (runtime/bench/front_door_probe.py) ends with batches of streamed requests
decoding through the real server; their decode steps, priced by the model of the engine alone, give
the factor: the median of measured / priced. The fit reports it (``served_steps`` in the model's
meta) and does not apply it: on the 2-core CPU it came out ×1.03 and ×1.09 in two profiles, while
the machine itself ran one sweep 5.9 % slower than the same sweep half an hour before
(docs/BENCHMARKS.md): a served engine's own cost is smaller there than the machine's drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cost.features import FEATURES
from simulator.cost.logged_run import LoggedRun
from simulator.cost.step_data import StepData

MIN_STEPS = 20  # fewer served decode steps say nothing (a probe without its streaming phase has none)


@dataclass(frozen=True)
class ServedSteps:
    factor: float  # served step / the same step of the engine alone, the median
    steps: int  # the probe's decode steps it rests on
    p10: float
    p90: float


def fit_served_steps(probe: LoggedRun, model) -> ServedSteps | None:
    """The served steps' factor from a front-door probe's log, priced by ``model`` (the engine alone:
    ``predict_steps``); None when the probe ran too few decode steps."""
    try:
        data = StepData.from_logs([probe])
    except ValueError:  # no Step events
        return None
    decode = data.subset(data.features[:, FEATURES.index("prefill_tokens")] == 0)
    if len(decode.durations) < MIN_STEPS:
        return None
    ratio = decode.durations / np.maximum(model.predict_steps(decode), 1e-9)
    p10, median, p90 = np.percentile(ratio, [10, 50, 90])
    return ServedSteps(round(float(median), 4), len(ratio), round(float(p10), 4), round(float(p90), 4))
