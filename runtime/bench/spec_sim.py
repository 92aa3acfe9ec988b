"""The simulator's side of ``bench spec``: a run's event log re-simulated by a cost model.

The log's workload goes through the live scheduler again (as simulator.replay.replay.resimulate does):
every request at time 0, each with its recorded prompt and output length (fixed, eos ignored), so
the simulated run commits the same tokens; a speculative log's drafts and acceptances are drawn
from its own per-request rates. A predicted speed-up is then the ratio of two simulated makespans,
just as the live one is the ratio of two measured ones.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from simulator.cost.cost_model import CostModel
from simulator.replay.replay import log_config, own_speculation
from simulator.sim import simulate
from traces.importers.log import read_log_workload

# seeds a speculative run is re-simulated with, its predicted makespan their mean: a run of few
# rounds has few recorded acceptances to draw from, and one draw of its rounds is noisy (a run that
# accepted one proposal of six in six tries is as likely to be drawn with none or three)
DRAWS = 8


def simulated(log: str | Path, cost_model: CostModel, *, drafted: bool = True) -> tuple[float, int]:
    """(makespan in seconds, steps) of ``log``'s run as ``cost_model`` predicts it. The requests all
    arrive at 0, so the makespan is when the last simulated step ends. ``drafted``: whether the run
    proposed any draft; a speculative run that proposed none ran as plain decoding and has no
    acceptance rates to draw from, so it is simulated plain. A speculative run: the means over
    ``DRAWS`` seeds (the log read and its rates estimated once)."""
    _, config = log_config(log)
    workload = read_log_workload(log)
    if not drafted:
        result = simulate(workload, dataclasses.replace(config, speculative=""), cost_model)
        return result.end_time, result.num_steps
    rates = own_speculation([log], config.seed)
    results = [simulate(workload, config, cost_model, speculation=dataclasses.replace(rates, seed=config.seed + i))
               for i in range(DRAWS)]
    return (statistics.fmean(r.end_time for r in results),
            round(statistics.fmean(r.num_steps for r in results)))
