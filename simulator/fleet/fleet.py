"""A fleet: engine replicas behind one front door and a router, as SimPy processes, each replica
on a device (simulator/fleet/device.py: its own unless ``ReplicaSpec.device`` places several on one).

``simulate_fleet`` runs a workload through ``len(replicas)`` replicas (each its own config, cost
model and log) routed by a router from ``runtime.engine.routers`` (the live data-parallel front
door's own code). One replica with any router is today's single-engine simulation, log for log.
Each routing decision goes to ``on_route(index, replica, request_id, time)`` (the fleet log).

``outages`` (simulator/fleet/outages.py) take replicas down as a live fleet loses them: the dead
one's requests in flight fail, the router skips it, and at the outage's end a fresh replica takes
its place (its sink from ``restart_sink``); a request that arrives with no replica up is refused.
"""

from __future__ import annotations

import math
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
from simulator.fleet.outages import SimOutage, check_outages, edges
from simulator.fleet.replica import Replica, SimResult, SimulationError
from simulator.fleet.sessions import SessionArrivals
from simulator.fleet.speculation import Speculation
from traces.events import Event, Finished, ReplicaDown, ReplicaUp, Routed, make_header
from traces.prompt import materialize
from traces.workload import RequestSpec, Workload

RouteSink = Callable[[int, int, int | None, float], None]  # (workload index, replica, request id, time)
# replica i's sink after its k-th restart, and the name of its log (None: none)
RestartSink = Callable[[int, int], tuple[EventSink | None, str | None]]
OUTAGE_REASON = "replica down (simulated outage)"


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
                 speculation: Speculation | None = None, outages: Sequence[SimOutage] = (),
                 restart_sink: RestartSink | None = None, on_outage: EventSink | None = None) -> None:
        """``door``: the front door (default: the first replica's cost model's intake delay and service time);
        ``speculation``: the rates speculative replicas draw drafts and acceptances from; ``outages``:
        replicas down for a while (``on_outage`` gets their ReplicaDown / ReplicaUp events)."""
        check_outages(outages, len(replicas))
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
        if outages:  # a landed run of decode steps ends before an outage starts or ends
            times, next_arrival = edges(outages), due
            due = lambda: min(next_arrival(), next((t for t in times if t > env.now), math.inf))  # noqa: E731
        # (shared by the replicas: a logged request's rates are claimed once)
        self.rates = rates = speculation.matcher() if speculation is not None else None
        devices = devices_for([r.device if r.device is not None else -1 - i for i, r in enumerate(replicas)])
        def make(i: int, sink: EventSink | None) -> Replica:
            r = replicas[i]
            return Replica(env, r.config, r.cost_model, due=due, sink=self._watch_finishes(i, sink) if closed else sink,
                           token_fn=token_fn, plain_runs=plain_runs, progress=progress, rates=rates, device=devices[i])

        self._make = make
        self.replicas = [make(i, r.sink) for i, r in enumerate(replicas)]
        self.outages, self.restart_sink, self.on_outage = list(outages), restart_sink, on_outage
        self.up = [True] * len(replicas)
        self.restarts = [0] * len(replicas)
        self.gone: list[list[Replica]] = [[] for _ in replicas]  # each replica's dead ones
        self._closed = False
        self.on_route = on_route
        # per replica: (its steps and requests taken, its load then): recomputed once it has changed
        self._loads: list[tuple[tuple[int, int], ReplicaLoad]] = [((-1, -1), ReplicaLoad())] * len(replicas)

    def run(self) -> list[SimResult]:
        env = self.env
        for replica in self.replicas:
            replica.start()
        env.process(self.arrivals.run())
        for outage in self.outages:
            env.process(self._outage(outage))
        env.run()
        for i, replica in enumerate(self.replicas):
            if replica.core.has_unfinished() and not replica.dead:
                raise SimulationError(f"simulation ended with {len(replica.core.requests)} unfinished requests"
                                      + (f" on replica {i}" if len(self.replicas) > 1 else ""))
        return [_merged([*gone, r]) for gone, r in zip(self.gone, self.replicas)]

    def _outage(self, outage: SimOutage):
        """The SimPy process of one outage: the replica dies at its start, a fresh one comes at its end."""
        env, i = self.env, outage.replica
        yield env.at(outage.start)
        dead = self.replicas[i]
        dead.kill()
        self.up[i] = False
        self._emit(ReplicaDown(time=env.now, replica=i, reason=OUTAGE_REASON, restarting=outage.end is not None))
        if isinstance(self.arrivals, SessionArrivals):  # its clients got an error: their sessions go on
            for rid in list(dead.core.requests):
                if (index := self._index_of.pop((i, rid), None)) is not None:
                    self.arrivals.finished(index, env.now)
        if outage.end is None:
            return
        yield env.at(outage.end)
        self.restarts[i] += 1
        sink, log = self.restart_sink(i, self.restarts[i]) if self.restart_sink is not None else (None, None)
        fresh = self._make(i, sink)
        self.gone[i].append(dead)
        self.replicas[i] = fresh
        self._loads[i] = ((-1, -1), ReplicaLoad())
        self._emit(ReplicaUp(time=env.now, replica=i, log=log))
        self.up[i] = True
        if self._closed:
            fresh.close()
        fresh.start()

    def _emit(self, event: Event) -> None:
        if self.on_outage is not None:
            self.on_outage(event)

    def _dispatch(self, spec: RequestSpec, index: int) -> None:
        replicas = self.replicas
        if not any(self.up):  # (live: a 503, in no replica's log)
            if isinstance(self.arrivals, SessionArrivals):
                self.arrivals.finished(index, self.env.now)
            return
        if len(replicas) == 1:
            choice = 0
        else:
            key = prefix_key(materialize(spec.prompt)) if self.router.needs_prefix else None
            request = RouteRequest(self._dispatched, spec.prompt.num_tokens, key)  # (arrival order, as live)
            up = None if all(self.up) else self.up
            choice = self.router.route(request, [self._load(i) for i in range(len(replicas))], up)
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
        self._closed = True
        for replica in self.replicas:
            replica.close()


