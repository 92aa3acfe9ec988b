"""The physical limit of a decode-heavy run: bytes that must move / measured memory bandwidth.

Every step reads all weights once (the tied embedding counts once: the LM head reads it all), and
every scheduled sequence reads the KV of its whole context (cached + new tokens) once. Activations
are ignored (tiny next to weights + KV), so the limit is optimistic: no engine can beat it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from traces.events import Span


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass
class ByteCounter:
    """Accumulates the bytes each step must read; feed it every step's spans."""

    weights: int  # bytes of weights, read once per step
    kv_per_token: int
    steps: int = 0
    context_tokens: int = 0  # Σ over steps and scheduled sequences of the context read

    def add_step(self, spans: Iterable[Span]) -> None:
        self.steps += 1
        self.context_tokens += sum(s.start + s.num_tokens for s in spans)

    @property
    def total(self) -> int:
        return self.steps * self.weights + self.context_tokens * self.kv_per_token


@dataclass
class Roofline:
    bytes_read: int
    weight_bytes: int
    kv_bytes: int
    bandwidth_gbs: float  # measured copy bandwidth (bytes read + written per second)
    limit_s: float  # bytes_read / bandwidth
    measured_s: float
    fraction: float  # limit_s / measured_s: 1.0 = at the memory-bandwidth limit

    def describe(self) -> str:
        return (f"physical limit: {self.bytes_read / 1e9:.1f} GB to read (weights {self.weight_bytes / 1e9:.1f} GB, "
                f"KV {self.kv_bytes / 1e9:.1f} GB) at {self.bandwidth_gbs:,.0f} GB/s measured copy bandwidth "
                f"= {self.limit_s:.2f} s; the engine took {self.measured_s:.2f} s = {self.fraction:.1%} of the limit")

    def as_dict(self) -> dict:
        return asdict(self)


def roofline(counter: ByteCounter, bandwidth_gbs: float, measured_s: float) -> Roofline:
    kv = counter.context_tokens * counter.kv_per_token
    weights = counter.steps * counter.weights
    limit = (weights + kv) / (bandwidth_gbs * 1e9)
    return Roofline(weights + kv, weights, kv, bandwidth_gbs, limit, measured_s,
                    limit / measured_s if measured_s else float("nan"))


def measure_bandwidth(device: torch.device) -> float:
    """Copy bandwidth in GB/s: a large device-to-device copy on CUDA, a 1 GiB memcpy on the CPU."""
    if device.type == "cuda":
        from runtime.bench.gpu_timing import copy_bandwidth_gbs

        return copy_bandwidth_gbs(device)
    import time

    src = torch.empty(1 << 28, dtype=torch.float32).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best / 1e9
