"""TorchAttentionBackend against a dense reference: shuffled block tables, decodes and prefill chunks
in one batch, chunks that follow cached tokens, GQA, padding slots that write nothing."""

from __future__ import annotations

import math
import random

import pytest
import torch

from runtime.executor.attention import AttentionMetadata, get_backend
from runtime.executor.attention.torch_backend import KERNEL_MAX_SPAN, TorchAttentionBackend
from runtime.executor.cpu_kernels import available


def _reference(q, k, v, scale):
    """q [Lq, H, D] at the last Lq positions of k/v [L, KVH, D]; dense causal softmax."""
    lq, h, _ = q.shape
    group = h // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    ctx = k.shape[0]
    pos = torch.arange(ctx - lq, ctx)
    scores.masked_fill_(torch.arange(ctx)[None, None, :] > pos[None, :, None], -math.inf)
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).float()


@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["torch", "cpu-kernel"])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
def test_mixed_batch_matches_dense(block_size, heads, kv_heads, cpu_kernels):
    if cpu_kernels and not available():
        pytest.skip("no C compiler for the CPU kernel")
    rng = random.Random(block_size * 100 + heads)
    torch.manual_seed(0)
    dim, num_blocks = 16, 128
    # (context after the step, query length): decodes first, then chunks with and without cached prefix,
    # short (the CPU kernel's, up to the longest speculative verify span) and long (SDPA's), interleaved
    seqs = [(1, 1), (17, 1), (block_size, 1), (40, 1), (9, 9), (60, 24), (33, 12), (block_size * 3, block_size),
            (50, KERNEL_MAX_SPAN), (30, 30)]
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables, ks, vs, qs, slots = [], [], [], [], []
    for ctx, qlen in seqs:
        table = [free.pop() for _ in range(-(-ctx // block_size))]
        tables.append(table)
        k, v = torch.randn(ctx, kv_heads, dim), torch.randn(ctx, kv_heads, dim)
        ks.append(k)
        vs.append(v)
        for p in range(ctx - qlen):  # cached part: already in the pool
            slot = table[p // block_size] * block_size + p % block_size
            k_cache.view(-1, kv_heads, dim)[slot] = k[p]
            v_cache.view(-1, kv_heads, dim)[slot] = v[p]
        qs.append(torch.randn(qlen, heads, dim))
        slots += [table[p // block_size] * block_size + p % block_size for p in range(ctx - qlen, ctx)]
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qlens = [q for _, q in seqs]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots + [-1, -1]), query_start_loc=torch.tensor([0]),
        seq_lens=torch.tensor([c for c, _ in seqs], dtype=torch.int32), block_tables=bt, num_decodes=4,
        max_query_len=max(qlens), max_seq_len=max(c for c, _ in seqs), query_lens_cpu=qlens,
        seq_lens_cpu=[c for c, _ in seqs])
    backend = TorchAttentionBackend(cpu_kernels=cpu_kernels)
    new_k = torch.cat([k[c - q:] for k, (c, q) in zip(ks, seqs)] + [torch.full((2, kv_heads, dim), 7.0)])
    new_v = torch.cat([v[c - q:] for v, (c, q) in zip(vs, seqs)] + [torch.full((2, kv_heads, dim), 7.0)])
    before = k_cache.clone()
    backend.store_kv(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    assert (k_cache != before).any(dim=(1, 2, 3)).sum() > 0 and not (k_cache == 7.0).any(), "padding wrote KV"
    scale = dim ** -0.5
    q_all = torch.cat(qs + [torch.zeros(0, heads, dim)])
    out = backend.forward(q_all, k_cache, v_cache, meta, scale)
    lo = 0
    for q, k, v in zip(qs, ks, vs):
        torch.testing.assert_close(out[lo:lo + len(q)], _reference(q, k, v, scale), atol=2e-5, rtol=1e-4)
        lo += len(q)


def test_get_backend():
    assert get_backend("auto", "cpu").name == "torch"
    assert get_backend("torch", "cpu").name == "torch"
    with pytest.raises(ValueError, match="CUDA"):
        get_backend("triton", "cpu")
    with pytest.raises(ValueError, match="auto or one of torch, triton"):
        get_backend("flash", "cpu")
