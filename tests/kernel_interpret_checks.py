"""Tiny kernel checks run under ``TRITON_INTERPRET=1`` on the CPU (see test_kernels_interpret.py).

Run as a script: sets the interpreter flag before Triton is imported, runs every check and
prints one JSON line ``{name: "ok" | error}``. Shapes are tiny: the interpreter is numpy.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from runtime.kernels.backend import TritonAttentionBackend  # noqa: E402
from runtime.kernels.kv_store import store_kv, store_kv_reference  # noqa: E402
from runtime.kernels.paged_attention import paged_decode, paged_decode_reference  # noqa: E402
from runtime.kernels.paged_batch import make_paged_batch  # noqa: E402
from runtime.kernels.prefill import (  # noqa: E402
    paged_prefill,
    paged_prefill_reference,
    paged_prefill_sdpa,
)

TOL = {torch.float32: 1e-4, torch.float16: 2e-3}


def _decode(heads, head_dim, block_size, lens, dtype, splits):
    b = make_paged_batch(lens, [1] * len(lens), *heads, head_dim, block_size, dtype, "cpu", seed=len(lens))
    scale = head_dim ** -0.5
    ref = paged_decode_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, scale)
    for n in splits:
        out = torch.full_like(b.q, float("nan"))  # poison: every row must be written
        paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, scale, out=out, num_splits=n)
        torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype], msg=f"splits={n}")


def check_decode_mha_fp32():
    _decode((2, 2), 64, 8, [1, 7, 8, 9, 40], torch.float32, (1, 4))


def check_decode_gqa_fp32_padding_seq():
    # seq_len 0 is a padding sequence (CUDA-graph bucket): output must be 0, not NaN
    _decode((6, 2), 64, 16, [0, 15, 16, 17, 70], torch.float32, (1, 2, 8))


def check_decode_fp16_hd128_big_block():
    _decode((4, 1), 128, 256, [3, 300], torch.float16, (1, 4))
    _decode((4, 2), 128, 32, [5, 33, 64], torch.float16, (1, 64))


def check_kv_store_padding_and_strided():
    num_kv_heads, head_dim, block_size = 3, 64, 8
    fused = torch.randn(7, 2 * num_kv_heads + 1, head_dim)  # k, v as strided views of one tensor
    k, v = fused[:, :num_kv_heads], fused[:, num_kv_heads:2 * num_kv_heads]
    slots = torch.tensor([5, -1, 17, 0, 31, -1, 8])
    caches = [torch.randn(4, block_size, num_kv_heads, head_dim) for _ in range(2)]
    expect = [c.clone() for c in caches]
    store_kv(k, v, *caches, slots)
    store_kv_reference(k, v, *expect, slots)
    for got, want in zip(caches, expect):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


# (cached, new) per sequence: a fresh prompt, prefix hits, a chunk after a long prefix
PREFILL_SEQS = [(0, 7), (16, 5), (3, 30), (40, 1), (13, 20)]


def check_prefill_prefix_hits_and_chunks():
    cached, new = zip(*PREFILL_SEQS)
    lens = [c + n for c, n in PREFILL_SEQS]
    b = make_paged_batch(lens, list(new), 4, 2, 64, 8, torch.float32, "cpu", seed=1)
    scale = 64 ** -0.5
    ref = paged_prefill_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables,
                                  scale)
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale)
    for cfg in ({"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 16, "BLOCK_N": 32}, None):
        out = torch.full_like(b.q, float("nan"))
        paged_prefill(*args, out, first_seq=0, num_seqs=len(lens), max_query_len=max(new), config=cfg)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4, msg=f"config={cfg}")
    out = torch.full_like(b.q, float("nan"))
    paged_prefill_sdpa(*args, out, first_seq=0, num_seqs=len(lens))
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4, msg="sdpa")


def check_backend_mixed_batch():
    # 2 decodes first, then prefills; K/V of the new tokens go through store_kv first
    seqs = [(9, 1), (20, 1), (0, 6), (16, 3), (5, 12)]
    lens = [c + n for c, n in seqs]
    new = [n for _, n in seqs]
    b = make_paged_batch(lens, new, 4, 2, 64, 8, torch.float32, "cpu", seed=2)
    k_new, v_new = torch.randn(2, sum(new), 2, 64).unbind(0)
    backend = TritonAttentionBackend("cpu")
    meta = b.metadata(num_decodes=2)
    backend.store_kv(k_new, v_new, b.k_cache, b.v_cache, meta.slot_mapping)
    out = backend.forward(b.q, b.k_cache, b.v_cache, meta, 0.125)
    ref = paged_prefill_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables,
                                  0.125)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def check_backend_matches_torch_backend():
    from runtime.attention import TorchAttentionBackend

    seqs = [(9, 1), (31, 1), (0, 6), (16, 3), (5, 12)]
    lens = [c + n for c, n in seqs]
    b = make_paged_batch(lens, [n for _, n in seqs], 6, 2, 64, 16, torch.float32, "cpu", seed=3)
    meta = b.metadata(num_decodes=2)
    got = TritonAttentionBackend("cpu").forward(b.q, b.k_cache, b.v_cache, meta, 0.125)
    want = TorchAttentionBackend().forward(b.q, b.k_cache, b.v_cache, meta, 0.125)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def check_fused_rms_norm_and_rotary_fp16():
    from runtime.kernels.fused_norm_rope import rms_norm, rms_norm_reference, rotary, rotary_reference

    g = torch.Generator().manual_seed(5)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        qkv = torch.randn(7, 3 * 4 * 64, generator=g).to(dtype)  # strided [T, heads, D] views, as in the model
        q = qkv[:, : 4 * 64].view(7, 4, 64)
        w = (torch.rand(64, generator=g) + 0.5).to(dtype)
        torch.testing.assert_close(rms_norm(q, w, 1e-6), rms_norm_reference(q, w, 1e-6), atol=tol, rtol=tol)
        x2 = torch.randn(5, 96, generator=g).to(dtype)
        w2 = torch.rand(96, generator=g).to(dtype)
        torch.testing.assert_close(rms_norm(x2, w2, 1e-5), rms_norm_reference(x2, w2, 1e-5), atol=tol, rtol=tol)
        ang = torch.arange(40)[:, None] * torch.rand(32, generator=g)[None, :]
        emb = torch.cat((ang, ang), -1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        pos = torch.tensor([0, 3, 39, 7, 7, 1, 20])
        torch.testing.assert_close(rotary(q, cos, sin, pos), rotary_reference(q, cos, sin, pos), atol=tol, rtol=tol)
        k = qkv[:, 4 * 64: 5 * 64].view(7, 1, 64)  # one KV head: heads < block
        torch.testing.assert_close(rotary(k, cos, sin, pos), rotary_reference(k, cos, sin, pos), atol=tol, rtol=tol)


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


def main() -> None:
    torch.manual_seed(0)
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - reported back to the test
            results[name] = traceback.format_exc(limit=4)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
