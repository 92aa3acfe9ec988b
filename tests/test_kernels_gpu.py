"""Triton kernels against the fp32 torch references on a CUDA GPU: the full matrix.

Decode: batch {1, 4, 16, 64} × context {1, 15, 16, 17, 511, 1024, 4096} × block size {16, 32, 256}
× heads (MHA, GQA group 2, GQA group 3) × head_dim {64, 128} × {fp16, bf16}, shuffled block tables,
each with the split count forced to 1, chosen by the heuristic, and forced to 8. Then the KV store,
prefill with prefix hits and chunks, the mixed backend path and CUDA-graph replay.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from runtime.bench.paged_batch import make_paged_batch  # noqa: E402
from runtime.executor.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from runtime.executor.kernels.kv_store import store_kv, store_kv_reference  # noqa: E402
from runtime.executor.kernels.paged_attention import num_sms, paged_decode, paged_decode_reference  # noqa: E402
from runtime.executor.kernels.prefill import (  # noqa: E402
    paged_prefill_reference,
    paged_prefill_sdpa,
    prefill_splits,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float16, torch.bfloat16]
HEADS = {"mha": (8, 8), "gqa2": (16, 8), "gqa3": (12, 4)}
ATOL = RTOL = 1e-2


def _close(out: torch.Tensor, ref: torch.Tensor, msg: str = "") -> None:
    assert not out.isnan().any(), f"unwritten or NaN output {msg}"
    torch.testing.assert_close(out.float(), ref, atol=ATOL, rtol=RTOL, msg=lambda m: f"{msg}\n{m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32, 256])
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("batch", [1, 4, 16, 64])
@pytest.mark.parametrize("context", [1, 15, 16, 17, 511, 1024, 4096])
def test_decode_matrix(dtype, head_dim, block_size, heads, batch, context):
    lens = [max(1, context - i % 3) for i in range(batch)]  # context, context-1, context-2, ...
    b = make_paged_batch(lens, [1] * batch, *HEADS[heads], head_dim, block_size, dtype, "cuda",
                         seed=batch * 10007 + context)
    scale = head_dim ** -0.5
    ref = paged_decode_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, scale)
    for splits in (1, None, 8):
        out = torch.full_like(b.q, float("nan"))
        paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, scale, out=out,
                     max_seq_len=context, num_splits=splits)
        _close(out, ref, f"splits={splits}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_kv_heads", [1, 3, 8])
def test_kv_store(dtype, head_dim, num_kv_heads):
    num_tokens, block_size, num_blocks = 300, 16, 64
    fused = torch.randn(num_tokens, 2 * num_kv_heads + 2, head_dim, device="cuda", dtype=dtype)
    k, v = fused[:, :num_kv_heads], fused[:, num_kv_heads + 1:2 * num_kv_heads + 1]  # strided views
    slots = torch.randperm(num_blocks * block_size, device="cuda")[:num_tokens]
    slots[::7] = -1  # padding tokens
    caches = [torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device="cuda", dtype=dtype)
              for _ in range(2)]
    expect = [c.clone() for c in caches]
    store_kv(k, v, *caches, slots)
    store_kv_reference(k, v, *expect, slots)
    for got, want in zip(caches, expect):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


# (cached, new): decodes first, then a 1-token prompt, fresh prompts, prefix hits, long chunks
MIXED = [(37, 1), (4095, 1), (0, 1), (0, 17), (0, 300), (16, 5), (256, 100), (1000, 512), (33, 1024),
         (3000, 96)]
NUM_DECODES = 2


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32, 256])
@pytest.mark.parametrize("heads", ["mha", "gqa2", "gqa3"])
def test_backend_mixed_prefill(dtype, head_dim, block_size, heads):
    lens = [c + n for c, n in MIXED]
    new = [n for _, n in MIXED]
    num_heads, num_kv_heads = HEADS[heads]
    b = make_paged_batch(lens, new, num_heads, num_kv_heads, head_dim, block_size, dtype, "cuda", seed=5)
    meta = b.metadata(num_decodes=NUM_DECODES)
    k_new = torch.randn(sum(new), num_kv_heads, head_dim, device="cuda", dtype=dtype)
    v_new = torch.randn_like(k_new)
    backend = TritonAttentionBackend("cuda")
    backend.store_kv(k_new, v_new, b.k_cache, b.v_cache, meta.slot_mapping)
    scale = head_dim ** -0.5
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale)
    ref = paged_prefill_reference(*args)
    _close(backend.forward(b.q, b.k_cache, b.v_cache, meta, scale), ref, "triton backend")
    out = torch.full_like(b.q, float("nan"))
    paged_prefill_sdpa(*args, out, first_seq=0, num_seqs=len(lens))
    _close(out, ref, "gather + sdpa")


# decodes first, then short chunks over long cached prefixes: few programs, split
MIXED_LONG_PREFIX = [(37, 1), (4095, 1), (20000, 64), (9000, 16), (777, 33)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("heads", ["mha", "gqa2"])
def test_backend_prefill_split_over_long_prefixes(dtype, heads):
    lens = [c + n for c, n in MIXED_LONG_PREFIX]
    new = [n for _, n in MIXED_LONG_PREFIX]
    num_heads, num_kv_heads = HEADS[heads]
    assert prefill_splits(3, max(new[2:]), num_heads, max(lens), num_sms("cuda")) > 1
    b = make_paged_batch(lens, new, num_heads, num_kv_heads, 128, 16, dtype, "cuda", seed=7)
    meta = b.metadata(num_decodes=2)
    scale = 128 ** -0.5
    ref = paged_prefill_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale)
    _close(TritonAttentionBackend("cuda").forward(b.q, b.k_cache, b.v_cache, meta, scale), ref, "split prefill")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_decode_cuda_graph_replay(dtype):
    """Capture a decode-only forward once, then replay it on new lengths and block tables."""
    batch, max_len, block_size = 8, 2048, 16
    num_heads, num_kv_heads, head_dim = 16, 8, 128
    backend = TritonAttentionBackend("cuda")
    first = make_paged_batch([100] * batch, [1] * batch, num_heads, num_kv_heads, head_dim, block_size, dtype,
                             "cuda", seed=1)
    meta = first.metadata(num_decodes=batch)
    meta.max_seq_len = max_len  # the bucket's limit: fixes the split count for every replay
    # static inputs, big enough for the longest replay
    max_blocks = max_len // block_size
    static_bt = torch.zeros(batch, max_blocks, dtype=torch.int32, device="cuda")
    meta.block_tables = static_bt
    later = make_paged_batch([1, 2047, 600, 17, 2048, 5, 1024, 300], [1] * batch, num_heads, num_kv_heads,
                             head_dim, block_size, dtype, "cuda", seed=2, spare_blocks=first.k_cache.shape[0])
    k_cache, v_cache = later.k_cache, later.v_cache  # one pool, large enough for both batches
    q = first.q.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(q, k_cache, v_cache, meta, head_dim ** -0.5)  # warm up (compile) outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k_cache, v_cache, meta, head_dim ** -0.5)
    for b in (first, later):
        q.copy_(b.q)
        meta.seq_lens.copy_(b.seq_lens)
        static_bt.zero_()
        static_bt[:, :b.block_tables.shape[1]].copy_(b.block_tables)
        graph.replay()
        ref = paged_decode_reference(b.q, k_cache, v_cache, b.block_tables, b.seq_lens, head_dim ** -0.5)
        _close(out, ref, "graph replay")
