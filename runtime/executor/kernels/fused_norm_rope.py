"""Fused RMSNorm (optionally with the residual add before it) and rotary embedding (Triton), each
next to its torch reference.

In eager mode a step launches every elementwise op of every layer separately: HF's RMSNorm is
~8 kernels (cast, square, mean, add, rsqrt, mul, cast, mul) and the rotary embedding ~5 per
tensor. A prefill step of a 28-layer model then spends more time launching kernels than running
them; a decode step replayed from a CUDA graph is still a chain of tiny kernels whose count sets
its latency. So: one kernel per norm, with the residual add that precedes it folded in
(``add_rms_norm``, vLLM's layout: the residual stream travels beside the hidden state), and one
rotary launch for q and k together (they are adjacent heads of the fused qkv output; rotated in
place). Used on CUDA for fp16/bf16 (fp32 keeps HF's exact op order, which the token-for-token tests
rely on).

Numerics follow HF, with torch's rounding points: the residual sum is rounded to the input dtype
(as ``x + residual`` is) and is what the norm reads; the norm is computed in fp32 and cast to the
input dtype before the weight multiply; rotary uses the cos/sin table in the model dtype, each
product rounded before the sum. Arithmetic is written in fp32 with an explicit cast after each op:
on the GPU that gives the bits of the op done in the half dtype, as torch computes it (products of
two halves are exact in fp32, and a sum rounded to fp32 then to the half dtype rounds as one
correctly rounded half sum), and it is what the CPU interpreter needs (it stores bf16 as raw
uint16; its fp32 -> bf16 cast truncates, so bf16 is exact only on the GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_xr, stride_xh, stride_rr, stride_or,
                     stride_oh, stride_ror, heads, n_cols, eps, ADD_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row, head = r // heads, r % heads
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + head * stride_xh + cols, mask=mask, other=0.0)
    dtype = x.dtype
    x32 = x.to(tl.float32)
    if ADD_RESIDUAL:  # torch's x + residual: fp32 sum rounded once; the new residual and the norm's input
        res = tl.load(res_ptr + row * stride_rr + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x32 + res).to(dtype)
        tl.store(res_out_ptr + row * stride_ror + cols, x, mask=mask)
        x32 = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x32 * x32, axis=0) / n_cols + eps)
    y = (x32 * inv).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_or + head * stride_oh + cols, (w * y).to(dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` ``[T, D]`` or ``[T, heads, D]`` (any row/head strides).
    ``out`` (same shape, any strides; may be ``x`` itself: in place) receives the result."""
    d = x.shape[-1]
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    o3 = out if out.dim() == 3 else out.unsqueeze(1)
    assert x3.stride(-1) == 1 and o3.stride(-1) == 1 and o3.shape == x3.shape, "the normalised dim must be contiguous"
    t, heads = x3.shape[0], x3.shape[1]
    if t * heads:
        _rms_norm_kernel[(t * heads,)](x3, x3, weight, o3, o3, x3.stride(0), x3.stride(1), 0, o3.stride(0),
                                       o3.stride(1), 0, heads, d, eps, ADD_RESIDUAL=False,
                                       BLOCK=triton.next_power_of_2(d), num_warps=4)
    return out


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` for ``[T, D]`` inputs, in one kernel; bit-identical
    to the two ops (torch's add, then ``rms_norm``: the same kernel)."""
    t, d = x.shape
    assert residual.shape == x.shape and x.stride(-1) == 1 and residual.stride(-1) == 1
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    new_residual = torch.empty((t, d), dtype=x.dtype, device=x.device)
    if t:
        _rms_norm_kernel[(t,)](x, residual, weight, out, new_residual, x.stride(0), 0, residual.stride(0),
                               out.stride(0), 0, new_residual.stride(0), 1, d, eps, ADD_RESIDUAL=True,
                               BLOCK=triton.next_power_of_2(d), num_warps=4)
    return out, new_residual


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return rms_norm_reference(s, weight, eps), s


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh,
                   stride_c, heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (hs < heads)[:, None]
    d = tl.arange(0, HALF)[None, :]
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * stride_c + d).to(tl.float32)  # the table repeats each frequency: first half
    s = tl.load(sin_ptr + pos * stride_c + d).to(tl.float32)
    base = x_ptr + t * stride_xt + hs[:, None] * stride_xh
    x1 = tl.load(base + d, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(base + HALF + d, mask=mask, other=0.0).to(tl.float32)
    # HF in the model dtype: x * cos + rotate_half(x) * sin, each product rounded, then the sum
    o1 = (x1 * c).to(dtype).to(tl.float32) - (x2 * s).to(dtype).to(tl.float32)
    o2 = (x2 * c).to(dtype).to(tl.float32) + (x1 * s).to(dtype).to(tl.float32)
    obase = out_ptr + t * stride_ot + hs[:, None] * stride_oh
    tl.store(obase + d, o1.to(dtype), mask=mask)
    tl.store(obase + HALF + d, o2.to(dtype), mask=mask)


def rotary(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """HF rotary of ``x`` ``[T, heads, D]`` at ``positions`` ``[T]`` from ``[max_pos, D]`` tables.
    ``out`` (any row/head strides) may be ``x`` itself: each program reads its heads before writing
    them, so in place is safe. q and k rotate in one call as adjacent heads of the qkv output."""
    t, heads, d = x.shape
    out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device) if out is None else out
    assert x.stride(-1) == 1 and out.stride(-1) == 1 and out.shape == x.shape and cos_table.stride(-1) == 1
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
