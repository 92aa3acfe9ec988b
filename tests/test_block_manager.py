from array import array

import pytest

from runtime.engine.block_manager import BlockManager, chain_hash, root_hash, salted_root
from runtime.engine.request import Request
from traces.events import BlockAllocated, BlockCached, BlockFreed, PrefixHit, Reserved
from traces.fold import FoldedState
from traces.params import SamplingParams

BS = 4


def req(rid, tokens, max_tokens=8):
    return Request(rid, array("i", tokens), SamplingParams(max_tokens=max_tokens), 0.0, 1000)


def admit_and_compute(bm, r, reserve_full=True):
    """Admit with prefix hits and compute the whole prompt in one span."""
    hits = bm.probe(r)
    assert bm.admit(r, hits, r.num_tokens - len(hits) * BS, reserve_full) is not None
    assert bm.allocate(r, r.num_tokens)
    r.num_computed_tokens = r.num_tokens
    bm.register_computed(r)
    bm.check_invariants()
    return hits


def test_allocation_is_lazy_and_consumes_the_reservation():
    bm = BlockManager(10, BS)
    r = req(0, range(1, 11))  # 10 tokens -> 3 blocks
    assert bm.admit(r, [], 4, reserve_full=True) == 3
    assert bm.tables[0] == [] and bm.total_reserved == 3 and bm.num_available_blocks == 7
    assert bm.allocate(r, 4)  # first chunk: one block
    assert len(bm.tables[0]) == 1 and bm.reserved[0] == 2 and bm.num_free_blocks == 9
    assert bm.allocate(r, 10)
    assert len(bm.tables[0]) == 3 and 0 not in bm.reserved and bm.total_reserved == 0
    assert bm.allocate(r, 11)  # decode past the prompt: unreserved capacity
    assert len(bm.tables[0]) == 3
    assert bm.allocate(r, 13)
    assert len(bm.tables[0]) == 4
    bm.check_invariants()


def test_reserve_only_first_chunk():
    bm = BlockManager(10, BS)
    r = req(0, range(1, 41))  # 40 tokens = 10 blocks
    assert bm.admit(r, [], 8, reserve_full=False) == 2
    assert bm.total_reserved == 2


def test_admission_refused_when_reservations_exhaust_capacity():
    bm = BlockManager(6, BS)
    a, b = req(0, range(1, 17)), req(1, range(1, 13))  # 4 and 3 blocks
    assert bm.admit(a, [], 4, reserve_full=True) == 4
    before = bm.snapshot()
    assert bm.admit(b, [], 4, reserve_full=True) is None  # 3 > 6 - 4
    assert bm.snapshot() == before and bm.events[-1] == Reserved(0, 4)
    assert bm.admit(b, [], 4, reserve_full=False) == 1  # only its first chunk
    # unreserved capacity: one block; b may not take a second without a reservation
    assert bm.allocate(b, 4) and not bm.allocate(b, 12)
    bm.check_invariants()


def test_prefix_hits_full_blocks_only_and_never_the_last_token():
    bm = BlockManager(20, BS)
    a = req(0, range(1, 11))  # blocks [1..4] [5..8] [9,10]
    admit_and_compute(bm, a)
    assert len(bm.cache_index) == 2  # the partial third block is not cached
    b = req(1, list(range(1, 9)) + [99, 98, 97])
    assert bm.probe(b) == bm.tables[0][:2]
    c = req(2, range(1, 9))  # exactly the two cached blocks: the last token must be computed
    assert bm.probe(c) == bm.tables[0][:1]
    d = req(3, [1, 2, 3, 5, 5, 6, 7, 8, 9])  # differs in block 0: the chain breaks at once
    assert bm.probe(d) == []


def test_prefix_hash_is_rooted_in_model_identity():
    a = BlockManager(20, BS, root=1)
    admit_and_compute(a, req(0, range(1, 11)))
    b = BlockManager(20, BS, root=2)
    b.cache_index = a.cache_index  # same index, other model: nothing may match
    b.block_content = a.block_content
    assert b.probe(req(1, range(1, 11))) == []


