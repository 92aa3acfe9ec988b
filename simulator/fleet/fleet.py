"""A fleet: engine replicas behind one front door and a router, as SimPy processes, each replica
on a device (simulator/fleet/device.py: its own unless ``ReplicaSpec.device`` places several on one).

``simulate_fleet`` runs a workload through ``len(replicas)`` replicas (each its own config, cost
model and log) routed by a router from ``runtime.engine.routers`` (the live data-parallel front
door's own code). One replica with any router is today's single-engine simulation, log for log.
Each routing decision goes to ``on_route(index, replica, request_id, time)`` (the fleet log).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.engine.config import EngineConfig
from runtime.engine.drafters import parse_speculative
from runtime.engine.routers import ReplicaLoad, Router, RouteRequest, make_router, prefix_key
from runtime.engine.types import EventSink
from simulator.cost.cost_model import CostModel
from simulator.fleet.device import devices_for
from simulator.fleet.environment import SimEnvironment
from simulator.fleet.executor import TokenFn
from simulator.fleet.front_door import FrontDoor, OpenLoopArrivals
from simulator.fleet.replica import Replica, SimResult, SimulationError
from simulator.fleet.sessions import SessionArrivals
from simulator.fleet.speculation import Speculation
from traces.events import Finished, Routed, make_header
from traces.prompt import materialize
from traces.workload import RequestSpec, Workload

RouteSink = Callable[[int, int, int | None, float], None]  # (workload index, replica, request id, time)


@dataclass(frozen=True)
class ReplicaSpec:
    config: EngineConfig
    cost_model: CostModel
    sink: EventSink | None = None
    device: int | None = None  # the device it is placed on (simulator/fleet/device.py); None: its own


class Fleet:
    def __init__(self, workload: Workload, replicas: Sequence[ReplicaSpec], router: Router | str = "round-robin", *,
                 door: FrontDoor | None = None, token_fn: TokenFn | None = None, progress: Any = None,
                 plain_runs: bool = True, on_route: RouteSink | None = None,
                 speculation: Speculation | None = None) -> None:
        """``door``: the front door (default: the first replica's cost model's intake delay and service time);
        ``speculation``: the rates speculative replicas draw drafts and acceptances from."""
        specs = workload.requests
        start = min(0.0, specs[0].arrival) if specs else 0.0
        self.env = env = SimEnvironment(initial_time=start)
        self.router = make_router(router, len(replicas)) if isinstance(router, str) else router
        if door is None:
            timing = replicas[0].cost_model.timing(replicas[0].config.scheduler.max_num_batched_tokens)
            door = FrontDoor(latency=timing.intake_delay, service=timing.intake_service,
                             per_token=timing.intake_per_token)
        closed = workload.closed_loop
        source = SessionArrivals if closed else OpenLoopArrivals
        self.arrivals = source(env, specs, door, self._dispatch, self._close)
        self._dispatched = 0  # requests handed to a replica so far
        self._index_of: dict[tuple[int, int], int] = {}  # (replica, request id) -> index at the front door
        if closed and len(replicas) > 1:
            # a finish on one replica releases a turn that may go to another in the middle of a run,
            # at a time that replica's run could not have been bounded by: every step one at a time
            plain_runs = False
        due = self.arrivals.next_time
        # (shared by the replicas: a logged request's rates are claimed once)
        self.rates = rates = speculation.matcher() if speculation is not None else None
        devices = devices_for([r.device if r.device is not None else -1 - i for i, r in enumerate(replicas)])
        self.replicas = [Replica(env, r.config, r.cost_model, due=due,
                                 sink=self._watch_finishes(i, r.sink) if closed else r.sink,
                                 token_fn=token_fn, plain_runs=plain_runs, progress=progress, rates=rates,
                                 device=devices[i])
                         for i, r in enumerate(replicas)]
        self.on_route = on_route
        # per replica: (its steps and requests taken, its load then): recomputed once it has changed
        self._loads: list[tuple[tuple[int, int], ReplicaLoad]] = [((-1, -1), ReplicaLoad())] * len(replicas)

    def run(self) -> list[SimResult]:
        env = self.env
        for replica in self.replicas:
            env.process(replica.run())
        env.process(self.arrivals.run())
        env.run()
        for i, replica in enumerate(self.replicas):
            if replica.core.has_unfinished():
                raise SimulationError(f"simulation ended with {len(replica.core.requests)} unfinished requests"
                                      + (f" on replica {i}" if len(self.replicas) > 1 else ""))
        return [r.result for r in self.replicas]

    def _dispatch(self, spec: RequestSpec, index: int) -> None:
        replicas = self.replicas
        if len(replicas) == 1:
            choice = 0
        else:
            key = prefix_key(materialize(spec.prompt)) if self.router.needs_prefix else None
            request = RouteRequest(self._dispatched, spec.prompt.num_tokens, key)  # (arrival order, as live)
            choice = self.router.route(request, [self._load(i) for i in range(len(replicas))])
        self._dispatched += 1
        rid = replicas[choice].add(spec, index)
        if self.on_route is not None:
            self.on_route(index, choice, rid, self.env.now)
        if isinstance(self.arrivals, SessionArrivals):
            if rid is None:  # refused: its session goes on
                self.arrivals.finished(index, self.env.now)
            else:
                self._index_of[(choice, rid)] = index

    def _watch_finishes(self, replica: int, sink: EventSink | None) -> EventSink:
        """``sink``, telling the sessions' arrivals which requests finished, when."""
        index_of, arrivals = self._index_of, self.arrivals

        def watched(event) -> None:
            if sink is not None:
                sink(event)
            if type(event) is Finished:
                arrivals.finished(index_of.pop((replica, event.request_id)), event.time)

        return watched

    def _load(self, i: int) -> ReplicaLoad:
        """What the front door sees of replica i (recomputed only once it has stepped or taken a request)."""
        replica = self.replicas[i]
        stamp = (replica.result.num_steps, replica.result.num_requests)
        memo = self._loads[i]
        if memo[0] == stamp:
            return memo[1]
        core = replica.core
        queued = sum(r.num_prompt_tokens for r in core.requests.values() if not r.num_output_tokens)
        bm = core.block_manager
        load = ReplicaLoad(len(core.requests), queued, bm.num_used_blocks / bm.num_blocks)
        self._loads[i] = (stamp, load)
        return load

    def _close(self) -> None:
        for replica in self.replicas:
            replica.close()


