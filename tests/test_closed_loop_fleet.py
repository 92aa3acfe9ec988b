"""Closed loops and routers as the live front door has them: a fleet whose replicas land decode
runs at once writes what stepping one at a time writes, closed loops and every router included;
the front door serves requests in the order clients send them; round-robin counts arrivals."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine.routers import ROUTERS
from simulator.cost.host_timing import HostTiming
from simulator.cost.linear_model import LinearCostModel
from simulator.fleet.environment import SimEnvironment
from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
from simulator.fleet.front_door import FrontDoor
from simulator.fleet.sessions import SessionArrivals
from tests.sim_helpers import small_config
from traces.generators import generate
from traces.log import encode
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic
from traces.sessions import generate_sessions
from traces.workload import RequestSpec


def _model(overlap: bool) -> LinearCostModel:
    m = LinearCostModel({"const": 0.002, "prefill_tokens": 1e-5, "decode_context": 2e-8, "seqs": 3e-4})
    if overlap:
        m = m.with_host(HostTiming(overlap=True, intake_delay=0.001))
    return m


def _logs(workload, replicas, router, model, config, plain_runs):
    sinks: list[list] = [[] for _ in range(replicas)]
    routes: list = []
    simulate_fleet(workload, [ReplicaSpec(config, model, s.append) for s in sinks], router,
                   route_sink=routes.append, plain_runs=plain_runs)
    return [[encode(e) for e in s] for s in sinks], [encode(e) for e in routes]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), replicas=st.integers(1, 3), router=st.sampled_from(sorted(ROUTERS)),
       closed=st.booleans(), overlap=st.booleans(), think=st.sampled_from([0.0, 0.05, 1.0]),
       num_blocks=st.sampled_from([64, 1024]))
def test_landing_decode_runs_writes_what_stepping_writes(seed, replicas, router, closed, overlap, think, num_blocks):
    """Fleets, routers, closed loops (a turn released by one replica's finish may be routed to a
    replica in the middle of a run) and small KV pools: byte for byte the same logs."""
    if closed:
        wl = generate_sessions(8, rate=20.0, think_time=think, first_len="uniform:16:64", message_len="uniform:8:32",
                               output_len="uniform:20:120", seed=seed)
    else:
        wl = generate(24, rate=30.0, input_len="uniform:8:64", output_len="uniform:20:150", seed=seed)
    config = small_config(block_size=4, num_blocks=num_blocks, budget=256)
    model = _model(overlap)
    assert _logs(wl, replicas, router, model, config, True) == _logs(wl, replicas, router, model, config, False)


def _spec(arrival: float, session: int, think: float = 0.0) -> RequestSpec:
    return RequestSpec(arrival=arrival, prompt=PromptSynthetic(num_tokens=8, unique_seed=session),
                       params=SamplingParams(max_tokens=4), session=session, think_time=think)


def test_the_front_door_serves_turns_in_the_order_they_are_sent():
    """A turn released with a long think time is sent late: turns sent before it never queue behind it."""
    env = SimEnvironment()
    specs = [_spec(0.0, 0), _spec(0.0, 1), _spec(0.0, 0, think=10.0), _spec(0.0, 1)]
    handed: dict[int, float] = {}
    door = FrontDoor(latency=0.001, service=0.0005)
    arrivals = SessionArrivals(env, specs, door, lambda spec, i: handed.__setitem__(i, env.now), lambda: None)
    env.run(until=0.01)
    arrivals.finished(0, 0.01)  # conversation 0's next turn is sent at 10.01
    env.run(until=0.02)
    arrivals.finished(1, 0.02)  # conversation 1's at 0.02: served at once, not after 10.01
    env.run()
    assert math.isclose(handed[3], 0.02 + 0.001)
    assert math.isclose(handed[2], 10.01 + 0.001)


def test_round_robin_takes_requests_in_the_order_they_arrive():
    """Live, round-robin counts requests as the front door receives them; so does the simulation,
    whatever order the workload lists a conversation's turns in."""
    wl = generate_sessions(12, rate=8.0, think_time=0.2, first_len="uniform:16:64", message_len="uniform:8:32",
                           output_len="uniform:4:40", seed=5)
    routes: list = []
    simulate_fleet(wl, [ReplicaSpec(small_config(num_blocks=1024), _model(True)) for _ in range(2)], "round-robin",
                   route_sink=routes.append)
    assert [r.replica for r in sorted(routes, key=lambda r: r.time)] == [i % 2 for i in range(len(routes))]
    assert any(r.index % 2 != r.replica for r in routes)  # (the workload's order is not the arrival order)
