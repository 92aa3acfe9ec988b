"""Property tests: random configs and workloads, every invariant checked after every step."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from tests.helpers import SeededTokenExecutor, run_checked
from traces.events import Aborted, Finished
from traces.log import encode
from traces.params import InvalidRequest, SamplingParams

configs = st.builds(
    lambda bs, nb, budget, seqs, chunked, reserve, policy, prefix: EngineConfig(
        cache=CacheConfig(block_size=bs, num_blocks=nb, enable_prefix_caching=prefix),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs,
                                  enable_chunked_prefill=chunked, reserve_full_prompt=reserve,
                                  policy=policy, max_model_len=96),
    ),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(6, 48),
    st.integers(1, 96),
    st.integers(1, 8),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["fcfs", "priority"]),
    st.booleans(),
)

requests = st.lists(
    st.tuples(
        st.integers(0, 3),  # shared prefix id (0 = none)
        st.integers(1, 40),  # own prompt length
        st.integers(1, 24),  # max_tokens
        st.integers(0, 3),  # priority
        st.booleans(),  # ignore eos
    ),
    min_size=2,
    max_size=20,
)


def build(config, reqs, events, abort_every=0):
    core = EngineCore(config, eos_token_id=0, sink=events.append)
    accepted = 0
    for i, (prefix, n, max_tokens, prio, ignore_eos) in enumerate(reqs):
        tokens = [prefix * 100 + j + 1 for j in range(12 * bool(prefix))] + [1000 + 13 * i + j for j in range(n)]
        try:
            core.add_request(tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
                             now=0.0, priority=prio)
            accepted += 1
        except InvalidRequest:
            pass  # too big for this pool / budget: rejected up front, never admitted
    return core, accepted


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, reqs=requests, seed=st.integers(0, 5), abort_every=st.sampled_from([0, 0, 3, 7]))
def test_invariants_hold_after_every_step_and_every_request_ends(config, reqs, seed, abort_every):
    events = []
    core, accepted = build(config, reqs, events)
    ex = SeededTokenExecutor(seed=seed, vocab=50, eos_id=0, eos_every=11)
    steps = [0]

    def maybe_abort(out):
        steps[0] += 1
        if abort_every and steps[0] % abort_every == 0 and core.requests:
            core.abort(min(core.requests), now=float(steps[0]))
            core.block_manager.check_invariants()

    # the step bound proves no deadlock or starvation: all work is done in bounded steps
    run_checked(core, ex, events, max_steps=5000, on_step=maybe_abort)
    ended = sum(isinstance(e, (Finished, Aborted)) for e in events)
    assert ended == accepted
    bm = core.block_manager
    assert bm.num_used_blocks == 0 and bm.total_reserved == 0 and not bm.tables


@settings(max_examples=40, deadline=None)
@given(config=configs, reqs=requests, seed=st.integers(0, 5))
def test_same_inputs_same_log(config, reqs, seed):
    logs = []
    for _ in range(2):
        events = []
        core, _ = build(config, reqs, events)
        run_checked(core, SeededTokenExecutor(seed=seed, vocab=50, eos_id=0, eos_every=11), None)
        logs.append(b"\n".join(encode(e) for e in events))
    assert logs[0] == logs[1]


def test_seeded_sweep_of_larger_workloads():
    """Hypothesis shrinks towards tiny cases; this sweep keeps pools under real pressure."""
    import random

    preempting = hitting = 0
    for seed in range(60):
        r = random.Random(seed)
        config = EngineConfig(
            cache=CacheConfig(block_size=r.choice([2, 4, 8]), num_blocks=r.randrange(12, 60),
                              enable_prefix_caching=r.random() < 0.8),
            scheduler=SchedulerConfig(max_num_batched_tokens=r.randrange(24, 128), max_num_seqs=r.randrange(2, 16),
                                      enable_chunked_prefill=r.random() < 0.7,
                                      reserve_full_prompt=r.random() < 0.5,
                                      policy=r.choice(["fcfs", "priority"]), max_model_len=96),
        )
        reqs = [(r.randrange(4), r.randrange(1, 30), r.randrange(1, 30), r.randrange(3), r.random() < 0.5)
                for _ in range(30)]
        events = []
        core, accepted = build(config, reqs, events)
        run_checked(core, SeededTokenExecutor(seed=seed, vocab=50, eos_id=0, eos_every=17), events)
        assert sum(isinstance(e, (Finished, Aborted)) for e in events) == accepted
        names = {type(e).__name__ for e in events}
        preempting += "Preempted" in names
        hitting += any(type(b).__name__ == "PrefixHit" for e in events for b in getattr(e, "block_events", ()))
    assert preempting >= 10 and hitting >= 10  # the sweep really exercises both paths