def simulate_fleet(workload: Workload, replicas: Sequence[ReplicaSpec], router: Router | str = "round-robin", *,
                   route_sink: EventSink | None = None, header_extra: dict[str, Any] | None = None,
                   token_fn: TokenFn | None = None, progress: Any = None, plain_runs: bool = True,
                   speculation: Speculation | None = None) -> list[SimResult]:
    """Run ``workload`` through the replicas; each replica's sink gets a Header (clock ``sim``) and its
    events, ``route_sink`` a ``Routed`` event per request (the fleet log's, after its own Header).
    ``speculation``: the rates a speculative config's rounds are drawn from (its Header says which)."""
    extra = {"workload": {"source": workload.source, "num_requests": len(workload), **workload.meta}}
    if speculation is not None and any(parse_speculative(r.config.speculative) for r in replicas):
        extra["speculation"] = speculation.header_extra()
    extra.update(header_extra or {})
    for i, r in enumerate(replicas):
        if r.sink is not None:
            r.sink(make_header(r.config, clock="sim", extra=extra if len(replicas) == 1 else {**extra, "replica": i}))
    on_route = None
    if route_sink is not None:
        def on_route(index: int, replica: int, request_id: int | None, time: float) -> None:
            route_sink(Routed(time=time, index=index, replica=replica, request_id=request_id))
    fleet = Fleet(workload, replicas, router, token_fn=token_fn, progress=progress, plain_runs=plain_runs,
                  on_route=on_route, speculation=speculation)
    return fleet.run()