def test_hit_is_verified_against_block_tokens():
    bm = BlockManager(20, BS)
    admit_and_compute(bm, req(0, range(1, 11)))
    block = bm.tables[0][0]
    bm.block_content[block] = b"\x00" * 16  # simulate a hash collision: content differs
    assert bm.probe(req(1, range(1, 11))) == []


def test_shared_blocks_are_ref_counted_and_cached_blocks_stay_reusable():
    bm = BlockManager(20, BS)
    a, b = req(0, range(1, 11)), req(1, range(1, 12))
    admit_and_compute(bm, a)
    hits = admit_and_compute(bm, b)
    assert hits == bm.tables[0][:2] and [bm.ref_counts[x] for x in hits] == [2, 2]
    bm.free(a)
    assert [bm.ref_counts[x] for x in hits] == [1, 1]
    bm.free(b)
    assert bm.num_used_blocks == 0 and set(hits) <= set(bm.evictable)
    c = req(2, range(1, 10))
    assert bm.probe(c) == hits  # still cached with ref 0
    admit_and_compute(bm, c)
    assert [bm.ref_counts[x] for x in hits] == [1, 1] and not set(hits) & set(bm.evictable)


def test_lru_eviction_takes_least_recently_freed_tail_first():
    bm = BlockManager(4, BS)
    a = req(0, range(1, 10))  # 3 blocks, 2 full -> cached
    admit_and_compute(bm, a)
    t = list(bm.tables[0])
    bm.free(a)
    assert list(bm.evictable) == [t[1], t[0]]  # tail first: the chain's end goes first
    assert list(bm.free_blocks) == [3, t[2]]
    folded = FoldedState(bm.num_blocks)
    for ev in bm.drain_events():
        folded.apply_block_event(ev)
    b = req(1, range(50, 63))  # 4 blocks: takes 2 free then evicts t[1], t[0]
    assert bm.admit(b, [], 13, True) == 4 and bm.allocate(b, 13)
    events = bm.drain_events()
    # one allocation; its evictions are implied: the log's fold evicts the cached blocks it takes
    assert t == [0, 1, 2] and events == [Reserved(1, 4), BlockAllocated(1, [3, -4])]  # blocks 3, 2, 1, 0
    assert not bm.cache_index
    for ev in events:
        folded.apply_block_event(ev)
    assert folded.block_state() == bm.snapshot()
    bm.check_invariants()


def test_free_is_idempotent_and_releases_reservations():
    bm = BlockManager(10, BS)
    r = req(0, range(1, 20))
    bm.admit(r, [], 4, True)
    bm.allocate(r, 4)
    bm.free(r)
    bm.free(r)
    bm.check_invariants()
    assert bm.num_free_blocks == 10 and bm.total_reserved == 0 and not bm.tables
    events = bm.drain_events()
    assert events == [Reserved(0, 5), BlockAllocated(0, [0, 1]), BlockFreed(0)]  # one free: blocks and reservation


def test_no_prefix_caching_means_no_hits_and_no_cached_blocks():
    bm = BlockManager(10, BS, enable_prefix_caching=False)
    a = req(0, range(1, 11))
    admit_and_compute(bm, a)
    bm.free(a)
    assert bm.probe(req(1, range(1, 11))) == [] and not bm.cache_index and not bm.evictable
    assert not any(isinstance(e, (BlockCached, PrefixHit)) for e in bm.events)


# --- prefix-cache reuse, bookkeeping and the invariant checker (docs/MUTATION.md) ----------------


@pytest.mark.parametrize(("turn1_len", "cached"), [(6, 12), (7, 16)])
def test_a_follow_up_turn_reuses_the_kv_of_the_previous_answer(turn1_len, cached):
    """Multi-turn chat: prompt 2 = prompt 1 + answer 1 + new text. The blocks holding answer 1 were
    filled by decode steps, after admission hashed the prompt; they must be found all the same, the
    last one too when the answer's last computed token fills it (turn 1 of 7 tokens: 16 computed).
    Turn 1's last sampled token never goes through the model: 6 + 10 tokens leave 15 computed, 3 blocks."""
    from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from runtime.engine.core import EngineCore
    from tests.helpers import SeededTokenExecutor
    from traces.events import Admitted

    events = []
    cfg = EngineConfig(cache=CacheConfig(block_size=BS, num_blocks=32), scheduler=SchedulerConfig(max_model_len=64))
    core = EngineCore(cfg, sink=events.append)
    ex = SeededTokenExecutor()
    turn1 = list(range(1, 1 + turn1_len))
    answer = []
    core.add_request(turn1, SamplingParams(max_tokens=10, ignore_eos=True), 0.0)
    while core.has_unfinished():
        for d in core.step(0.0, ex).deltas:
            answer += d.new_token_ids
    assert len(answer) == 10
    core.add_request(turn1 + answer + [900, 901, 902], SamplingParams(max_tokens=1), 1.0)
    core.step(1.0, ex)
    assert [e.num_cached_tokens for e in events if isinstance(e, Admitted)] == [0, cached]


