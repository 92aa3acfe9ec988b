"""Prefill attention over paged KV: prefix-cache hits and chunked prefill with no special case.

A prefill sequence's ``q_len`` new tokens sit at positions ``seq_len - q_len .. seq_len - 1``; their
K/V are already stored, so every query attends to cache positions ``0 .. its own position``
(cached blocks + its causal span). The Triton kernel walks the block table like the decode kernel;
each program takes BLOCK_M queries of one head: KV tiles wholly before the tile's first query
need no mask, only the tiles on the diagonal do.

Split-context, as the decode kernel: a short chunk over a long cached prefix (a prefix-cache hit,
a chunked prompt's last chunks) has few programs (sequences × query tiles × heads), each reading
the whole prefix. Such a launch cuts each program's unmasked tiles into ``num_splits`` ranges (the
diagonal tiles go to the last), writes normalised partial outputs and their log-sum-exp, and
merges them with the decode kernel's merge: on an H100 a 256-token chunk over 40k cached tokens
took 1.08 ms a layer unsplit, 0.30 ms split 8 ways (docs/kernels-notes.md). ``prefill_splits``
decides from host ints only, by the decode kernel's rule (traces/decode_splits.py).

``paged_prefill_sdpa`` is the alternative measured against it (gather the prefix, then SDPA with a
bottom-right causal mask), and ``paged_prefill_reference`` the fp32 reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.executor.kernels.launch import Launch, no_launch
from runtime.executor.kernels.paged_attention import (
    LOG2E,
    dot_precision,
    gather_positions,
    merge_splits_kernel,
    num_sms,
)
from traces.decode_splits import MAX_SPLITS, num_splits


@triton.jit
def _attend_tile(acc, m_i, l_i, q, k_head, v_head, bt_row, start, q_pos, hi, scale_log2, block_shift,
                 stride_kb, stride_kt, stride_vb, stride_vt,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, PRECISION: tl.constexpr):
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if MASK:
        mask_n = offs_n < hi
        blocks = tl.load(bt_row + (offs_n >> block_shift), mask=mask_n, other=0).to(tl.int64)
    else:
        blocks = tl.load(bt_row + (offs_n >> block_shift)).to(tl.int64)
    rows = offs_n & ((1 << block_shift) - 1)
    k_ptrs = k_head + (blocks * stride_kb + rows * stride_kt)[:, None] + offs_d[None, :]
    v_ptrs = v_head + (blocks * stride_vb + rows * stride_vt)[:, None] + offs_d[None, :]
    if MASK:
        k = tl.load(k_ptrs, mask=mask_n[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    if MASK:
        s = tl.where((offs_n[None, :] <= q_pos[:, None]) & mask_n[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASK:
        v = tl.load(v_ptrs, mask=mask_n[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


# block size (as a shift), group, first sequence, first token and split count are runtime ints:
# fewer compiled variants
@triton.jit(do_not_specialize=["first_seq", "first_tok", "group", "block_shift", "num_splits", "stride_bt"])
def _prefill_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr,
    scale_log2, first_seq, first_tok, group, block_shift, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = first_seq + tl.program_id(0)
    m_start = tl.program_id(1) * BLOCK_M
    head = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    kv_head = head // group

    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_start = seq_len - q_len  # position of the first new token

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_m = offs_m < q_len
    tok = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=mask_m[:, None], other=0.0)
    q = q.to(k_ptr.dtype.element_ty)
    q_pos = ctx_start + offs_m

    # keys [0, hi) are needed; keys [0, full_hi) are visible to every query of the tile
    tile_valid = m_start < q_len
    hi = tl.where(tile_valid, ctx_start + tl.minimum(m_start + BLOCK_M, q_len), 0)
    full_hi = tl.where(tile_valid, (ctx_start + m_start + 1) // BLOCK_N * BLOCK_N, 0)
    # this split's share of the unmasked tiles; the last split takes the diagonal tiles too
    tiles_per_split = tl.cdiv(full_hi // BLOCK_N, num_splits)
    lo = tl.minimum(split * tiles_per_split * BLOCK_N, full_hi)
    full_end = tl.minimum(lo + tiles_per_split * BLOCK_N, full_hi)
    masked_end = tl.where(split == num_splits - 1, hi, full_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head = k_ptr + kv_head * stride_kh
    v_head = v_ptr + kv_head * stride_vh
    for start in range(lo, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_head, v_head, bt_row, start, q_pos, hi,
                                     scale_log2, block_shift, stride_kb, stride_kt, stride_vb, stride_vt,
                                     HEAD_DIM, BLOCK_N, False, PRECISION)
    for start in range(full_hi, masked_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_head, v_head, bt_row, start, q_pos, hi,
                                     scale_log2, block_shift, stride_kb, stride_kt, stride_vb, stride_vt,
                                     HEAD_DIM, BLOCK_N, True, PRECISION)

    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    if not SPLIT:
        tl.store(out_ptr + tok[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None])
    else:  # rows [tokens from first_tok, heads, splits], as the decode kernel's [seqs, heads, splits]
        row = ((tok - first_tok) * (tl.num_programs(2) // num_splits) + head) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=mask_m[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=mask_m)


def _prefill_config(head_dim: int) -> dict:
    """Tile and launch parameters: the best of the H200 sweep (docs/kernels-notes.md)."""
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def prefill_splits(num_seqs: int, max_query_len: int, num_heads: int, longest: int, sms: int,
                   block_m: int = 64) -> int:
    """The prefill kernel's split count: the decode kernel's rule with a program per (sequence, query
    tile, head), ``longest`` the most keys any of them reads. A full-budget prefill fills the GPU
    unsplit; a short chunk over a long prefix is split."""
    return num_splits(num_seqs * triton.cdiv(max_query_len, block_m), num_heads, longest, sms)


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                  scale: float, out: torch.Tensor, first_seq: int, num_seqs: int, max_query_len: int,
                  config: dict | None = None, splits: int | None = None) -> torch.Tensor:
    """Attention for sequences ``first_seq .. first_seq + num_seqs - 1`` of a flattened batch.

    ``q, out [T, H, D]`` hold the whole batch; only these sequences' rows of ``out`` are written.
    ``max_query_len`` (host int) sizes the grid; programs past a sequence's end do nothing.
    ``splits``: the split count (None: ``prefill_splits``'s). Reads the batch's lengths back to the
    host (a sync: not for a CUDA graph; ``prefill_launch`` takes them as host ints).
    """
    if num_seqs == 0:
        return out
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    tokens = (starts[first_seq], starts[first_seq + num_seqs])
    prefill_launch(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, out, first_seq, num_seqs,
                   max_query_len, tokens, max(lens[first_seq:first_seq + num_seqs]), config, splits)(
        k_cache, v_cache, scale)
    return out


def prefill_launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                   seq_lens: torch.Tensor, block_tables: torch.Tensor, out: torch.Tensor, first_seq: int,
                   num_seqs: int, max_query_len: int, tokens: tuple[int, int], longest: int,
                   config: dict | None = None, splits: int | None = None) -> Launch:
    """``paged_prefill`` with all but the layer worked out once (as ``decode_launch``): ``tokens`` is
    the range of these sequences' rows of ``q`` and ``longest`` their longest context (host ints)."""
    if num_seqs == 0:
        return no_launch
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.stride(-1) == 1 and out.stride(-1) == 1 and block_size & (block_size - 1) == 0
    cfg = {**_prefill_config(head_dim), **(config or {})}
    if splits is None:
        splits = prefill_splits(num_seqs, max_query_len, num_heads, longest, num_sms(q.device), cfg["BLOCK_M"])
    assert 1 <= splits <= MAX_SPLITS
    first_tok, rows = tokens[0], tokens[1] - tokens[0]
    if splits > 1:
        part_out = torch.empty((rows, num_heads, splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((rows, num_heads, splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    kernel = _prefill_kernel[(num_seqs, triton.cdiv(max_query_len, cfg["BLOCK_M"]), num_heads * splits)]
    merge = merge_splits_kernel[(rows, num_heads)]
    merged = out[first_tok:]
    group, shift, bt_stride = num_heads // num_kv_heads, block_size.bit_length() - 1, block_tables.stride(0)
    (qt, qh), (ot, oh) = q.stride()[:2], out.stride()[:2]
    constants = dict(HEAD_DIM=head_dim, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], SPLIT=splits > 1,
                     PRECISION=dot_precision(q.dtype), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

    def launch(k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> None:
        (kb, kt, kh, _), (vb, vt, vh, _) = k_cache.stride(), v_cache.stride()
        kernel(out, part_out, part_lse, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
               scale * LOG2E, first_seq, first_tok, group, shift, splits, qt, qh, ot, oh, kb, kt, kh, vb, vt, vh,
               bt_stride, **constants)
        if splits > 1:
            merge(merged, part_out, part_lse, splits, ot, oh, HEAD_DIM=head_dim, MAX_SPLITS=MAX_SPLITS, num_warps=4)

    return launch


# ----------------------------------------------------------------------------- torch paths

def _sequences(query_start_loc, seq_lens, first_seq, num_seqs):
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for s in range(first_seq, first_seq + num_seqs):
        yield s, starts[s], starts[s + 1], lens[s]


def paged_prefill_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                       scale: float, out: torch.Tensor, first_seq: int, num_seqs: int) -> torch.Tensor:
    """Gather each sequence's K/V, then SDPA with a bottom-right-aligned causal mask (host loop)."""
    from torch.nn.attention.bias import causal_lower_right

    group = q.shape[1] // k_cache.shape[2]
    for s, t0, t1, length in _sequences(query_start_loc, seq_lens, first_seq, num_seqs):
        k = gather_positions(k_cache, block_tables[s], length).repeat_interleave(group, dim=1)
        v = gather_positions(v_cache, block_tables[s], length).repeat_interleave(group, dim=1)
        qs = q[t0:t1].transpose(0, 1).unsqueeze(0).to(k.dtype)  # [1, H, q_len, D]
        mask = causal_lower_right(t1 - t0, length)
        o = torch.nn.functional.scaled_dot_product_attention(
            qs, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=scale)
        out[t0:t1] = o[0].transpose(0, 1).to(out.dtype)
    return out


def paged_prefill_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            block_tables: torch.Tensor, scale: float, first_seq: int = 0,
                            num_seqs: int | None = None) -> torch.Tensor:
    """fp32 reference; returns ``[T, H, D]`` fp32 with only these sequences' rows filled."""
    if num_seqs is None:
        num_seqs = len(seq_lens) - first_seq
    group = q.shape[1] // k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for s, t0, t1, length in _sequences(query_start_loc, seq_lens, first_seq, num_seqs):
        k = gather_positions(k_cache, block_tables[s], length).float().repeat_interleave(group, dim=1)
        v = gather_positions(v_cache, block_tables[s], length).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,lhd->hql", q[t0:t1].float(), k) * scale
        q_pos = torch.arange(length - (t1 - t0), length, device=q.device)
        visible = torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[t0:t1] = torch.einsum("hql,lhd->qhd", scores.softmax(-1), v)
    return out
