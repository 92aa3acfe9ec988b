"""Tiny kernel checks run under ``TRITON_INTERPRET=1`` on the CPU (see test_kernels_interpret.py).

Run as a script: sets the interpreter flag before Triton is imported, runs every check and
prints one JSON line ``{name: "ok" | error}``. Shapes are tiny: the interpreter is numpy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from runtime.bench.paged_batch import make_paged_batch  # noqa: E402
from runtime.executor.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from runtime.executor.kernels.kv_store import store_kv, store_kv_reference  # noqa: E402
from runtime.executor.kernels.paged_attention import paged_decode, paged_decode_reference  # noqa: E402
from runtime.executor.kernels.prefill import (  # noqa: E402
    paged_prefill,
    paged_prefill_reference,
    paged_prefill_sdpa,
    prefill_splits,
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


def check_prefill_split_context():
    # two decodes first (rows the prefill launch must leave alone), then short chunks over long prefixes
    seqs = [(30, 1), (50, 1), (600, 4), (333, 9), (70, 20)]
    lens = [c + n for c, n in seqs]
    new = [n for _, n in seqs]
    b = make_paged_batch(lens, new, 4, 2, 64, 16, torch.float32, "cpu", seed=3)
    scale = 64 ** -0.5
    ref = paged_prefill_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale)
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale)
    assert prefill_splits(3, 20, 4, 604, 132) > 1  # few programs, long prefix: chosen split
    for cfg, splits in (({"BLOCK_M": 16, "BLOCK_N": 16}, 2), ({"BLOCK_M": 16, "BLOCK_N": 32}, 3),
                        ({"BLOCK_M": 16, "BLOCK_N": 16}, 64), (None, None)):
        out = torch.full_like(b.q, float("nan"))
        paged_prefill(*args, out, first_seq=2, num_seqs=3, max_query_len=20, config=cfg, splits=splits)
        torch.testing.assert_close(out[2:], ref[2:], atol=1e-4, rtol=1e-4, msg=f"config={cfg} splits={splits}")
        assert out[:2].isnan().all(), "the decode rows were written"


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
    from runtime.executor.attention.torch_backend import TorchAttentionBackend

    seqs = [(9, 1), (31, 1), (0, 6), (16, 3), (5, 12)]
    lens = [c + n for c, n in seqs]
    b = make_paged_batch(lens, [n for _, n in seqs], 6, 2, 64, 16, torch.float32, "cpu", seed=3)
    meta = b.metadata(num_decodes=2)
    got = TritonAttentionBackend("cpu").forward(b.q, b.k_cache, b.v_cache, meta, 0.125)
    want = TorchAttentionBackend().forward(b.q, b.k_cache, b.v_cache, meta, 0.125)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def check_backend_prepared_once_for_every_layer():
    """A step's attention prepared once (the piecewise graphs' layer loop) gives each layer's caches what
    a forward of that layer gives, split decodes (a workspace shared by the layers) and prefills alike;
    so does the torch backend's."""
    from runtime.executor.attention.torch_backend import TorchAttentionBackend

    seqs = [(40, 1), (75, 1), (0, 6), (16, 3), (5, 12)]
    lens = [c + n for c, n in seqs]
    b = make_paged_batch(lens, [n for _, n in seqs], 6, 2, 64, 8, torch.float32, "cpu", seed=4)
    caches = [(b.k_cache, b.v_cache), (torch.randn_like(b.k_cache), torch.randn_like(b.v_cache))]
    meta = dataclasses.replace(b.metadata(num_decodes=2), decode_splits=2)
    for backend in (TritonAttentionBackend("cpu"), TorchAttentionBackend()):
        out = torch.full_like(b.q, float("nan"))
        attend = backend.prepare(meta, b.q, out, *caches[0])
        for (k_cache, v_cache), scale in zip(caches, (0.125, 0.2)):
            attend(k_cache, v_cache, scale)
            want = backend.forward(b.q, k_cache, v_cache, meta, scale)
            torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5, msg=backend.name)
            ref = paged_prefill_reference(b.q, k_cache, v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale)
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4, msg=backend.name)


def check_fused_rms_norm_and_rotary_fp16():
    from runtime.executor.kernels.fused_norm_rope import rms_norm, rms_norm_reference, rotary, rotary_reference

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


# The interpreter rounds fp32 -> bf16 by truncation (the GPU: to nearest even), so bf16 results can
# be a unit in the last place off torch's; fp16 it rounds as the GPU does: bitwise checks use fp16.
BF16 = {"atol": 1e-2, "rtol": 1.6e-2}


