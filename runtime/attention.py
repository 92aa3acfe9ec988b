"""Attention over paged KV: the metadata every backend reads and the backend protocol.

KV layout (per layer): ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]`` tensors; token at position p of a sequence lives in slot
``block_table[p // block_size] * block_size + p % block_size``.

A step's batch is flattened: T query tokens from S sequences, decode sequences (q_len == 1)
first, then prefill chunks. Each sequence's queries attend to all its cached positions plus its
own causal span (prefix-cache hits and chunked prefill need nothing else).

Backends: ``torch`` (reference: gather + SDPA; every device) and ``triton`` (runtime/kernels;
CUDA). ``get_backend("auto", device)`` picks triton on CUDA, torch elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64, -1 = padding token (no KV written)
    query_start_loc: torch.Tensor  # [S + 1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [S] int32, context length after this step (cached + new)
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with 0
    num_decodes: int  # the first num_decodes sequences have q_len == 1
    max_query_len: int
    max_seq_len: int
    # host copies for paths that loop or size buffers on the CPU
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


class AttentionBackend(Protocol):
    name: str

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Write k, v ``[T, num_kv_heads, head_dim]`` into the caches at ``slot_mapping`` (skip -1)."""

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Causal attention of ``q [T, num_heads, head_dim]`` over paged KV (already stored)."""