def test_requests_computed_in_the_same_step_cache_their_distinct_tails():
    """Two prompts sharing block 0 but not block 1, computed together: both second blocks get cached."""
    bm = BlockManager(20, BS)
    a, b = req(0, [1, 2, 3, 4, 10, 11, 12, 13, 99]), req(1, [1, 2, 3, 4, 20, 21, 22, 23, 99])
    for r in (a, b):  # both admitted before either is computed: no hits
        assert bm.admit(r, bm.probe(r), r.num_tokens, True) is not None
        assert bm.allocate(r, r.num_tokens)
    for r in (a, b):
        r.num_computed_tokens = r.num_tokens
        bm.register_computed(r)
    bm.check_invariants()
    assert bm.probe(req(2, [1, 2, 3, 4, 20, 21, 22, 23, 5])) == [bm.tables[0][0], bm.tables[1][1]]
    assert bm.probe(req(3, [1, 2, 3, 4, 10, 11, 12, 13, 5])) == bm.tables[0][:2]


def test_no_per_request_state_outlives_the_request():
    """A long-running engine must not grow with the requests it has served (finished, aborted, preempted)."""
    from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from runtime.engine.core import EngineCore
    from tests.helpers import SeededTokenExecutor, run_checked

    cfg = EngineConfig(cache=CacheConfig(block_size=BS, num_blocks=10),
                       scheduler=SchedulerConfig(max_num_batched_tokens=12, max_model_len=64))
    core = EngineCore(cfg)
    for i in range(8):
        core.add_request([1 + i % 2] * 4 + list(range(10 * i, 10 * i + 7)),
                         SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    core.step(0.0, SeededTokenExecutor())
    core.abort(3, 0.0)  # waiting
    seen_preemption = []
    run_checked(core, SeededTokenExecutor(), None, on_step=lambda out: seen_preemption.extend(out.plan.preempted))
    assert seen_preemption  # the pool is small enough to preempt
    bm = core.block_manager
    per_request = {"tables": bm.tables, "reserved": bm.reserved, "hash memo": bm._hashes,
                   "registered": bm._registered, "running": core.scheduler.running, "requests": core.requests}
    assert {name: d for name, d in per_request.items() if d} == {}
    assert len(core.scheduler.waiting) == 0


def test_model_identity_and_salt_root_the_hash_chain():
    """Two models or two tenants (salts) never produce the same block hashes, so they can't share KV."""
    from runtime.engine.block_manager import root_hash

    roots = {root_hash(m, s) for m in ("model-a", "model-b") for s in ("", "tenant-1")}
    assert len(roots) == 4
    assert root_hash("model-a", "tenant-1") == root_hash("model-a", "tenant-1")
    cached = []
    for root in sorted(roots):
        bm = BlockManager(20, BS, root=root)
        admit_and_compute(bm, req(0, range(1, 10)))
        cached.append(set(bm.cache_index))
    assert all(len(c) == 2 for c in cached) and len(set().union(*cached)) == 8


def _corrupt_free_and_in_use(bm):
    """An in-use block listed as free (in place of a free one, so every count still adds up)."""
    bm.free_blocks.popleft()
    bm.free_blocks.append(bm.tables[1][-1])


def _corrupt_zero_reservation(bm):
    """A reservation of 0 blocks left behind (the total kept consistent)."""
    bm.total_reserved -= bm.reserved[1]
    bm.reserved[1] = 0


def _corrupt_ref_count(bm):
    bm.ref_counts[bm.tables[1][0]] += 1


@pytest.mark.parametrize("corrupt", [_corrupt_free_and_in_use, _corrupt_zero_reservation, _corrupt_ref_count])
def test_the_invariant_checker_catches_each_corruption(corrupt):
    """check_invariants is what every engine test relies on: each kind of accounting error trips it."""
    bm = BlockManager(12, BS)
    a = req(0, range(1, 10))
    admit_and_compute(bm, a)
    bm.free(a)  # two cached blocks, now evictable
    b = req(1, range(50, 59))
    assert bm.admit(b, [], 4, reserve_full=True) == 3 and bm.allocate(b, 4)
    bm.check_invariants()
    corrupt(bm)
    with pytest.raises(AssertionError):
        bm.check_invariants()


def salted(rid, tokens, salt):
    r = req(rid, tokens)
    r.cache_salt = salt
    return r


def test_a_cache_salt_shares_prefix_blocks_only_within_the_salt():
    """Tenants with different salts never hit each other's blocks (a hit would time-leak a prompt)."""
    prompt = range(1, 11)  # two full blocks a later request could hit
    bm = BlockManager(40, BS, root=7)
    admit_and_compute(bm, salted(0, prompt, "tenant-a"))
    assert bm.probe(salted(1, prompt, "tenant-a")) == bm.tables[0][:2]
    assert bm.probe(salted(2, prompt, "tenant-b")) == []
    assert bm.probe(req(3, prompt)) == []  # no salt vs a salt
    admit_and_compute(bm, req(4, prompt))
    assert bm.probe(req(5, prompt)) == bm.tables[4][:2]
    assert bm.probe(salted(6, prompt, "tenant-a")) == bm.tables[0][:2]  # the unsalted copy doesn't shadow it


def test_the_salted_root_is_its_own_hash_domain():
    roots = {salted_root(r, s) for r in (0, 1, -5) for s in ("a", "b", "a\x00", "\x00a")}
    assert len(roots) == 12
    # never a block hash of the unsalted chain: a salt spelling out a block's tokens gains nothing
    block = array("i", [1, 2, 3, 4]).tobytes()
    assert salted_root(0, block.decode("latin-1")) != chain_hash(0, block)
    assert root_hash("m", "s") not in {salted_root(root_hash("m", ""), "s"), salted_root(root_hash("m", "s"), "")}


@pytest.mark.parametrize("salt", [None, "tenant"])
def test_the_memoized_chain_is_chain_hash_block_after_block(salt):
    """``_chain`` hashes a request's blocks in one pass over its bytes; each is ``chain_hash`` of
    the one before (rooted in the engine's root, or the salted root) and the block's tokens."""
    bm = BlockManager(20, BS, root=root_hash("m", ""))
    r = req(0, range(1, 5 * BS + 3))
    r.cache_salt = salt
    parent = bm.root if salt is None else salted_root(bm.root, salt)
    expected = []
    for i in range(5):
        parent = chain_hash(parent, r.token_ids[i * BS:(i + 1) * BS].tobytes())
        expected.append(parent)
    # memoized: each call continues the chain from the last hash it kept (one, then three)
    assert bm._chain(r, 1) == expected[:1] and bm._chain(r, 3) == expected[:3]
    assert bm._chain(r, 5) == expected and bm.prompt_hashes(r) == expected


def test_a_block_filled_by_decoding_after_an_empty_memo_chains_from_the_root():
    """A prompt shorter than a block has no full block to hash (a trace's prompt hashes: []); the
    block its decodes fill is cached under ``chain_hash(root, its tokens)``."""
    bm = BlockManager(8, BS, root=root_hash("m", ""))
    r = req(0, [5, 6, 7])
    assert bm.prompt_hashes(r) == []
    admit_and_compute(bm, r)
    r.token_ids.append(8)  # a decoded token (the engine appends it so)
    assert bm.allocate(r, 4)
    r.num_computed_tokens = 4
    bm.register_computed(r)
    block = bm.tables[0][0]
    assert bm.block_hash[block] == chain_hash(bm.root, array("i", [5, 6, 7, 8]).tobytes())
    assert bm.events[-1] == BlockCached(0, [0, 1])
    bm.check_invariants()
