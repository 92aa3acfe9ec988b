"""``torch`` attention backend: the reference on every device (gather + SDPA)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from runtime.engine.drafters import MAX_SPECULATIVE_TOKENS
from runtime.executor.attention.metadata import AttentionMetadata, Launch
from runtime.executor.cpu_kernels import available as cpu_kernel_available
from runtime.executor.cpu_kernels import paged_attention

# the longest verify span (a decode and K drafts); longer chunks: gather + SDPA (the gather is paid
# once for many query rows)
KERNEL_MAX_SPAN = 1 + MAX_SPECULATIVE_TOKENS


@dataclass(frozen=True)
class _KernelRows:
    """The sequences of a step the CPU kernel takes (decodes and spans of ≤ KERNEL_MAX_SPAN rows),
    as its int32 index tensors, and the rest (for SDPA)."""

    seq_ids: torch.Tensor
    q_starts: torch.Tensor
    q_lens: torch.Tensor
    others: list[int]

    @staticmethod
    def of(meta: AttentionMetadata) -> _KernelRows:
        starts, lens = meta.query_start_loc_cpu, meta.query_lens_cpu
        short = [i for i in range(meta.num_seqs) if lens[i] <= KERNEL_MAX_SPAN]
        as_int32 = partial(torch.tensor, dtype=torch.int32)
        return _KernelRows(as_int32(short), as_int32([starts[i] for i in short]), as_int32([lens[i] for i in short]),
                           [i for i in range(meta.num_seqs) if lens[i] > KERNEL_MAX_SPAN])


class TorchAttentionBackend:
    """Reference backend on any device: gather each sequence's paged KV, then SDPA.

    Decodes (q_len 1) run as one batched SDPA over KV gathered block-wise into a padded
    ``[num_decodes, kv_heads, max_len, head_dim]``; the query heads sharing a KV head ride as rows of
    one query matrix (no KV repeat). Prefill chunks loop per sequence with the causal mask offset by
    the number of tokens already cached before the chunk.

    On the CPU in fp32, decodes and spans of up to KERNEL_MAX_SPAN tokens (a speculative verify
    span) go to a small C kernel (runtime/executor/cpu_kernels) that reads the paged KV in place:
    the gather copy is most of the torch path's time there. ``cpu_kernels=False`` keeps the
    pure-torch path (the reference the kernel is tested against).
    """

    name = "torch"

    def __init__(self, cpu_kernels: bool = True) -> None:
        self.cpu_kernels = cpu_kernels
        self._rows: tuple[AttentionMetadata, _KernelRows] | None = None  # the step's, for every layer

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
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty_like(q)
        if self._kernel_applies(q, k_cache):
            if self._rows is None or self._rows[0] is not meta:
                self._rows = (meta, _KernelRows.of(meta))
            rows = self._rows[1]
            q = q.contiguous()
            if len(rows.seq_ids):
                paged_attention(q, k_cache, v_cache, meta.block_tables.contiguous(),
                                            meta.seq_lens.contiguous(), rows.seq_ids, rows.q_starts, rows.q_lens,
                                            scale, out)
            self._prefill(q, k_cache, v_cache, meta, scale, out, rows.others)
            return out
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta, scale)
        self._prefill(q, k_cache, v_cache, meta, scale, out, range(nd, meta.num_seqs))
        return out

    def prepare(self, meta: AttentionMetadata, q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> Launch:
        return lambda k, v, scale: self.forward(q, k, v, meta, scale, out=out)

    def _kernel_applies(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        return (self.cpu_kernels and q.device.type == "cpu" and q.dtype == k_cache.dtype == torch.float32
                and cpu_kernel_available())

    def _decode(self, q, k_cache, v_cache, meta, scale):
        nd = meta.num_decodes
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
        # slots past a sequence's end hold whatever a block's last owner left, NaN included (a request
        # aborted for non-finite logits): masked scores still multiply them, so zero them (a copy)
        stale = ~mask.view(nd, 1, length, 1)
        k.masked_fill_(stale, 0.0)
        v.masked_fill_(stale, 0.0)
        qg = q.view(nd, kv_heads, heads // kv_heads, dim)  # q head h uses kv head h // group
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
        return o.reshape(nd, heads, dim)

    def _prefill(self, q, k_cache, v_cache, meta, scale, out, seqs):
        _, block_size, kv_heads, dim = k_cache.shape
        starts = meta.query_start_loc_cpu
        for i in seqs:
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
