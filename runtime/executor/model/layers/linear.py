"""``linear`` / ``Linear``: F.linear with the CPU small-batch row padding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, except that on the CPU 8..15 rows are padded to 16: the CPU GEMM takes a slow path
    for those row counts (measured on this machine: 9-15 rows cost 1.2-1.8x as much as 16), which a
    decode step with that many sequences would pay in every layer. Rows are independent, so the
    real rows get the same result."""
    rows = x.shape[0]
    if 8 <= rows < 16 and x.device.type == "cpu":
        return F.linear(F.pad(x, (0, 0, 0, 16 - rows)), weight, bias)[:rows]
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
