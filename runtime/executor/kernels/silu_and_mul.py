"""Fused SiLU-and-mul of the gate/up projection (Triton), next to its torch reference.

The MLP's fused gate/up matmul gives ``[T, 2 * I]`` (gate columns, then up); ``F.silu(gate) * up``
is two elementwise kernels and a ``[T, I]`` intermediate, one kernel here. Used on CUDA for
fp16/bf16. Bit-identical to torch there: torch computes silu as ``x / (1 + exp(-x))`` in fp32
(``expf``, IEEE division) and rounds it to the dtype, then the product in fp32, rounded again; the
kernel does the same (libdevice ``expf``, ``div_rn``: Triton's ``/`` and ``tl.exp`` are
approximate). The CPU interpreter has no libdevice: there ``tl.exp`` (numpy's) stands in.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = tl.div_rn(g, 1.0 + e).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (silu * up).to(dtype), mask=mask)


_COMPILED = isinstance(_silu_and_mul_kernel, triton.runtime.JITFunction)  # False under TRITON_INTERPRET=1


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[T, 2 * I]`` (gate = the first I columns) → ``[T, I]``."""
    t, two_i = gate_up.shape
    n = two_i // 2
    assert gate_up.stride(-1) == 1 and two_i == 2 * n
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(triton.next_power_of_2(n), 1024)
    if t:
        _silu_and_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, gate_up.stride(0), out.stride(0), n,
                                                         LIBDEVICE=_COMPILED, BLOCK=block, num_warps=4)
    return out


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
