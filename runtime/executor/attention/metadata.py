"""What every attention backend reads: the step's ``AttentionMetadata``, and the backend protocol.

KV layout (per layer): ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]`` tensors; token at position p of a sequence lives in slot
``block_table[p // block_size] * block_size + p % block_size``.

A step's batch is flattened: T query tokens from S sequences, decode sequences (q_len == 1)
first, then prefill chunks. Each sequence's queries attend to all its cached positions plus its
own causal span (prefix-cache hits and chunked prefill need nothing else).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

import torch

from runtime.executor.kernels.launch import Launch


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
    query_start_loc_cpu: list[int] = field(default_factory=list)  # derived when not given
    # split-context count of the Triton decode kernel; None = the backend chooses (CUDA graphs
    # fix it at capture to what an eager step of the same shape would choose)
    decode_splits: int | None = None

    def __post_init__(self) -> None:
        if not self.query_start_loc_cpu:
            self.query_start_loc_cpu = list(itertools.accumulate(self.query_lens_cpu, initial=0))

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


class AttentionBackend(Protocol):
    name: str

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Write k, v ``[T, num_kv_heads, head_dim]`` into the caches at ``slot_mapping`` (skip -1)."""

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of ``q [T, num_heads, head_dim]`` over paged KV (already stored), into ``out``
        (a new tensor when None; never ``q``'s memory)."""

    def prepare(self, meta: AttentionMetadata, q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> Launch:
        """``forward(q, ·, ·, meta, scale, out)`` for every layer of one step, given that layer's caches
        (shaped as these) and scale: what the step's layers share is worked out once."""
