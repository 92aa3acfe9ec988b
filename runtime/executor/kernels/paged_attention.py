"""Paged-attention decode: one query token per sequence, K/V read through the block table.

Layout (runtime/executor/attention.py): caches ``[num_blocks, block_size, num_kv_heads, head_dim]``;
position p of sequence s lives in block ``block_tables[s, p // block_size]``, row ``p % block_size``.

One program handles one (sequence, KV head, split): all ``group`` query heads that share the KV
head are rows of one tile, so each K/V byte is read once per group and the scores are a small
matrix product (rows padded to 16 for the tensor cores). Softmax is online, in fp32, base 2.

Split-context (flash-decoding): with few sequences the grid (seqs × kv_heads) cannot fill the
GPU, so the context is cut into ``num_splits`` ranges, each program writes a normalised partial
output and its log-sum-exp, and a second kernel merges them. ``choose_num_splits`` decides from
host-side ints only, so the launch is the same on every replay of a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.executor.kernels.launch import Launch, no_launch
from traces.decode_splits import DEFAULT_SMS, MAX_SPLITS
from traces.decode_splits import num_splits as split_count

LOG2E = 1.4426950408889634


# Block size, group and split count are runtime ints (block size as a shift): one compiled
# variant per (dtype, head_dim, split or not) serves every cache geometry.
@triton.jit(do_not_specialize=["group", "block_shift", "num_splits", "stride_bt"])
def _decode_kernel(
    out_ptr, part_out_ptr, part_lse_ptr,
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr,
    scale_log2, group, block_shift, num_splits,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_q_heads = tl.num_programs(1) * group

    seq_len = tl.load(seq_lens_ptr + seq)
    # splits own whole tiles so every program but the last loads full tiles
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    head_mask = offs_h < group
    q_heads = kv_head * group + offs_h
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qs + q_heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_mask[:, None], other=0.0)
    q = q.to(k_ptr.dtype.element_ty)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head = k_ptr + kv_head * stride_kh
    v_head = v_ptr + kv_head * stride_vh
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        blocks = tl.load(bt_row + (offs_n >> block_shift), mask=mask_n, other=0).to(tl.int64)
        rows = offs_n & ((1 << block_shift) - 1)
        k = tl.load(k_head + (blocks * stride_kb + rows * stride_kt)[:, None] + offs_d[None, :],
                    mask=mask_n[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + (blocks * stride_vb + rows * stride_vt)[:, None] + offs_d[None, :],
                    mask=mask_n[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    # an empty range (padding sequence, or a split past the end) leaves l_i == 0: output 0
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    if not SPLIT:
        o_ptrs = out_ptr + seq.to(tl.int64) * stride_os + q_heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
    else:
        row = (seq.to(tl.int64) * num_q_heads + q_heads) * num_splits + split  # [S, H, splits]
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=head_mask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=head_mask)


@triton.jit(do_not_specialize=["num_splits"])
def merge_splits_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, num_splits,
    stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)  # a decode sequence, or a prefill token row (runtime/executor/kernels/prefill.py)
    head = tl.program_id(1)
    row = (seq.to(tl.int64) * tl.num_programs(1) + head) * num_splits
    offs_s = tl.arange(0, MAX_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_s = offs_s < num_splits
    lse = tl.load(part_lse_ptr + row + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # every split empty: weights 0, output 0
    w = tl.exp2(lse - m)
    parts = tl.load(part_out_ptr + (row + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=mask_s[:, None], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq.to(tl.int64) * stride_os + head * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty))


# ----------------------------------------------------------------------------- launch

def dot_precision(dtype: torch.dtype) -> str:
    """fp32 models get true fp32 dots (tl.dot would round fp32 operands to TF32, ~1e-3 error);
    fp16/bf16 operands are exact in any mode."""
    return "ieee" if dtype == torch.float32 else "tf32"


def num_sms(device: torch.device | str) -> int:
    device = torch.device(device)
    if device.type != "cuda":
        return DEFAULT_SMS  # the interpreter: the H200's
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, sms: int) -> int:
    """Power-of-two split count so that about 4 programs per SM are in flight.

    Host-side ints only (no tensor reads): the same batch shape always launches the same grid.
    H200: 512 programs (64 seqs x 8 KV heads) already fill it (2 splits were 10-20% slower there),
    128 programs with 4 splits ran 2x faster than unsplit (docs/kernels-notes.md).
    """
    return split_count(num_seqs, num_kv_heads, max_seq_len, sms)  # (traces/decode_splits.py: the cost models' too)


def _decode_config(head_dim: int, dtype: torch.dtype) -> dict:
    """Tile and launch parameters: the best of the H200 sweep for head_dim 64 and 128 (kernels-notes)."""
    return {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 out: torch.Tensor | None = None, max_seq_len: int | None = None,
                 num_splits: int | None = None, config: dict | None = None) -> torch.Tensor:
    """Decode attention: ``q [S, H, D]`` (one token per sequence) over paged K/V → ``[S, H, D]``.

    ``max_seq_len`` (host int; default: the block table's capacity) only steers the split count.
    """
    if out is None:
        out = torch.empty_like(q)
    decode_launch(q, k_cache, v_cache, block_tables, seq_lens, out, max_seq_len, num_splits, config)(
        k_cache, v_cache, scale)
    return out


def decode_launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, out: torch.Tensor, max_seq_len: int | None = None,
                  num_splits: int | None = None, config: dict | None = None) -> Launch:
    """``paged_decode`` with all but the layer worked out once: the grid, the split count and its
    workspace, the strides. A step's layers share their queries, outputs and block tables, and their
    caches are alike, so each layer pays only the kernel launches (a small model's mixed step is
    host-bound: ``runtime/executor/piecewise_graphs.py``)."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and head_dim & (head_dim - 1) == 0
    assert block_size & (block_size - 1) == 0
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    group = num_heads // num_kv_heads
    if num_seqs == 0:
        return no_launch
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = block_tables.shape[1] * block_size
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, num_sms(q.device))
    assert 1 <= num_splits <= MAX_SPLITS
    cfg = {**_decode_config(head_dim, k_cache.dtype), **(config or {})}
    split = num_splits > 1
    if split:
        part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32,
                               device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    kernel = _decode_kernel[(num_seqs, num_kv_heads, num_splits)]
    merge = merge_splits_kernel[(num_seqs, num_heads)]
    shift, bt_stride = block_size.bit_length() - 1, block_tables.stride(0)
    (q_s, q_h), (o_s, o_h) = q.stride()[:2], out.stride()[:2]
    constants = dict(HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=cfg["BLOCK_N"],
                     PRECISION=dot_precision(q.dtype), SPLIT=split, num_warps=cfg["num_warps"],
                     num_stages=cfg["num_stages"])

    def launch(k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> None:
        (kb, kt, kh, _), (vb, vt, vh, _) = k_cache.stride(), v_cache.stride()
        kernel(out, part_out, part_lse, q, k_cache, v_cache, block_tables, seq_lens, scale * LOG2E, group, shift,
               num_splits, q_s, q_h, kb, kt, kh, vb, vt, vh, bt_stride, o_s, o_h, **constants)
        if split:
            merge(out, part_out, part_lse, num_splits, o_s, o_h, HEAD_DIM=head_dim, MAX_SPLITS=MAX_SPLITS, num_warps=4)

    return launch


# ----------------------------------------------------------------------------- reference

def gather_positions(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """Rows ``0..length-1`` of one sequence from a paged cache → ``[length, num_kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    slots = block_table.to(cache.device).long()[pos // block_size] * block_size + pos % block_size
    return cache.flatten(0, 1)[slots]


def paged_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """Gather + softmax in fp32, one sequence at a time; returns fp32 ``[S, H, D]``."""
    num_seqs, num_heads, _ = q.shape
    group = num_heads // k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for s, length in enumerate(seq_lens.tolist()):
        if length == 0:
            continue
        k = gather_positions(k_cache, block_tables[s], length).float().repeat_interleave(group, dim=1)
        v = gather_positions(v_cache, block_tables[s], length).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[s].float(), k) * scale
        out[s] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v)
    return out


def decode_bytes(seq_lens: list[int], num_kv_heads: int, head_dim: int, elem: int) -> int:
    """KV bytes a decode step must read (K and V of every context token)."""
    return 2 * sum(seq_lens) * num_kv_heads * head_dim * elem


__all__ = ["paged_decode", "decode_launch", "paged_decode_reference", "choose_num_splits",
           "gather_positions", "decode_bytes", "num_sms"]
