"""Random paged-KV batches for kernel tests and benchmarks.

Block ids are a random permutation of the pool (so a kernel that assumes contiguous blocks fails),
K/V are random at every position (never zeros: zeros hide unwritten or misindexed reads), and
the new tokens' K/V are already in the cache, as after ``store_kv``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.executor.attention import AttentionMetadata


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, H, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with 0
    seq_lens: torch.Tensor  # [S] int32, context after the step
    query_start_loc: torch.Tensor  # [S + 1] int32
    slot_mapping: torch.Tensor  # [T] int64, slots of the new tokens
    seq_lens_cpu: list[int]
    query_lens_cpu: list[int]

    def metadata(self, num_decodes: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping, query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens, block_tables=self.block_tables, num_decodes=num_decodes,
            max_query_len=max(self.query_lens_cpu, default=0), max_seq_len=max(self.seq_lens_cpu, default=0),
            query_lens_cpu=list(self.query_lens_cpu), seq_lens_cpu=list(self.seq_lens_cpu))


def make_paged_batch(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int,
                     head_dim: int, block_size: int, dtype: torch.dtype, device: str | torch.device,
                     seed: int = 0, spare_blocks: int = 3) -> PagedBatch:
    """Sequence s has ``seq_lens[s]`` positions, the last ``query_lens[s]`` of them new this step."""
    gen = torch.Generator().manual_seed(seed)
    nblocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(nblocks) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    block_tables = torch.zeros((len(seq_lens), max(max(nblocks, default=1), 1)), dtype=torch.int32)
    slots: list[int] = []
    used = 0
    for s, (n, length, qlen) in enumerate(zip(nblocks, seq_lens, query_lens)):
        block_tables[s, :n] = perm[used:used + n]
        used += n
        table = block_tables[s].tolist()
        slots += [table[p // block_size] * block_size + p % block_size for p in range(length - qlen, length)]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    starts = [0]
    for qlen in query_lens:
        starts.append(starts[-1] + qlen)
    dev = torch.device(device)
    rand = torch.Generator(device=dev).manual_seed(seed)  # drawn on the device: caches can be GBs
    return PagedBatch(
        q=torch.randn((starts[-1], num_heads, head_dim), generator=rand, device=dev, dtype=dtype),
        k_cache=torch.randn(shape, generator=rand, device=dev, dtype=dtype),
        v_cache=torch.randn(shape, generator=rand, device=dev, dtype=dtype),
        block_tables=block_tables.to(dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        seq_lens_cpu=list(seq_lens), query_lens_cpu=list(query_lens))