def _merged(results: Sequence[Replica]) -> SimResult:
    """One replica's result over its lives (before and after its outages)."""
    if len(results) == 1:
        return results[0].result
    parts = [r.result for r in results]
    return SimResult(sum(p.num_requests for p in parts), sum(p.num_steps for p in parts),
                     max(p.end_time for p in parts), [x for p in parts for x in p.rejected])


def simulate_fleet(workload: Workload, replicas: Sequence[ReplicaSpec], router: Router | str = "round-robin", *,
                   route_sink: EventSink | None = None, header_extra: dict[str, Any] | None = None,
                   token_fn: TokenFn | None = None, progress: Any = None, plain_runs: bool = True,
                   speculation: Speculation | None = None, outages: Sequence[SimOutage] = (),
                   restart_sink: RestartSink | None = None) -> list[SimResult]:
    """Run ``workload`` through the replicas; each replica's sink gets a Header (clock ``sim``) and its
    events, ``route_sink`` a ``Routed`` event per request (the fleet log's, after its own Header) and
    each outage's ``ReplicaDown`` / ``ReplicaUp``. ``speculation``: the rates a speculative config's
    rounds are drawn from (its Header says which); ``outages``: replicas down for a while, each
    back with a sink of ``restart_sink``'s (one per replica per restart)."""
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
    headed = None
    if restart_sink is not None:
        def headed(i: int, k: int) -> tuple[EventSink | None, str | None]:
            sink, log = restart_sink(i, k)
            if sink is not None:
                sink(make_header(replicas[i].config, clock="sim", extra={**extra, "replica": i, "restart": k}))
            return sink, log
    fleet = Fleet(workload, replicas, router, token_fn=token_fn, progress=progress, plain_runs=plain_runs,
                  on_route=on_route, speculation=speculation, outages=outages, restart_sink=headed,
                  on_outage=route_sink)
    return fleet.run()
