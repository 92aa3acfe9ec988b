"""Fleets in the SimPy model: N replicas behind one front door and a router.

- Under round-robin, N replicas write the logs of N independent simulations of the round-robin
  split (the front door and the replicas share nothing but time).
- Routing is deterministic: the same run writes the same bytes.
- Every replica's log folds to its live state after every step.
- The fleet log and the replicas' logs read as one run.
- prefix-affinity sends requests that share a prefix to one replica, whose cache serves them.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.frames import load_frames
from runtime.cli import main
from runtime.engine.routers import LeastLoaded, PrefixAffinity, ReplicaLoad, RouteRequest, make_router, prefix_key
from simulator.cost.host_timing import HostTiming
from simulator.cost.linear_model import LinearCostModel
from simulator.fleet.fleet import Fleet, ReplicaSpec, simulate_fleet
from simulator.sim import simulate
from tests.sim_helpers import mixed_workload, small_config
from traces.events import Admitted, Routed, Step, make_header
from traces.fleet_log import FleetLog, replica_log_path
from traces.fold import FoldedState
from traces.generators import generate
from traces.log import encode, read_log
from traces.workload import Workload


def _model(overlap: bool) -> LinearCostModel:
    m = LinearCostModel({"const": 0.002, "prefill_tokens": 1e-5, "decode_context": 2e-8, "seqs": 3e-4})
    if overlap:  # the async engine: steps planned ahead, a front-door delay
        m = m.with_host(HostTiming(overlap=True, intake_delay=0.001))
    return m


def _fleet(workload, n, router, model, config, *, plain_runs=True, sinks=None, routes=None):
    sinks = sinks or [[] for _ in range(n)]
    specs = [ReplicaSpec(config, model, s.append) for s in sinks]
    results = simulate_fleet(workload, specs, router, route_sink=None if routes is None else routes.append,
                             plain_runs=plain_runs)
    return sinks, results


def _bytes(events) -> list[bytes]:
    return [encode(e) for e in events[1:]]  # the Header says which replica it is


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), seed=st.integers(0, 50), overlap=st.booleans(), chunked=st.booleans(),
       size=st.integers(0, 60))
def test_round_robin_replicas_are_independent_simulations_of_the_split(n, seed, overlap, chunked, size):
    workload = mixed_workload(size, seed=seed) if size else Workload([])
    config = small_config(chunked=chunked, budget=256 if chunked else 1024, num_blocks=128)
    sinks, _ = _fleet(workload, n, "round-robin", _model(overlap), config)
    for i in range(n):
        alone = []
        simulate(Workload(workload.requests[i::n], source="split"), config, _model(overlap), sink=alone.append)
        assert _bytes(sinks[i]) == _bytes(alone)


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "prefix-affinity"])
def test_routing_is_deterministic(router):
    workload = mixed_workload(80, seed=3, rate=200.0)
    runs = []
    for _ in range(2):
        routes: list = []
        sinks, _ = _fleet(workload, 3, router, _model(True), small_config(num_blocks=128), routes=routes)
        runs.append(([encode(r) for r in routes], [_bytes(s) for s in sinks]))
    assert runs[0] == runs[1]
    routes = [msgspec.json.decode(r, type=Routed) for r in runs[0][0]]
    assert [r.index for r in routes] == list(range(len(workload)))
    if router == "least-loaded":
        assert len({r.replica for r in routes}) == 3  # at this load every replica gets work


def _fold_checker(replica_core):
    """A sink applying each event to a FoldedState and holding it to the replica's live state at every step."""
    state = FoldedState(0)
    checked = []

    def sink(event):
        nonlocal state
        if type(event).__name__ == "Header":
            state = FoldedState(event.num_blocks)
            return
        state.apply(event)
        if isinstance(event, Step):
            core = replica_core()
            core.block_manager.check_invariants()
            assert state.block_state() == core.block_manager.snapshot()
            checked.append(event.step)

    return sink, checked


@pytest.mark.parametrize("router", ["least-loaded", "prefix-affinity"])
def test_every_replica_folds_to_its_live_state_after_every_step(router):
    workload = mixed_workload(60, seed=5, rate=300.0)
    config = small_config(num_blocks=48, budget=128)  # a small pool: preemption and eviction happen
    fleet: list[Fleet] = []
    checkers = [_fold_checker(lambda i=i: fleet[0].replicas[i].core) for i in range(2)]
    for sink, _ in checkers:
        sink(make_header(config, clock="sim"))
    fleet.append(Fleet(workload, [ReplicaSpec(config, _model(False), sink) for sink, _ in checkers], router,
                       plain_runs=False))
    fleet[0].run()
    assert all(checked for _, checked in checkers)


