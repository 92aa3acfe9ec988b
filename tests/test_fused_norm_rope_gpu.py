"""Fused RMSNorm / add+RMSNorm / rotary / SiLU-and-mul kernels on CUDA (bf16, fp16) against their
torch references, and the fused model forward against the unfused one (bitwise)."""

import pytest
import torch

from runtime.executor.kernels.fused_norm_rope import (
    add_rms_norm,
    add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
    rotary,
    rotary_reference,
)
from runtime.executor.kernels.silu_and_mul import silu_and_mul, silu_and_mul_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.bfloat16, torch.float16]


def _tol(dtype):
    return 2e-2 if dtype == torch.bfloat16 else 2e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "heads", "head_dim"), [(1, 16, 128), (300, 8, 128), (37, 9, 64), (2048, 3, 64)])
def test_fused_matches_reference(dtype, tokens, heads, head_dim):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2) * head_dim, device="cuda", generator=g).to(dtype)
    x = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    w = (torch.rand(head_dim, device="cuda", generator=g) + 0.5).to(dtype)
    tol = _tol(dtype)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), atol=tol, rtol=tol)
    hidden = torch.randn(tokens, heads * head_dim, device="cuda", generator=g).to(dtype)
    wh = torch.rand(heads * head_dim, device="cuda", generator=g).to(dtype)
    torch.testing.assert_close(rms_norm(hidden, wh, 1e-5), rms_norm_reference(hidden, wh, 1e-5), atol=tol, rtol=tol)
    ang = torch.arange(4096, device="cuda")[:, None] * torch.rand(head_dim // 2, device="cuda", generator=g)
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    pos = torch.randint(0, 4096, (tokens,), device="cuda", generator=g)
    torch.testing.assert_close(rotary(x, cos, sin, pos), rotary_reference(x, cos, sin, pos), atol=tol, rtol=tol)
    inplace = qkv.clone()  # in place on the strided view (the fused path's q_norm) == a fresh output
    q_cols = heads * head_dim
    xi = inplace[:, :q_cols].view(tokens, heads, head_dim)
    rms_norm(xi, w, 1e-6, out=xi)
    assert torch.equal(xi, rms_norm(x, w, 1e-6)) and torch.equal(inplace[:, q_cols:], qkv[:, q_cols:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 576), (37, 576), (300, 4096), (2048, 896)])
def test_add_rms_norm_bitwise(dtype, tokens, hidden):
    """new residual == torch's ``x + residual``; normed == ``rms_norm`` of it: the unfused path's bits."""
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(dtype)
    res = (8 * torch.randn(tokens, hidden, device="cuda", generator=g)).to(dtype)
    w = (torch.rand(hidden, device="cuda", generator=g) + 0.5).to(dtype)
    normed, new_res = add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(new_res, x + res)
    assert torch.equal(normed, rms_norm(x + res, w, 1e-5))
    want, _ = add_rms_norm_reference(x, res, w, 1e-5)
    torch.testing.assert_close(normed, want, atol=_tol(dtype), rtol=_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "inter"), [(1, 1536), (37, 1536), (300, 8960), (2048, 1536), (5, 1300)])
def test_silu_and_mul_bitwise(dtype, tokens, inter):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    gate_up = (4 * torch.randn(tokens, 2 * inter, device="cuda", generator=g)).to(dtype)
    gate_up[0, :10] = torch.tensor([-100.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.0, 100.0, 1e-6])
    assert torch.equal(silu_and_mul(gate_up), silu_and_mul_reference(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "head_dim"),
                         [(1, 9, 3, 64), (37, 9, 3, 64), (300, 32, 8, 128), (2048, 16, 2, 128)])
def test_rotary_q_and_k_in_one_launch(dtype, tokens, heads, kv_heads, head_dim):
    """q and k rotated in place as adjacent heads of qkv == two launches; v untouched."""
    g = torch.Generator(device="cuda").manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda", generator=g).to(dtype)
    q, k, v = qkv.view(tokens, -1, head_dim).split([heads, kv_heads, kv_heads], dim=1)
    ang = torch.arange(4096, device="cuda")[:, None] * torch.rand(head_dim // 2, device="cuda", generator=g)
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    pos = torch.randint(0, 4096, (tokens,), device="cuda", generator=g)
    want_q, want_k, want_v = rotary(q, cos, sin, pos), rotary(k, cos, sin, pos), v.clone()
    qk = qkv.view(tokens, -1, head_dim)[:, : heads + kv_heads]
    rotary(qk, cos, sin, pos, out=qk)
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("model", ["llama", "qwen2", "qwen3", "random:smollm2-135m", "random:qwen3-0.6b"])
def test_fused_model_bitwise_equals_unfused(tmp_path, model, dtype):
    """The loader picks the fused forward on CUDA in half precision; its logits (prefill, decode and
    mixed steps, Triton attention) are the unfused forward's, bit for bit."""
    from runtime.executor.attention.triton_backend import TritonAttentionBackend
    from runtime.executor.model.loader import load_model
    from tests.model_helpers import forward_steps, tiny_hf_model

    if not model.startswith("random:"):
        tiny_hf_model(model).save_pretrained(tmp_path)
        model = str(tmp_path)
    net = load_model(model, device="cuda", dtype=dtype, max_positions=512).model
    assert net.use_fused_kernels
    backend = TritonAttentionBackend("cuda")
    fused = forward_steps(net, backend)
    net.use_fused_kernels = False
    unfused = forward_steps(net, backend)
    for step, (a, b) in enumerate(zip(fused, unfused)):
        assert torch.equal(a, b), (step, (a - b).abs().max().item())
