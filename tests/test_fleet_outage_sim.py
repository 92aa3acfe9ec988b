"""A simulated fleet takes an outage as a live one does (simulator/fleet/outages.py): the replica's
requests in flight at the start stay unfinished in its log, the router skips it until the end, then a
fresh replica with a log of its own serves; the fleet log has the ReplicaDown / ReplicaUp a live
one has, and reads back (traces/fleet_log.py) as the live one's does."""

from __future__ import annotations

import pytest

from runtime.cli import main
from simulator.cost.linear_model import LinearCostModel
from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
from simulator.fleet.outages import SimOutage
from tests.sim_helpers import mixed_workload, small_config
from traces.events import Arrived, Finished, ReplicaDown, ReplicaUp, Routed, make_header
from traces.fleet_log import FleetLog, fleet_extra, relative_log, replica_log_path, restart_log_path
from traces.log import LogWriter, read_log

MODEL = LinearCostModel({"const": 0.002, "prefill_tokens": 1e-5, "decode_context": 2e-8, "seqs": 3e-4})


def _run(outages, n=80, router="round-robin"):
    workload = mixed_workload(n, rate=60.0)
    sinks = [[] for _ in range(2)]
    restarted: list[list] = []
    routes: list = []

    def restart_sink(replica, k):
        restarted.append([])
        return restarted[-1].append, f"r{replica}.{k}"

    specs = [ReplicaSpec(small_config(), MODEL, s.append) for s in sinks]
    results = simulate_fleet(workload, specs, router, route_sink=routes.append, outages=outages,
                             restart_sink=restart_sink)
    return workload, sinks, restarted, routes, results


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "prefix-affinity"])
def test_a_simulated_outage_fails_the_replicas_requests_and_skips_it(router):
    t0, t1 = 0.4, 0.9
    workload, sinks, restarted, routes, results = _run([SimOutage(1, t0, t1)], router=router)
    downs = [e for e in routes if isinstance(e, ReplicaDown)]
    ups = [e for e in routes if isinstance(e, ReplicaUp)]
    assert [(e.replica, e.time) for e in downs] == [(1, t0)] and [(e.replica, e.time, e.log) for e in ups] == [
        (1, t1, "r1.1")]
    routed = [e for e in routes if isinstance(e, Routed)]
    assert not [e for e in routed if e.replica == 1 and t0 <= e.time < t1]  # skipped while down
    before = sinks[1]
    arrived = {e.request_id for e in before if isinstance(e, Arrived)}
    ended = {e.request_id for e in before if isinstance(e, Finished)}
    assert arrived - ended, "the outage took no request down"  # those in flight failed
    assert all(e.time <= t0 for e in before if hasattr(e, "time"))  # nothing after its death
    (after,) = restarted
    assert after[0].extra["restart"] == 1 and any(isinstance(e, Finished) for e in after)
    assert all(e.time >= t1 for e in after if isinstance(e, Arrived))
    served = sum(isinstance(e, Finished) for s in [*sinks, after] for e in s)
    assert served + len(arrived - ended) == len(workload)  # every request: served or failed
    assert sum(r.num_requests for r in results) == len(workload)


def test_with_every_replica_down_requests_are_unserved_and_the_run_ends():
    workload, sinks, restarted, routes, _ = _run([SimOutage(0, 0.2, None), SimOutage(1, 0.2, 0.5)])
    routed = [e for e in routes if isinstance(e, Routed)]
    assert not [e for e in routed if 0.2 <= e.time < 0.5]
    assert len(restarted) == 1 and not [e for e in routed if e.replica == 0 and e.time >= 0.2]


def test_bad_outages_are_one_clear_error():
    for outages, message in [([SimOutage(2, 0.1, 0.2)], "replicas 0..1"),
                             ([SimOutage(0, 0.1, 0.5), SimOutage(0, 0.3, 0.6)], "overlap")]:
        with pytest.raises(ValueError, match=message):
            _run(outages)
    with pytest.raises(ValueError, match="an end after it"):
        SimOutage(0, 0.5, 0.1)


def test_a_simulated_fleet_log_with_an_outage_reads_back_and_re_simulates(tmp_path, capsys):
    """Written as serve writes a fleet log, it reads as one run, analyze shows the outage, and
    fidelity re-simulates it with the same outage."""
    trace = tmp_path / "fleet.jsonl"
    logs = [replica_log_path(trace, i) for i in range(2)]
    writers = [LogWriter(p) for p in logs]
    restarts: list[LogWriter] = []
    route_log = LogWriter(trace)
    config = small_config()
    route_log(make_header(config, clock="sim", extra=fleet_extra("round-robin", logs, trace)))

    def restart_sink(replica, k):
        restarts.append(LogWriter(restart_log_path(trace, replica, k)))
        return restarts[-1], relative_log(restarts[-1].path, trace)

    simulate_fleet(mixed_workload(80, rate=60.0), [ReplicaSpec(config, MODEL, w) for w in writers], "round-robin",
                   route_sink=route_log, outages=[SimOutage(1, 0.4, 0.9)], restart_sink=restart_sink)
    for w in [*writers, *restarts, route_log]:
        w.close()
    fleet = FleetLog.read(trace)
    assert fleet.log_replicas == [0, 1, 1] and [(o.replica, o.down, o.up) for o in fleet.outages] == [(1, 0.4, 0.9)]
    arrived = [{e.request_id for e in read_log(p) if isinstance(e, Arrived)} for p in fleet.replica_logs]
    assert all(r.request_id in arrived[r.replica] for r in fleet.routes if r.request_id is not None)
    assert main(["analyze", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "outage: replica 1 down at 0.40 s for 0.50 s, back with fleet.replica1.restart1.jsonl" in out
    main(["fidelity", str(trace), "--cost-model", str(_model_file(tmp_path))])
    assert "makespan:" in capsys.readouterr().out


def _model_file(tmp_path):
    path = tmp_path / "model.json"
    MODEL.save(path)
    return path


def test_routers_never_choose_a_replica_that_is_down():
    from runtime.engine.routers import PrefixAffinity, ReplicaLoad, RouteRequest, make_router, prefix_key

    loads = [ReplicaLoad(queued_tokens=t) for t in (0, 5, 9)]
    up = [False, True, True]
    rr = make_router("round-robin", 3)
    assert [rr.route(RouteRequest(i, 10), loads, up) for i in range(6)] == [1, 1, 2, 1, 1, 2]
    assert make_router("least-loaded", 3).route(RouteRequest(0, 10), loads, up) == 1
    pa = PrefixAffinity(3)
    keys = [prefix_key([k, k + 1]) for k in range(40)]
    homes = [pa.home(k) for k in keys]
    assert all(pa.home(k, up) != 0 for k in keys)
    # rendezvous hashing: only the down replica's prefixes move
    assert all(pa.home(k, up) == h for k, h in zip(keys, homes) if h != 0)
