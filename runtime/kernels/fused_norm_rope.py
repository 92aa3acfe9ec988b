"""Fused RMSNorm and rotary embedding (Triton), each next to its torch reference.

In eager mode a step launches every elementwise op of every layer separately: HF's RMSNorm is
~8 kernels (cast, square, mean, add, rsqrt, mul, cast, mul) and the rotary embedding ~5 per
tensor. A prefill step of a 28-layer model then spends more time launching kernels than running
them. One kernel each removes that; they are used on CUDA for fp16/bf16 (fp32 keeps HF's exact
op order, which the token-for-token tests rely on).

Numerics follow HF: the norm is computed in fp32 and cast to the input dtype before the weight
multiply; rotary uses the cos/sin table in the model dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_xr, stride_xh, stride_or, stride_oh, heads, n_cols, eps,
                     BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row, head = r // heads, r % heads
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + head * stride_xh + cols, mask=mask, other=0.0)
    x32 = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x32 * x32, axis=0) / n_cols + eps)
    y = (x32 * inv).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_or + head * stride_oh + cols, (w * y).to(x.dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` ``[T, D]`` or ``[T, heads, D]`` (any row/head strides)."""
    d = x.shape[-1]
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    assert x3.stride(-1) == 1, "the normalised dim must be contiguous"
    out = torch.empty(x3.shape, dtype=x.dtype, device=x.device)
    t, heads = x3.shape[0], x3.shape[1]
    if t * heads:
        _rms_norm_kernel[(t * heads,)](x3, weight, out, x3.stride(0), x3.stride(1), out.stride(0), out.stride(1),
                                       heads, d, eps, BLOCK=triton.next_power_of_2(d), num_warps=4)
    return out.view(x.shape)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh,
                   stride_c, heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (hs < heads)[:, None]
    d = tl.arange(0, HALF)[None, :]
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * stride_c + d)  # the table repeats each frequency: its first half suffices
    s = tl.load(sin_ptr + pos * stride_c + d)
    base = x_ptr + t * stride_xt + hs[:, None] * stride_xh
    x1 = tl.load(base + d, mask=mask, other=0.0)
    x2 = tl.load(base + HALF + d, mask=mask, other=0.0)
    # HF in the model dtype: x * cos + rotate_half(x) * sin, each product rounded, then the sum
    o1 = (x1 * c).to(x1.dtype) - (x2 * s).to(x1.dtype)
    o2 = (x2 * c).to(x1.dtype) + (x1 * s).to(x1.dtype)
    obase = out_ptr + t * stride_ot + hs[:, None] * stride_oh
    tl.store(obase + d, o1.to(x1.dtype), mask=mask)
    tl.store(obase + HALF + d, o2.to(x1.dtype), mask=mask)


def rotary(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """HF rotary of ``x`` ``[T, heads, D]`` at ``positions`` ``[T]`` from ``[max_pos, D]`` tables."""
    t, heads, d = x.shape
    assert x.stride(-1) == 1 and cos_table.stride(-1) == 1
    out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    block_h = min(triton.next_power_of_2(heads), 16)
    if t:
        _rotary_kernel[(t, triton.cdiv(heads, block_h))](
            x, cos_table, sin_table, positions, out, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
            cos_table.stride(0), heads, HALF=d // 2, BLOCK_H=block_h, num_warps=4)
    return out


def rotary_reference(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_table[positions].unsqueeze(1), sin_table[positions].unsqueeze(1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
