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

import itertools
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F


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
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Causal attention of ``q [T, num_heads, head_dim]`` over paged KV (already stored)."""


class TorchAttentionBackend:
    """Reference backend on any device: gather each sequence's paged KV, then SDPA.

    Decodes (q_len 1) run as one batched SDPA over KV gathered block-wise into a padded
    ``[num_decodes, kv_heads, max_len, head_dim]``; the query heads sharing a KV head ride as rows of
    one query matrix (no KV repeat). Prefill chunks loop per sequence with the causal mask offset by
    the number of tokens already cached before the chunk.

    On the CPU in fp32, decodes go to a small C kernel (runtime/cpu_kernels) that reads the paged
    KV in place: the gather copy is most of the torch path's decode time there.
    ``cpu_kernels=False`` keeps the pure-torch path (the reference the kernel is tested against).
    """

    name = "torch"

    def __init__(self, cpu_kernels: bool = True) -> None:
        self.cpu_kernels = cpu_kernels

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        heads, dim = k_cache.shape[-2:]
        k_flat, v_flat = k_cache.view(-1, heads, dim), v_cache.view(-1, heads, dim)
        if slot_mapping.device.type != "cpu" or bool((slot_mapping < 0).any()):
            keep = slot_mapping >= 0  # padding tokens (CUDA-graph buckets) write nothing
            slot_mapping, k, v = slot_mapping[keep], k[keep], v[keep]
        k_flat.index_copy_(0, slot_mapping, k)
        v_flat.index_copy_(0, slot_mapping, v)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta, scale)
        if nd < meta.num_seqs:
            self._prefill(q, k_cache, v_cache, meta, scale, out)
        return out

    def _decode(self, q, k_cache, v_cache, meta, scale):
        nd = meta.num_decodes
        if self.cpu_kernels and q.device.type == "cpu" and q.dtype == k_cache.dtype == torch.float32:
            from runtime import cpu_kernels

            if cpu_kernels.available():
                return cpu_kernels.paged_decode(q, k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale)
        _, block_size, kv_heads, dim = k_cache.shape
        heads = q.shape[1]
        max_len = max(meta.seq_lens_cpu[:nd])
        num_blocks = -(-max_len // block_size)
        length = num_blocks * block_size
        tables = meta.block_tables[:nd, :num_blocks]
        k = k_cache[tables].view(nd, length, kv_heads, dim).transpose(1, 2)
        v = v_cache[tables].view(nd, length, kv_heads, dim).transpose(1, 2)
        positions = torch.arange(length, device=q.device)
        mask = (positions[None, :] < meta.seq_lens[:nd, None]).view(nd, 1, 1, length)
        qg = q.view(nd, kv_heads, heads // kv_heads, dim)  # q head h uses kv head h // group
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
        return o.reshape(nd, heads, dim)

    def _prefill(self, q, k_cache, v_cache, meta, scale, out):
        _, block_size, kv_heads, dim = k_cache.shape
        starts = meta.query_start_loc_cpu
        for i in range(meta.num_decodes, meta.num_seqs):
            q_lo, q_hi = starts[i], starts[i + 1]
            q_len, ctx = q_hi - q_lo, meta.seq_lens_cpu[i]
            table = meta.block_tables[i, : -(-ctx // block_size)]
            k = k_cache[table].view(-1, kv_heads, dim)[:ctx].transpose(0, 1)
            v = v_cache[table].view(-1, kv_heads, dim)[:ctx].transpose(0, 1)
            qi = q[q_lo:q_hi].transpose(0, 1)
            cached = ctx - q_len
            if cached == 0:
                o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=scale, enable_gqa=True)
            else:  # query j sits at position cached + j and sees keys 0..cached + j
                rows = torch.arange(cached, ctx, device=q.device)
                mask = torch.arange(ctx, device=q.device)[None, :] <= rows[:, None]
                o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
            out[q_lo:q_hi] = o.transpose(0, 1)


def get_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """``auto`` = triton on CUDA when it imports, else torch; ``triton`` insists (clear error)."""
    device = torch.device(device)
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"attention_backend must be auto, torch or triton, got {name!r}")
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttentionBackend()
    if device.type != "cuda":
        raise ValueError(f"attention_backend 'triton' needs a CUDA device, got {device}")
    try:
        from runtime.kernels.backend import TritonAttentionBackend
    except ImportError as e:
        if name == "triton":
            raise ValueError(f"attention_backend 'triton' is unavailable: {e}") from e
        return TorchAttentionBackend()
    return TritonAttentionBackend(device)
