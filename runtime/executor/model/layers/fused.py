"""Triton kernels of the fused forward, imported on first use: CPU-only installs have no Triton,
and the unfused path never calls these (runtime/executor/kernels/fused_norm_rope.py, silu_and_mul.py)."""

from __future__ import annotations

import torch


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    from runtime.executor.kernels.fused_norm_rope import rms_norm

    return rms_norm(x, weight, eps, out)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    from runtime.executor.kernels.fused_norm_rope import add_rms_norm

    return add_rms_norm(x, residual, weight, eps)


def fused_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    from runtime.executor.kernels.fused_norm_rope import rotary

    return rotary(x, cos, sin, positions, out)


def fused_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    from runtime.executor.kernels.silu_and_mul import silu_and_mul

    return silu_and_mul(gate_up)
