"""Paged KV accounting: a fixed pool of blocks, block tables, ref counts, prefix caching.

Rules
- Blocks are free (never cached or evicted), evictable (cached, ref 0, LRU order) or in use.
- Prefix caching covers *full* blocks only. Block i of a request is keyed by a hash chain
  ``h_i = H(h_{i-1}, tokens of block i)`` rooted in model identity + salt (+ the request's own
  cache salt, if it has one: tenants with different salts never share a block, so a prefix hit
  can't tell one what another sent); a hit is verified against the block's stored token ids.
  A block is registered only after it is computed.
- Reservation ≠ allocation: admission *reserves* capacity for the cold blocks it will need;
  physical blocks are taken lazily as spans are scheduled, consuming the reservation first.
  Invariant: total reservation <= free + evictable blocks.
- ``free`` is idempotent, so aborting at any status never leaks or double-frees.

Every state change is appended to ``events`` (drained by the core into the log) in the order
it happened, one operation per call with its blocks as runs (``traces.events``);
``traces.log.fold`` replays them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque

from runtime.engine.request import Request
from traces.block_runs import extend_runs, runs_of
from traces.events import BlockAllocated, BlockCached, BlockEvent, BlockFreed, BlockTrimmed, PrefixHit, Reserved
from traces.fold import BlockState


def root_hash(model_identity: str, salt: str) -> int:
    digest = hashlib.blake2b(f"{model_identity}\x00{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def salted_root(root: int, cache_salt: str) -> int:
    """The chain root of a request with a cache salt: the engine's root and the salt, hashed in a
    domain of its own (``person``) so it equals no block hash and no unsalted root."""
    h = hashlib.blake2b(root.to_bytes(8, "little", signed=True), digest_size=8, person=b"cache_salt")
    h.update(cache_salt.encode())
    return int.from_bytes(h.digest(), "little", signed=True)


_BLAKE2B_8 = hashlib.blake2b(digest_size=8)  # copied, never updated: what chain_hash starts from


def _extend_chain(hashes: list[int], parent: int, data: bytes, width: int) -> None:
    """Append to ``hashes`` the chain hashes of ``data``'s blocks (``width`` bytes each) after
    ``parent``: ``chain_hash`` block after block, the parent kept as the digest's bytes."""
    digest = parent.to_bytes(8, "little", signed=True)
    blank, from_bytes, append = _BLAKE2B_8, int.from_bytes, hashes.append
    for offset in range(0, len(data), width):
        h = blank.copy()  # cheaper than a new blake2b(digest_size=8)
        h.update(digest)
        h.update(data[offset : offset + width])
        digest = h.digest()
        append(from_bytes(digest, "little", signed=True))


