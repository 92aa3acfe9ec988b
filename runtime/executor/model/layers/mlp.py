"""Gated SiLU MLP: one fused gate/up matmul, ``silu(gate) * up``, down."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.executor.model.layers.fused import fused_silu_and_mul
from runtime.executor.model.layers.linear import Linear
from runtime.executor.model.spec import ModelSpec


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.intermediate = spec.intermediate_size
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=spec.mlp_bias)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        if fused:
            return self.down_proj(fused_silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)
