"""KV store: write each new token's K and V rows into the paged cache at its slot.

``slot_mapping[t]`` is the flat slot (``block * block_size + row``) of token t, or -1 for a padding
token (CUDA-graph batches are padded), which is skipped. One program per token copies all KV
heads of that token; K/V inputs may be strided views (e.g. slices of a fused qkv projection).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    num_kv_heads,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cs, stride_ch, stride_vcs, stride_vch,
    HEAD_DIM: tl.constexpr, BLOCK_KV: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_KV)
    offs_d = tl.arange(0, HEAD_DIM)
    # a padding token (slot -1) masks every head (a tensor compare; the interpreter mishandles
    # tensor & scalar-bool masks)
    heads = tl.where(slot >= 0, num_kv_heads, 0)
    mask = (offs_h[:, None] < heads) & (offs_d[None, :] < HEAD_DIM)
    t64 = t.to(tl.int64)
    k = tl.load(k_ptr + t64 * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + t64 * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(k_cache_ptr + slot * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + slot * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """``k, v [T, num_kv_heads, head_dim]`` → caches ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and head_dim & (head_dim - 1) == 0
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    # flat slot stride: one slot = one (block, row) = num_kv_heads * head_dim elements
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        num_kv_heads,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_KV=triton.next_power_of_2(num_kv_heads), num_warps=4,
    )


def store_kv_reference(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    k_cache.flatten(0, 1)[slots] = k[valid].to(k_cache.dtype)
    v_cache.flatten(0, 1)[slots] = v[valid].to(v_cache.dtype)
