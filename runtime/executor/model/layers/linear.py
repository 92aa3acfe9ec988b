"""``linear`` / ``Linear``: F.linear, with two CPU speed-ups.

- fp32 weights on the CPU are packed once into oneDNN's blocked layout (``pack_cpu_weights``) and
  multiplied by its prepacked GEMM (the op PyTorch's own CPU compiler emits): on a 2-core VM it is
  1.6x faster than F.linear's MKL for one row (the weights are read once per step either way, and
  it reads them faster), 2.7x for 9 rows (a speculative verify step of 8 drafts costs 1.2x a decode
  step) and 1.3x for a 1k-token prefill (SmolLM2-135M's linears, weights cold in cache). The dense
  weight stays too (state_dict, the embedding a tied head shares, byte counts).
- otherwise (another dtype, no oneDNN), 8..15 rows are padded to 16 for F.linear.
"""

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


def cpu_packed(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` ([out, in]) packed for ``packed_linear``; None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    return None if reorder is None else reorder(weight.detach(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class Linear(nn.Linear):
    packed: torch.Tensor | None = None  # set by pack_cpu_weights; not a buffer: no state_dict entry

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        return linear(x, self.weight, self.bias)


def pack_cpu_weights(model: nn.Module) -> None:
    """Pack every ``Linear`` of a loaded model whose weight qualifies (after its weights are final)."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.packed = cpu_packed(module.weight)
