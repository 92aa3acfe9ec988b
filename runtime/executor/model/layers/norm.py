"""RMSNorm in HF's arithmetic order (fp32), one Triton kernel on CUDA in fp16/bf16."""

from __future__ import annotations

import torch
from torch import nn

from runtime.executor.model.layers.fused import fused_add_rms_norm, fused_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype != torch.float32:
            return fused_rms_norm(x, self.weight, self.eps)  # one fused kernel instead of ~8
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused path: ``(norm(x + residual), x + residual)`` in one kernel; residual None (the
        first layer): x is the residual stream, ``(norm(x), x)``."""
        if residual is None:
            return fused_rms_norm(x, self.weight, self.eps), x
        return fused_add_rms_norm(x, residual, self.weight, self.eps)