def check_add_rms_norm():
    from runtime.executor.kernels.fused_norm_rope import add_rms_norm, add_rms_norm_reference, rms_norm

    g = torch.Generator().manual_seed(6)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        wide = torch.randn(9, 200, generator=g).to(dtype)
        x, res = wide[:, :96], wide[:, 100:196]  # strided rows
        w = (torch.rand(96, generator=g) + 0.5).to(dtype)
        normed, new_res = add_rms_norm(x, res, w, 1e-6)
        assert torch.equal(normed, rms_norm(new_res, w, 1e-6)), dtype  # the norm reads the rounded sum
        want_normed, want_res = add_rms_norm_reference(x, res, w, 1e-6)
        if dtype == torch.bfloat16:
            torch.testing.assert_close(new_res, want_res, **BF16)
            torch.testing.assert_close(normed, want_normed, **BF16)
        else:
            assert torch.equal(new_res, want_res), dtype
            tol = 1e-5 if dtype == torch.float32 else 2e-3
            torch.testing.assert_close(normed, want_normed, atol=tol, rtol=tol)


def check_silu_and_mul():
    from runtime.executor.kernels.silu_and_mul import silu_and_mul, silu_and_mul_reference

    g = torch.Generator().manual_seed(7)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        gate_up = (4 * torch.randn(5, 2 * 1300, generator=g)).to(dtype)  # 1300: two column blocks, masked tail
        got, want = silu_and_mul(gate_up), silu_and_mul_reference(gate_up)
        if dtype == torch.bfloat16:
            torch.testing.assert_close(got, want, **BF16)
        else:  # numpy's expf is not torch's: within an ulp (fp32), fp16 rounds that away almost always
            torch.testing.assert_close(got, want)
            assert dtype == torch.float32 or (got != want).float().mean() < 1e-3


def check_rotary_q_and_k_in_one_launch():
    from runtime.executor.kernels.fused_norm_rope import rotary, rotary_reference

    g = torch.Generator().manual_seed(8)
    heads, kv_heads, d, t = 5, 2, 32, 6
    ang = torch.arange(40)[:, None] * torch.rand(d // 2, generator=g)[None, :]
    pos = torch.tensor([0, 3, 39, 7, 7, 1])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
        qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
        qkv_in = qkv.view(t, -1, d).clone()
        q, k, v = qkv.view(t, -1, d).split([heads, kv_heads, kv_heads], dim=1)
        want_q, want_k, want_v = rotary(q, cos, sin, pos), rotary(k, cos, sin, pos), v.clone()
        qk = qkv.view(t, -1, d)[:, : heads + kv_heads]
        assert rotary(qk, cos, sin, pos, out=qk) is qk
        assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(v, want_v), dtype
        if dtype != torch.bfloat16:  # the same rounding points as torch's
            assert torch.equal(qk, rotary_reference(qkv_in[:, : heads + kv_heads], cos, sin, pos)), dtype


def check_fused_model_equals_unfused():
    """The fused forward (residual adds in the norms, q|k rotary in place, SiLU-and-mul) against the
    unfused one, which on the CPU is torch's HF-order path (the norm's reduction order differs from
    the kernel's: close, not bitwise; the GPU test checks bitwise against the CUDA unfused path)."""
    import tempfile

    from runtime.executor.attention.torch_backend import TorchAttentionBackend
    from runtime.executor.model.loader import load_model
    from tests.model_helpers import forward_steps, tiny_hf_model

    tol = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 8e-2}  # relative to the largest logit
    for arch in ("llama", "qwen3"):
        folder = tempfile.mkdtemp()
        tiny_hf_model(arch).save_pretrained(folder)
        for dtype in ("float32", "float16", "bfloat16"):
            model = load_model(folder, device="cpu", dtype=dtype).model
            assert not model.use_fused_kernels
            want = forward_steps(model, TorchAttentionBackend())
            model.use_fused_kernels = True
            # the Triton attention kernels do not run bf16 in the interpreter
            backends = [TorchAttentionBackend()] + ([TritonAttentionBackend("cpu")] if dtype != "bfloat16" else [])
            for backend in backends:
                for step, (a, b) in enumerate(zip(forward_steps(model, backend), want)):
                    err = ((a - b).abs().max() / b.abs().max()).item()
                    assert err < tol[dtype], (arch, dtype, backend.name, step, err)


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
