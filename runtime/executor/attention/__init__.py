"""Attention over paged KV: backends by name.

- ``metadata``: ``AttentionMetadata`` (what a step's attention reads) and the backend protocol;
- ``torch_backend``: the reference (gather + SDPA), every device;
- ``triton_backend``: the Triton kernels (runtime/executor/kernels), CUDA.

``get_backend("auto", device)`` picks triton on CUDA when it imports, torch elsewhere. A new
backend is one module with a class following ``AttentionBackend`` and one entry in ``BACKENDS``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.executor.attention.metadata import AttentionBackend, AttentionMetadata
from runtime.executor.attention.torch_backend import TorchAttentionBackend

__all__ = ["BACKENDS", "AttentionBackend", "AttentionMetadata", "get_backend"]


def _triton(device: torch.device) -> AttentionBackend:
    # imported on use: CPU-only installs have no Triton
    from runtime.executor.attention.triton_backend import TritonAttentionBackend

    if device.type != "cuda":
        raise ValueError(f"attention_backend 'triton' needs a CUDA device, got {device}")
    return TritonAttentionBackend(device)


BACKENDS: dict[str, Callable[[torch.device], AttentionBackend]] = {
    "torch": lambda device: TorchAttentionBackend(),
    "triton": _triton,
}


def get_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """``auto`` = triton on CUDA when it imports, else torch; a named backend insists (clear error)."""
    device = torch.device(device)
    if name == "auto":
        if device.type != "cuda":
            return BACKENDS["torch"](device)
        try:
            return BACKENDS["triton"](device)
        except ImportError:
            return BACKENDS["torch"](device)
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be auto or one of {', '.join(BACKENDS)}, got {name!r}")
    try:
        return BACKENDS[name](device)
    except ImportError as e:
        raise ValueError(f"attention_backend {name!r} is unavailable: {e}") from e