def test_a_fleet_log_reads_as_one_run(tmp_path):
    out = tmp_path / "fleet.jsonl"
    argv = ["simulate", "tests/data/azure_conv_head200.csv", "--cost-model", "qwen3-0.6b-h200", "--replicas", "2",
            "--router", "least-loaded", "--replica", "1: --max-num-seqs 8", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    logs = [replica_log_path(out, i) for i in range(2)]
    assert all(p.exists() for p in logs)
    fleet = FleetLog.read(out)
    assert fleet.router == "least-loaded" and fleet.replica_logs == logs and len(fleet.routes) == 200
    headers = [next(read_log(p)) for p in logs]
    assert [h.config["scheduler"]["max_num_seqs"] for h in headers] == [256, 8]
    frames = load_frames(out)
    assert len(frames.requests) == 200 and sorted(frames.requests["request_id"]) == list(range(200))
    assert set(frames.requests["replica"]) == {0, 1} and set(frames.steps["replica"]) == {0, 1}
    assert main(["analyze", str(out), "--out", str(tmp_path / "report")]) == 0
    assert "makespan" in (tmp_path / "report" / "report.md").read_text()


def test_bad_fleet_flags_are_one_line(capsys):
    base = ["simulate", "tests/data/azure_conv_head200.csv", "--cost-model", "qwen3-0.6b-h200", "--out", "/dev/null"]
    for extra, message in [(["--replicas", "0"], "--replicas"), (["--router", "random"], "--router"),
                           (["--replicas", "2", "--replica", "2: --max-num-seqs 8"], "0 to 1"),
                           (["--replicas", "2", "--replica", "1: --model x"], "not a simulate engine flag"),
                           (["--replicas", "2", "--replica", "1: --max-num-seqs 0"], "max_num_seqs")]:
        with pytest.raises(SystemExit) as exc:
            main(base + extra)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def _two_documents(n: int = 120):
    """Requests that open with one of two 512-token documents (then a question of their own)."""
    wl = generate(n, rate=40.0, input_len="uniform:560:700", output_len="uniform:4:16", shared_prefix=0, seed=1)
    from traces.prompt import PromptSynthetic

    specs = [msgspec.structs.replace(s, prompt=PromptSynthetic(num_tokens=s.prompt.num_tokens, unique_seed=i + 1,
                                                               segment_ids=[1 + i % 2], segment_len=512))
             for i, s in enumerate(wl.requests)]
    return Workload(specs, source="two-documents")


def test_prefix_affinity_keeps_a_prefix_on_one_replica_and_hits_its_cache():
    workload, config = _two_documents(), small_config(num_blocks=2048, budget=2048, max_num_seqs=64)
    hits = {}
    for router in ("round-robin", "prefix-affinity"):
        routes: list = []
        sinks, _ = _fleet(workload, 4, router, _model(True), config, routes=routes)
        cached = sum(e.num_cached_tokens for s in sinks for e in s if isinstance(e, Admitted))
        hits[router] = cached
        if router == "prefix-affinity":
            home = {}
            for r in routes:
                home.setdefault(r.index % 2, set()).add(r.replica)
            assert all(len(v) == 1 for v in home.values()), home
    assert hits["prefix-affinity"] > hits["round-robin"]


def test_routers():
    loads = [ReplicaLoad(3, 500, 0.5), ReplicaLoad(1, 100, 0.9), ReplicaLoad(2, 100, 0.2)]
    rr = make_router("round-robin", 3)
    assert [rr.route(RouteRequest(i, 10), loads) for i in range(5)] == [0, 1, 2, 0, 1]
    assert LeastLoaded(3).route(RouteRequest(0, 10), loads) == 2  # tokens tie: less KV in use
    pa = PrefixAffinity(3, slack_tokens=300)
    key = prefix_key([1, 2, 3])
    home = pa.home(key)
    assert home == pa.home(prefix_key([1, 2, 3])) and key != prefix_key([1, 2, 4])
    assert pa.route(RouteRequest(0, 10, key), [ReplicaLoad()] * 3) == home
    crowded = [ReplicaLoad(queued_tokens=1000 if i == home else 0) for i in range(3)]
    assert pa.route(RouteRequest(0, 10, key), crowded) != home  # past the load bound: least-loaded
    with pytest.raises(ValueError, match="unknown router"):
        make_router("random", 2)


def test_one_replica_is_the_single_engine_simulation(tmp_path):
    """``--replicas 1`` (any router) writes the single-engine log, not a fleet log."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    base = ["simulate", "tests/data/azure_conv_head200.csv", "--cost-model", "qwen3-0.6b-h200", "--no-progress"]
    assert main(base + ["--out", str(a)]) == 0
    assert main(base + ["--out", str(b), "--replicas", "1", "--router", "least-loaded"]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_a_fleet_log_resimulated_by_its_own_model_is_reproduced_exactly(tmp_path):
    """``fidelity`` of a fleet log: its requests through as many replicas and its router again."""
    from simulator.cost.loading import load_cost_model
    from simulator.fidelity.fidelity import fidelity

    out = tmp_path / "fleet.jsonl"
    assert main(["simulate", "tests/data/azure_conv_head200.csv", "--cost-model", "qwen3-0.6b-h200", "--replicas", "3",
                 "--router", "least-loaded", "--rate-scale", "20", "--out", str(out), "--no-progress"]) == 0
    report, _ = fidelity(out, load_cost_model("qwen3-0.6b-h200"))
    assert report["live"]["requests"] == report["sim"]["requests"] == 200
    assert all(abs(cell["error_pct"]) < 1e-9 for m in report["metrics"].values()
               for k, cell in m.items() if isinstance(cell, dict))
    assert report["steps"]["live"] == report["steps"]["sim"]
