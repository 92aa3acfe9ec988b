from array import array

from runtime.engine.block_manager import BlockManager
from runtime.engine.request import Request
from traces.events import BlockAllocated, BlockCached, BlockEvicted, BlockFreed, PrefixHit, Reserved
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
    bm.drain_events()
    b = req(1, range(50, 63))  # 4 blocks: takes 2 free then evicts t[1], t[0]
    assert bm.admit(b, [], 13, True) == 4 and bm.allocate(b, 13)
    kinds = [type(e) for e in bm.drain_events()]
    assert kinds.count(BlockEvicted) == 2 and kinds.count(BlockAllocated) == 4
    assert not bm.cache_index
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
    assert events[-2:] == [BlockFreed(0, events[1].block), Reserved(0, 0)]


def test_no_prefix_caching_means_no_hits_and_no_cached_blocks():
    bm = BlockManager(10, BS, enable_prefix_caching=False)
    a = req(0, range(1, 11))
    admit_and_compute(bm, a)
    bm.free(a)
    assert bm.probe(req(1, range(1, 11))) == [] and not bm.cache_index and not bm.evictable
    assert not any(isinstance(e, (BlockCached, PrefixHit)) for e in bm.events)