def chain_hash(parent: int, content: bytes) -> int:
    h = hashlib.blake2b(parent.to_bytes(8, "little", signed=True), digest_size=8)
    h.update(content)
    return int.from_bytes(h.digest(), "little", signed=True)


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, root: int = 0
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.root = root
        self.ref_counts = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))  # taken from the left, freed to the right
        self.evictable: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_content: list[bytes | None] = [None] * num_blocks  # a cached block's tokens (hits verify them)
        self.cache_index: dict[int, int] = {}  # hash -> block
        self.tables: dict[int, list[int]] = {}
        self.reserved: dict[int, int] = {}
        self.total_reserved = 0
        # per request: chain hashes of its full blocks (memo; token ids never change once appended)
        self._hashes: dict[int, list[int]] = {}
        # per request: how many leading blocks are registered or known cached
        self._registered: dict[int, int] = {}
        self.events: list[BlockEvent] = []

    # --- capacity ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out: free + evictable (cached, unreferenced)."""
        return len(self.free_blocks) + len(self.evictable)

    @property
    def num_available_blocks(self) -> int:
        """Free capacity not promised to any reservation."""
        return len(self.free_blocks) + len(self.evictable) - self.total_reserved

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- prefix cache -------------------------------------------------------------------------

    def _block_bytes(self, req: Request, i: int) -> bytes:
        bs = self.block_size
        return req.token_ids[i * bs : (i + 1) * bs].tobytes()

    def _chain(self, req: Request, num_blocks: int) -> list[int]:
        """Chain hashes of the first ``num_blocks`` full blocks of ``req`` (memoized): ``chain_hash``
        block after block, the parent kept as the digest's bytes (``chain_hash`` reads them back)."""
        hashes = self._hashes.setdefault(req.request_id, [])
        done = len(hashes)
        if done >= num_blocks:
            return hashes
        bs = self.block_size
        data = req.token_ids[done * bs : num_blocks * bs].tobytes()
        _extend_chain(hashes, hashes[-1] if hashes else self._root_of(req), data, len(data) // (num_blocks - done))
        return hashes

    def _root_of(self, req: Request) -> int:
        return self.root if req.cache_salt is None else salted_root(self.root, req.cache_salt)

    def prompt_hashes(self, req: Request) -> list[int]:
        """Chain hashes of the full blocks of ``req``'s prompt (what a trace may record instead of
        its tokens: equal leading hashes mean an equal prefix)."""
        n = req.num_prompt_tokens // self.block_size
        return self._chain(req, n)[:n]

    def probe(self, req: Request) -> list[int]:
        """Read-only: the cached blocks that would serve ``req``'s leading tokens.

        At most ``(num_tokens - 1) // block_size`` blocks: the last token is always computed
        so the step produces logits, and a hit never covers a partial block.
        """
        if not self.enable_prefix_caching:
            return []
        limit = (req.num_tokens - 1) // self.block_size
        hits: list[int] = []
        if limit <= 0:
            return hits
        hashes = self._chain(req, limit)
        for i in range(limit):
            block = self.cache_index.get(hashes[i])
            if block is None or self.block_content[block] != self._block_bytes(req, i):
                break
            hits.append(block)
        return hits

    # --- admission and allocation ---------------------------------------------------------------

    def admit(self, req: Request, hits: list[int], num_new_tokens: int, reserve_full: bool) -> int | None:
        """Take the hit blocks and reserve the cold blocks admission needs.

        Returns the number of blocks reserved, or None (no change) if they don't fit.

        ``num_new_tokens`` is the first chunk to compute; ``reserve_full`` reserves for the whole
        remaining prompt instead.
        """
        rid = req.request_id
        cached_tokens = len(hits) * self.block_size
        upto = req.num_tokens if reserve_full else cached_tokens + num_new_tokens
        reserve = self.blocks_for(upto) - len(hits)
        unreferenced_hits = sum(1 for b in hits if self.ref_counts[b] == 0)
        if unreferenced_hits + reserve > self.num_available_blocks:
            return None
        table = self.tables.setdefault(rid, [])
        assert not table, f"request {rid} admitted while holding blocks"
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.evictable[block]
            self.ref_counts[block] += 1
            table.append(block)
        if hits:
            self.events.append(PrefixHit(rid, runs_of(hits)))
        self._registered[rid] = len(hits)
        if reserve:
            self.reserved[rid] = reserve
            self.total_reserved += reserve
            self.events.append(Reserved(rid, reserve))
        return reserve

    def allocate(self, req: Request, num_tokens: int) -> bool:
        """Make ``req``'s table cover positions [0, num_tokens); False (no change) if it can't."""
        rid = req.request_id
        table = self.tables.get(rid)
        if table is None:
            table = self.tables[rid] = []
        need = -(-num_tokens // self.block_size) - len(table)
        if need <= 0:
            return True
        reserved = self.reserved.get(rid, 0)
        from_reservation = reserved if reserved < need else need
        free_blocks, evictable = self.free_blocks, self.evictable
        if need - from_reservation > len(free_blocks) + len(evictable) - self.total_reserved:  # available
            return False
        start = len(table)
        ref_counts = self.ref_counts
        block_hash, cache_index, block_content = self.block_hash, self.cache_index, self.block_content
        for _ in range(need):
            if free_blocks:
                block = free_blocks.popleft()
            else:  # evict the least recently used cached block (the log's alloc of it says so)
                block = evictable.popitem(last=False)[0]
                del cache_index[block_hash[block]]  # type: ignore[index]
                block_content[block] = None
                block_hash[block] = None
            ref_counts[block] = 1
            table.append(block)
        events = self.events
        last = events[-1] if events else None
        if last.__class__ is BlockAllocated and last.request_id == rid:  # type: ignore[union-attr]
            extend_runs(last.runs, table[start:])  # type: ignore[union-attr]  # one operation, as fold sees it
        else:
            events.append(BlockAllocated(rid, [table[start], 1] if need == 1 else runs_of(table[start:])))
        if from_reservation:
            left = reserved - from_reservation
            self.total_reserved -= from_reservation
            if left:
                self.reserved[rid] = left
            else:
                del self.reserved[rid]
        return True

    def register_computed(self, req: Request) -> None:
        """Register the request's newly full, computed blocks in the prefix cache."""
        rid = req.request_id
        done = self._registered.get(rid, 0)
        full = req.num_computed_tokens // self.block_size
        if full <= done:
            return
        self._registered[rid] = full
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        data = req.token_ids[done * bs : full * bs].tobytes()
        width = len(data) // (full - done)
        hashes = self._hashes.get(rid)
        if hashes is not None and done <= len(hashes) < full:  # (a decode's new block: hashed from data)
            parent = hashes[-1] if hashes else self._root_of(req)
            _extend_chain(hashes, parent, data[(len(hashes) - done) * width :], width)
        else:
            hashes = self._chain(req, full)
        table = self.tables[rid]
        cached: list[int] = []
        cache_index, block_hash, block_content = self.cache_index, self.block_hash, self.block_content
        for i in range(done, full):
            h = hashes[i]
            block = table[i]  # (not cached: newly computed; so setdefault returns it iff it took it)
            if cache_index.setdefault(h, block) != block:
                continue  # the same content is already cached (e.g. computed concurrently)
            block_hash[block] = h
            offset = (i - done) * width
            block_content[block] = data[offset : offset + width]
            cached.append(i)
        if cached:  # positions in its table
            self.events.append(BlockCached(rid, [cached[0], 1] if len(cached) == 1 else runs_of(cached)))

    # --- runs of decode steps ------------------------------------------------------------------

    def decode_steps_that_fit(self, decodes: list[tuple[int, int]], steps: int) -> int:
        """Of ``steps`` decode steps, the first planned already, in which each ``(request id, position)``
        of ``decodes`` takes one more token a step (position + i in step i), how many leading ones
        find the blocks they take."""
        bs, tables = self.block_size, self.tables
        # per decode: the first step that needs a block past its table's end (then one every bs steps)
        firsts = [len(tables[rid]) * bs - position for rid, position in decodes]

        def blocks_by(step: int) -> int:
            return sum((step - f) // bs + 1 for f in firsts if f <= step)

        if steps > 1 and blocks_by(steps - 1) > self.num_available_blocks:
            available = self.num_available_blocks
            lo, hi = 1, steps  # (step 0's blocks were taken when it was planned: blocks_by(0) is 0)
            while hi - lo > 1:  # the longest run whose blocks fit: blocks_by(lo - 1) <= available
                mid = (lo + hi) // 2
                if blocks_by(mid - 1) <= available:
                    lo = mid
                else:
                    hi = mid
            steps = lo
        return max(steps, 0)

    def grow_decodes(self, reqs: list[Request], positions: list[int], steps: int) -> dict[int, list[BlockEvent]]:
        """What ``steps`` decode steps of ``reqs`` (request k at ``positions[k]`` + i in step i, its
        token ids already holding every token of the run) do to the pool, at once: each step's new
        blocks allocated as the scheduler takes them (a block when a position passes its table's end,
        requests in span order), then the blocks its tokens fill cached, as a commit caches them.
        Returns each step's block events (by step index; steps without any are left out). The
        caller checked ``decode_steps_that_fit``."""
        bs, tables = self.block_size, self.tables
        at: dict[int, tuple[list, list]] = {}  # step -> (requests taking a block, requests filling one)
        for req, c in zip(reqs, positions):
            for i in range(len(tables[req.request_id]) * bs - c, steps, bs):
                at.setdefault(i, ([], []))[0].append((req, c))
            for i in range(bs - 1 - c % bs, steps, bs):
                at.setdefault(i, ([], []))[1].append((req, c))
        blocks: dict[int, list[BlockEvent]] = {}
        for i in sorted(at):
            taken, filled = at[i]
            for req, c in taken:
                ok = self.allocate(req, c + i + 1)
                assert ok, "decode_steps_that_fit counted this block"
            for req, c in filled:
                req.num_computed_tokens = c + i + 1
                self.register_computed(req)
            if self.events:
                blocks[i] = self.drain_events()
        return blocks

    # --- release ---------------------------------------------------------------------------------

    def free(self, req: Request) -> None:
        """Release ``req``'s blocks and reservation. Idempotent. Tail blocks become LRU first."""
        rid = req.request_id
        table = self.tables.pop(rid, None)
        self._registered.pop(rid, None)
        if table:
            ref_counts, block_hash = self.ref_counts, self.block_hash
            free_blocks, evictable = self.free_blocks, self.evictable
            for block in reversed(table):
                ref_counts[block] -= 1
                if ref_counts[block] == 0:
                    if block_hash[block] is None:
                        free_blocks.append(block)
                    else:
                        evictable[block] = None
        reserved = self.reserved.pop(rid, 0)
        if reserved:
            self.total_reserved -= reserved
        if table or reserved:
            self.events.append(BlockFreed(rid))

    def trim(self, req: Request, num_tokens: int) -> None:
        """Cut ``req``'s table to the blocks that cover positions [0, num_tokens): the KV past them
        was written for speculative drafts that were rejected. Those blocks were taken for this
        request and never computed (so never cached): each goes back to the free list, tail first."""
        rid = req.request_id
        table = self.tables.get(rid)
        keep = -(-num_tokens // self.block_size)
        if table is None or len(table) <= keep:
            return
        ref_counts, block_hash, free_blocks = self.ref_counts, self.block_hash, self.free_blocks
        for block in reversed(table[keep:]):
            assert ref_counts[block] == 1 and block_hash[block] is None, "a trimmed block is shared or cached"
            ref_counts[block] = 0
            free_blocks.append(block)
        del table[keep:]
        self.events.append(BlockTrimmed(rid, keep))

    def forget(self, req: Request) -> None:
        """Drop per-request memo once the request is gone for good (finished or aborted)."""
        self._hashes.pop(req.request_id, None)

    # --- inspection --------------------------------------------------------------------------------

    def drain_events(self) -> list[BlockEvent]:
        events, self.events = self.events, []
        return events

    def snapshot(self) -> BlockState:
        return BlockState(
            tables={rid: tuple(t) for rid, t in self.tables.items() if t},
            ref_counts=tuple(self.ref_counts),
            free=tuple(self.free_blocks),
            evictable=tuple(self.evictable),
            cached=frozenset(self.cache_index.values()),
            reserved=dict(self.reserved),
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is inconsistent (used by tests after each step)."""
        refs = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                refs[block] += 1
        assert refs == self.ref_counts, "ref counts differ from the number of tables holding blocks"
        in_use = {b for b, r in enumerate(self.ref_counts) if r > 0}
        free, evictable = set(self.free_blocks), set(self.evictable)
        assert not (free & evictable) and not (free & in_use) and not (evictable & in_use)
        assert len(free) + len(evictable) + len(in_use) == self.num_blocks, "free + used != total"
        assert all(self.block_hash[b] is not None for b in evictable), "evictable block not cached"
        assert all(self.block_hash[b] is None for b in free), "free block still cached"
        assert {self.cache_index[h] for h in self.cache_index} == {
            b for b in range(self.num_blocks) if self.block_hash[b] is not None
        }
        assert self.total_reserved == sum(self.reserved.values()) >= 0
        assert all(v > 0 for v in self.reserved.values())
        assert self.total_reserved <= self.num_free_blocks, "reservations exceed free capacity"
