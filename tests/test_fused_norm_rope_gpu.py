"""Fused RMSNorm / rotary kernels on CUDA (bf16, fp16) against their torch references."""

import pytest
import torch

from runtime.kernels.fused_norm_rope import rms_norm, rms_norm_reference, rotary, rotary_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("tokens", "heads", "head_dim"), [(1, 16, 128), (300, 8, 128), (37, 9, 64), (2048, 3, 64)])
def test_fused_matches_reference(dtype, tokens, heads, head_dim):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2) * head_dim, device="cuda", generator=g).to(dtype)
    x = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    w = (torch.rand(head_dim, device="cuda", generator=g) + 0.5).to(dtype)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), atol=tol, rtol=tol)
    hidden = torch.randn(tokens, heads * head_dim, device="cuda", generator=g).to(dtype)
    wh = torch.rand(heads * head_dim, device="cuda", generator=g).to(dtype)
    torch.testing.assert_close(rms_norm(hidden, wh, 1e-5), rms_norm_reference(hidden, wh, 1e-5), atol=tol, rtol=tol)
    ang = torch.arange(4096, device="cuda")[:, None] * torch.rand(head_dim // 2, device="cuda", generator=g)
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    pos = torch.randint(0, 4096, (tokens,), device="cuda", generator=g)
    torch.testing.assert_close(rotary(x, cos, sin, pos), rotary_reference(x, cos, sin, pos), atol=tol, rtol=tol)
