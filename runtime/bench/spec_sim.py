"""The simulator's side of ``bench spec``: a run's event log re-simulated by a cost model.

The log's workload goes through the live scheduler again (simulator.replay.replay.resimulate):
every request at time 0, each with its recorded prompt and output length (fixed, eos ignored), so
the simulated run commits the same tokens; a speculative log's drafts and acceptances are drawn
from its own per-request rates. A predicted speed-up is then the ratio of two simulated makespans,
just as the live one is the ratio of two measured ones.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from simulator.cost.cost_model import CostModel
from simulator.replay.replay import log_config, resimulate


def simulated(log: str | Path, cost_model: CostModel, *, drafted: bool = True) -> tuple[float, int]:
    """(makespan in seconds, steps) of ``log``'s run as ``cost_model`` predicts it. The requests all
    arrive at 0, so the makespan is when the last simulated step ends. ``drafted``: whether the run
    proposed any draft; a speculative run that proposed none ran as plain decoding and has no
    acceptance rates to draw from, so it is simulated plain."""
    config = None
    if not drafted:
        _, config = log_config(log)
        config = dataclasses.replace(config, speculative="")
    result = resimulate(log, cost_model, config)
    return result.end_time, result.num_steps
