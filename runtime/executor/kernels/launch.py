"""A step's attention prepared for its layers (no Triton here: the backend protocol names the type).

``prepare`` works out what a step's layers share (grid, split workspace, strides) once; the
``Launch`` it returns runs one layer's kernels given that layer's caches and scale, writing into the
prepared output (runtime/executor/piecewise_graphs.py calls it per layer).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Launch = Callable[[torch.Tensor, torch.Tensor, float], None]  # (k_cache, v_cache, scale) -> None


def no_launch(k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> None:
    """The launch of a step with no sequences of that kind."""
