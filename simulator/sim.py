"""One engine in virtual time: a fleet of one replica (simulator/fleet) on a SimPy environment.

The replica is the live ``StepLoop`` over the live ``EngineCore``, with a cost-model executor;
arrivals come through the front door (the cost model's ``intake_delay``) as urgent events, so an
arrival at time t lands before a step that starts (or commits) at t — the order live drivers
follow, which is what lets a re-simulation with recorded durations reproduce a live log decision
for decision. Runs of plain decode steps are landed at once (simulator/fleet/replica.py).

Same workload + config + cost model + seed → byte-identical log (no clock, no unseeded RNG).
"""

from __future__ import annotations

from typing import Any

from runtime.engine.config import EngineConfig
from runtime.engine.types import EventSink
from simulator.cost.cost_model import CostModel
from simulator.fleet.executor import SYNTHETIC_TOKEN, TokenFn
from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
from simulator.fleet.replica import MIN_RUN, SimResult, SimulationError
from simulator.fleet.speculation import Speculation
from traces.workload import Workload

__all__ = ["MIN_RUN", "SYNTHETIC_TOKEN", "SimResult", "SimulationError", "Speculation", "TokenFn", "simulate"]


def simulate(
    workload: Workload,
    config: EngineConfig,
    cost_model: CostModel,
    *,
    sink: EventSink | None = None,
    token_fn: TokenFn | None = None,
    progress: Any = None,
    header_extra: dict[str, Any] | None = None,
    plain_runs: bool = True,
    speculation: Speculation | None = None,
) -> SimResult:
    """Run ``workload`` through a simulated engine; write a Header (clock ``sim``) + events to ``sink``
    (``plain_runs``: land runs of decode steps at once; False steps through them one by one;
    ``speculation``: the rates a speculative config's drafts and acceptances are drawn from)."""
    return simulate_fleet(workload, [ReplicaSpec(config, cost_model, sink)], header_extra=header_extra,
                          token_fn=token_fn, progress=progress, plain_runs=plain_runs, speculation=speculation)[0]
